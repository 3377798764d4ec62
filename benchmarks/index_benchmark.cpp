// BM_IndexApplyEvents: KV events applied per second by the KV-event index:
// batches of 64 single-block BlockStored events followed by batches removing
// them again, so the table stays at a steady size (256k background entries).
#include <benchmark/benchmark.h>

#include <vector>

#include "bench_support.hpp"

namespace kvc_router::bench {
namespace {

void BM_IndexApplyEvents(benchmark::State& state) {
  constexpr uint32_t kWorkers = 8;
  constexpr size_t kPerBatch = 64;
  KvEventIndex index(kWorkers, {.hashing = EventHashing::kEngineHashes});
  uint64_t sequence[kWorkers] = {};
  // Background residency.
  for (uint32_t d = 0; d < kWorkers; ++d) {
    KvEventBatch batch{d, sequence[d]++, 0.0, {}};
    BlockStoredEvent stored;
    stored.block_hashes = MakeChain(kBackgroundEntries / kWorkers, 1000 + d);
    batch.events.push_back(std::move(stored));
    (void)index.Apply(batch);
  }
  // The stream: store then remove 64 blocks per worker, round-robin.
  std::vector<KvEventBatch> stream;
  for (uint32_t d = 0; d < kWorkers; ++d) {
    const std::vector<BlockHash> chain = MakeChain(kPerBatch, 5000 + d);
    KvEventBatch store{d, 0, 0.0, {}};
    KvEventBatch remove{d, 0, 0.0, {}};
    for (size_t i = 0; i < kPerBatch; ++i) {
      BlockStoredEvent event;
      event.block_hashes = {chain[i]};
      if (i > 0) event.parent_block_hash = chain[i - 1];
      store.events.push_back(std::move(event));
      BlockRemovedEvent removed;
      removed.block_hashes = {chain[kPerBatch - 1 - i]};
      remove.events.emplace_back(std::in_place_type<BlockRemovedEvent>, std::move(removed));
    }
    stream.push_back(std::move(store));
    stream.push_back(std::move(remove));
  }
  size_t next = 0;
  uint64_t errors = 0;
  for (auto _ : state) {
    KvEventBatch& batch = stream[next];
    batch.sequence = sequence[batch.worker]++;
    errors += index.Apply(batch).ok() ? 0 : 1;
    next = next + 1 == stream.size() ? 0 : next + 1;
  }
  if (errors != 0) state.SkipWithError("an event batch was refused");
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kPerBatch));
  state.counters["bytes_per_entry"] =
      static_cast<double>(index.memory_bytes()) / static_cast<double>(index.entries());
}
BENCHMARK(BM_IndexApplyEvents);

}  // namespace
}  // namespace kvc_router::bench
