// Fuzz target: SessionHasher. Incremental hashing (turns and context added
// in arbitrary pieces) equals hashing the whole prompt at once, and every
// turn's Request is consistent (prefix = blocks before the turn, append =
// carried-over partial block + new tokens). SessionHasher::Create refuses
// block sizes outside 1..kMaxBlockTokens.
#include <cstdint>
#include <vector>

#include "fuzz_input.hpp"
#include "kvc_router/block_hash.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvc_fuzz::FuzzInput in(data, size);
  const uint32_t raw_block = in.U32();
  auto checked = kvc_router::SessionHasher::Create(7, raw_block);
  FUZZ_CHECK(checked.ok() == (raw_block >= 1 && raw_block <= kvc_router::kMaxBlockTokens));
  const uint32_t block_tokens = 1 + raw_block % 64;
  kvc_router::SessionHasher hasher(7, block_tokens);
  std::vector<kvc_router::TokenId> all;
  uint32_t turns = 0;
  while (!in.empty()) {
    const bool is_turn = in.U8() % 2 == 0;
    std::vector<kvc_router::TokenId> piece(in.U8() % 200);
    for (auto& token : piece) token = in.U16() % 50;  // few distinct tokens: collisions of content
    const size_t blocks_before = hasher.hashes().size();
    const size_t pending_before = hasher.pending_tokens();
    all.insert(all.end(), piece.begin(), piece.end());
    if (is_turn) {
      const kvc_router::Request request = hasher.BeginTurn(piece);
      FUZZ_CHECK(request.turn == turns);
      ++turns;
      FUZZ_CHECK(request.prefix_hashes.size() == blocks_before);
      FUZZ_CHECK(request.append_tokens == pending_before + piece.size());
      FUZZ_CHECK(request.appended_hashes.size() == hasher.hashes().size() - blocks_before);
      FUZZ_CHECK(request.appended_hashes.size() <= request.append_tokens / block_tokens);
      FUZZ_CHECK(request.input_tokens(block_tokens) == all.size());
    } else {
      hasher.AppendContext(piece);
    }
    FUZZ_CHECK(hasher.total_tokens() == all.size());
    FUZZ_CHECK(hasher.pending_tokens() == all.size() % block_tokens);
  }
  const std::vector<kvc_router::BlockHash> whole =
      kvc_router::ChainedBlockHashes(all, block_tokens);
  FUZZ_CHECK(whole.size() == hasher.hashes().size());
  for (size_t i = 0; i < whole.size(); ++i) FUZZ_CHECK(whole[i] == hasher.hashes()[i]);
  return 0;
}
