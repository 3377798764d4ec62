// Checks the hit-rate bound (hit_bound.hpp): exact values on a hand-built
// cyclic workload where LRU thrashes and the optimum does not, refusal of
// bad orders, and, on seeded random workloads, that no policy's replay ever
// beats the bound its own run reports.
#include "kvc_sim/hit_bound.hpp"

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

// Sessions of two turns with one-token blocks: turn 0 reads blocks {1, 2}
// of its session, turn 1 reads them plus block 3. Hash = 10 * (session + 1)
// + block, so no two sessions share a block.
Trace TwoTurnSessions(uint32_t sessions) {
  Trace trace;
  trace.block_tokens = 1;
  for (uint32_t s = 0; s < sessions; ++s) {
    trace.sessions.push_back(TraceSession{"s" + std::to_string(s), 2 * s, 2});
    const BlockHash base = 10 * (BlockHash{s} + 1);
    for (uint32_t k = 0; k < 2; ++k) {
      TraceTurn t;
      t.session = s;
      t.turn = k;
      t.line = 2 * s + k + 1;
      t.hash_begin = trace.hashes.size();
      t.input_blocks = k == 0 ? 2 : 3;
      t.input_tokens = t.input_blocks;
      t.prefix_blocks = k == 0 ? 0 : 2;
      t.reusable_tokens = t.prefix_blocks;
      for (uint32_t b = 1; b <= t.input_blocks; ++b) trace.hashes.push_back(base + b);
      trace.turns.push_back(t);
    }
  }
  REQUIRE(trace.Validate().ok());
  return trace;
}

// A small claude-code-shaped workload.
Trace SmallClaudeCode(uint32_t sessions, uint64_t seed) {
  SyntheticConfig c = SyntheticConfig::ClaudeCode();
  c.sessions = sessions;
  c.requests = 10 * sessions;
  c.seed = seed;
  absl::StatusOr<Trace> trace = GenerateSynthetic(c);
  REQUIRE(trace.ok());
  return std::move(*trace);
}

// The optimum's and one LRU pool's cached tokens for `order` in `capacity`.
std::pair<uint64_t, uint64_t> Served(const Trace& trace, const std::vector<uint32_t>& order,
                                     uint64_t capacity) {
  const absl::StatusOr<HitBound> bound = OfflineHitBound(trace, order, capacity);
  REQUIRE(bound.ok());
  return {bound->hit_tokens, bound->lru_hit_tokens};
}

using Pair = std::pair<uint64_t, uint64_t>;

TEST_CASE("hit bound: a cycle one block too large for the cache", "[sim][hit-bound]") {
  // A0 B0 C0 A1 B1 C1: six blocks are read again, four fit.
  const Trace trace = TwoTurnSessions(3);
  const std::vector<uint32_t> order = {0, 2, 4, 1, 3, 5};
  const absl::StatusOr<HitBound> bound = OfflineHitBound(trace, order, 4);
  REQUIRE(bound.ok());
  CHECK(bound->input_tokens == 15);
  // The optimum keeps A's and B's blocks and leaves C's out, so A1 and B1
  // hit both of theirs; LRU evicts exactly what is read next, every time.
  CHECK(Served(trace, order, 4) == Pair{4, 0});
  // With room for all six the optimum hits every second turn's two blocks.
  // LRU makes room for A1's new block by evicting B's deepest, and B1's
  // new blocks evict C's: it gets 2 + 1 + 0.
  CHECK(Served(trace, order, 6) == Pair{6, 3});
  // Room for the new blocks too: both get everything; with none, nothing.
  CHECK(Served(trace, order, 9) == Pair{6, 6});
  CHECK(Served(trace, order, 0) == Pair{0, 0});

  // Requests left out of the order neither read nor fill the cache.
  const std::vector<uint32_t> without_c = {0, 2, 1, 3};
  CHECK(OfflineHitBound(trace, without_c, 4)->input_tokens == 10);
  CHECK(Served(trace, without_c, 4) == Pair{4, 3});
}

TEST_CASE("hit bound: a closed session's pages go first in the LRU reference",
          "[sim][hit-bound]") {
  // B0 A0 A1 C0 B1 C1 in five pages: A ends after A1, younger than B.
  const Trace trace = TwoTurnSessions(3);
  const std::vector<uint32_t> order = {2, 0, 1, 4, 3, 5};
  auto served = [&](bool close) {
    const absl::StatusOr<HitBound> bound = OfflineHitBound(trace, order, 5, close);
    REQUIRE(bound.ok());
    return Pair{bound->hit_tokens, bound->lru_hit_tokens};
  };
  // Without the close C0 evicts B's pages, the oldest, and B1 misses.
  CHECK(served(false) == Pair{6, 4});
  // With it C0 takes A's, which no one reads again.
  CHECK(served(true) == Pair{6, 6});
}

