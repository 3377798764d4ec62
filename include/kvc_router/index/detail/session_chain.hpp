// kvc_router/index/detail/session_chain.hpp
//
// The session bookkeeping shared by the placement-learned indexes
// (EstimateIndex, FastIndex): for one decode worker, the chain each session
// was placed with, their least-recently-placed order, and eviction of whole
// sessions once the worker's blocks pass its capacity. The indexes keep the
// block residency themselves and hear about it through `ref`/`unref`
// callbacks: `ref(hash)` when a session starts holding a block, `unref(hash)`
// when it stops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvc_router/types.hpp"

namespace kvc_router::index_detail {

// Length of the common leading run of the chain a session held (`old_chain`)
// and the one it holds now. With chained hashes equal last blocks mean equal
// prefixes, so the usual case, a chain that only grew, costs one comparison.
inline size_t CommonChainPrefix(std::span<const BlockHash> old_chain,
                                std::span<const BlockHash> new_chain) {
  if (!old_chain.empty() && old_chain.size() <= new_chain.size() &&
      new_chain[old_chain.size() - 1] == old_chain.back()) {
    return old_chain.size();
  }
  size_t common = 0;
  while (common < old_chain.size() && common < new_chain.size() &&
         old_chain[common] == new_chain[common]) {
    ++common;
  }
  return common;
}

class WorkerSessions {
 public:
  // Session `session` now holds `chain` (truncated to `capacity_blocks`);
  // then, while the worker holds more than `capacity_blocks`, the least
  // recently placed other sessions are dropped.
  template <class Ref, class Unref>
  void Learn(SessionId session, std::span<const BlockHash> chain, uint64_t capacity_blocks,
             Ref&& ref, Unref&& unref) {
    if (chain.size() > capacity_blocks) chain = chain.first(capacity_blocks);
    Session& s = sessions_[session];
    const size_t common = CommonChainPrefix(s.blocks, chain);
    for (size_t i = common; i < s.blocks.size(); ++i) unref(s.blocks[i]);
    total_blocks_ = total_blocks_ - s.blocks.size() + chain.size();
    s.blocks.resize(common);
    s.blocks.insert(s.blocks.end(), chain.begin() + common, chain.end());
    for (size_t i = common; i < chain.size(); ++i) ref(chain[i]);
    if (s.last_use != 0) lru_.erase(s.last_use);
    s.last_use = ++clock_;
    lru_.emplace(s.last_use, session);
    while (total_blocks_ > capacity_blocks && lru_.size() > 1) {
      auto oldest = lru_.begin();
      if (oldest->second == session) ++oldest;
      Drop(sessions_.find(oldest->second), unref);
    }
  }

  template <class Unref>
  void Forget(SessionId session, Unref&& unref) {
    auto it = sessions_.find(session);
    if (it != sessions_.end()) Drop(it, unref);
  }

  bool Holds(SessionId session) const { return sessions_.contains(session); }
  // Blocks held, counting a block once per session holding it.
  uint64_t total_blocks() const { return total_blocks_; }
  // Approximate bytes of the bookkeeping (hash-map overhead from capacities).
  size_t memory_bytes() const {
    size_t bytes = sessions_.capacity() * (sizeof(SessionId) + sizeof(Session) + 1) +
                   lru_.size() * (sizeof(uint64_t) + sizeof(SessionId) + 32);
    for (const auto& [id, s] : sessions_) bytes += s.blocks.capacity() * sizeof(BlockHash);
    return bytes;
  }

 private:
  struct Session {
    std::vector<BlockHash> blocks;
    uint64_t last_use = 0;  // key in lru_
  };

  template <class Unref>
  void Drop(absl::flat_hash_map<SessionId, Session>::iterator it, Unref& unref) {
    for (BlockHash hash : it->second.blocks) unref(hash);
    total_blocks_ -= it->second.blocks.size();
    lru_.erase(it->second.last_use);
    sessions_.erase(it);
  }

  absl::flat_hash_map<SessionId, Session> sessions_;
  std::map<uint64_t, SessionId> lru_;  // use tick -> session, oldest first
  uint64_t total_blocks_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace kvc_router::index_detail
