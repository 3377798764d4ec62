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
//   kvc_router::FastIndex index(/*num_workers=*/8, /*capacity_tokens=*/92104,
//                               /*block_tokens=*/24);
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvc_router/index/detail/block_table.hpp"
#include "kvc_router/index/detail/session_chain.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {

class FastIndex {
 public:
  // `capacity_tokens` bounds each worker (0 = unbounded); `block_tokens`
  // converts blocks to tokens.
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
  void Learn(WorkerId worker, SessionId session, std::span<const BlockHash> hashes) {
    if (worker >= workers_.size()) return;
    Worker& w = workers_[worker];
    if (hashes.size() > capacity_blocks_) hashes = hashes.first(capacity_blocks_);
    Session& s = w.sessions[session];
    const size_t old_blocks = s.blocks.size();
    const size_t common = index_detail::CommonChainPrefix(s.blocks, hashes);
    for (size_t i = common; i < s.blocks.size(); ++i) Unref(worker, s.blocks[i]);
    s.blocks.resize(common);
    s.blocks.insert(s.blocks.end(), hashes.begin() + common, hashes.end());
    for (size_t i = common; i < hashes.size(); ++i) Ref(worker, hashes[i]);
    w.total_blocks = w.total_blocks - old_blocks + s.blocks.size();
    if (s.last_use != 0) w.lru.erase(s.last_use);
    s.last_use = ++clock_;
    w.lru.emplace(s.last_use, session);
    EvictOverCapacity(worker, session);
  }

  void ForgetSession(WorkerId worker, SessionId session) {
    if (worker >= workers_.size()) return;
    auto it = workers_[worker].sessions.find(session);
    if (it != workers_[worker].sessions.end()) DropSession(worker, it);
  }

  bool Contains(WorkerId worker, BlockHash hash) const {
    return worker < workers_.size() && table_.Contains(hash, worker);
  }
  bool HoldsSession(WorkerId worker, SessionId session) const {
    return worker < workers_.size() && workers_[worker].sessions.contains(session);
  }
  // Blocks the estimate holds for `worker`, counting a block once per session.
  uint64_t resident_blocks(WorkerId worker) const {
    return worker < workers_.size() ? workers_[worker].total_blocks : 0;
  }
  uint64_t capacity_blocks() const { return capacity_blocks_; }

  // Resident (block, worker) pairs.
  uint64_t entries() const { return entries_; }
  // Bytes of the table, the per-session block lists and the shared-block
  // counters (hash-map overhead estimated from their capacities).
  size_t memory_bytes() const {
    size_t bytes = table_.memory_bytes() + workers_.capacity() * sizeof(Worker);
    for (const Worker& w : workers_) {
      bytes += w.sessions.capacity() * (sizeof(SessionId) + sizeof(Session) + 1);
      bytes += w.shared.capacity() * (sizeof(BlockHash) + sizeof(uint32_t) + 1);
      bytes += w.lru.size() * (sizeof(uint64_t) + sizeof(SessionId) + 32);
      for (const auto& [id, s] : w.sessions) bytes += s.blocks.capacity() * sizeof(BlockHash);
    }
    return bytes;
  }

 private:
  struct Session {
    std::vector<BlockHash> blocks;
    uint64_t last_use = 0;
  };
  struct Worker {
    absl::flat_hash_map<SessionId, Session> sessions;
    // Blocks held by two or more sessions of this worker -> holder count.
    // Most blocks have one holder and cost nothing here.
    absl::flat_hash_map<BlockHash, uint32_t> shared;
    std::map<uint64_t, SessionId> lru;  // use tick -> session, oldest first
    uint64_t total_blocks = 0;
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

  void DropSession(WorkerId worker, absl::flat_hash_map<SessionId, Session>::iterator it) {
    Worker& w = workers_[worker];
    for (BlockHash hash : it->second.blocks) Unref(worker, hash);
    w.total_blocks -= it->second.blocks.size();
    w.lru.erase(it->second.last_use);
    w.sessions.erase(it);
  }

  void EvictOverCapacity(WorkerId worker, SessionId keep) {
    Worker& w = workers_[worker];
    while (w.total_blocks > capacity_blocks_ && w.lru.size() > 1) {
      auto oldest = w.lru.begin();
      if (oldest->second == keep) ++oldest;
      DropSession(worker, w.sessions.find(oldest->second));
    }
  }

  index_detail::BlockTable table_;
  std::vector<Worker> workers_;
  uint64_t capacity_blocks_;
  uint64_t clock_ = 0;
  uint64_t entries_ = 0;
};

}  // namespace kvc_router
