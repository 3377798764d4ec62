// Tests of the synthetic agentic workload generator (kvc_router/sim/synthetic.hpp):
// determinism and the shape of its defaults (the seeds' SWE-bench replay).
#include "kvc_router/sim/synthetic.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

TEST_CASE("synthetic: same seed, same trace; another seed, another trace", "[sim][synthetic]") {
  SyntheticConfig config;
  config.sessions = 8;
  config.requests = 300;
  auto a = GenerateSynthetic(config);
  auto b = GenerateSynthetic(config);
  REQUIRE((a.ok() && b.ok()));
  CHECK(a->hashes == b->hashes);
  REQUIRE(a->turns.size() == b->turns.size());
  for (size_t i = 0; i < a->turns.size(); ++i) {
    CHECK(a->turns[i].input_tokens == b->turns[i].input_tokens);
    CHECK(a->turns[i].delay_s == b->turns[i].delay_s);
  }
  config.seed = 2;
  auto c = GenerateSynthetic(config);
  REQUIRE(c.ok());
  CHECK(c->hashes != a->hashes);
}

TEST_CASE("synthetic: the defaults are shaped like the seeds' agentic replay", "[sim][synthetic]") {
  const SyntheticConfig config;
  auto trace = GenerateSynthetic(config);
  REQUIRE(trace.ok());
  REQUIRE(trace->Validate().ok());
  CHECK(trace->sessions.size() == 52);
  CHECK(trace->turns.size() == 4450);
  std::vector<uint64_t> contexts, appends, outputs, turns;
  std::vector<double> delays;
  for (const TraceSession& s : trace->sessions) turns.push_back(s.num_turns);
  for (const TraceTurn& t : trace->turns) {
    contexts.push_back(t.input_tokens);
    outputs.push_back(t.output_tokens);
    if (t.turn > 0 && t.reusable_tokens > 0) {
      appends.push_back(t.input_tokens - t.reusable_tokens);
      delays.push_back(t.delay_s);
    }
  }
  auto median = [](auto v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Contexts of 10^4 tokens and more, appends and outputs of 10^2-10^3,
  // tool delays of seconds.
  CHECK(median(contexts) >= 10000);
  CHECK(*std::max_element(contexts.begin(), contexts.end()) <= config.max_context_tokens);
  CHECK(median(appends) >= 100);
  CHECK(median(appends) <= 1000);
  CHECK(median(outputs) >= 100);
  CHECK(median(outputs) <= 1000);
  CHECK(median(delays) >= 1.0);
  CHECK(median(delays) <= 10.0);
  // Heavy skew: the top 10% of sessions carry far more than 10% of the turns.
  std::sort(turns.rbegin(), turns.rend());
  uint64_t top = 0;
  for (size_t i = 0; i < turns.size() / 10; ++i) top += turns[i];
  CHECK(static_cast<double>(top) / 4450.0 > 0.25);
  // Every session shares the system prompt's blocks.
  const uint64_t system_blocks = config.system_prompt_tokens / config.block_tokens;
  REQUIRE(system_blocks > 0);
  const auto first = trace->InputChain(trace->turns[trace->sessions[0].first_turn]);
  const auto last = trace->InputChain(trace->turns[trace->sessions.back().first_turn]);
  CHECK(first[system_blocks - 1] == last[system_blocks - 1]);
  CHECK(first[system_blocks] != last[system_blocks]);
}

TEST_CASE("synthetic: invalid parameters are refused", "[sim][synthetic]") {
  SyntheticConfig config;
  config.requests = 10;  // fewer than sessions * min_turns
  CHECK_FALSE(GenerateSynthetic(config).ok());
  config = SyntheticConfig{};
  config.block_tokens = 0;
  CHECK_FALSE(GenerateSynthetic(config).ok());
  config = SyntheticConfig{};
  config.turns_sigma = -1;
  CHECK_FALSE(GenerateSynthetic(config).ok());
  config = SyntheticConfig{};
  config.max_context_tokens = 1000;
  CHECK_FALSE(GenerateSynthetic(config).ok());
}

}  // namespace
}  // namespace kvc_router::sim
