#include "kvc_router/index/fast_index.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kvc_router/index/detail/block_table.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "kvc_router/testing/property_kit.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

using test::OverlapOf;
using test::TestChain;

TEST_CASE("block table: insert, erase, growth and backward-shift deletion", "[fast_index]") {
  index_detail::BlockTable table(130);  // three mask words
  // Small consecutive keys collide in the low bits without remixing.
  for (BlockHash key = 0; key < 5000; ++key) CHECK(table.Insert(key, key % 130));
  CHECK_FALSE(table.Insert(17, 17));
  CHECK(table.Insert(17, 129));
  CHECK(table.size() == 5000);
  for (BlockHash key = 0; key < 5000; key += 2) CHECK(table.Erase(key, key % 130));
  CHECK_FALSE(table.Erase(0, 0));
  CHECK(table.size() == 2500);
  for (BlockHash key = 0; key < 5000; ++key) {
    INFO(key);
    CHECK(table.Contains(key, key % 130) == (key % 2 == 1));
  }
  CHECK(table.Contains(17, 129));
  size_t held_by_129 = 1;  // key 17
  for (BlockHash key = 129; key < 5000; key += 130) held_by_129 += key % 2;
  CHECK(table.EraseWorker(129) == held_by_129);
  CHECK_FALSE(table.Contains(17, 129));
  CHECK(table.Contains(17, 17));
}

TEST_CASE("block table: worker sets move between inline and pooled forms", "[fast_index]") {
  for (uint32_t workers : {64u, 65u, 300u, 4096u}) {
    INFO(workers << " workers");
    index_detail::BlockTable table(workers);
    testing::ScenarioRng rng(workers);
    std::vector<bool> held(workers, false);
    for (int step = 0; step < 4000; ++step) {
      const WorkerId d = static_cast<WorkerId>(rng.Uniform(0, std::min(workers, 9u) - 1) *
                                               (workers / 9 + 1) % workers);
      if (rng.Chance(55)) {
        CHECK(table.Insert(99, d) == !held[d]);
        held[d] = true;
      } else {
        CHECK(table.Erase(99, d) == held[d]);
        held[d] = false;
      }
      for (WorkerId w = 0; w < workers; w += (workers / 9 + 1)) REQUIRE(table.Contains(99, w) == held[w]);
      const bool any = std::find(held.begin(), held.end(), true) != held.end();
      REQUIRE(table.size() == (any ? 1u : 0u));
      std::vector<uint32_t> runs(workers, 0);
      const BlockHash prefix[] = {99};
      table.MatchedRuns(prefix, runs);
      for (WorkerId w = 0; w < workers; ++w) REQUIRE(runs[w] == (held[w] ? 1u : 0u));
    }
  }
}