TEST_CASE("hit bound: an order naming a turn twice or outside the trace is refused",
          "[sim][hit-bound]") {
  const Trace trace = TwoTurnSessions(2);
  const std::vector<uint32_t> twice = {0, 1, 0};
  auto bound = OfflineHitBound(trace, twice, 4);
  REQUIRE_FALSE(bound.ok());
  CHECK(bound.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bound.status().message()), Catch::Contains("turn 0 is listed twice"));
  const std::vector<uint32_t> outside = {0, 7};
  bound = OfflineHitBound(trace, outside, 4);
  REQUIRE_FALSE(bound.ok());
  CHECK_THAT(std::string(bound.status().message()), Catch::Contains("turn 7 is not in the trace"));
}

TEST_CASE("hit bound: no policy beats the bound of its own run (property)",
          "[sim][hit-bound][property]") {
  const std::vector<std::string> policies = {"dp",  "ear",         "unified",  "load-only",
                                             "kvc", "kvc-adaptive", "pd-sglang", "ear-pd"};
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Trace trace = SmallClaudeCode(24, seed);
    SimConfig config;
    config.concurrency = 12;
    config.hit_bound = true;
    // Two GPUs of 250k-325k tokens for twelve live contexts of ~100k: the
    // memory binds, so a bound that counted memory wrongly would show.
    config.cluster.prefill_workers = 1;
    config.cluster.decode_workers = 1;
    config.admission.capacity_tokens = 250000 + 25000 * (seed % 4);
    std::vector<uint32_t> trace_order(trace.turns.size());
    for (uint32_t i = 0; i < trace_order.size(); ++i) trace_order[i] = i;
    // With unlimited memory the order hardly matters: every block read
    // again hits.
    const absl::StatusOr<HitBound> unlimited =
        OfflineHitBound(trace, trace_order, uint64_t{1} << 40);
    REQUIRE(unlimited.ok());
    PolicySetup setup;
    setup.cluster = config.cluster;
    setup.admission = config.admission;
    setup.router.block_tokens = trace.block_tokens;
    for (const std::string& name : policies) {
      INFO("seed " << seed << ", policy " << name << ", K_d " << config.admission.capacity_tokens);
      absl::StatusOr<MadePolicy> made = MakePolicy(name, setup);
      REQUIRE(made.ok());
      auto result = Simulator::Run(trace, *made->policy, config, made->engine);
      REQUIRE(result.ok());
      CHECK(result->cached_tokens <= result->hit_bound_tokens);
      CHECK(result->one_pool_lru_tokens <= result->hit_bound_tokens);
      // Unless load control held sessions back until their contexts fit
      // (ear), in which order even the optimum may lose nothing.
      if (result->held_turns == 0) {
        CHECK(result->hit_bound_tokens < unlimited->hit_tokens);
      } else {
        CHECK(result->hit_bound_tokens <= unlimited->hit_tokens);
      }
    }
  }
}

TEST_CASE("hit bound: more memory never lowers it, and unlimited memory reaches the ideal",
          "[sim][hit-bound][property]") {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    INFO("seed " << seed);
    const Trace trace = SmallClaudeCode(16, seed);
    // Trace order: every session's turns in order, sessions one after another.
    std::vector<uint32_t> order(trace.turns.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    uint64_t previous = 0;
    for (uint64_t capacity : {0ull, 50000ull, 200000ull, 800000ull, 3200000ull}) {
      auto bound = OfflineHitBound(trace, order, capacity);
      REQUIRE(bound.ok());
      CHECK(bound->hit_tokens >= previous);
      CHECK(bound->lru_hit_tokens <= bound->hit_tokens);
      previous = bound->hit_tokens;
    }
    // Unlimited: each later turn finds its whole previous context (up to the
    // partial block ending it) and later sessions the shared system prompt.
    auto unlimited = OfflineHitBound(trace, order, uint64_t{1} << 40);
    REQUIRE(unlimited.ok());
    CHECK(unlimited->hit_rate() >= trace.IdealSessionHitRate() - 1e-12);
    CHECK(unlimited->lru_hit_tokens == unlimited->hit_tokens);
  }
}

}  // namespace
}  // namespace kvc_router::sim
