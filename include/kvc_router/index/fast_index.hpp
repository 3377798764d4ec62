// kvc_router/index/fast_index.hpp
//
// The production residency estimate: what EstimateIndex does, in one
// structure for all decode workers and with an overlap search that costs
// O(k log n) look-ups instead of O(|D| n).
//
//  - One table maps each block hash to the set of workers holding it.
//  - Overlap for all workers comes from one bisection over the prefix
//    (index/detail/block_table.hpp): exact when residency is prefix-closed,
//    which placements of chained prefixes always are.
//  - Each worker has a capacity in tokens; past it, whole sessions are
//    dropped least recently placed first, as a session-aware worker cache
//    would, so the estimate never claims more than a worker can hold.
//  - `memory_bytes()` / `entries()` report the cost per resident
//    (block, worker) entry.
//
// Not thread-safe by itself; RoutingState serializes writers and lets
// readers share.
//
//   absl::StatusOr<kvc_router::FastIndex> index = kvc_router::FastIndex::Create(
//       /*num_workers=*/8, /*capacity_tokens=*/92104, /*block_tokens=*/24);
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvc_router/index/detail/block_table.hpp"
#include "kvc_router/index/detail/session_chain.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {

class FastIndex {
 public:
  // Checks `num_workers` (1..kMaxWorkers, what the block table encodes).
  static absl::StatusOr<FastIndex> Create(uint32_t num_workers, uint64_t capacity_tokens,
                                          uint32_t block_tokens) {
    absl::Status status = index_detail::BlockTable::CheckNumWorkers(num_workers, "FastIndex");
    if (!status.ok()) return status;
    return FastIndex(num_workers, capacity_tokens, block_tokens);
  }

  // `capacity_tokens` bounds each worker (0 = unbounded); `block_tokens`
  // converts blocks to tokens. Unchecked: prefer `Create`. With more than
  // kMaxWorkers workers the index ignores placements on workers past
  // kMaxWorkers - 1 (RoutingState::Create never accepts such a |D| anyway).
  FastIndex(uint32_t num_workers, uint64_t capacity_tokens, uint32_t block_tokens)
      : table_(num_workers),
        workers_(num_workers),
        capacity_blocks_(capacity_tokens == 0 || block_tokens == 0
                             ? std::numeric_limits<uint64_t>::max()
                             : capacity_tokens / block_tokens) {}

  size_t num_workers() const { return workers_.size(); }

  void Overlap(std::span<const BlockHash> prefix, std::span<uint32_t> out) const {
    table_.MatchedRuns(prefix, out);
  }

  // Session `session` on `worker` now holds `hashes` (its chained prefix).
  // If the session alone exceeds the capacity, only its leading blocks are kept.
  void Learn(WorkerId worker, SessionId session, std::span<const BlockHash> hashes) {
    if (!table_.Covers(worker)) return;
    workers_[worker].sessions.Learn(
        session, hashes, capacity_blocks_, [&](BlockHash h) { Ref(worker, h); },
        [&](BlockHash h) { Unref(worker, h); });
  }

  void ForgetSession(WorkerId worker, SessionId session) {
    if (worker >= workers_.size()) return;
    workers_[worker].sessions.Forget(session, [&](BlockHash h) { Unref(worker, h); });
  }

  // Elastic membership (ElasticCacheIndex): grow to `num_workers` workers
  // (at most kMaxWorkers; the table re-encodes in place when |D| passes a
  // multiple of 64); forget everything `worker` holds.
  void ResizeWorkers(uint32_t num_workers) {
    if (num_workers <= workers_.size()) return;
    table_.Resize(num_workers);
    workers_.resize(num_workers);
  }
  void ForgetWorker(WorkerId worker) {
    if (worker >= workers_.size()) return;
    entries_ -= table_.EraseWorker(worker);
    workers_[worker] = Worker();
  }
  bool Contains(WorkerId worker, BlockHash hash) const {
    return worker < workers_.size() && table_.Contains(hash, worker);
  }
  bool HoldsSession(WorkerId worker, SessionId session) const {
    return worker < workers_.size() && workers_[worker].sessions.Holds(session);
  }
  // Blocks the estimate holds for `worker`, counting a block once per session.
  uint64_t resident_blocks(WorkerId worker) const {
    return worker < workers_.size() ? workers_[worker].sessions.total_blocks() : 0;
  }
  uint64_t capacity_blocks() const { return capacity_blocks_; }

  // Resident (block, worker) pairs.
  uint64_t entries() const { return entries_; }
  // Bytes of the table, the per-session block lists and the shared-block
  // counters (hash-map overhead estimated from their capacities).
  size_t memory_bytes() const {
    size_t bytes = table_.memory_bytes() + workers_.capacity() * sizeof(Worker);
    for (const Worker& w : workers_) {
      bytes += w.sessions.memory_bytes();
      bytes += w.shared.capacity() * (sizeof(BlockHash) + sizeof(uint32_t) + 1);
    }
    return bytes;
  }

 private:
  struct Worker {
    index_detail::WorkerSessions sessions;
    // Blocks held by two or more sessions of this worker -> holder count.
    // Most blocks have one holder and cost nothing here.
    absl::flat_hash_map<BlockHash, uint32_t> shared;
  };

  void Ref(WorkerId worker, BlockHash hash) {
    if (table_.Insert(hash, worker)) {
      ++entries_;
    } else {
      auto [it, inserted] = workers_[worker].shared.try_emplace(hash, 1);
      ++it->second;
    }
  }

  void Unref(WorkerId worker, BlockHash hash) {
    auto& shared = workers_[worker].shared;
    if (auto it = shared.find(hash); it != shared.end()) {
      if (--it->second == 1) shared.erase(it);
      return;
    }
    if (table_.Erase(hash, worker)) --entries_;
  }

  index_detail::BlockTable table_;
  std::vector<Worker> workers_;
  uint64_t capacity_blocks_;
  uint64_t entries_ = 0;
};

}  // namespace kvc_router
