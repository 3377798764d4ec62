// Checks that the simulator tells the truth (issue 4, item 6): conservation,
// the rho*K_d bound, hit rates at the extremes (no cache, infinite cache),
// a lone request's TTFT against the cost model's formula, determinism, the
// seed's claims on the synthetic default, and v1's thrashing under an
// overload burst.
#include "kvc_router/sim/simulator.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvc_router/policy/registry.hpp"
#include "kvc_router/sim/report.hpp"
#include "kvc_router/sim/synthetic.hpp"
#include "kvc_router/sim/trace.hpp"
#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

const std::vector<std::string> kAllPolicies = {"kvc", "kvc-v1", "pd", "dp", "kvc-colo"};

policy::PolicyEnvironment EnvFor(const SimConfig& config, const Trace& trace) {
  policy::PolicyEnvironment env;
  env.prefill_workers = config.prefill_workers;
  env.decode_workers = config.decode_workers;
  env.colocated_instances = config.colocated_instances;
  env.block_tokens = trace.block_tokens;
  env.kv_capacity_tokens = config.admission.capacity_tokens;
  return env;
}

PolicyResult Replay(const Trace& trace, const std::string& name, const SimConfig& config,
                    policy::PolicyEnvironment env) {
  auto policy = policy::MakePolicy(name, env);
  REQUIRE(policy.ok());
  auto result = Simulator::Run(trace, **policy, config);
  INFO(name << ": " << (result.ok() ? "ok" : test::Message(result.status())));
  REQUIRE(result.ok());
  return std::move(*result);
}

PolicyResult Replay(const Trace& trace, const std::string& name, const SimConfig& config) {
  return Replay(trace, name, config, EnvFor(config, trace));
}

Trace SmallSynthetic(uint64_t seed = 3) {
  SyntheticConfig c;
  c.sessions = 12;
  c.requests = 600;
  c.session_interarrival_s = 20;
  c.seed = seed;
  auto trace = GenerateSynthetic(c);
  REQUIRE(trace.ok());
  return std::move(*trace);
}

Trace ParseMultiturnText(const std::string& text) {
  std::istringstream in(text);
  auto trace = ParseMultiturnTrace(in, TraceOptions{});
  REQUIRE(trace.ok());
  return std::move(*trace);
}

TEST_CASE("simulator: every request finishes once and tokens are conserved", "[sim][truth]") {
  const Trace trace = SmallSynthetic();
  SimConfig config;
  config.admission.capacity_tokens = 60000;  // pressure: rejections, evictions, waits
  for (const std::string& name : kAllPolicies) {
    INFO(name);
    const PolicyResult r = Replay(trace, name, config);  // Run checks exactly-once itself
    CHECK(r.requests == trace.turns.size());
    uint64_t modes = 0;
    for (uint64_t n : r.mode_counts) modes += n;
    CHECK(modes == r.requests);
    CHECK(r.input_tokens == trace.total_input_tokens());
    CHECK(r.input_tokens == r.cached_tokens + r.prefill_tokens_remote + r.prefill_tokens_local);
    CHECK(r.ttft_sorted_s.size() == r.requests);
    CHECK(r.ttft_s.p50 > 0);
    CHECK(r.e2e_s.p50 >= r.ttft_s.p50);
    if (r.topology == policy::Topology::kColocated) {
      CHECK(r.prefill_tokens_remote == 0);
      CHECK(r.kv_transfer_tokens == 0);
    } else {
      CHECK(r.kv_transfer_tokens == r.prefill_tokens_remote);
    }
  }
}

TEST_CASE("simulator: no instance ever holds more than rho*K_d", "[sim][truth]") {
  const Trace trace = SmallSynthetic(5);
  for (uint64_t capacity : {30000u, 60000u, 92104u}) {
    SimConfig config;
    config.admission.capacity_tokens = capacity;
    config.admission.high_water = 0.9;
    for (const std::string& name : kAllPolicies) {
      INFO(name << " K_d " << capacity);
      const PolicyResult r = Replay(trace, name, config);
      CHECK(r.budget_tokens == config.admission.budget_tokens());
      CHECK(r.peak_used_tokens <= r.budget_tokens);
      CHECK(r.peak_used_tokens > 0);
    }
  }
}

TEST_CASE("simulator: without a prefix cache nothing is reused", "[sim][truth]") {
  const Trace trace = SmallSynthetic();
  SimConfig config;
  config.prefix_cache = false;
  for (const std::string& name : kAllPolicies) {
    INFO(name);
    const PolicyResult r = Replay(trace, name, config);
    CHECK(r.cached_tokens == 0);
    CHECK(r.hit_rate() == 0.0);
  }
}

