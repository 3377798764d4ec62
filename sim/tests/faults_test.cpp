// Fault injection (kvc_sim/faults.hpp): crashes that lose KV (and take an
// instance out of the affinity rules' rotation while it is down), admission
// RPC timeouts, dropped / duplicated / reordered KV (eviction) events. Every
// request still completes exactly once (Simulator::Run checks it), the pools
// are never overfilled, tokens are conserved, and the hit rate degrades
// gradually with the fault rate.
#include "kvc_sim/faults.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "kvc_sim/policies/registry.hpp"
#include "kvc_sim/simulator.hpp"
#include "kvc_sim/synthetic.hpp"
#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

Trace FaultTrace() {
  SyntheticConfig c;
  c.sessions = 12;
  c.requests = 600;
  c.session_interarrival_s = 20;
  c.seed = 7;
  auto trace = GenerateSynthetic(c);
  REQUIRE(trace.ok());
  return std::move(*trace);
}

PolicyResult ReplayWith(const Trace& trace, const std::string& name, const FaultConfig& faults,
                        uint64_t capacity = 60000, SimConfig config = {}) {
  config.admission.capacity_tokens = capacity;
  config.faults = faults;
  PolicySetup setup;
  setup.cluster = config.cluster;
  setup.admission = config.admission;
  setup.router.block_tokens = trace.block_tokens;
  auto made = MakePolicy(name, setup);
  REQUIRE(made.ok());
  auto result = Simulator::Run(trace, *made->policy, config, made->engine);
  INFO(name << ": " << (result.ok() ? "ok" : test::Message(result.status())));
  REQUIRE(result.ok());
  return std::move(*result);
}

void CheckInvariants(const Trace& trace, const PolicyResult& r) {
  CHECK(r.requests == trace.turns.size());
  CHECK(r.refused_oversize == 0);
  CHECK(r.input_tokens == trace.total_input_tokens());
  CHECK(r.input_tokens == r.cached_tokens + r.prefill_tokens_remote + r.prefill_tokens_local);
  CHECK(r.peak_used_tokens <= r.budget_tokens);
}

TEST_CASE("faults: bad fault rates are refused, naming the field", "[sim][faults]") {
  FaultConfig bad;
  bad.event_drop_rate = 1.5;
  CHECK(bad.Validate().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(bad.Validate()).find("event_drop_rate") != std::string::npos);
  FaultConfig nan;
  nan.crash_interval_s = std::numeric_limits<double>::quiet_NaN();
  CHECK(test::Message(nan.Validate()).find("crash_interval_s") != std::string::npos);
  SimConfig config;
  config.faults = bad;
  CHECK_FALSE(config.Validate().ok());
}

TEST_CASE("faults: every request completes under every fault, KVC policies", "[sim][faults]") {
  const Trace trace = FaultTrace();
  const uint64_t seed = GENERATE(1u, 2u, 3u);
  FaultConfig faults;
  faults.seed = seed;
  faults.crash_interval_s = 30;
  faults.crash_downtime_s = 5;
  faults.rpc_timeout_rate = 0.1;
  faults.event_drop_rate = 0.2;
  faults.event_duplicate_rate = 0.2;
  faults.event_reorder_rate = 0.2;
  for (const std::string name : {"kvc", "kvc-v1", "kvc-colo", "kvc-adaptive"}) {
    INFO(name << " fault seed " << seed);
    const PolicyResult r = ReplayWith(trace, name, faults);
    CheckInvariants(trace, r);
    CHECK(r.faults.crashes > 0);
    CHECK(r.faults.rpc_timeouts > 0);
    CHECK(r.faults.events_dropped + r.faults.events_duplicated + r.faults.events_reordered > 0);
    // The router saw the timeouts as worker-unavailable rejections.
    CHECK(r.rejections[static_cast<int>(RejectReason::kWorkerUnavailable)] > 0);
  }
}

TEST_CASE("faults: a faulty replay is deterministic", "[sim][faults]") {
  const Trace trace = FaultTrace();
  FaultConfig faults;
  faults.crash_interval_s = 20;
  faults.rpc_timeout_rate = 0.05;
  faults.event_reorder_rate = 0.3;
  const PolicyResult a = ReplayWith(trace, "kvc", faults);
  const PolicyResult b = ReplayWith(trace, "kvc", faults);
  CHECK(a.makespan_s == b.makespan_s);
  CHECK(a.cached_tokens == b.cached_tokens);
  CHECK(a.faults.crashes == b.faults.crashes);
  CHECK(a.faults.sessions_lost == b.faults.sessions_lost);
}

TEST_CASE("faults: policies without admission complete too", "[sim][faults]") {
  const Trace trace = FaultTrace();
  FaultConfig faults;
  faults.crash_interval_s = 30;
  faults.event_drop_rate = 0.5;
  for (const std::string name : {"pd", "pd-sglang", "dp", "unified", "ear"}) {
    INFO(name);
    CheckInvariants(trace, ReplayWith(trace, name, faults));
  }
}

// What the replay saw: each crash's down window, each request's placement.
struct CrashLog {
  struct Down {
    WorkerId instance;
    double from_s, until_s;
  };
  std::vector<Down> downs;
  std::vector<RequestRecord> requests;

