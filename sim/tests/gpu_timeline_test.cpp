// Tests of the shared GPU timeline (kvc_sim/gpu_timeline.hpp): alone, work
// takes the cost model's time; together, a prefill chunk lengthens the
// decode step it shares an iteration with, and decodes lengthen prefills.
#include "kvc_sim/gpu_timeline.hpp"

#include <catch2/catch.hpp>
#include <vector>

namespace kvc_router::sim {
namespace {

// Runs the timeline until idle; returns each slot's completion time.
std::vector<double> RunToIdle(GpuTimeline& gpu, size_t slots) {
  std::vector<double> done(slots, -1);
  std::vector<uint32_t> prefills, decodes;
  for (int guard = 0; guard < 100000; ++guard) {
    const double next = gpu.NextCompletion();
    if (!std::isfinite(next)) break;
    gpu.AdvanceTo(next);
    prefills.clear();
    decodes.clear();
    gpu.TakeDue(prefills, decodes);
    for (uint32_t s : prefills) done[s] = next;
    for (uint32_t s : decodes) done[s] = next;
  }
  return done;
}

TEST_CASE("gpu timeline: alone, a prefill and a decode take the cost model's time",
          "[sim][gpu]") {
  const CostModel cost;
  GpuTimeline gpu(cost);
  CHECK(!std::isfinite(gpu.NextCompletion()));
  gpu.EnqueuePrefill(0, cost.PrefillSeconds(20000, 0), cost.PrefillChunks(20000), 20000);
  CHECK(gpu.pending_prefill_tokens() == 20000);
  std::vector<double> done = RunToIdle(gpu, 1);
  CHECK(done[0] == Approx(cost.PrefillSeconds(20000, 0)).epsilon(1e-12));
  CHECK(gpu.pending_prefill_tokens() == 0);

  GpuTimeline solo(cost);
  solo.AddDecode(1, 100, 5000);
  done = RunToIdle(solo, 2);
  CHECK(done[1] == Approx(100 * cost.DecodeStepSeconds(1, 5000)).epsilon(1e-12));
}

TEST_CASE("gpu timeline: a decode step sharing the GPU with a chunk is longer by that chunk",
          "[sim][gpu][interference]") {
  const CostModel cost;
  const double step = cost.DecodeStepSeconds(1, 8000);
  const double prefill = cost.PrefillSeconds(30000, 0);
  const uint32_t chunks = cost.PrefillChunks(30000);
  REQUIRE(chunks == 4);
  GpuTimeline gpu(cost);
  gpu.AddDecode(0, 500, 8000);
  gpu.AdvanceTo(0.5);
  gpu.EnqueuePrefill(1, prefill, chunks, 30000);
  const std::vector<double> done = RunToIdle(gpu, 2);
  // Each of the 4 chunks shares an iteration with one decode step.
  CHECK(done[1] == Approx(0.5 + prefill + chunks * step).epsilon(1e-9));
  // The decode lost exactly the prefill's GPU time.
  CHECK(done[0] == Approx(500 * step + prefill).epsilon(1e-9));
}

TEST_CASE("gpu timeline: prefills run one at a time, first in first out", "[sim][gpu]") {
  const CostModel cost;
  GpuTimeline gpu(cost);
  gpu.EnqueuePrefill(0, 1.0, 2, 100);
  gpu.EnqueuePrefill(1, 0.5, 1, 50);
  CHECK(gpu.queued_prefills() == 2);
  CHECK(gpu.pending_prefill_tokens() == 150);
  const std::vector<double> done = RunToIdle(gpu, 2);
  CHECK(done[0] == Approx(1.0));
  CHECK(done[1] == Approx(1.5));
}

TEST_CASE("gpu timeline: a batch shares its step time", "[sim][gpu]") {
  const CostModel cost;
  GpuTimeline gpu(cost);
  gpu.AddDecode(0, 10, 1000);
  gpu.AddDecode(1, 20, 3000);
  CHECK(gpu.decode_batch() == 2);
  const std::vector<double> done = RunToIdle(gpu, 2);
  const double both = cost.DecodeStepSeconds(2, 4000);
  CHECK(done[0] == Approx(10 * both).epsilon(1e-12));
  CHECK(done[1] == Approx(10 * both + 10 * cost.DecodeStepSeconds(1, 3000)).epsilon(1e-12));
}

}  // namespace
}  // namespace kvc_router::sim

namespace kvc_router::sim {
namespace {

TEST_CASE("gpu timeline: zero-time work completes at once, never lost", "[sim][gpu]") {
  CostModel free;
  free.prefill_overhead_s = 0;
  free.decode_step_base_s = 0;
  free.decode_step_per_request_s = 0;
  free.decode_step_per_context_token_s = 0;
  GpuTimeline gpu(free);
  gpu.AdvanceTo(5.0);
  gpu.EnqueuePrefill(0, 0.0, 1, 0);
  gpu.AddDecode(1, 10, 100);
  CHECK(gpu.NextCompletion() == 5.0);
  std::vector<uint32_t> prefills, decodes;
  gpu.TakeDue(prefills, decodes);
  CHECK(prefills == std::vector<uint32_t>{0});
  CHECK(decodes == std::vector<uint32_t>{1});
  CHECK(gpu.idle());
}

TEST_CASE("gpu timeline: completions at epoch-sized times are reached", "[sim][gpu]") {
  const CostModel cost;
  GpuTimeline gpu(cost);
  gpu.AdvanceTo(1.7e9);
  gpu.AddDecode(0, 3, 1000);
  gpu.AddDecode(1, 5, 1000);
  gpu.AddDecode(2, 7, 1000);
  std::vector<uint32_t> prefills, decodes;
  int wakes = 0;
  while (!gpu.idle() && wakes < 100) {
    gpu.AdvanceTo(gpu.NextCompletion());
    gpu.TakeDue(prefills, decodes);
    ++wakes;
  }
  CHECK(decodes.size() == 3);
  CHECK(wakes <= 3);
}

}  // namespace
}  // namespace kvc_router::sim
