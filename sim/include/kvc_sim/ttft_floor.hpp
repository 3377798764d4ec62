// kvc_sim/ttft_floor.hpp
//
// The time to first token no router can beat on a workload: each request
// prefilled alone on an idle colocated instance that already holds its
// session's previous context and every full block of its input that any
// other session, or an earlier turn of its own session, ever read or wrote
// (one cache of unbounded size, in whatever order the replay issues them).
// What is left is the request's own prefill, cost.PrefillSeconds(new,
// cached), with no queueing, no decode batch beside it, no transfer and no
// host-tier reload. A replay's TTFT percentiles say what a policy got; the
// floor says how much any placement could still remove. When the best
// baseline's p90 is within 25% of the floor's, a policy that cuts it by
// 20% does not exist on that workload (docs/policies.md reads the Mooncake
// trace and sessions started together this way).
//
// It bounds every request of every replay from below (sim/tests checks
// this on seeded workloads): a cached block came from some request other
// than this one, a real instance holds at most what the unbounded cache
// holds, and a prefill only takes longer with fewer cached tokens or with
// anything else on the GPU (gpu_timeline.hpp). It is generous rather than
// tight: the cache counts prefixes other instances computed, even ones
// whose requests come later.
//
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "kvc_sim/cost_model.hpp"
#include "kvc_sim/metrics.hpp"
#include "kvc_sim/trace.hpp"

namespace kvc_router::sim {

// Each turn's TTFT floor, indexed like trace.turns.
inline std::vector<double> TtftFloor(const Trace& trace, const CostModel& cost) {
  // For each block: the first session that has it, and whether another does.
  struct Owners {
    uint32_t session;
    bool shared;
  };
  absl::flat_hash_map<BlockHash, Owners> owners;
  for (const TraceTurn& t : trace.turns) {
    const BlockHash* blocks = trace.hashes.data() + t.hash_begin;
    for (uint64_t b = 0; b < uint64_t{t.input_blocks} + t.output_blocks; ++b) {
      auto [it, fresh] = owners.try_emplace(blocks[b], Owners{t.session, false});
      if (!fresh && it->second.session != t.session) it->second.shared = true;
    }
  }
  std::vector<double> floor(trace.turns.size(), 0.0);
  absl::flat_hash_set<BlockHash> own_earlier;  // blocks of the session's earlier turns
  for (const TraceSession& session : trace.sessions) {
    own_earlier.clear();
    for (uint32_t i = session.first_turn; i < session.first_turn + session.num_turns; ++i) {
      const TraceTurn& t = trace.turns[i];
      const BlockHash* blocks = trace.hashes.data() + t.hash_begin;
      uint64_t held_blocks = 0;
      while (held_blocks < t.input_blocks && (owners.at(blocks[held_blocks]).shared ||
                                              own_earlier.contains(blocks[held_blocks]))) {
        ++held_blocks;
      }
      const uint64_t cached = std::min<uint64_t>(
          t.input_tokens, std::max<uint64_t>(t.reusable_tokens, held_blocks * trace.block_tokens));
      floor[i] = cost.PrefillSeconds(t.input_tokens - cached, cached);
      own_earlier.insert(blocks, blocks + t.input_blocks + t.output_blocks);
    }
  }
  return floor;
}

inline Summary TtftFloorSummary(const Trace& trace, const CostModel& cost) {
  std::vector<double> floor = TtftFloor(trace, cost);
  return Summary::Of(floor);
}

}  // namespace kvc_router::sim
