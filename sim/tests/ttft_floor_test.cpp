// Checks the TTFT floor (ttft_floor.hpp): exact values on a hand-built
// trace (a block counts as cached only if another session or an earlier
// turn of the same session has it, independent of where sessions sit in
// the trace), and, on seeded workloads, that no request of any policy's
// replay ever gets its first token sooner than its floor.
#include "kvc_sim/ttft_floor.hpp"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvc_sim/policies/registry.hpp"
#include "kvc_sim/simulator.hpp"
#include "kvc_sim/synthetic.hpp"

namespace kvc_router::sim {
namespace {

// Prefill time = new tokens (seconds), so floors read as uncached tokens.
CostModel TokenCost() {
  CostModel cost;
  cost.prefill_overhead_s = 0;
  cost.prefill_per_token_s = 1;
  cost.prefill_attention_s = 0;
  return cost;
}

struct TurnSpec {
  std::vector<BlockHash> input;   // one-token blocks
  uint64_t extra_tokens = 0;      // a partial block after them
  uint32_t prefix_blocks = 0;     // the session's previous context, in blocks
  std::vector<BlockHash> output;  // blocks the answer completes
};

Trace Build(const std::vector<std::vector<TurnSpec>>& sessions) {
  Trace trace;
  trace.block_tokens = 1;
  for (size_t s = 0; s < sessions.size(); ++s) {
    trace.sessions.push_back(TraceSession{"s" + std::to_string(s),
                                          static_cast<uint32_t>(trace.turns.size()),
                                          static_cast<uint32_t>(sessions[s].size())});
    for (size_t k = 0; k < sessions[s].size(); ++k) {
      const TurnSpec& spec = sessions[s][k];
      TraceTurn t;
      t.session = static_cast<uint32_t>(s);
      t.turn = static_cast<uint32_t>(k);
      t.line = static_cast<uint32_t>(trace.turns.size() + 1);
      t.hash_begin = trace.hashes.size();
      t.input_blocks = static_cast<uint32_t>(spec.input.size());
      t.output_blocks = static_cast<uint32_t>(spec.output.size());
      t.input_tokens = spec.input.size() + spec.extra_tokens;
      t.output_tokens = spec.output.size();
      t.prefix_blocks = spec.prefix_blocks;
      t.reusable_tokens = spec.prefix_blocks;
      trace.hashes.insert(trace.hashes.end(), spec.input.begin(), spec.input.end());
      trace.hashes.insert(trace.hashes.end(), spec.output.begin(), spec.output.end());
      trace.turns.push_back(t);
    }
  }
  REQUIRE(trace.Validate().ok());
  return trace;
}

TEST_CASE("ttft floor: cached blocks come from other sessions or earlier own turns",
          "[sim][ttft-floor]") {
  // Block 100 is a system prompt sessions 0 and 1 share; session 2 shares
  // nothing. Session 0's second turn reads its first turn's input and
  // answer (101, 102) and appends 103; its first turn's own block 101 is
  // not cached for it, though the second turn reads it later.
  const std::vector<std::vector<TurnSpec>> sessions = {
      {{{100, 101}, 0, 0, {102}}, {{100, 101, 102, 103}, 2, 3, {}}},
      {{{100, 201}, 0, 0, {}}},
      {{{300, 301}, 1, 0, {}}},
  };
  const Trace trace = Build(sessions);
  const std::vector<double> floor = TtftFloor(trace, TokenCost());
  REQUIRE(floor.size() == 4);
  CHECK(floor[0] == 1);  // 100 shared, 101 new
  CHECK(floor[1] == 3);  // 100..102 held; 103 and the 2-token tail new
  CHECK(floor[2] == 1);  // 100 shared, 201 new
  CHECK(floor[3] == 3);  // nothing shared: 2 blocks + 1 tail token

  // Where a session sits in the trace changes nothing.
  const Trace reordered = Build({sessions[2], sessions[1], sessions[0]});
  const std::vector<double> again = TtftFloor(reordered, TokenCost());
  CHECK(again == std::vector<double>{3, 1, 1, 3});

  // The previous context counts even without blocks (a session's tail).
  std::vector<std::vector<TurnSpec>> tail = {{{{}, 5, 0, {}}, {{}, 9, 0, {}}}};
  Trace tail_trace = Build(tail);
  tail_trace.turns[1].reusable_tokens = 5;
  REQUIRE(tail_trace.Validate().ok());
  CHECK(TtftFloor(tail_trace, TokenCost()) == std::vector<double>{5, 4});

  const Summary s = TtftFloorSummary(trace, TokenCost());
  CHECK(s.p50 == Approx(2.0));
  CHECK(s.max == 3);
}

TEST_CASE("ttft floor: no request of any policy's replay beats its floor (property)",
          "[sim][ttft-floor][property]") {
  const std::vector<std::string> policies = {"dp",  "ear",          "unified",   "load-only",
                                             "kvc", "kvc-adaptive", "pd-sglang", "ear-pd"};
  // Seeds 1-4 closed loop (even: sessions started together); 5 open loop;
  // 6 a host tier with sessions closed by their clients.
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SyntheticConfig c = SyntheticConfig::ClaudeCode();
    c.sessions = 16;
    c.requests = 120;
    c.seed = seed;
    if (seed % 2 == 0) c.session_interarrival_s = 0;  // started together
    absl::StatusOr<Trace> trace = GenerateSynthetic(c);
    REQUIRE(trace.ok());
    SimConfig config;
    config.concurrency = 8;
    config.cluster.prefill_workers = 2;
    config.cluster.decode_workers = 2;
    // Tight pools: evictions, migrations and re-prefills all happen.
    config.admission.capacity_tokens = 200000 + 50000 * (seed % 4);
    if (seed == 5) {
      config.loop = LoopMode::kOpen;
      config.concurrency = 0;
    }
    if (seed == 6) {
      config.host_tier.capacity_tokens = 400000;
      config.close_sessions = true;
    }
    const std::vector<double> floor = TtftFloor(*trace, config.cost);
    PolicySetup setup;
    setup.cluster = config.cluster;
    setup.admission = config.admission;
    setup.router.block_tokens = trace->block_tokens;
    for (const std::string& name : policies) {
      INFO("seed " << seed << ", policy " << name);
      setup.host_tier_tokens = config.host_tier.capacity_tokens;
      absl::StatusOr<MadePolicy> made = MakePolicy(name, setup);
      REQUIRE(made.ok());
      std::vector<RequestRecord> records;
      SimConfig run = config;
      run.on_request = [&records](const RequestRecord& r) { records.push_back(r); };
      REQUIRE(Simulator::Run(*trace, *made->policy, run, made->engine).ok());
      REQUIRE(records.size() == trace->turns.size());
      uint32_t served = 0, below = 0;
      for (const RequestRecord& r : records) {
        if (r.refused) continue;
        ++served;
        // The GPU timeline may finish a prefill up to 1e-6 of an iteration
        // early (its rounding slack): a relative tolerance.
        if (r.first_token_s - r.issue_s < floor[r.turn] * (1 - 1e-6) - 1e-9) {
          ++below;
          UNSCOPED_INFO("turn " << r.turn << ": TTFT " << r.first_token_s - r.issue_s
                                << " s below its floor " << floor[r.turn] << " s");
        }
      }
      CHECK(served > 0);
      CHECK(below == 0);
    }
  }
}

}  // namespace
}  // namespace kvc_router::sim
