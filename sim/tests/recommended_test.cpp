// The recommended policy (kRecommendedPolicy) against the baselines on the
// agentic shapes it is judged on, on the h100-8b profile with 8 colocated
// instances or 4 prefill + 4 decode workers: 32 claude-code sessions started
// together at the profile's K_d and at 400k tokens, and 32 kept running (a
// new session starts as one ends; 300 sessions here), seeds 1-3. It must keep what
// docs/policies.md reports: TTFT p90 at least 20% below the best baseline
// (dp, pd-sglang, load-only), TTFT p99 no worse than dp's, and a prefix hit
// rate within 2 points of the workload's ideal (geometric means of the
// latencies and mean hit rates over the seeds, so one seed's luck does not
// decide). A change to the policy or the simulator that loses this fails here.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kvc_sim/policies/registry.hpp"
#include "kvc_sim/profiles.hpp"
#include "kvc_sim/simulator.hpp"
#include "kvc_sim/synthetic.hpp"
#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

struct Outcome {
  double log_p90 = 0;
  double log_p99 = 0;
  double hit = 0;
};

// Replays `names` on seeds 1-3 of `workload` and checks the three targets
// for names[0] against the others (dp among them).
void CheckTargets(SyntheticConfig workload, const SimConfig& config,
                  const std::vector<std::string>& names) {
  std::map<std::string, Outcome> outcomes;
  double ideal = 0;
  const int kSeeds = 3;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    workload.seed = seed;
    absl::StatusOr<Trace> trace = GenerateSynthetic(workload);
    REQUIRE(trace.ok());
    ideal += trace->IdealSessionHitRate() / kSeeds;
    PolicySetup setup;
    setup.cluster = config.cluster;
    setup.admission = config.admission;
    setup.cost = config.cost;
    setup.host_tier_tokens = config.host_tier.capacity_tokens;
    setup.router.block_tokens = trace->block_tokens;
    for (const std::string& name : names) {
      absl::StatusOr<MadePolicy> made = MakePolicy(name, setup);
      REQUIRE(made.ok());
      absl::StatusOr<PolicyResult> result =
          Simulator::Run(*trace, *made->policy, config, made->engine);
      INFO(name << " seed " << seed << ": "
                << (result.ok() ? "ok" : test::Message(result.status())));
      REQUIRE(result.ok());
      REQUIRE(result->served() == trace->turns.size());
      Outcome& o = outcomes[name];
      o.log_p90 += std::log(result->ttft_s.p90) / kSeeds;
      o.log_p99 += std::log(result->ttft_s.p99) / kSeeds;
      o.hit += result->hit_rate() / kSeeds;
    }
  }
  const std::string& recommended = names.front();
  const Outcome& mine = outcomes[recommended];
  double best_baseline_p90 = INFINITY;
  std::string best_baseline;
  for (const std::string& name : names) {
    if (name == recommended) continue;
    const double p90 = std::exp(outcomes[name].log_p90);
    INFO(name << " TTFT p90 " << p90 << " p99 " << std::exp(outcomes[name].log_p99)
              << " hit " << outcomes[name].hit);
    if (p90 < best_baseline_p90) {
      best_baseline_p90 = p90;
      best_baseline = name;
    }
  }
  INFO(recommended << " TTFT p90 " << std::exp(mine.log_p90) << " against " << best_baseline
                   << "'s " << best_baseline_p90 << "; p99 " << std::exp(mine.log_p99)
                   << " against dp's " << std::exp(outcomes["dp"].log_p99) << "; hit "
                   << mine.hit << " against the ideal " << ideal);
  CHECK(std::exp(mine.log_p90) <= 0.8 * best_baseline_p90);
  CHECK(mine.log_p99 <= outcomes["dp"].log_p99);
  CHECK(mine.hit >= ideal - 0.02);
}

SimConfig H100(uint64_t capacity) {
  absl::StatusOr<HardwareProfile> profile = FindProfile("h100-8b");
  REQUIRE(profile.ok());
  SimConfig config;
  config.cost = profile->cost;
  config.host_tier = profile->host_tier;
  config.admission.capacity_tokens = capacity != 0 ? capacity : profile->kv_capacity_tokens;
  config.concurrency = 32;
  return config;
}

TEST_CASE("recommended policy: 32 claude-code sessions started together beat the baselines",
          "[sim][recommended]") {
  const uint64_t capacity = GENERATE(uint64_t{0}, uint64_t{400000});
  const SimConfig config = H100(capacity);
  INFO("K_d " << config.admission.capacity_tokens);
  SyntheticConfig workload = SyntheticConfig::ClaudeCode();
  workload.sessions = 32;
  workload.requests = 32 * 12;
  workload.session_interarrival_s = 0;
  CheckTargets(workload, config,
               {std::string(kRecommendedPolicy), "dp", "pd-sglang", "load-only"});
}

TEST_CASE("recommended policy: 32 claude-code sessions kept running beat the baselines",
          "[sim][recommended]") {
  // Contexts outgrow the eight pools here: the hit target rests on ear's
  // load control (docs/policies.md, "Load control").
  SyntheticConfig workload = SyntheticConfig::ClaudeCode();
  workload.sessions = 300;
  workload.requests = 300 * 12;
  CheckTargets(workload, H100(0),
               {std::string(kRecommendedPolicy), "dp", "pd-sglang", "load-only"});
}

}  // namespace
}  // namespace kvc_router::sim
