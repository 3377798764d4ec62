// kvc_router/detail/worker_mask.hpp
//
// A small set of worker ids (a bit per worker) for the workers already tried
// inside one Dispatch. Up to 256 workers it lives inline, with no allocation.
#pragma once

#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "kvc_router/types.hpp"

namespace kvc_router::detail {

class WorkerMask {
 public:
  WorkerMask() = default;
  explicit WorkerMask(uint32_t num_workers) : words_((num_workers + 63) / 64, 0) {}

  // Grows when `worker` is past the size it was made for (workers added at
  // runtime).
  void Insert(WorkerId worker) {
    const size_t word = worker / 64;
    if (word >= words_.size()) words_.resize(word + 1, 0);
    words_[word] |= uint64_t{1} << (worker % 64);
  }
  bool Contains(WorkerId worker) const {
    const size_t word = worker / 64;
    return word < words_.size() && (words_[word] >> (worker % 64)) & 1;
  }

 private:
  absl::InlinedVector<uint64_t, 4> words_;
};

}  // namespace kvc_router::detail