// kv-1: inline worker ids are 12 bits, so worker 4096 aliased worker 0.
TEST_CASE("block table: workers past the 12-bit encoding are never aliased", "[fast_index]") {
  CHECK(index_detail::BlockTable::CheckNumWorkers(kMaxWorkers, "T").ok());
  CHECK(index_detail::BlockTable::CheckNumWorkers(kMaxWorkers + 1, "T").code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(index_detail::BlockTable::CheckNumWorkers(0, "T").code() ==
        absl::StatusCode::kInvalidArgument);
  index_detail::BlockTable table(kMaxWorkers + 1);
  CHECK_FALSE(table.Covers(kMaxWorkers));
  CHECK_FALSE(table.Insert(5, kMaxWorkers));
  CHECK_FALSE(table.Contains(5, 0));
  CHECK_FALSE(table.Contains(5, kMaxWorkers));
  CHECK(table.size() == 0);
  CHECK(table.Insert(5, kMaxWorkers - 1));
  CHECK_FALSE(table.Contains(5, 0));
  CHECK(table.EraseWorker(kMaxWorkers) == 0);
  CHECK_FALSE(table.Erase(5, kMaxWorkers));
  CHECK(table.Contains(5, kMaxWorkers - 1));
}

TEST_CASE("fast index: more workers than the encoding supports are refused", "[fast_index]") {
  const auto refused = FastIndex::Create(kMaxWorkers + 1, 0, 16);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(refused.status()).find("FastIndex") != std::string::npos);
  CHECK(test::Message(refused.status()).find("num_workers") != std::string::npos);
  CHECK(FastIndex::Create(0, 0, 16).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(FastIndex::Create(kMaxWorkers, 0, 16).ok());

  // Built unchecked anyway: placements on worker 4096 are ignored, not
  // credited to worker 0.
  FastIndex unchecked(kMaxWorkers + 1, 0, 16);
  const auto chain = TestChain(6, 1);
  unchecked.Learn(kMaxWorkers, /*session=*/1, chain);
  const std::vector<uint32_t> overlap = OverlapOf(unchecked, chain);
  CHECK(overlap[0] == 0);
  CHECK(overlap[kMaxWorkers] == 0);
  CHECK(unchecked.entries() == 0);
  CHECK_FALSE(unchecked.Contains(0, chain[0]));
  CHECK_FALSE(unchecked.HoldsSession(kMaxWorkers, 1));
  unchecked.Learn(kMaxWorkers - 1, /*session=*/1, chain);
  CHECK(OverlapOf(unchecked, chain)[kMaxWorkers - 1] == 6);
  CHECK(OverlapOf(unchecked, chain)[0] == 0);
}

TEST_CASE("fast index: runs per worker from one bisection", "[fast_index]") {
  FastIndex index(5, 0, 16);
  const auto chain = TestChain(1000, 1);
  const std::span<const BlockHash> all(chain);
  index.Learn(0, 1, all);
  index.Learn(1, 2, all.first(1));
  index.Learn(2, 3, all.first(999));
  index.Learn(3, 4, all.first(517));
  CHECK(OverlapOf(index, all) == std::vector<uint32_t>{1000, 1, 999, 517, 0});
  CHECK(OverlapOf(index, all.first(1)) == std::vector<uint32_t>{1, 1, 1, 1, 0});
  CHECK(OverlapOf(index, all.first(0)) == std::vector<uint32_t>{0, 0, 0, 0, 0});
  CHECK(OverlapOf(index, TestChain(10, 9)) == std::vector<uint32_t>{0, 0, 0, 0, 0});
  CHECK(index.entries() == 1000 + 1 + 999 + 517);
}

TEST_CASE("fast index: shared blocks are counted once per worker and survive", "[fast_index]") {
  FastIndex index(2, 0, 16);
  const auto root = TestChain(10, 1);
  auto a = root;
  auto a_tail = TestChain(5, 2, root.back());
  a.insert(a.end(), a_tail.begin(), a_tail.end());
  index.Learn(0, 1, root);
  index.Learn(0, 2, a);
  CHECK(index.entries() == 15);
  index.ForgetSession(0, 1);
  CHECK(OverlapOf(index, a)[0] == 15);  // session 2 still holds the root
  index.ForgetSession(0, 2);
  CHECK(OverlapOf(index, a)[0] == 0);
  CHECK(index.entries() == 0);
}

TEST_CASE("fast index: capacity evicts whole sessions, least recent first", "[fast_index]") {
  FastIndex index(1, 10 * 16, 16);
  index.Learn(0, 1, TestChain(6, 1));
  index.Learn(0, 2, TestChain(3, 2));
  index.Learn(0, 3, TestChain(4, 3));
  CHECK_FALSE(index.HoldsSession(0, 1));
  CHECK(index.resident_blocks(0) == 7);
  CHECK(index.entries() == 7);
  index.Learn(0, 9, TestChain(40, 9));
  CHECK(index.resident_blocks(0) == 10);
  CHECK(index.HoldsSession(0, 9));
  CHECK(index.entries() == 10);
}

TEST_CASE("fast index: memory per resident entry stays small", "[fast_index]") {
  FastIndex index(8, 0, 16);
  for (SessionId s = 0; s < 256; ++s) index.Learn(s % 8, s, TestChain(1024, s));
  REQUIRE(index.entries() == 256 * 1024);
  const double per_entry = static_cast<double>(index.memory_bytes()) / index.entries();
  INFO("bytes per entry " << per_entry);
  CHECK(per_entry <= 48.0);
  // Many workers: most blocks on one worker still cost one 16-byte slot.
  FastIndex wide(256, 0, 16);
  for (SessionId s = 0; s < 256; ++s) wide.Learn(static_cast<WorkerId>(s), s, TestChain(1024, s));
  const double wide_per_entry = static_cast<double>(wide.memory_bytes()) / wide.entries();
  INFO("bytes per entry at 256 workers " << wide_per_entry);
  CHECK(wide_per_entry <= 48.0);
}

TEST_CASE("fast, estimate and naive indexes agree on random placements",
          "[fast_index][property]") {
  const uint64_t seed = GENERATE(take(300, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  testing::ScenarioRng rng(seed);
  const uint32_t workers = static_cast<uint32_t>(rng.Uniform(1, 70));
  NaiveIndex naive(workers);
  EstimateIndex estimate(workers, 0, 16);
  FastIndex fast(workers, 0, 16);
  const auto root = TestChain(rng.Uniform(0, 5), 777);
  std::vector<std::vector<BlockHash>> chains;
  for (int s = 0; s < 8; ++s) {
    auto chain = root;
    const auto own = TestChain(rng.Uniform(1, 80), 100 + s, root.empty() ? kChainRootHash : root.back());
    chain.insert(chain.end(), own.begin(), own.end());
    chains.push_back(chain);
  }
  for (int step = 0; step < 80; ++step) {
    const WorkerId d = static_cast<WorkerId>(rng.Uniform(0, workers - 1));
    const SessionId s = rng.Uniform(0, chains.size() - 1);
    if (rng.Chance(70)) {
      const auto prefix = std::span<const BlockHash>(chains[s]).first(rng.Uniform(0, chains[s].size()));
      naive.Learn(d, s, prefix);
      estimate.Learn(d, s, prefix);
      fast.Learn(d, s, prefix);
    } else {
      naive.ForgetSession(d, s);
      estimate.ForgetSession(d, s);
      fast.ForgetSession(d, s);
    }
    const auto& query = chains[rng.Uniform(0, chains.size() - 1)];
    const auto probe = std::span<const BlockHash>(query).first(rng.Uniform(0, query.size()));
    const auto expected = OverlapOf(naive, probe);
    REQUIRE(OverlapOf(estimate, probe) == expected);
    REQUIRE(OverlapOf(fast, probe) == expected);
  }
}

}  // namespace
}  // namespace kvc_router
