// BM_DispatchStep: one whole Dispatch through the I/O-free form (route,
// admission answer, bookkeeping, completion) against an in-memory answer,
// on the same population as BM_Route/8/4096. Its difference from BM_Route is
// the step machine's overhead.
#include <benchmark/benchmark.h>

#include "bench_support.hpp"

namespace kvc_router::bench {
namespace {

void BM_DispatchStep(benchmark::State& state) {
  RouteSetup<FastIndex> setup =
      BuildRouteSetup(8, 4096, FastIndex(8, 0, RouterConfig{}.block_tokens));
  for (auto _ : state) {
    auto op = StartDispatch(*setup.state, setup.request);
    (void)op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kDirect));
    benchmark::DoNotOptimize(op->decision());
    (void)op->Complete();
  }
}
BENCHMARK(BM_DispatchStep);

// The same with a rejection first: two routes, one placement.
void BM_DispatchStepWithRetry(benchmark::State& state) {
  RouteSetup<FastIndex> setup =
      BuildRouteSetup(8, 4096, FastIndex(8, 0, RouterConfig{}.block_tokens));
  for (auto _ : state) {
    auto op = StartDispatch(*setup.state, setup.request);
    (void)op->OnAdmitResult(AdmitResult::Rejected(RejectReason::kNoDCapacity));
    (void)op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kReseed));
    benchmark::DoNotOptimize(op->decision());
    (void)op->Complete();
    state.PauseTiming();
    // Undo the rejection so every iteration starts from the same state.
    (void)setup.state->LearnResidency(setup.pinned, 42, setup.chain);
    auto reset = StartDispatch(*setup.state, setup.request);
    while (reset->awaiting_admit()) {
      (void)reset->OnAdmitResult(reset->admit_target() == setup.pinned
                                     ? AdmitResult::Admitted(DecisionMode::kDirect)
                                     : AdmitResult::Rejected(RejectReason::kNoDCapacity));
    }
    (void)reset->Complete();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_DispatchStepWithRetry);

}  // namespace
}  // namespace kvc_router::bench