TEST_CASE("simulator: with infinite capacity the hit rate is the trace's ideal", "[sim][truth]") {
  SyntheticConfig c;
  c.sessions = 10;
  c.requests = 500;
  c.max_context_tokens = 1000000;  // no compaction
  auto trace = GenerateSynthetic(c);
  REQUIRE(trace.ok());
  SimConfig config;
  config.admission.capacity_tokens = uint64_t{1} << 40;
  config.admission.max_direct_append_tokens = uint64_t{1} << 40;

  // Independently: a session-aware cache that never evicts reuses every later
  // turn's previous context; turn 0 is prefilled in full.
  // From token counts alone: a later turn's previous context is the previous
  // turn's input plus its output.
  uint64_t reusable = 0, input = 0, previous_context = 0;
  for (const TraceTurn& t : trace->turns) {
    input += t.input_tokens;
    if (t.turn > 0) reusable += previous_context;
    previous_context = t.input_tokens + t.output_tokens;
  }
  const double session_ideal = static_cast<double>(reusable) / static_cast<double>(input);
  CHECK(session_ideal == Approx(trace->IdealSessionHitRate()));
  const PolicyResult kvc = Replay(*trace, "kvc", config);
  CHECK(kvc.mode_share(DecisionMode::kDirect) ==
        Approx(1.0 - static_cast<double>(trace->sessions.size()) / trace->turns.size()));
  CHECK(kvc.hit_rate() == Approx(session_ideal).epsilon(1e-12));

  // A single colocated instance with a global prefix cache also reuses the
  // shared system prompt of every session after the first.
  config.colocated_instances = 1;
  uint64_t global = reusable;
  const uint64_t system_tokens = c.system_prompt_tokens / c.block_tokens * c.block_tokens;
  global += system_tokens * (trace->sessions.size() - 1);
  const PolicyResult dp = Replay(*trace, "dp", config);
  CHECK(dp.hit_rate() == Approx(static_cast<double>(global) / static_cast<double>(input)).epsilon(1e-12));
}

TEST_CASE("simulator: the bundled Mooncake trace reaches its ideal with an infinite cache",
          "[sim][truth]") {
  const std::string path =
      (std::filesystem::path(__FILE__).parent_path().parent_path() /
       "data/traces/mooncake/conversation_trace.jsonl").string();
  auto trace = LoadTraceFile(path, TraceFormat::kMooncake);
  REQUIRE(trace.ok());
  // Independently, from the raw ids: a request reuses the leading run of its
  // full blocks that any earlier request had as full blocks.
  std::ifstream in(path);
  std::string text;
  std::unordered_set<int64_t> seen;
  uint64_t hit = 0, input = 0;
  while (std::getline(in, text)) {
    auto json = JsonLine::Parse(text);
    REQUIRE(json.ok());
    const uint64_t length = static_cast<uint64_t>(json->Find("input_length")->integer);
    const auto& ids = json->Find("hash_ids")->integers;
    const size_t full = length / 512;
    size_t run = 0;
    while (run < full && seen.contains(ids[run])) ++run;
    hit += run * 512;
    input += length;
    for (size_t i = 0; i < full; ++i) seen.insert(ids[i]);
  }
  const double ideal = static_cast<double>(hit) / static_cast<double>(input);
  SimConfig config;
  config.loop = LoopMode::kOpen;
  config.colocated_instances = 1;
  config.admission.capacity_tokens = uint64_t{1} << 40;
  const PolicyResult dp = Replay(*trace, "dp", config);
  INFO("ideal " << ideal << " simulated " << dp.hit_rate());
  // A session whose next turn shares all but its last full block drops that
  // block from the cache, so the simulated rate may be a hair lower.
  CHECK(dp.hit_rate() <= ideal + 1e-12);
  CHECK(dp.hit_rate() > ideal - 0.002);
}

