// Tests of the synthetic agentic workload generator (kvc_sim/synthetic.hpp):
// determinism, the shape of its defaults (the seeds' SWE-bench replay) and of
// the claude-code preset, and the preset lookup.
#include "kvc_sim/synthetic.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
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
  config = SyntheticConfig{};
  config.max_append_tokens = 0;
  CHECK_FALSE(GenerateSynthetic(config).ok());
  config = SyntheticConfig{};
  config.max_task_fraction = 0;
  CHECK_FALSE(GenerateSynthetic(config).ok());
  // The window must hold a compacted turn with the largest append and output.
  config = SyntheticConfig::ClaudeCode();
  config.max_append_tokens = 150000;
  CHECK_FALSE(GenerateSynthetic(config).ok());
}

template <typename T>
double Mean(const std::vector<T>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// The q-quantile (nearest rank) of `v`.
template <typename T>
double Quantile(std::vector<T> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return static_cast<double>(v[std::clamp<size_t>(rank, 1, v.size()) - 1]);
}

TEST_CASE("synthetic: presets by name; the default config is swe-bench", "[sim][synthetic]") {
  CHECK(SyntheticConfig{} == SyntheticConfig::SweBench());
  CHECK_FALSE(SyntheticConfig::ClaudeCode() == SyntheticConfig::SweBench());
  auto swe = SyntheticPreset("swe-bench");
  REQUIRE(swe.ok());
  CHECK(*swe == SyntheticConfig::SweBench());
  auto cc = SyntheticPreset("claude-code");
  REQUIRE(cc.ok());
  CHECK(*cc == SyntheticConfig::ClaudeCode());
  CHECK(cc->name == "claude-code");
  CHECK(cc->Validate().ok());

  for (const char* bad : {"", "claude", "SWE-bench", "swe-bench "}) {
    INFO("name \"" << bad << "\"");
    auto unknown = SyntheticPreset(bad);
    REQUIRE_FALSE(unknown.ok());
    CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
    const std::string message(unknown.status().message());
    CHECK(message.find("swe-bench") != std::string::npos);
    CHECK(message.find("claude-code") != std::string::npos);
  }

  SyntheticConfig small = SyntheticConfig::ClaudeCode();
  small.sessions = 4;
  small.requests = 40;
  auto trace = GenerateSynthetic(small);
  REQUIRE(trace.ok());
  CHECK(trace->description == "synthetic claude-code workload (seed 1)");
  small = SyntheticConfig::SweBench();
  small.sessions = 4;
  small.requests = 40;
  small.seed = 5;
  trace = GenerateSynthetic(small);
  REQUIRE(trace.ok());
  CHECK(trace->description == "synthetic swe-bench workload (seed 5)");
}

TEST_CASE("synthetic: claude-code, same seed, same trace", "[sim][synthetic]") {
  SyntheticConfig config = SyntheticConfig::ClaudeCode();
  config.sessions = 100;
  config.requests = 1200;
  for (uint64_t seed : {uint64_t{1}, uint64_t{2}, uint64_t{20261129}}) {
    INFO("seed " << seed);
    config.seed = seed;
    auto a = GenerateSynthetic(config);
    auto b = GenerateSynthetic(config);
    REQUIRE((a.ok() && b.ok()));
    CHECK(a->description == b->description);
    CHECK(a->hashes == b->hashes);
    REQUIRE(a->turns.size() == b->turns.size());
    for (size_t i = 0; i < a->turns.size(); ++i) {
      const TraceTurn& x = a->turns[i];
      const TraceTurn& y = b->turns[i];
      CHECK((x.session == y.session && x.turn == y.turn && x.segment == y.segment &&
             x.arrival_s == y.arrival_s && x.delay_s == y.delay_s &&
             x.input_tokens == y.input_tokens && x.output_tokens == y.output_tokens &&
             x.reusable_tokens == y.reusable_tokens && x.hash_begin == y.hash_begin &&
             x.prefix_blocks == y.prefix_blocks && x.input_blocks == y.input_blocks &&
             x.output_blocks == y.output_blocks));
    }
  }
}

TEST_CASE("synthetic: the claude-code preset is shaped like its profile", "[sim][synthetic]") {
  const uint64_t seed = 1;
  INFO("seed " << seed);
  SyntheticConfig config = SyntheticConfig::ClaudeCode();
  config.seed = seed;
  auto trace = GenerateSynthetic(config);
  REQUIRE(trace.ok());
  REQUIRE(trace->Validate().ok());
  REQUIRE(trace->sessions.size() == 1000);
  REQUIRE(trace->turns.size() == 12000);
  CHECK(trace->block_tokens == 512);

  std::vector<uint64_t> first_inputs, new_tokens, outputs;
  std::vector<double> delays;
  uint64_t max_input = 0, max_context = 0, shrinking = 0;
  for (const TraceTurn& t : trace->turns) {
    outputs.push_back(t.output_tokens);
    max_input = std::max(max_input, t.input_tokens);
    max_context = std::max(max_context, t.input_tokens + t.output_tokens);
    if (t.turn == 0) {
      first_inputs.push_back(t.input_tokens);
      continue;
    }
    delays.push_back(t.delay_s);
    const TraceSession& session = trace->sessions[t.session];
    const TraceTurn& prev = trace->turns[session.first_turn + t.turn - 1];
    if (prev.segment != t.segment) continue;  // compacted: a fresh context
    if (t.input_tokens < prev.input_tokens + prev.output_tokens) {
      ++shrinking;
      continue;
    }
    new_tokens.push_back(t.input_tokens - prev.input_tokens - prev.output_tokens);
  }
  CHECK(shrinking == 0);  // a continued context only grows
  INFO("first-turn input mean " << Mean(first_inputs) << " median "
                                << Quantile(first_inputs, 0.5));
  INFO("new tokens mean " << Mean(new_tokens) << " median " << Quantile(new_tokens, 0.5)
                          << " (" << new_tokens.size() << " turns)");
  INFO("output mean " << Mean(outputs) << " median " << Quantile(outputs, 0.5) << " p99 "
                      << Quantile(outputs, 0.99));
  INFO("delay median " << Quantile(delays, 0.5) << " p95 " << Quantile(delays, 0.95));
  INFO("max input " << max_input << " max context " << max_context);

  CHECK(Mean(first_inputs) == Approx(57000).epsilon(0.08));
  CHECK(Quantile(first_inputs, 0.5) == Approx(47000).epsilon(0.08));
  CHECK(Mean(new_tokens) == Approx(6000).epsilon(0.10));
  CHECK(Quantile(new_tokens, 0.5) == Approx(4000).epsilon(0.10));
  CHECK(Mean(outputs) == Approx(1000).epsilon(0.08));
  CHECK(Quantile(outputs, 0.5) == Approx(800).epsilon(0.08));
  CHECK(Quantile(outputs, 0.99) == Approx(3750).epsilon(0.15));
  CHECK(Quantile(delays, 0.5) == Approx(2.0).epsilon(0.15));
  CHECK(Quantile(delays, 0.95) == Approx(30.0).epsilon(0.20));
  const double mean_turns =
      static_cast<double>(trace->turns.size()) / static_cast<double>(trace->sessions.size());
  CHECK(mean_turns >= 10.0);
  CHECK(mean_turns <= 14.0);
  // The 200k window: no prompt passes it (nor does prompt + output), and
  // long sessions do compact.
  CHECK(max_input <= 200000);
  CHECK(max_context <= config.max_context_tokens);
  uint32_t segments = 0;
  for (const TraceTurn& t : trace->turns) segments = std::max(segments, t.segment + 1);
  CHECK(segments > trace->sessions.size());

  // Every session's first turn starts with the shared system prompt's blocks.
  const uint64_t system_blocks = config.system_prompt_tokens / config.block_tokens;
  REQUIRE(system_blocks > 0);
  const auto reference = trace->InputChain(trace->turns[trace->sessions[0].first_turn]);
  REQUIRE(reference.size() > system_blocks);
  for (const TraceSession& session : trace->sessions) {
    INFO("session " << session.name);
    const auto chain = trace->InputChain(trace->turns[session.first_turn]);
    REQUIRE(chain.size() > system_blocks);
    CHECK(std::equal(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(system_blocks),
                     reference.begin()));
    if (&session != &trace->sessions[0]) CHECK(chain[system_blocks] != reference[system_blocks]);
  }
}

}  // namespace
}  // namespace kvc_router::sim
