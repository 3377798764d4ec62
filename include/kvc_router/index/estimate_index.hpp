// kvc_router/index/estimate_index.hpp
//
// A residency estimate learned from the router's own placements, bounded by
// what each decode worker can hold. Each worker keeps the blocks of the
// sessions placed on it; when a worker's estimate passes its capacity in
// tokens, whole sessions are dropped least-recently-placed first, the way a
// session-aware worker cache evicts. Overlap per worker is the length of the
// leading run of the prefix that the worker holds: with chained hashes a
// worker that holds block i holds the prefix before it, so the run equals the
// set intersection whenever residency is prefix-closed (tests check this
// against NaiveIndex).
//
// Cost: Overlap is O(|D| * run length) hash look-ups; OverlapOfChain, for
// callers whose every chain starts at the root (the EAR policies), finds the
// same run by bisection in O(|D| * log(prefix length)); Learn is O(new
// blocks) when a session's chain only grew. Not thread-safe by itself;
// RoutingState serializes access.
//
//   kvc_router::EstimateIndex index(/*num_workers=*/8,
//                                   /*capacity_tokens=*/92104,
//                                   /*block_tokens=*/24);
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvc_router/index/detail/session_chain.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {

class EstimateIndex {
 public:
  // `capacity_tokens` bounds each worker's estimate (use the workers' K_d);
  // 0 means unbounded. `block_tokens` converts blocks to tokens.
  EstimateIndex(uint32_t num_workers, uint64_t capacity_tokens, uint32_t block_tokens)
      : workers_(num_workers),
        capacity_blocks_(capacity_tokens == 0 || block_tokens == 0
                             ? std::numeric_limits<uint64_t>::max()
                             : capacity_tokens / block_tokens) {}

  size_t num_workers() const { return workers_.size(); }

  void Overlap(std::span<const BlockHash> prefix, std::span<uint32_t> out) const {
    for (size_t d = 0; d < workers_.size() && d < out.size(); ++d) {
      const auto& refs = workers_[d].block_refs;
      uint32_t run = 0;
      while (run < prefix.size() && refs.contains(prefix[run])) ++run;
      out[d] = run;
    }
  }

  // Overlap for a caller that only ever learns and asks about chains that
  // start at the root block (SessionHasher's, a trace's): each worker's
  // blocks are then the union of such chains, cut to their leading blocks, so
  // "holds block k" is true up to the run and false after it, and bisection
  // finds the run Overlap would, with O(log prefix length) look-ups.
  void OverlapOfChain(std::span<const BlockHash> chain, std::span<uint32_t> out) const {
    for (size_t d = 0; d < workers_.size() && d < out.size(); ++d) {
      const auto& refs = workers_[d].block_refs;
      size_t lo = 0, hi = chain.size();  // refs holds chain[i] for i < lo, not for i >= hi
      while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (refs.contains(chain[mid])) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      out[d] = static_cast<uint32_t>(lo);
    }
  }

  // Session `session` on `worker` now holds `hashes` (its chained prefix).
  // If the session alone exceeds the capacity, only its leading blocks are kept.
  void Learn(WorkerId worker, SessionId session, std::span<const BlockHash> hashes) {
    if (worker >= workers_.size()) return;
    Worker& w = workers_[worker];
    w.sessions.Learn(
        session, hashes, capacity_blocks_, [&w](BlockHash h) { ++w.block_refs[h]; },
        [&w](BlockHash h) { Unref(w, h); });
  }

  void ForgetSession(WorkerId worker, SessionId session) {
    if (worker >= workers_.size()) return;
    Worker& w = workers_[worker];
    w.sessions.Forget(session, [&w](BlockHash h) { Unref(w, h); });
  }

  // Elastic membership (ElasticCacheIndex): grow to `num_workers` workers;
  // forget everything `worker` holds.
  void ResizeWorkers(uint32_t num_workers) {
    if (num_workers > workers_.size()) workers_.resize(num_workers);
  }
  void ForgetWorker(WorkerId worker) {
    if (worker < workers_.size()) workers_[worker] = Worker();
  }
  // Blocks (session, worker) entries the estimate holds for `worker`.
  uint64_t resident_blocks(WorkerId worker) const {
    return worker < workers_.size() ? workers_[worker].sessions.total_blocks() : 0;
  }
  uint64_t capacity_blocks() const { return capacity_blocks_; }
  bool HoldsSession(WorkerId worker, SessionId session) const {
    return worker < workers_.size() && workers_[worker].sessions.Holds(session);
  }

 private:
  struct Worker {
    absl::flat_hash_map<BlockHash, uint32_t> block_refs;
    index_detail::WorkerSessions sessions;
  };

  static void Unref(Worker& w, BlockHash hash) {
    auto it = w.block_refs.find(hash);
    if (--it->second == 0) w.block_refs.erase(it);
  }

  std::vector<Worker> workers_;
  uint64_t capacity_blocks_;
};

}  // namespace kvc_router
