// BM_ReplaySynthetic/<requests>: a whole closed-loop replay of the
// SWE-bench-shaped synthetic workload under the KVC-Router (v2) policy on the
// default cluster (4P+4D, h100-8b), about 85 requests per session as in the
// default workload, 32 sessions at a time. Trace generation is outside the
// timed region. Target: 1M requests in under 10 s on a 2-core machine.
//
// BM_ReplayClaudeCode/<sessions>: the claude-code preset under every policy
// that keeps a page cache (dp), the heaviest per-request path.
#include <benchmark/benchmark.h>

#include "kvc_sim/policies/registry.hpp"
#include "kvc_sim/simulator.hpp"
#include "kvc_sim/synthetic.hpp"

namespace kvc_router::sim {
namespace {

void RunReplay(benchmark::State& state, const Trace& trace, const std::string& name) {
  SimConfig config;
  config.concurrency = 32;
  PolicySetup setup;
  setup.cluster = config.cluster;
  setup.admission = config.admission;
  setup.router.block_tokens = trace.block_tokens;
  double direct = 0;
  for (auto _ : state) {
    absl::StatusOr<MadePolicy> made = MakePolicy(name, setup);
    if (!made.ok()) {
      state.SkipWithError("policy construction failed");
      return;
    }
    absl::StatusOr<PolicyResult> result = Simulator::Run(trace, *made->policy, config, made->engine);
    if (!result.ok()) {
      state.SkipWithError("replay failed");
      return;
    }
    direct = result->mode_share(DecisionMode::kDirect);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * trace.turns.size()));
  state.counters["direct"] = direct;
}

void BM_ReplaySynthetic(benchmark::State& state) {
  SyntheticConfig synthetic = SyntheticConfig::SweBench();
  synthetic.requests = static_cast<uint64_t>(state.range(0));
  synthetic.sessions = static_cast<uint32_t>(synthetic.requests / 85);
  absl::StatusOr<Trace> trace = GenerateSynthetic(synthetic);
  if (!trace.ok()) {
    state.SkipWithError("trace generation failed");
    return;
  }
  RunReplay(state, *trace, "kvc");
}
BENCHMARK(BM_ReplaySynthetic)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kSecond)->UseRealTime();

void BM_ReplayClaudeCode(benchmark::State& state) {
  SyntheticConfig synthetic = SyntheticConfig::ClaudeCode();
  synthetic.sessions = static_cast<uint32_t>(state.range(0));
  synthetic.requests = uint64_t{synthetic.sessions} * 12;
  absl::StatusOr<Trace> trace = GenerateSynthetic(synthetic);
  if (!trace.ok()) {
    state.SkipWithError("trace generation failed");
    return;
  }
  RunReplay(state, *trace, "dp");
}
BENCHMARK(BM_ReplayClaudeCode)->Arg(200)->Arg(1000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace kvc_router::sim
