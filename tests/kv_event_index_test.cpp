#include "kvc_router/index/kv_event_index.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kvc_router/index/fast_index.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "kvc_router/testing/property_kit.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

using test::OverlapOf;
using test::TestChain;

KvEventBatch Batch(WorkerId worker, uint64_t sequence, std::vector<KvEvent> events) {
  KvEventBatch batch;
  batch.worker = worker;
  batch.sequence = sequence;
  batch.events = std::move(events);
  return batch;
}

BlockStoredEvent Stored(std::span<const BlockHash> hashes, std::optional<BlockHash> parent) {
  BlockStoredEvent event;
  event.block_hashes.assign(hashes.begin(), hashes.end());
  event.parent_block_hash = parent;
  return event;
}

TEST_CASE("stored, removed and cleared events drive residency", "[kv_events]") {
  KvEventIndex index(2);
  const auto chain = TestChain(8, 1);
  const std::span<const BlockHash> all(chain);
  auto report = index.Apply(Batch(0, 0, {Stored(all.first(4), std::nullopt),
                                         Stored(all.subspan(4), chain[3])}));
  REQUIRE(report.ok());
  CHECK(report->events == 2);
  CHECK(report->missed_batches == 0);
  CHECK(report->orphan_blocks == 0);
  REQUIRE(index.Apply(Batch(1, 0, {Stored(all.first(2), std::nullopt)})).ok());
  CHECK(OverlapOf(index, all) == std::vector<uint32_t>{8, 2});
  // Evicting the leaves keeps residency prefix-closed.
  REQUIRE(index.Apply(Batch(0, 1, {BlockRemovedEvent{{chain[7], chain[6]}}})).ok());
  CHECK(OverlapOf(index, all) == std::vector<uint32_t>{6, 2});
  REQUIRE(index.Apply(Batch(0, 2, {AllBlocksClearedEvent{}})).ok());
  CHECK(OverlapOf(index, all) == std::vector<uint32_t>{0, 2});
  CHECK(index.entries() == 2);
  CHECK(index.next_sequence(0) == 3);
}

TEST_CASE("sequence gaps are applied and reported; replays are refused", "[kv_events]") {
  KvEventIndex index(1);
  const auto chain = TestChain(3, 2);
  REQUIRE(index.Apply(Batch(0, 0, {Stored(std::span(chain).first(1), std::nullopt)})).ok());
  auto gap = index.Apply(Batch(0, 4, {Stored(std::span(chain).subspan(2), chain[1])}));
  REQUIRE(gap.ok());
  CHECK(gap->missed_batches == 3);
  CHECK(gap->orphan_blocks == 1);  // its parent was in a lost batch
  CHECK(index.gaps(0) == 1);
  CHECK(index.missed_batches(0) == 3);
  CHECK(index.orphan_blocks(0) == 1);
  const auto replay = index.Apply(Batch(0, 4, {AllBlocksClearedEvent{}}));
  CHECK(replay.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(test::Message(replay.status()).find("out of order") != std::string::npos);
  CHECK(index.Contains(0, chain[0]));  // the refused clear changed nothing
  // A late joiner that first hears batch 5 has missed batches 0..4.
  KvEventIndex late(1);
  auto first = late.Apply(Batch(0, 5, {}));
  REQUIRE(first.ok());
  CHECK(first->missed_batches == 5);
}

TEST_CASE("bad batches are refused whole with a message", "[kv_events]") {
  KvEventIndex index(2);
  const auto chain = TestChain(4, 3);
  auto unknown = index.Apply(Batch(2, 0, {Stored(chain, std::nullopt)}));
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(unknown.status()).find("unknown worker 2") != std::string::npos);
  // A valid event followed by a malformed one: nothing is applied.
  auto empty = index.Apply(Batch(0, 0, {Stored(chain, std::nullopt), BlockStoredEvent{}}));
  CHECK(empty.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(empty.status()).find("event 1") != std::string::npos);
  CHECK_FALSE(index.Contains(0, chain[0]));
  CHECK(index.next_sequence(0) == 0);
  BlockStoredEvent wrong_tokens = Stored(chain, std::nullopt);
  wrong_tokens.block_size = 16;
  wrong_tokens.token_ids.assign(16 * 4 + 1, 1);
  CHECK_FALSE(index.Apply(Batch(0, 0, {wrong_tokens})).ok());
  wrong_tokens.token_ids.assign(16 * 3 + 5, 1);  // a short last page is fine
  CHECK(index.Apply(Batch(0, 0, {wrong_tokens})).ok());
  CHECK_FALSE(index.Apply(Batch(0, 1, {BlockRemovedEvent{}})).ok());
}