TEST_CASE("simulator: a lone request's TTFT is the cost model's formula", "[sim][truth]") {
  const Trace trace = ParseMultiturnText(
      R"({"session_id":"x","input_length":10000,"output_length":100,"timestamp":0})" "\n"
      R"({"session_id":"x","input_length":600,"output_length":40,"delay":3000})" "\n");
  SimConfig config;
  const CostModel& cost = config.cost;
  const double seed_prefill = cost.PrefillSeconds(10000, 0);
  const double transfer = cost.TransferSeconds(10000);
  const double decode1 = 99 * cost.DecodeStepSeconds(1, 10000 + 50);
  // Turn 1 reuses the 10,100-token context and prefills 600 tokens.
  const double direct_prefill = cost.PrefillSeconds(600, 10100);

  const PolicyResult pd = Replay(trace, "pd", config);
  CHECK(pd.ttft_by_mode_s[static_cast<int>(DecisionMode::kSeed)].p50 ==
        Approx(seed_prefill + transfer).epsilon(1e-12));
  CHECK(pd.e2e_s.max == Approx(seed_prefill + transfer + decode1).epsilon(1e-12));
  CHECK(pd.e2e_s.p50 == Approx((seed_prefill + transfer + decode1 + cost.PrefillSeconds(10700, 0) +
                                cost.TransferSeconds(10700) +
                                39 * cost.DecodeStepSeconds(1, 10700 + 20)) /
                               2)
                            .epsilon(1e-12));

  const PolicyResult kvc = Replay(trace, "kvc", config);
  REQUIRE(kvc.mode_counts[static_cast<int>(DecisionMode::kSeed)] == 1);
  REQUIRE(kvc.mode_counts[static_cast<int>(DecisionMode::kDirect)] == 1);
  CHECK(kvc.ttft_by_mode_s[static_cast<int>(DecisionMode::kSeed)].p50 ==
        Approx(cost.admit_rpc_s + seed_prefill + transfer).epsilon(1e-12));
  CHECK(kvc.ttft_by_mode_s[static_cast<int>(DecisionMode::kDirect)].p50 ==
        Approx(cost.admit_rpc_s + direct_prefill).epsilon(1e-12));
  CHECK(kvc.e2e_s.max == Approx(cost.admit_rpc_s + seed_prefill + transfer + decode1).epsilon(1e-12));
  CHECK(kvc.hit_rate() == Approx(10100.0 / 20700.0));

  const PolicyResult dp = Replay(trace, "dp", config);
  CHECK(dp.ttft_by_mode_s[static_cast<int>(DecisionMode::kSeed)].p50 ==
        Approx(seed_prefill).epsilon(1e-12));
  CHECK(dp.ttft_by_mode_s[static_cast<int>(DecisionMode::kDirect)].p50 ==
        Approx(direct_prefill).epsilon(1e-12));
  // Closed loop: the second turn starts 3 s after the first one finished.
  CHECK(dp.makespan_s == Approx(seed_prefill + decode1 + 3.0 + direct_prefill +
                                39 * cost.DecodeStepSeconds(1, 10700 + 20))
                             .epsilon(1e-12));

  // RDMA shortens only the transfer.
  config.cost = CostModel::Rdma();
  const PolicyResult rdma = Replay(trace, "pd", config);
  CHECK(rdma.ttft_by_mode_s[static_cast<int>(DecisionMode::kSeed)].p50 ==
        Approx(seed_prefill + config.cost.TransferSeconds(10000)).epsilon(1e-12));
}

TEST_CASE("cost model: the defaults reproduce the seed's reseed regime", "[sim][cost]") {
  const CostModel tcp = CostModel::Tcp();
  const CostModel rdma = CostModel::Rdma();
  for (uint64_t context : {25000u, 30000u, 40000u}) {
    INFO(context);
    const double prefill = tcp.PrefillSeconds(context, 0);
    CHECK(prefill >= 1.4);
    CHECK(prefill <= 3.0);
    CHECK(tcp.TransferSeconds(context) >= 1.5);
    CHECK(tcp.TransferSeconds(context) <= 4.0);
    CHECK(prefill + tcp.TransferSeconds(context) >= 3.0);
    CHECK(prefill + tcp.TransferSeconds(context) <= 7.0);
    CHECK(rdma.TransferSeconds(context) == Approx(0.2).margin(0.1));
  }
}

TEST_CASE("simulator: same inputs give byte-identical JSON", "[sim][determinism]") {
  auto run = [](uint64_t seed) {
    SyntheticConfig c;
    c.sessions = 16;
    c.requests = 800;
    c.seed = seed;
    auto trace = GenerateSynthetic(c);
    REQUIRE(trace.ok());
    SimConfig config;
    config.admission.capacity_tokens = 50000;
    ReplayReport report = ReplayReport::ForTrace(*trace);
    for (const std::string& name : kAllPolicies) {
      report.results.push_back(Replay(*trace, name, config));
    }
    return FormatJson(report) + FormatCsv(report);
  };
  const std::string a = run(11);
  const std::string b = run(11);
  CHECK(a == b);
  CHECK(a != run(12));
  CHECK(a.find("\"policies\": [") != std::string::npos);
}

