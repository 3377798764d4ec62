#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "kvc_router/block_hash.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "kvc_router/testing/property_kit.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

using test::OverlapOf;
using test::TestChain;

TEST_CASE("naive index: literal set intersection per worker", "[index]") {
  NaiveIndex index(3);
  const auto a = TestChain(10, 1);
  const auto b = TestChain(6, 2);
  index.Learn(0, 1, a);
  index.Learn(1, 1, std::span<const BlockHash>(a).first(4));
  index.Learn(1, 2, b);
  CHECK(OverlapOf(index, a) == std::vector<uint32_t>{10, 4, 0});
  // Not prefix-closed: the naive index still counts scattered blocks.
  index.ForgetBlocks(0, std::span<const BlockHash>(a).first(1));
  CHECK(OverlapOf(index, a) == std::vector<uint32_t>{9, 4, 0});
  index.ForgetSession(1, 1);
  CHECK(OverlapOf(index, a) == std::vector<uint32_t>{9, 0, 0});
  CHECK(index.resident_blocks(1) == 6);
  // Shared blocks survive until the last session holding them goes.
  index.Learn(2, 3, b);
  index.Learn(2, 4, std::span<const BlockHash>(b).first(3));
  index.ForgetSession(2, 3);
  CHECK(OverlapOf(index, b)[2] == 3);
}

TEST_CASE("estimate index: leading run, session eviction by capacity", "[index]") {
  // 10 blocks of 24 tokens per worker.
  EstimateIndex index(2, 240, 24);
  const auto a = TestChain(6, 1);
  const auto b = TestChain(3, 2);
  const auto c = TestChain(4, 3);
  index.Learn(0, 1, a);
  index.Learn(0, 2, b);
  CHECK(index.resident_blocks(0) == 9);
  CHECK(OverlapOf(index, a) == std::vector<uint32_t>{6, 0});
  index.Learn(0, 3, c);  // 13 > 10: session 1, the oldest, goes
  CHECK_FALSE(index.HoldsSession(0, 1));
  CHECK(index.resident_blocks(0) == 7);
  CHECK(OverlapOf(index, a) == std::vector<uint32_t>{0, 0});
  // Touching session 2 makes session 3 the oldest.
  index.Learn(0, 2, TestChain(5, 2));
  index.Learn(0, 4, TestChain(3, 4));
  CHECK_FALSE(index.HoldsSession(0, 3));
  CHECK(index.HoldsSession(0, 2));
  CHECK(index.resident_blocks(0) <= index.capacity_blocks());
  // A session larger than the whole worker keeps its leading blocks.
  const auto huge = TestChain(25, 9);
  index.Learn(1, 9, huge);
  CHECK(index.resident_blocks(1) == 10);
  CHECK(OverlapOf(index, huge)[1] == 10);
}

TEST_CASE("estimate index: a grown chain adds its tail, a diverged one is replaced", "[index]") {
  EstimateIndex index(1, 0, 24);
  auto chain = TestChain(8, 1);
  index.Learn(0, 1, std::span<const BlockHash>(chain).first(5));
  index.Learn(0, 1, chain);
  CHECK(index.resident_blocks(0) == 8);
  CHECK(OverlapOf(index, chain)[0] == 8);
  auto other = TestChain(3, 7);
  index.Learn(0, 1, other);
  CHECK(index.resident_blocks(0) == 3);
  CHECK(OverlapOf(index, chain)[0] == 0);
  CHECK(OverlapOf(index, other)[0] == 3);
  index.ForgetSession(0, 1);
  CHECK(index.resident_blocks(0) == 0);
}

