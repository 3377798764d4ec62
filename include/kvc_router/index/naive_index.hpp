// kvc_router/index/naive_index.hpp
//
// The reference cache index: Algorithm 1's overlap taken literally, as the
// size of the set intersection |prefix_hashes ∩ resident[d]| for every worker
// d, with resident[d] the union of the blocks of the sessions placed on d.
// It has no capacity bound and is slow (ordered sets, a look-up per block
// and worker) on purpose: it is the yardstick that faster indexes are tested
// against, and the baseline the benchmarks compare with. Not for production.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "kvc_router/types.hpp"

namespace kvc_router {

class NaiveIndex {
 public:
  explicit NaiveIndex(uint32_t num_workers) : workers_(num_workers) {}

  size_t num_workers() const { return workers_.size(); }

  void Overlap(std::span<const BlockHash> prefix, std::span<uint32_t> out) const {
    for (size_t d = 0; d < workers_.size() && d < out.size(); ++d) {
      uint32_t count = 0;
      for (BlockHash hash : prefix) count += workers_[d].block_refs.contains(hash) ? 1 : 0;
      out[d] = count;
    }
  }

  // Session `session` on `worker` now holds exactly `hashes`.
  void Learn(WorkerId worker, SessionId session, std::span<const BlockHash> hashes) {
    if (worker >= workers_.size()) return;
    ForgetSession(worker, session);
    Worker& w = workers_[worker];
    std::set<BlockHash>& blocks = w.sessions[session];
    for (BlockHash hash : hashes) {
      if (blocks.insert(hash).second) ++w.block_refs[hash];
    }
  }

  void ForgetSession(WorkerId worker, SessionId session) {
    if (worker >= workers_.size()) return;
    Worker& w = workers_[worker];
    auto it = w.sessions.find(session);
    if (it == w.sessions.end()) return;
    for (BlockHash hash : it->second) {
      auto ref = w.block_refs.find(hash);
      if (--ref->second == 0) w.block_refs.erase(ref);
    }
    w.sessions.erase(it);
  }

  // Drops single blocks, wherever a session holds them (worker-side eviction
  // of blocks rather than sessions).
  void ForgetBlocks(WorkerId worker, std::span<const BlockHash> hashes) {
    if (worker >= workers_.size()) return;
    Worker& w = workers_[worker];
    for (BlockHash hash : hashes) {
      if (!w.block_refs.erase(hash)) continue;
      for (auto& [session, blocks] : w.sessions) blocks.erase(hash);
    }
  }

  // Elastic membership (ElasticCacheIndex): grow to `num_workers` workers;
  // forget everything `worker` holds.
  void ResizeWorkers(uint32_t num_workers) {
    if (num_workers > workers_.size()) workers_.resize(num_workers);
  }
  void ForgetWorker(WorkerId worker) {
    if (worker < workers_.size()) workers_[worker] = Worker();
  }
  bool Contains(WorkerId worker, BlockHash hash) const {
    return worker < workers_.size() && workers_[worker].block_refs.contains(hash);
  }
  size_t resident_blocks(WorkerId worker) const {
    return worker < workers_.size() ? workers_[worker].block_refs.size() : 0;
  }

 private:
  struct Worker {
    std::map<SessionId, std::set<BlockHash>> sessions;
    std::map<BlockHash, uint32_t> block_refs;  // sessions holding each block
  };
  std::vector<Worker> workers_;
};

}  // namespace kvc_router
