// Bounded-memory soak: millions of requests over a million sessions through
// RoutingState<FastIndex> with an idle TTL and a session cap, reporting the
// process's resident set size at 1M, 5M and 10M requests (it must stay flat:
// sessions expire and every worker's estimate is bounded by its capacity),
// plus the bytes each index spends per resident (block, worker) entry.
//
// Scale: KVC_ROUTER_SOAK_REQUESTS (default 10,000,000; the RSS checkpoints
// are at 10%, 50% and 100% of it). scripts/test.sh's benchmark smoke stage
// sets it to 200,000 so the smoke run stays short; scripts/bench.sh runs the
// full soak. Counters:
//   rss_mb_at_10pct / 50pct / 100pct   RSS at the checkpoints (MB)
//   rss_growth_10_to_100               RSS(100%) / RSS(10%) - 1 (flat: < 0.05)
//   sessions, index_entries            what the state holds at the end
//   bytes_per_entry                    FastIndex::memory_bytes() / entries()
// BM_IndexBytesPerEntry/<index> fills one index with 1M (block, worker)
// entries and reports bytes per entry measured by heap growth (all indexes)
// and by the index's own accounting (FastIndex, KvEventIndex).
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kvc_router/kvc_router.hpp"
#include "kvc_router/detail/splitmix.hpp"

namespace kvc_router::bench {
namespace {

// Resident set size of this process in bytes (/proc/self/statm), 0 if unknown.
double RssBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int read = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return read == 2 ? static_cast<double>(resident) * 4096.0 : 0;
}

// Heap bytes in use (glibc mallinfo2: arena + mmapped chunks). Unlike RSS
// it does not hide an allocation in memory freed by an earlier benchmark.
double HeapBytes() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<double>(info.uordblks + info.hblkhd);
}

uint64_t SoakRequests() {
  const char* env = std::getenv("KVC_ROUTER_SOAK_REQUESTS");
  if (env == nullptr || *env == '\0') return 10'000'000;
  const uint64_t n = std::strtoull(env, nullptr, 10);
  return n < 1000 ? 1000 : n;
}

BlockHash SessionBlock(uint64_t session, uint64_t i) {
  // A system prompt shared by every session (8 blocks), then the session's own.
  if (i < 8) return detail::SplitMix64(0xfeed + i).Next();
  return detail::SplitMix64((session << 20) ^ i).Next();
}