TEST_CASE("estimate and naive indexes agree on prefix-closed residency",
          "[index][property]") {
  const uint64_t seed = GENERATE(take(300, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  testing::ScenarioRng rng(seed);
  const uint32_t workers = static_cast<uint32_t>(rng.Uniform(1, 8));
  NaiveIndex naive(workers);
  EstimateIndex estimate(workers, 0, 16);
  std::vector<std::vector<BlockHash>> chains;
  const auto root = TestChain(rng.Uniform(0, 5), 777);
  for (int s = 0; s < 6; ++s) {
    auto chain = root;
    const auto own = TestChain(rng.Uniform(1, 30), 100 + s);
    // Chains stay chained: continue from the root's last hash.
    BlockHash parent = chain.empty() ? kChainRootHash : chain.back();
    for (BlockHash h : own) {
      const TokenId token = static_cast<TokenId>(h);
      parent = HashBlock(parent, {&token, 1});
      chain.push_back(parent);
    }
    chains.push_back(chain);
  }
  for (int step = 0; step < 60; ++step) {
    const WorkerId d = static_cast<WorkerId>(rng.Uniform(0, workers - 1));
    const SessionId s = rng.Uniform(0, chains.size() - 1);
    const auto& chain = chains[s];
    if (rng.Chance(70)) {
      const auto prefix = std::span<const BlockHash>(chain).first(rng.Uniform(0, chain.size()));
      naive.Learn(d, s, prefix);
      estimate.Learn(d, s, prefix);
    } else {
      naive.ForgetSession(d, s);
      estimate.ForgetSession(d, s);
    }
    const auto& query = chains[rng.Uniform(0, chains.size() - 1)];
    const auto probe = std::span<const BlockHash>(query).first(rng.Uniform(0, query.size()));
    REQUIRE(OverlapOf(naive, probe) == OverlapOf(estimate, probe));
  }
}

TEST_CASE("estimate index: bisection over root chains finds the leading run (property)",
          "[index][property]") {
  // Sessions fork from shared prefixes of one tree of chains; learning whole
  // chains or their leading blocks, forgetting sessions and evicting by a
  // small capacity keep every worker's blocks prefix-closed, where
  // OverlapOfChain must equal the linear Overlap.
  const uint64_t seed = GENERATE(take(200, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  testing::ScenarioRng rng(seed);
  const uint32_t workers = static_cast<uint32_t>(rng.Uniform(1, 6));
  const uint64_t capacity_blocks = rng.Chance(50) ? 0 : rng.Uniform(4, 120);
  EstimateIndex index(workers, capacity_blocks * 16, 16);
  std::vector<std::vector<BlockHash>> chains = {TestChain(rng.Uniform(1, 40), 1)};
  for (int s = 1; s < 12; ++s) {
    const auto& from = chains[rng.Uniform(0, chains.size() - 1)];
    const size_t keep = rng.Uniform(0, from.size());
    std::vector<BlockHash> chain(from.begin(), from.begin() + static_cast<ptrdiff_t>(keep));
    const auto tail = TestChain(rng.Uniform(1, 40), 50 + static_cast<uint64_t>(s),
                                chain.empty() ? kChainRootHash : chain.back());
    chain.insert(chain.end(), tail.begin(), tail.end());
    chains.push_back(chain);
  }
  std::vector<uint32_t> linear(workers), bisected(workers);
  for (int step = 0; step < 80; ++step) {
    const WorkerId d = static_cast<WorkerId>(rng.Uniform(0, workers - 1));
    const SessionId s = rng.Uniform(0, chains.size() - 1);
    if (rng.Chance(75)) {
      index.Learn(d, s, std::span<const BlockHash>(chains[s]).first(rng.Uniform(0, chains[s].size())));
    } else {
      index.ForgetSession(d, s);
    }
    const auto& query = chains[rng.Uniform(0, chains.size() - 1)];
    const auto probe = std::span<const BlockHash>(query).first(rng.Uniform(0, query.size()));
    index.Overlap(probe, linear);
    index.OverlapOfChain(probe, bisected);
    REQUIRE(linear == bisected);
  }
}

}  // namespace
}  // namespace kvc_router