// kv-1: inline worker ids are 12 bits, so with 4097 workers the blocks of
// worker 4096 were recorded as worker 0's.
TEST_CASE("more workers than the block table encodes are refused", "[kv_events]") {
  for (uint32_t bad : {0u, kMaxWorkers + 1, 1u << 20}) {
    INFO(bad << " workers");
    const absl::StatusOr<KvEventIndex> index = KvEventIndex::Create(bad);
    CHECK(index.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(test::Message(index.status()).find("num_workers") != std::string::npos);
  }
  REQUIRE(KvEventIndex::Create(kMaxWorkers).ok());
  CHECK(KvEventIndex::Create(kMaxWorkers)->num_workers() == kMaxWorkers);
  CHECK(KvEventIndex::Create(3, {.learn_placements = false}).ok());

  // Built unchecked anyway: worker 4096's batches are refused and change
  // nothing, and its placements are not taken for worker 0's.
  KvEventIndex unchecked(kMaxWorkers + 1);
  const auto chain = TestChain(4, 1);
  const auto refused = unchecked.Apply(Batch(kMaxWorkers, 0, {Stored(chain, std::nullopt)}));
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(refused.status()).find("encodes at most") != std::string::npos);
  CHECK_FALSE(unchecked.Contains(0, chain[0]));
  CHECK(unchecked.next_sequence(kMaxWorkers) == 0);
  CHECK(unchecked.entries() == 0);
  unchecked.Learn(kMaxWorkers, /*session=*/1, chain);
  CHECK_FALSE(unchecked.Contains(0, chain[0]));
  CHECK(OverlapOf(unchecked, chain)[0] == 0);
  CHECK(unchecked.entries() == 0);
  // Workers the table covers still work.
  REQUIRE(unchecked.Apply(Batch(kMaxWorkers - 1, 0, {Stored(chain, std::nullopt)})).ok());
  CHECK(unchecked.Contains(kMaxWorkers - 1, chain[3]));
  CHECK_FALSE(unchecked.Contains(0, chain[3]));
}

TEST_CASE("event, fast and naive indexes agree under random streams", "[kv_events][property]") {
  const uint64_t seed = GENERATE(take(200, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  testing::ScenarioRng rng(seed);
  const uint32_t workers = static_cast<uint32_t>(rng.Uniform(1, 12));
  KvEventIndex events(workers, {.learn_placements = false});
  NaiveIndex naive(workers);
  std::vector<uint64_t> sequence(workers, 0);
  // Each worker caches chains; it removes leaves (keeping prefix closure),
  // sometimes clears everything. The naive index mirrors it per "session" =
  // chain id with the same prefix lengths.
  std::vector<std::vector<BlockHash>> chains;
  for (int c = 0; c < 6; ++c) chains.push_back(TestChain(rng.Uniform(1, 60), 50 + c));
  std::vector<std::vector<size_t>> held(workers, std::vector<size_t>(chains.size(), 0));
  for (int step = 0; step < 60; ++step) {
    const WorkerId d = static_cast<WorkerId>(rng.Uniform(0, workers - 1));
    const size_t c = rng.Uniform(0, chains.size() - 1);
    const auto chain = std::span<const BlockHash>(chains[c]);
    KvEventBatch batch;
    batch.worker = d;
    batch.sequence = sequence[d]++;
    const uint64_t roll = rng.Uniform(0, 99);
    if (roll < 60) {
      const size_t to = rng.Uniform(held[d][c], chain.size());
      if (to > held[d][c]) {
        batch.events.push_back(Stored(chain.subspan(held[d][c], to - held[d][c]),
                                      held[d][c] == 0 ? std::nullopt
                                                      : std::optional(chain[held[d][c] - 1])));
        held[d][c] = to;
      }
    } else if (roll < 95) {
      const size_t to = rng.Uniform(0, held[d][c]);
      if (to < held[d][c]) {
        std::vector<BlockHash> leaves(chain.begin() + to, chain.begin() + held[d][c]);
        batch.events.push_back(BlockRemovedEvent{leaves});
        held[d][c] = to;
      }
    } else {
      batch.events.push_back(AllBlocksClearedEvent{});
      for (auto& h : held[d]) h = 0;
    }
    REQUIRE(events.Apply(batch).ok());
    for (size_t k = 0; k < chains.size(); ++k) {
      naive.Learn(d, k, std::span<const BlockHash>(chains[k]).first(held[d][k]));
    }
    const auto& query = chains[rng.Uniform(0, chains.size() - 1)];
    const auto probe = std::span<const BlockHash>(query).first(rng.Uniform(0, query.size()));
    std::vector<uint32_t> expected(workers);
    naive.Overlap(probe, expected);
    REQUIRE(OverlapOf(events, probe) == expected);
  }
}

TEST_CASE("property kit over the fast and KV-event indexes", "[property][kit]") {
  testing::PropertyOptions options;
  options.seed = test::PropertySeed();
  options.scenarios = test::PropertyScenarios();
  INFO("seed " << options.seed);
  auto make_fast = [](const RouterConfig& c) {
    return FastIndex(c.num_decode_workers, 0, c.block_tokens);
  };
  auto make_events = [](const RouterConfig& c) { return KvEventIndex(c.num_decode_workers); };
  const absl::Status fast = testing::CheckAllProperties<FastIndex>(make_fast, options);
  INFO(fast.message());
  CHECK(fast.ok());
  const absl::Status events = testing::CheckAllProperties<KvEventIndex>(make_events, options);
  INFO(events.message());
  CHECK(events.ok());
}

}  // namespace
}  // namespace kvc_router