void BM_SoakBoundedMemory(benchmark::State& bench) {
  const uint64_t total = SoakRequests();
  constexpr uint64_t kSessions = 1'000'000;
  constexpr uint32_t kWorkers = 8;
  constexpr uint32_t kBlockTokens = 16;
  RouterConfig config;
  config.num_decode_workers = kWorkers;
  config.num_prefill_workers = 2;
  config.block_tokens = kBlockTokens;
  config.session_idle_ttl = absl::Seconds(60);
  config.max_sessions = 1 << 16;
  auto now = std::make_shared<absl::Time>(absl::UnixEpoch());
  auto created = RoutingState<FastIndex>::Create(
      config, FastIndex(kWorkers, /*capacity_tokens=*/2'000'000, kBlockTokens),
      [now] { return *now; });
  if (!created.ok()) {
    bench.SkipWithError("RoutingState::Create failed");
    return;
  }
  RoutingState<FastIndex>& state = **created;
  std::vector<uint16_t> turns(kSessions, 0);
  std::vector<BlockHash> prefix;
  prefix.reserve(512);
  detail::SplitMix64 rng(20261201);
  double rss[3] = {0, 0, 0};
  const uint64_t checkpoints[3] = {total / 10, total / 2, total};
  for (auto _ : bench) {
    uint64_t done = 0;
    for (int c = 0; c < 3; ++c) {
      for (; done < checkpoints[c]; ++done) {
        // Sessions are active in a sliding window: each gets ~10 turns over
        // ~100k requests (100 s at 1 ms per request), then goes idle.
        const uint64_t base = done * kSessions / total;
        const uint64_t session = (base + rng.Next() % 10'000) % kSessions;
        const uint32_t turn = turns[session]++;
        const uint64_t blocks = std::min<uint64_t>(8 + uint64_t{turn} * 24, 480);
        prefix.clear();
        for (uint64_t i = 0; i < blocks; ++i) prefix.push_back(SessionBlock(session, i));
        Request request{.session = session, .turn = turn, .prefix_hashes = prefix,
                        .append_tokens = 200};
        auto op = StartDispatch(state, request);
        while (op.ok() && op->awaiting_admit()) {
          const AdmitResult answer =
              rng.Next() % 10 == 0
                  ? AdmitResult::Rejected(RejectReason::kNoDCapacity)
                  : AdmitResult::Admitted(turn == 0 ? DecisionMode::kSeed : DecisionMode::kDirect);
          if (!op->OnAdmitResult(answer).ok()) break;
        }
        if (op.ok()) (void)op->Complete();
        *now += absl::Milliseconds(1);
      }
      rss[c] = RssBytes();
    }
    benchmark::DoNotOptimize(done);
  }
  bench.counters["requests"] = static_cast<double>(total);
  bench.counters["rss_mb_at_10pct"] = rss[0] / 1e6;
  bench.counters["rss_mb_at_50pct"] = rss[1] / 1e6;
  bench.counters["rss_mb_at_100pct"] = rss[2] / 1e6;
  bench.counters["rss_growth_10_to_100"] = rss[0] > 0 ? rss[2] / rss[0] - 1 : 0;
  bench.counters["sessions"] = static_cast<double>(state.num_sessions());
  const auto [entries, bytes] = state.ReadIndex([](const FastIndex& index) {
    return std::pair<uint64_t, size_t>(index.entries(), index.memory_bytes());
  });
  bench.counters["index_entries"] = static_cast<double>(entries);
  bench.counters["bytes_per_entry"] =
      entries > 0 ? static_cast<double>(bytes) / static_cast<double>(entries) : 0;
  bench.counters["seconds_per_request"] = benchmark::Counter(
      static_cast<double>(total), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_SoakBoundedMemory)->Iterations(1)->Repetitions(1)->Unit(benchmark::kSecond)->UseRealTime();

// Bytes per resident (block, worker) entry of each index, by heap growth
// while filling it with ~1M entries (sessions of 64-block chains over 8
// workers; 1/10 of KVC_ROUTER_SOAK_REQUESTS when that is smaller).
template <class Index, class Make>
void IndexBytesPerEntry(benchmark::State& bench, Make make) {
  constexpr uint32_t kWorkers = 8;
  const uint64_t target = std::min<uint64_t>(1'000'000, SoakRequests() / 10);
  double heap_growth = 0;
  double own_bytes = 0;
  uint64_t entries = 0;
  for (auto _ : bench) {
    const double before = HeapBytes();
    auto index = std::make_unique<Index>(make(kWorkers));
    std::vector<BlockHash> chain(64);
    for (uint64_t s = 0; entries < target; ++s) {
      for (uint64_t i = 0; i < chain.size(); ++i) chain[i] = SessionBlock(s, i + 8);
      index->Learn(static_cast<WorkerId>(s % kWorkers), s, chain);
      entries += chain.size();
    }
    heap_growth = HeapBytes() - before;
    if constexpr (requires { index->memory_bytes(); }) {
      own_bytes = static_cast<double>(index->memory_bytes());
    }
    benchmark::DoNotOptimize(index.get());
  }
  bench.counters["entries"] = static_cast<double>(entries);
  bench.counters["heap_bytes_per_entry"] = heap_growth / static_cast<double>(entries);
  if (own_bytes > 0) {
    bench.counters["own_bytes_per_entry"] = own_bytes / static_cast<double>(entries);
  }
}

void BM_IndexBytesPerEntry_Fast(benchmark::State& bench) {
  IndexBytesPerEntry<FastIndex>(bench, [](uint32_t n) { return FastIndex(n, 0, 16); });
}
void BM_IndexBytesPerEntry_KvEvent(benchmark::State& bench) {
  IndexBytesPerEntry<KvEventIndex>(bench, [](uint32_t n) { return KvEventIndex(n); });
}
void BM_IndexBytesPerEntry_Estimate(benchmark::State& bench) {
  IndexBytesPerEntry<EstimateIndex>(bench, [](uint32_t n) { return EstimateIndex(n, 0, 16); });
}
void BM_IndexBytesPerEntry_Naive(benchmark::State& bench) {
  IndexBytesPerEntry<NaiveIndex>(bench, [](uint32_t n) { return NaiveIndex(n); });
}
BENCHMARK(BM_IndexBytesPerEntry_Fast)->Iterations(1)->Repetitions(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_IndexBytesPerEntry_KvEvent)->Iterations(1)->Repetitions(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_IndexBytesPerEntry_Estimate)->Iterations(1)->Repetitions(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_IndexBytesPerEntry_Naive)->Iterations(1)->Repetitions(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvc_router::bench
