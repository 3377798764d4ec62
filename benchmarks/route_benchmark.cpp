// BM_Route / BM_RouteNaive: Algorithm 1 end to end (lock, blacklist, overlap,
// score, tie-breaks) over the fast index and over the literal set
// intersection of the naive index, on the same population.
#include <benchmark/benchmark.h>

#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "bench_support.hpp"

namespace kvc_router::bench {
namespace {

void RouteArgs(benchmark::internal::Benchmark* b, uint64_t max_work) {
  for (int64_t workers : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
    for (int64_t blocks : {64, 256, 1024, 4096, 16384}) {
      if (static_cast<uint64_t>(workers * blocks) <= max_work) b->Args({workers, blocks});
    }
  }
}

// Routes the pinned session again and again; fails the run if Route ever
// picks another worker than the one holding its whole prefix.
template <class Index>
RouteSetup<Index> RunRoute(benchmark::State& state, Index index) {
  const auto workers = static_cast<uint32_t>(state.range(0));
  const auto blocks = static_cast<size_t>(state.range(1));
  RouteSetup<Index> setup = BuildRouteSetup(workers, blocks, std::move(index));
  WorkerId chosen = kNoWorker;
  for (auto _ : state) {
    const RouteChoice choice = Route(*setup.state, setup.request);
    benchmark::DoNotOptimize(choice);
    chosen = choice.worker;
  }
  if (chosen != setup.pinned) state.SkipWithError("Route did not choose the pinned worker");
  return setup;
}

void BM_Route(benchmark::State& state) {
  const auto workers = static_cast<uint32_t>(state.range(0));
  RouteSetup<FastIndex> setup =
      RunRoute(state, FastIndex(workers, 0, RouterConfig{}.block_tokens));
  const uint64_t entries = setup.state->ReadIndex([](const FastIndex& i) { return i.entries(); });
  const size_t bytes = setup.state->ReadIndex([](const FastIndex& i) { return i.memory_bytes(); });
  state.counters["entries"] = static_cast<double>(entries);
  state.counters["bytes_per_entry"] = static_cast<double>(bytes) / static_cast<double>(entries);
}
BENCHMARK(BM_Route)->Apply([](auto* b) { RouteArgs(b, ~uint64_t{0}); });

void BM_RouteNaive(benchmark::State& state) {
  RunRoute(state, NaiveIndex(static_cast<uint32_t>(state.range(0))));
}
// The literal intersection costs |D| * blocks ordered-set look-ups: capped.
BENCHMARK(BM_RouteNaive)->Apply([](auto* b) { RouteArgs(b, 8 * 16384); });

// A second literal baseline: the same set intersection over hash sets
// instead of NaiveIndex's ordered sets, so the ratio does not just measure
// std::map against a hash table.
class HashSetIndex {
 public:
  explicit HashSetIndex(uint32_t workers) : workers_(workers) {}
  size_t num_workers() const { return workers_.size(); }
  void Overlap(std::span<const BlockHash> prefix, std::span<uint32_t> out) const {
    for (size_t d = 0; d < workers_.size(); ++d) {
      uint32_t count = 0;
      for (BlockHash hash : prefix) count += workers_[d].refs.contains(hash) ? 1 : 0;
      out[d] = count;
    }
  }
  void Learn(WorkerId d, SessionId s, std::span<const BlockHash> hashes) {
    ForgetSession(d, s);
    auto& blocks = workers_[d].sessions[s];
    blocks.assign(hashes.begin(), hashes.end());
    for (BlockHash hash : hashes) ++workers_[d].refs[hash];
  }
  void ForgetSession(WorkerId d, SessionId s) {
    auto it = workers_[d].sessions.find(s);
    if (it == workers_[d].sessions.end()) return;
    for (BlockHash hash : it->second) {
      if (--workers_[d].refs[hash] == 0) workers_[d].refs.erase(hash);
    }
    workers_[d].sessions.erase(it);
  }

 private:
  struct Worker {
    absl::flat_hash_map<BlockHash, uint32_t> refs;
    absl::flat_hash_map<SessionId, std::vector<BlockHash>> sessions;
  };
  std::vector<Worker> workers_;
};

void BM_RouteHashSet(benchmark::State& state) {
  RunRoute(state, HashSetIndex(static_cast<uint32_t>(state.range(0))));
}
BENCHMARK(BM_RouteHashSet)->Apply([](auto* b) { RouteArgs(b, 8 * 16384); });

// Two gateway threads routing against one shared state.
void BM_RouteShared(benchmark::State& state) {
  static std::once_flag once;
  static std::unique_ptr<RouteSetup<FastIndex>> shared;
  std::call_once(once, [] {
    shared = std::make_unique<RouteSetup<FastIndex>>(
        BuildRouteSetup(8, 4096, FastIndex(8, 0, RouterConfig{}.block_tokens)));
  });
  for (auto _ : state) {
    benchmark::DoNotOptimize(Route(*shared->state, shared->request));
  }
}
BENCHMARK(BM_RouteShared)->ArgNames({"D8_blocks4096"})->Arg(0)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace
}  // namespace kvc_router::bench