  void Attach(SimConfig& config) {
    config.on_crash = [this](WorkerId d, double from, double until) {
      downs.push_back({d, from, until});
    };
    config.on_request = [this](const RequestRecord& r) { requests.push_back(r); };
  }
  // Requests placed on an instance while it was down, and how many of them
  // had their first token before it was back.
  std::pair<int, int> PlacedOnDown() const {
    int placed = 0, served_while_down = 0;
    for (const RequestRecord& r : requests) {
      for (const Down& d : downs) {
        if (r.instance == d.instance && r.placed_s >= d.from_s && r.placed_s < d.until_s) {
          ++placed;
          served_while_down += r.first_token_s < d.until_s;
        }
      }
    }
    return {placed, served_while_down};
  }
};

TEST_CASE("faults: crashes reach the affinity policies: KV lost, nothing placed on a down instance",
          "[sim][faults]") {
  const Trace trace = FaultTrace();
  const uint64_t seed = GENERATE(1u, 2u, 3u);
  FaultConfig faults;
  faults.seed = seed;
  faults.crash_interval_s = 20;
  faults.crash_downtime_s = 10;
  for (const std::string name : {"load-only", "lmetric", "sticky", "unified", "ear"}) {
    INFO(name << " fault seed " << seed);
    const PolicyResult clean = ReplayWith(trace, name, FaultConfig{});
    CrashLog log;
    SimConfig config;
    log.Attach(config);
    const PolicyResult r = ReplayWith(trace, name, faults, 60000, config);
    CheckInvariants(trace, r);
    REQUIRE(r.faults.crashes > 0);
    CHECK(r.faults.crashes == log.downs.size());
    CHECK(r.faults.cached_tokens_lost > 0);
    CHECK(r.faults.sessions_lost == 0);  // page caches lose tokens, not booked sessions
    CHECK(log.requests.size() == trace.turns.size());
    CHECK(log.PlacedOnDown().first == 0);
    CHECK(r.hit_rate() < clean.hit_rate());
  }
  // dp does not read routability: it places turns on a down instance, and
  // they start when it is back.
  CrashLog log;
  SimConfig config;
  log.Attach(config);
  const PolicyResult dp = ReplayWith(trace, "dp", faults, 60000, config);
  CheckInvariants(trace, dp);
  CHECK(dp.faults.cached_tokens_lost > 0);
  const auto [placed, served_while_down] = log.PlacedOnDown();
  CHECK(placed > 0);
  CHECK(served_while_down == 0);
}

TEST_CASE("faults: with every instance down, ear's turns wait for one to come back",
          "[sim][faults]") {
  const Trace trace = FaultTrace();
  const uint64_t seed = GENERATE(1u, 2u, 3u);
  INFO("fault seed " << seed);
  FaultConfig faults;
  faults.seed = seed;
  faults.crash_interval_s = 5;
  faults.crash_downtime_s = 20;
  CrashLog log;
  SimConfig config;
  config.cluster.prefill_workers = 1;
  config.cluster.decode_workers = 1;  // two colocated instances
  log.Attach(config);
  const PolicyResult r = ReplayWith(trace, "ear", faults, 60000, config);
  CheckInvariants(trace, r);
  CHECK(log.requests.size() == trace.turns.size());
  CHECK(log.PlacedOnDown().first == 0);
  // Both were down at once at some point, and a turn that came then waited.
  bool all_down = false;
  for (const CrashLog::Down& a : log.downs) {
    for (const CrashLog::Down& b : log.downs) {
      all_down |= a.instance != b.instance && b.from_s >= a.from_s && b.from_s < a.until_s;
    }
  }
  REQUIRE(all_down);
  CHECK(r.faults.turns_waited_for_instance > 0);
}

// The numbers docs/reliability.md quotes: the hit rate as faults grow, for
// kvc (every fault reaches it), ear (crashes: lost KV and down instances)
// and dp (crashes: lost KV only).
TEST_CASE("faults: the hit rate degrades gracefully as faults grow", "[sim][faults]") {
  const Trace trace = FaultTrace();
  for (const std::string name : {"kvc", "ear", "dp"}) {
    const PolicyResult clean = ReplayWith(trace, name, FaultConfig{});
    CHECK(clean.faults.crashes == 0);
    CHECK(clean.faults.rpc_timeouts == 0);
    double previous = clean.hit_rate();
    WARN(name << " clean: hit rate " << clean.hit_rate() << ", TTFT p90 " << clean.ttft_s.p90);
    for (double level : {0.05, 0.1, 0.2}) {
      FaultConfig faults;
      faults.crash_interval_s = 1.0 / level * 3;  // 60 s, 30 s, 15 s
      faults.rpc_timeout_rate = level;
      faults.event_drop_rate = level;
      faults.event_duplicate_rate = level;
      faults.event_reorder_rate = level;
      const PolicyResult r = ReplayWith(trace, name, faults);
      CheckInvariants(trace, r);
      WARN(name << " faults " << level << ": hit rate " << r.hit_rate() << ", TTFT p90 "
                << r.ttft_s.p90 << ", crashes " << r.faults.crashes << ", sessions lost "
                << r.faults.sessions_lost << ", cached tokens lost " << r.faults.cached_tokens_lost
                << ", RPC timeouts " << r.faults.rpc_timeouts << ", fallback "
                << r.mode_counts[3]);
      // Graceful: faults cost some reuse, never most of it.
      CHECK(r.hit_rate() <= clean.hit_rate() + 0.02);
      CHECK(r.hit_rate() >= 0.5 * clean.hit_rate());
      CHECK(r.hit_rate() <= previous + 0.05);
      previous = r.hit_rate();
    }
  }
}

}  // namespace
}  // namespace kvc_router::sim
