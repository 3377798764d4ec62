// kvc_sim/gpu_timeline.hpp
//
// One GPU's schedule when it both prefills and decodes (a colocated
// instance, or a decode worker serving KVC Direct appends), in the way
// chunked-prefill engines (SGLang, vLLM) run it: each iteration advances
// every running decode by one token and, while prefill work is queued,
// processes one chunk of the oldest prefill in the same forward pass. So
//
//   iteration time = decode step(batch, context)  [if anything decodes]
//                  + prefill chunk time           [if anything prefills]
//
// A prefill chunk lengthens every decode step it shares the GPU with by the
// chunk's time, and running decodes lengthen a prefill by one decode step per
// chunk. With nothing decoding, a prefill takes exactly the cost model's
// prefill time; with nothing prefilling, a decode step takes exactly the
// decode step time.
//
// The timeline is fluid between changes: it counts iterations (a real
// number) at the current iteration time and recomputes that time whenever
// the batch or the prefill queue changes, so a request costs O(log n) work,
// not one event per token. Prefills run one at a time, first in first out;
// a prefill of n tokens is ceil(n / chunk) chunks of equal time.
//
//   GpuTimeline gpu(cost);
//   gpu.AdvanceTo(now);
//   gpu.EnqueuePrefill(slot, cost.PrefillSeconds(n, c), chunks, n);
//   double next = gpu.NextCompletion();   // schedule a wake-up then
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

#include "kvc_sim/cost_model.hpp"

namespace kvc_router::sim {

class GpuTimeline {
 public:
  explicit GpuTimeline(const CostModel& cost) : cost_(&cost) {}

  // Moves the iteration count to `now` (never backwards).
  void AdvanceTo(double now) {
    if (now <= now_) return;
    const double iter = IterationSeconds();
    if (std::isfinite(iter) && iter > 0) iterations_ += (now - now_) / iter;
    now_ = now;
  }

  bool idle() const { return prefills_.empty() && decodes_.empty(); }

  // Queues a prefill of `tokens` new tokens taking `seconds` of GPU time
  // alone, in `chunks` chunks. Call AdvanceTo(now) first.
  void EnqueuePrefill(uint32_t slot, double seconds, uint32_t chunks, uint64_t tokens) {
    chunks = std::max<uint32_t>(chunks, 1);
    prefills_.push_back(Prefill{slot, seconds / chunks, chunks, tokens, 0});
    pending_prefill_tokens_ += tokens;
    if (prefills_.size() == 1) prefills_.front().done_at = iterations_ + chunks;
  }

  // Adds a request that decodes `steps` more tokens with `context` tokens of
  // KV. Call AdvanceTo(now) first.
  void AddDecode(uint32_t slot, uint64_t steps, uint64_t context) {
    decodes_.push_back(Decode{iterations_ + static_cast<double>(steps), sequence_++, slot, context});
    std::push_heap(decodes_.begin(), decodes_.end(), Later);
    batch_context_tokens_ += context;
  }

  // Absolute time of the next prefill or decode completion; +inf if idle.
  double NextCompletion() const {
    if (idle()) return std::numeric_limits<double>::infinity();
    const double iter = IterationSeconds();
    double target = std::numeric_limits<double>::infinity();
    if (!prefills_.empty()) target = prefills_.front().done_at;
    if (!decodes_.empty()) target = std::min(target, decodes_.front().done_at);
    // Within the slack the completion is due now: waking a hair later could
    // round to the same instant and never advance.
    if (target - iterations_ <= kSlack || iter == 0) return now_;
    return now_ + (target - iterations_) * iter;
  }

  // Removes what is complete at the current time; appends the slots of
  // finished prefills and decodes. Call AdvanceTo(now) first.
  void TakeDue(std::vector<uint32_t>& prefills_done, std::vector<uint32_t>& decodes_done) {
    while (!prefills_.empty() && Due(prefills_.front().done_at)) {
      pending_prefill_tokens_ -= prefills_.front().tokens;
      prefills_done.push_back(prefills_.front().slot);
      prefills_.pop_front();
      if (!prefills_.empty()) prefills_.front().done_at = iterations_ + prefills_.front().chunks;
    }
    while (!decodes_.empty() && Due(decodes_.front().done_at)) {
      std::pop_heap(decodes_.begin(), decodes_.end(), Later);
      batch_context_tokens_ -= decodes_.back().context;
      decodes_done.push_back(decodes_.back().slot);
      decodes_.pop_back();
    }
  }

  // Seconds one iteration takes now (0 is possible with zero cost
  // constants); +inf when the GPU is idle.
  double IterationSeconds() const {
    if (idle()) return std::numeric_limits<double>::infinity();
    double iter = 0;
    if (!decodes_.empty()) iter += cost_->DecodeStepSeconds(decodes_.size(), batch_context_tokens_);
    if (!prefills_.empty()) iter += prefills_.front().chunk_s;
    return iter;
  }

  uint64_t decode_batch() const { return decodes_.size(); }
  uint64_t pending_prefill_tokens() const { return pending_prefill_tokens_; }
  size_t queued_prefills() const { return prefills_.size(); }
  double now() const { return now_; }

 private:
  // Iterations within which a completion counts as reached (rounding).
  static constexpr double kSlack = 1e-6;

  // Reached now: within the slack, at zero-time iterations, or so close that
  // its time rounds to the current instant.
  bool Due(double target) const {
    if (target <= iterations_ + kSlack) return true;
    const double iter = IterationSeconds();
    return iter == 0 || now_ + (target - iterations_) * iter <= now_;
  }

  struct Prefill {
    uint32_t slot;
    double chunk_s;
    uint32_t chunks;
    uint64_t tokens;
    double done_at;  // iteration count at which it completes (when at the head)
  };
  struct Decode {
    double done_at;
    uint64_t sequence;  // equal targets complete in the order they joined
    uint32_t slot;
    uint64_t context;
  };
  static bool Later(const Decode& a, const Decode& b) {
    if (a.done_at != b.done_at) return a.done_at > b.done_at;
    return a.sequence > b.sequence;
  }

  const CostModel* cost_;
  double now_ = 0;
  double iterations_ = 0;
  std::deque<Prefill> prefills_;
  std::vector<Decode> decodes_;
  uint64_t sequence_ = 0;
  uint64_t batch_context_tokens_ = 0;
  uint64_t pending_prefill_tokens_ = 0;
};

}  // namespace kvc_router::sim