TEST_CASE("simulator: synthetic default gives KVC v2 >= 85% Direct, <= 10% Fallback",
          "[sim][seed-claims]") {
  auto trace = GenerateSynthetic(SyntheticConfig{});
  REQUIRE(trace.ok());
  CHECK(trace->sessions.size() == 52);
  CHECK(trace->turns.size() == 4450);
  const SimConfig config;
  const PolicyResult kvc = Replay(*trace, "kvc", config);
  INFO("direct " << kvc.mode_share(DecisionMode::kDirect) << " fallback "
                 << kvc.mode_share(DecisionMode::kFallback));
  CHECK(kvc.mode_share(DecisionMode::kDirect) >= 0.85);
  CHECK(kvc.mode_share(DecisionMode::kFallback) <= 0.10);
  // Vanilla P/D reuses nothing and recomputes every later turn.
  const PolicyResult pd = Replay(*trace, "pd", config);
  CHECK(pd.hit_rate() == 0.0);
  CHECK(pd.mode_share(DecisionMode::kDirect) == 0.0);
  CHECK(kvc.ttft_s.p50 < pd.ttft_s.p50);
}

// Six long-lived sessions (two per decode worker) work through 300 turns
// each while, all along, a big one-turn request arrives every 6 s and
// saturates whichever decode worker takes it. Every such request makes the
// long sessions on that worker collect rejections. v2 forgets them at the
// next success; v1 keeps them, blacklists home workers and moves sessions.
std::string OverloadBurstTrace() {
  std::string text;
  constexpr int kLong = 6, kLongTurns = 300;
  for (int s = 0; s < kLong; ++s) {
    absl::StrAppend(&text, "{\"session_id\":\"long", s, "\",\"input_length\":12000,"
                    "\"output_length\":40,\"timestamp\":", s * 100, "}\n");
    for (int k = 1; k < kLongTurns; ++k) {
      absl::StrAppend(&text, "{\"session_id\":\"long", s,
                      "\",\"input_length\":60,\"output_length\":30,\"delay\":700}\n");
    }
  }
  int burst = 0;
  for (int t = 30000; t < kLongTurns * 1000; t += 6000) {
    absl::StrAppend(&text, "{\"session_id\":\"burst", burst++, "\",\"input_length\":40000,"
                    "\"output_length\":2,\"timestamp\":", t, "}\n");
  }
  return text;
}

TEST_CASE("simulator: under an overload burst v1 falls back and migrates more than v2",
          "[sim][v1v2]") {
  const Trace trace = ParseMultiturnText(OverloadBurstTrace());
  SimConfig config;
  config.prefill_workers = 1;
  config.decode_workers = 3;
  const PolicyResult v2 = Replay(trace, "kvc", config);
  const PolicyResult v1 = Replay(trace, "kvc-v1", config);
  INFO("v2: direct " << v2.mode_counts[0] << " reseed " << v2.mode_counts[2] << " fallback "
                     << v2.mode_counts[3] << " migrations " << v2.migrations);
  INFO("v1: direct " << v1.mode_counts[0] << " reseed " << v1.mode_counts[2] << " fallback "
                     << v1.mode_counts[3] << " migrations " << v1.migrations);
  CHECK(v1.mode_counts[static_cast<int>(DecisionMode::kFallback)] >
        v2.mode_counts[static_cast<int>(DecisionMode::kFallback)]);
  CHECK(v1.migrations > v2.migrations);
  CHECK(v1.rejections[static_cast<int>(RejectReason::kSessionNotResidentNoCapacity)] >
        v2.rejections[static_cast<int>(RejectReason::kSessionNotResidentNoCapacity)]);
}

TEST_CASE("simulator: a policy whose block size differs from the trace's is refused",
          "[sim]") {
  const Trace trace = SmallSynthetic();
  SimConfig config;
  policy::PolicyEnvironment env = EnvFor(config, trace);
  env.block_tokens = trace.block_tokens * 2;
  auto policy = policy::MakePolicy("kvc", env);
  REQUIRE(policy.ok());
  auto result = Simulator::Run(trace, **policy, config);
  REQUIRE_FALSE(result.ok());
  CHECK_THAT(test::Message(result.status()), Catch::Contains("block"));
}

}  // namespace
}  // namespace kvc_router::sim
