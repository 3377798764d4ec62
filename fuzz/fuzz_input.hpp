// fuzz/fuzz_input.hpp
//
// Reads typed values from a libFuzzer input, for the targets in fuzz/. Past
// the end every read returns 0 (the target then stops), so any byte string
// is a valid input. FUZZ_CHECK aborts with a message when an invariant fails:
// libFuzzer records the input as a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define FUZZ_CHECK(condition)                                                   \
  do {                                                                          \
    if (!(condition)) {                                                         \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, \
                   #condition);                                                 \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

namespace kvc_fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (uint16_t{U8()} << 8)); }
  uint32_t U32() { return uint32_t{U16()} | (uint32_t{U16()} << 16); }
  uint64_t U64() { return uint64_t{U32()} | (uint64_t{U32()} << 32); }
  // Uniform-ish in [0, n); 0 when n == 0.
  uint32_t Below(uint32_t n) { return n == 0 ? 0 : U32() % n; }
  // A size that is usually small but sometimes extreme.
  uint64_t Tokens() {
    switch (U8() % 8) {
      case 0:
        return U64();  // anything, overflow included
      case 1:
        return U32();
      default:
        return U16() % 4096;
    }
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace kvc_fuzz
