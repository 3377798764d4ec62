// BM_ReplaySynthetic/<requests>: a whole closed-loop replay of the synthetic
// agentic workload under the KVC-Router (v2) policy, default 2P+6D cluster,
// about 85 requests per session as in the default workload. Trace generation
// is outside the timed region. The target: 1M requests under 60 s.
#include <benchmark/benchmark.h>

#include "kvc_router/policy/registry.hpp"
#include "kvc_router/sim/simulator.hpp"
#include "kvc_router/sim/synthetic.hpp"

namespace kvc_router::sim {
namespace {

void BM_ReplaySynthetic(benchmark::State& state) {
  SyntheticConfig synthetic;
  synthetic.requests = static_cast<uint64_t>(state.range(0));
  synthetic.sessions = static_cast<uint32_t>(synthetic.requests / 85);
  absl::StatusOr<Trace> trace = GenerateSynthetic(synthetic);
  if (!trace.ok()) {
    state.SkipWithError("trace generation failed");
    return;
  }
  SimConfig config;
  policy::PolicyEnvironment env;
  env.prefill_workers = config.prefill_workers;
  env.decode_workers = config.decode_workers;
  env.kv_capacity_tokens = config.admission.capacity_tokens;
  env.block_tokens = trace->block_tokens;
  double direct = 0;
  for (auto _ : state) {
    auto policy = policy::MakePolicy("kvc", env);
    absl::StatusOr<PolicyResult> result = Simulator::Run(*trace, **policy, config);
    if (!result.ok()) {
      state.SkipWithError("replay failed");
      return;
    }
    direct = result->mode_share(DecisionMode::kDirect);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * trace->turns.size()));
  state.counters["direct"] = direct;
}
BENCHMARK(BM_ReplaySynthetic)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace
}  // namespace kvc_router::sim
