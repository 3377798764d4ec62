// kvc_router/detail/splitmix.hpp
//
// SplitMix64: the tiny deterministic generator behind the property kit's
// scenarios and the simulator's synthetic workloads. It gives the same stream
// on every platform and standard library, which std:: distributions do not.
#pragma once

#include <cstdint>

namespace kvc_router::detail {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

}  // namespace kvc_router::detail
