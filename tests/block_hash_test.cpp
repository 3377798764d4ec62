#include "kvc_router/block_hash.hpp"

#include <catch2/catch.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "xxh3_reference.hpp"

namespace kvc_router {
namespace {

std::vector<TokenId> Iota(size_t n, TokenId first = 1) {
  std::vector<TokenId> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

TEST_CASE("golden hashes never change silently", "[block_hash]") {
  // Tokens 1..100 in 24-token blocks: four full blocks, 4 tokens left over.
  const std::vector<BlockHash> hashes = ChainedBlockHashes(Iota(100), 24);
  REQUIRE(hashes.size() == 4);
  CHECK(hashes[0] == 0x4c0d45b0c68c6d03ULL);
  CHECK(hashes[1] == 0xec3b4ed72865fe57ULL);
  CHECK(hashes[2] == 0xf633189a15e40589ULL);
  CHECK(hashes[3] == 0xdcbeaa082be4892cULL);
  const TokenId zero = 0;
  CHECK(HashBlock(kChainRootHash, {&zero, 1}) == 0x11fb676b7d28003eULL);
  CHECK(HashBlock(kChainRootHash, {}) == 0x5a878444b7db98d5ULL);
}

TEST_CASE("a block hash is XXH3-64 of the little-endian tokens seeded by its parent",
          "[block_hash]") {
  const std::vector<TokenId> tokens = Iota(48, 1000);
  const std::vector<BlockHash> hashes = ChainedBlockHashes(tokens, 24);
  REQUIRE(hashes.size() == 2);
  CHECK(hashes[0] == test::ReferenceXxh3(tokens.data(), 24, kChainRootHash));
  CHECK(hashes[1] == test::ReferenceXxh3(tokens.data() + 24, 24, hashes[0]));
}

TEST_CASE("a hash names its whole prefix", "[block_hash]") {
  std::vector<TokenId> a = Iota(72);
  std::vector<TokenId> b = a;
  b[3] = 999;  // differs only in block 0
  const auto ha = ChainedBlockHashes(a, 24);
  const auto hb = ChainedBlockHashes(b, 24);
  for (size_t i = 0; i < 3; ++i) CHECK(ha[i] != hb[i]);
  std::vector<TokenId> c = a;
  c[60] = 999;  // differs only in block 2
  const auto hc = ChainedBlockHashes(c, 24);
  CHECK(ha[0] == hc[0]);
  CHECK(ha[1] == hc[1]);
  CHECK(ha[2] != hc[2]);
}

TEST_CASE("partial blocks get no hash; block_tokens 0 hashes nothing", "[block_hash]") {
  CHECK(ChainedBlockHashes(Iota(23), 24).empty());
  CHECK(ChainedBlockHashes(Iota(24), 24).size() == 1);
  CHECK(ChainedBlockHashes(Iota(100), 0).empty());
}

// hash-1: the constructor reserved block_tokens tokens up front, so a
// block_tokens of 2.9e9 asked for 11.6 GB before hashing anything.
TEST_CASE("SessionHasher::Create refuses block sizes outside 1..kMaxBlockTokens",
          "[block_hash]") {
  for (uint32_t bad : {0u, kMaxBlockTokens + 1, 2'900'000'000u}) {
    INFO("block_tokens " << bad);
    const absl::StatusOr<SessionHasher> hasher = SessionHasher::Create(/*session=*/3, bad);
    CHECK(hasher.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(hasher.status().message()).find("block_tokens") != std::string::npos);
  }
  absl::StatusOr<SessionHasher> largest = SessionHasher::Create(/*session=*/3, kMaxBlockTokens);
  REQUIRE(largest.ok());
  const std::vector<TokenId> context = Iota(kMaxBlockTokens + 5);
  const Request turn = largest->BeginTurn(context);
  CHECK(turn.prefix_hashes.empty());
  REQUIRE(turn.appended_hashes.size() == 1);
  CHECK(turn.appended_hashes[0] == ChainedBlockHashes(context, kMaxBlockTokens)[0]);
  CHECK(largest->pending_tokens() == 5);
}

TEST_CASE("the unchecked constructor stays cheap and correct for huge blocks", "[block_hash]") {
  SessionHasher hasher(/*session=*/4, 2'900'000'000u);
  const std::vector<TokenId> tokens = Iota(100);
  const Request turn = hasher.BeginTurn(tokens);
  CHECK(turn.append_tokens == 100);
  CHECK(turn.appended_hashes.empty());
  CHECK(hasher.pending_tokens() == 100);
  CHECK(hasher.total_tokens() == 100);
}

TEST_CASE("incremental hashing equals hashing the whole context", "[block_hash][property]") {
  const uint64_t seed = GENERATE(take(200, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  uint64_t state = seed;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  const uint32_t block_tokens = static_cast<uint32_t>(1 + next() % 40);
  SessionHasher hasher(/*session=*/9, block_tokens);
  std::vector<TokenId> context;
  for (int turn = 0; turn < 8; ++turn) {
    std::vector<TokenId> output(next() % 70);
    for (auto& t : output) t = static_cast<TokenId>(next());
    hasher.AppendContext(output);
    context.insert(context.end(), output.begin(), output.end());

    std::vector<TokenId> fresh(next() % 90);
    for (auto& t : fresh) t = static_cast<TokenId>(next());
    const uint64_t before_tokens = context.size();
    const size_t prefix_blocks = before_tokens / block_tokens;
    const Request request = hasher.BeginTurn(fresh);
    context.insert(context.end(), fresh.begin(), fresh.end());

    const std::vector<BlockHash> whole = ChainedBlockHashes(context, block_tokens);
    REQUIRE(hasher.hashes().size() == whole.size());
    CHECK(std::equal(whole.begin(), whole.end(), hasher.hashes().begin()));
    CHECK(request.session == 9);
    CHECK(request.turn == static_cast<uint32_t>(turn));
    CHECK(request.prefix_hashes.size() == prefix_blocks);
    CHECK(request.input_tokens(block_tokens) == context.size());
    CHECK(request.append_tokens == context.size() - prefix_blocks * block_tokens);
    CHECK(request.prefix_hashes.size() + request.appended_hashes.size() == whole.size());
    CHECK(hasher.pending_tokens() == context.size() % block_tokens);
    CHECK(hasher.total_tokens() == context.size());
  }
}

}  // namespace
}  // namespace kvc_router
