#include "kvc_router/index/kv_event_index.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kvc_router/index/fast_index.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "kvc_router/route.hpp"
#include "kvc_router/routing_state.hpp"
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

// An index that takes the engines' hashes as router hashes (the tests below
// that feed TestChain hashes directly).
constexpr KvEventIndex::Options kEngineHashes{.hashing = EventHashing::kEngineHashes};

BlockStoredEvent Stored(std::span<const BlockHash> hashes, std::optional<BlockHash> parent) {
  BlockStoredEvent event;
  event.block_hashes.assign(hashes.begin(), hashes.end());
  event.parent_block_hash = parent;
  return event;
}

TEST_CASE("stored, removed and cleared events drive residency", "[kv_events]") {
  KvEventIndex index(2, kEngineHashes);
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

TEST_CASE("batches after a gap are held back until the replay fills it", "[kv_events]") {
  KvEventIndex index(1, kEngineHashes);
  const auto chain = TestChain(4, 2);
  const std::span<const BlockHash> all(chain);
  REQUIRE(index.Apply(Batch(0, 0, {Stored(all.first(1), std::nullopt)})).ok());
  // Batches 1 and 2 are lost; 3 arrives and waits.
  auto held = index.Apply(Batch(0, 3, {Stored(all.subspan(3, 1), chain[2])}));
  REQUIRE(held.ok());
  CHECK(held->held_back);
  CHECK(held->applied_batches == 0);
  CHECK(held->missed_batches == 2);
  CHECK(held->gap_from == 1);
  CHECK(held->gap_batches == 2);
  CHECK_FALSE(index.Contains(0, chain[3]));
  CHECK(index.next_sequence(0) == 1);
  CHECK(index.held_batches(0) == 1);
  CHECK(index.gaps(0) == 1);
  // The replay delivers 1: applied, 3 still waits for 2.
  auto one = index.Apply(Batch(0, 1, {Stored(all.subspan(1, 1), chain[0])}));
  REQUIRE(one.ok());
  CHECK_FALSE(one->held_back);
  CHECK(one->applied_batches == 1);
  CHECK(one->gap_from == 2);
  CHECK(one->gap_batches == 1);
  CHECK(index.Contains(0, chain[1]));
  CHECK_FALSE(index.Contains(0, chain[3]));
  // Then 2: 2 and the held 3 are applied, in order, with no orphan.
  auto two = index.Apply(Batch(0, 2, {Stored(all.subspan(2, 1), chain[1])}));
  REQUIRE(two.ok());
  CHECK(two->applied_batches == 2);
  CHECK(two->events == 2);
  CHECK(two->gap_batches == 0);
  CHECK(two->orphan_blocks == 0);
  CHECK(OverlapOf(index, all) == std::vector<uint32_t>{4});
  CHECK(index.next_sequence(0) == 4);
  CHECK(index.held_batches(0) == 0);
  CHECK(index.orphan_blocks(0) == 0);
  // Replays of applied or held batches are refused and change nothing.
  const auto replay = index.Apply(Batch(0, 2, {AllBlocksClearedEvent{}}));
  CHECK(replay.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(test::Message(replay.status()).find("out of order") != std::string::npos);
  CHECK(index.Contains(0, chain[0]));
  REQUIRE(index.Apply(Batch(0, 6, {})).ok());
  CHECK(index.Apply(Batch(0, 6, {AllBlocksClearedEvent{}})).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(index.Contains(0, chain[0]));
}

TEST_CASE("an abandoned gap clears the worker's residency and says so", "[kv_events]") {
  KvEventIndex index(2, kEngineHashes);
  const auto chain = TestChain(3, 9);
  const std::span<const BlockHash> all(chain);
  REQUIRE(index.Apply(Batch(0, 0, {Stored(all.first(2), std::nullopt)})).ok());
  REQUIRE(index.Apply(Batch(1, 0, {Stored(all.first(2), std::nullopt)})).ok());
  auto held = index.Apply(Batch(0, 5, {Stored(all.first(1), std::nullopt)}));
  REQUIRE(held.ok());
  CHECK(held->held_back);
  CHECK(index.Contains(0, chain[1]));  // nothing changed yet
  CHECK(index.AbandonGap(1).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(index.AbandonGap(7).status().code() == absl::StatusCode::kInvalidArgument);
  auto abandoned = index.AbandonGap(0);
  REQUIRE(abandoned.ok());
  CHECK(abandoned->residency_cleared);
  CHECK(abandoned->applied_batches == 1);
  CHECK(abandoned->gap_batches == 0);
  CHECK(index.abandoned_gaps(0) == 1);
  CHECK(OverlapOf(index, all) == std::vector<uint32_t>{1, 2});  // worker 1 untouched
  CHECK(index.next_sequence(0) == 6);
  // Too many held batches abandon the gap by themselves.
  auto small = KvEventIndex::Create(1, {.hashing = EventHashing::kEngineHashes,
                                        .max_held_batches = 2});
  REQUIRE(small.ok());
  REQUIRE(small->Apply(Batch(0, 0, {Stored(all.first(1), std::nullopt)})).ok());
  REQUIRE(small->Apply(Batch(0, 2, {})).ok());
  REQUIRE(small->Apply(Batch(0, 3, {})).ok());
  CHECK(small->Contains(0, chain[0]));
  auto overflow = small->Apply(Batch(0, 4, {}));
  REQUIRE(overflow.ok());
  CHECK(overflow->residency_cleared);
  CHECK(overflow->applied_batches == 3);
  CHECK_FALSE(small->Contains(0, chain[0]));
  CHECK(small->next_sequence(0) == 5);
  // A late joiner that first hears batch 5 waits for 0..4.
  KvEventIndex late(1, kEngineHashes);
  auto first = late.Apply(Batch(0, 5, {}));
  REQUIRE(first.ok());
  CHECK(first->held_back);
  CHECK(first->gap_from == 0);
  CHECK(first->gap_batches == 5);
}

TEST_CASE("bad batches are refused whole with a message", "[kv_events]") {
  KvEventIndex index(2, kEngineHashes);
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
  KvEventIndex unchecked(kMaxWorkers + 1, kEngineHashes);
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
  KvEventIndex events(workers, {.learn_placements = false,
                                .hashing = EventHashing::kEngineHashes});
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

// --- re-hashing engine blocks from their tokens (EventHashing::kRehashTokens)

std::vector<TokenId> Tokens(size_t n, uint64_t salt) {
  std::vector<TokenId> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<TokenId>((salt * 7919 + i * 31) % 50000);
  return tokens;
}

// A BlockStored as an engine sends it: its own hashes, the router never saw them.
BlockStoredEvent EngineStored(std::vector<BlockHash> engine_hashes,
                              std::optional<BlockHash> parent, std::span<const TokenId> tokens,
                              uint32_t block_size, std::string lora_name = "",
                              std::string medium = "GPU") {
  BlockStoredEvent event;
  event.block_hashes = std::move(engine_hashes);
  event.parent_block_hash = parent;
  event.token_ids.assign(tokens.begin(), tokens.end());
  event.block_size = block_size;
  event.lora_name = std::move(lora_name);
  event.medium = std::move(medium);
  return event;
}

TEST_CASE("stored blocks are re-hashed from their tokens with the router's chain",
          "[kv_events][rehash]") {
  auto index = KvEventIndex::Create(2, {.block_tokens = 16});
  REQUIRE(index.ok());
  const auto tokens = Tokens(16 * 5, 1);
  const std::span<const TokenId> all(tokens);
  const auto router = ChainedBlockHashes(tokens, 16);
  REQUIRE(router.size() == 5);
  // Engine hashes look nothing like the router's (e.g. sha256 cut to 64 bits).
  const std::vector<BlockHash> engine = {0xE0, 0xE1, 0xE2, 0xE3, 0xE4};
  auto report = index->Apply(Batch(
      0, 0, {EngineStored({engine[0], engine[1]}, std::nullopt, all.first(32), 16),
             EngineStored({engine[2], engine[3], engine[4]}, engine[1], all.subspan(32), 16)}));
  REQUIRE(report.ok());
  CHECK(report->orphan_blocks == 0);
  for (size_t i = 0; i < 5; ++i) {
    CHECK(index->Contains(0, router[i]));
    CHECK_FALSE(index->Contains(0, engine[i]));
    CHECK(index->RouterHashOf(0, engine[i]) == router[i]);
  }
  CHECK(OverlapOf(*index, router) == std::vector<uint32_t>{5, 0});
  // Removals name engine hashes; the index maps them back.
  REQUIRE(index->Apply(Batch(0, 1, {BlockRemovedEvent{{engine[4], engine[3]}, "GPU"},
                                    BlockRemovedEvent{{0x777}, ""}})).ok());
  CHECK(OverlapOf(*index, router) == std::vector<uint32_t>{3, 0});
  CHECK(index->unknown_removals(0) == 1);
  CHECK_FALSE(index->RouterHashOf(0, engine[4]).has_value());
  // A child whose parent the worker does not hold cannot be re-hashed.
  auto orphan = index->Apply(Batch(1, 0, {EngineStored({engine[2]}, engine[1],
                                                       all.subspan(32, 16), 16)}));
  REQUIRE(orphan.ok());
  CHECK(orphan->orphan_blocks == 1);
  CHECK(index->orphan_blocks(1) == 1);
  CHECK(OverlapOf(*index, router) == std::vector<uint32_t>{3, 0});
  REQUIRE(index->Apply(Batch(0, 2, {AllBlocksClearedEvent{}})).ok());
  CHECK(OverlapOf(*index, router) == std::vector<uint32_t>{0, 0});
  CHECK_FALSE(index->RouterHashOf(0, engine[0]).has_value());
  CHECK(index->entries() == 0);
}

TEST_CASE("an engine block size other than the router's is refused", "[kv_events][rehash]") {
  auto index = KvEventIndex::Create(1, {.block_tokens = 24});
  REQUIRE(index.ok());
  const auto tokens = Tokens(32, 2);
  const auto refused = index->Apply(Batch(0, 0, {EngineStored({1, 2}, std::nullopt, tokens, 16)}));
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(refused.status()).find("block_size 16") != std::string::npos);
  CHECK(test::Message(refused.status()).find("24") != std::string::npos);
  CHECK(index->entries() == 0);
  CHECK(index->next_sequence(0) == 0);
  // Without tokens nothing can be re-hashed.
  const auto no_tokens = index->Apply(Batch(0, 0, {EngineStored({1}, std::nullopt, {}, 24)}));
  CHECK(test::Message(no_tokens.status()).find("without token_ids") != std::string::npos);
  CHECK(KvEventIndex::Create(1, {.block_tokens = 0}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("LoRA adapters never share blocks; other media are not residency",
          "[kv_events][rehash]") {
  auto index = KvEventIndex::Create(3, {.block_tokens = 16});
  REQUIRE(index.ok());
  const auto tokens = Tokens(48, 3);
  // Same tokens, same engine hashes even: base model on 0, adapter on 1.
  REQUIRE(index->Apply(Batch(0, 0, {EngineStored({1, 2, 3}, std::nullopt, tokens, 16)})).ok());
  REQUIRE(index->Apply(Batch(1, 0, {EngineStored({1, 2, 3}, std::nullopt, tokens, 16,
                                                 "sql-lora")})).ok());
  // CPU copies are tracked apart, never as residency.
  auto cpu = index->Apply(Batch(2, 0, {EngineStored({1, 2, 3}, std::nullopt, tokens, 16, "",
                                                    "CPU")}));
  REQUIRE(cpu.ok());
  CHECK(cpu->non_gpu_blocks == 3);
  CHECK(index->non_gpu_blocks(2) == 3);
  const auto base = ChainedBlockHashes(tokens, 16);
  std::vector<BlockHash> adapter;
  AppendChainedHashes(ChainRootFor("sql-lora"), tokens, 16, adapter);
  CHECK(OverlapOf(*index, base) == std::vector<uint32_t>{3, 0, 0});
  CHECK(OverlapOf(*index, adapter) == std::vector<uint32_t>{0, 3, 0});
  // An older engine's lora_id salts too.
  BlockStoredEvent by_id = EngineStored({9}, std::nullopt, std::span(tokens).first(16), 16);
  by_id.lora_id = 4;
  REQUIRE(index->Apply(Batch(2, 1, {by_id})).ok());
  CHECK(OverlapOf(*index, base) == std::vector<uint32_t>{3, 0, 0});
  // A CPU removal leaves the GPU copy alone.
  REQUIRE(index->Apply(Batch(0, 1, {BlockRemovedEvent{{3}, "CPU"}})).ok());
  CHECK(OverlapOf(*index, base) == std::vector<uint32_t>{3, 0, 0});
  // A SessionHasher rooted at the adapter finds the adapter's blocks.
  auto hasher = SessionHasher::Create(1, 16, ChainRootFor("sql-lora"));
  REQUIRE(hasher.ok());
  hasher->AppendContext(tokens);
  CHECK(std::vector<BlockHash>(hasher->hashes().begin(), hasher->hashes().end()) == adapter);
}

TEST_CASE("a forgotten worker loses its engine-hash map and held batches", "[kv_events][rehash]") {
  auto index = KvEventIndex::Create(2, {.block_tokens = 16});
  REQUIRE(index.ok());
  const auto tokens = Tokens(32, 11);
  REQUIRE(index->Apply(Batch(0, 0, {EngineStored({1, 2}, std::nullopt, tokens, 16)})).ok());
  REQUIRE(index->Apply(Batch(0, 3, {BlockRemovedEvent{{2}, ""}})).ok());  // held: gap 1..2
  CHECK(index->held_batches(0) == 1);
  index->ForgetWorker(0);
  CHECK(index->held_batches(0) == 0);
  CHECK(index->next_sequence(0) == 0);
  CHECK_FALSE(index->RouterHashOf(0, 1).has_value());
  CHECK(index->event_blocks(0) == 0);
  CHECK(OverlapOf(*index, ChainedBlockHashes(tokens, 16)) == std::vector<uint32_t>{0, 0});
  index->ResizeWorkers(3);
  REQUIRE(index->Apply(Batch(2, 0, {EngineStored({1, 2}, std::nullopt, tokens, 16)})).ok());
  CHECK(OverlapOf(*index, ChainedBlockHashes(tokens, 16)) == std::vector<uint32_t>{0, 0, 2});
}

TEST_CASE("routing a session whose prompt tokens an engine published finds the overlap",
          "[kv_events][rehash][property]") {
  const uint64_t seed = GENERATE(take(100, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  testing::ScenarioRng rng(seed);
  const uint32_t block = static_cast<uint32_t>(rng.Uniform(1, 32));
  RouterConfig config;
  config.num_decode_workers = static_cast<uint32_t>(rng.Uniform(2, 8));
  config.block_tokens = block;
  auto index = KvEventIndex::Create(config.num_decode_workers,
                                    {.learn_placements = false, .block_tokens = block});
  REQUIRE(index.ok());
  auto state = RoutingState<KvEventIndex>::Create(config, std::move(*index));
  REQUIRE(state.ok());
  const WorkerId holder = static_cast<WorkerId>(rng.Uniform(0, config.num_decode_workers - 1));
  const auto prompt = Tokens(rng.Uniform(block, 40 * block), rng.Next() % 1000);
  const size_t full = prompt.size() / block;
  const size_t published = rng.Uniform(1, full);
  // The engine publishes the first `published` blocks in random pieces,
  // with hashes of its own.
  std::vector<KvEvent> events;
  std::optional<BlockHash> parent;
  for (size_t at = 0; at < published;) {
    const size_t n = rng.Uniform(1, published - at);
    std::vector<BlockHash> engine;
    for (size_t i = 0; i < n; ++i) engine.push_back(rng.Next());
    events.push_back(EngineStored(engine, parent,
                                  std::span(prompt).subspan(at * block, n * block), block));
    parent = engine.back();
    at += n;
  }
  const auto applied = (*state)->WithIndex(
      [&](KvEventIndex& idx) { return idx.Apply(Batch(holder, 0, std::move(events))); });
  REQUIRE(applied.ok());
  auto hasher = SessionHasher::Create(42, block);
  REQUIRE(hasher.ok());
  const Request request = hasher->BeginTurn(prompt);
  // The request's prefix is empty on a first turn; its blocks are appended.
  std::vector<BlockHash> chain(hasher->hashes().begin(), hasher->hashes().end());
  const auto overlap = (*state)->ReadIndex(
      [&](const KvEventIndex& idx) { return OverlapOf(idx, chain); });
  for (WorkerId d = 0; d < config.num_decode_workers; ++d) {
    CHECK(overlap[d] == (d == holder ? published : 0));
  }
  // A later turn whose prefix is the prompt is routed to the holder.
  hasher->AppendContext(Tokens(3, 5));
  const Request next = hasher->BeginTurn(Tokens(block, 6));
  CHECK(next.prefix_hashes.size() >= published);
  CHECK(Route(**state, next).worker == holder);
  (void)request;
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
