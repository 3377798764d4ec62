// kvc_router/block_hash.hpp
//
// Chained KV-block hashing. A context of tokens is cut into blocks of
// `block_tokens` tokens; block i's hash is XXH3-64 of its tokens seeded with
// block i-1's hash (the first block is seeded with `kChainRootHash`), so one
// hash names the whole prefix that ends at that block, the way vLLM, SGLang,
// Dynamo and Mooncake name cache blocks. A trailing partial block has no hash
// until it fills.
//
// Hashes leave the process (they are compared with what workers report), so
// they use a fixed seed and a fixed byte order (token ids as little-endian
// uint32) and never absl::Hash. tests/block_hash_test.cpp pins golden values.
//
// `SessionHasher` keeps one session's chain between turns and hashes only what
// each turn appends:
//
//   absl::StatusOr<kvc_router::SessionHasher> hasher =
//       kvc_router::SessionHasher::Create(/*session=*/7, /*block_tokens=*/24);
//   if (!hasher.ok()) return hasher.status();
//   kvc_router::Request turn0 = hasher->BeginTurn(prompt_tokens);
//   ... route turn0 ...
//   hasher->AppendContext(output_tokens);       // the model's answer
//   kvc_router::Request turn1 = hasher->BeginTurn(tool_result_tokens);
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/config.hpp"
#include "kvc_router/detail/xxhash.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {

// Seed of the first block of every chain ("kvcroute" in ASCII). Changing it
// changes every hash the library produces.
inline constexpr BlockHash kChainRootHash = 0x6b7663726f757465ULL;

// Root of the chain for a model or LoRA adapter: kChainRootHash for the
// empty name, else XXH3-64 of the name's bytes seeded with kChainRootHash.
// Chains that start from different roots never share a block hash, so KV
// computed under one adapter is never counted as a hit for another. A
// gateway hashing a request for adapter "sql-lora" starts its SessionHasher
// at ChainRootFor("sql-lora"); KvEventIndex salts the blocks an engine
// reports with the event's lora_name the same way.
inline BlockHash ChainRootFor(std::string_view model_or_lora) {
  if (model_or_lora.empty()) return kChainRootHash;
  return XXH3_64bits_withSeed(model_or_lora.data(), model_or_lora.size(), kChainRootHash);
}

// Hash of one block whose predecessor's hash is `parent` (kChainRootHash for
// the first block).
inline BlockHash HashBlock(BlockHash parent, std::span<const TokenId> tokens) {
  if constexpr (std::endian::native == std::endian::little) {
    return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
  } else {
    // Big-endian hosts hash the same little-endian bytes as everyone else.
    XXH3_state_t state;
    XXH3_64bits_reset_withSeed(&state, parent);
    for (TokenId token : tokens) {
      uint8_t bytes[4] = {static_cast<uint8_t>(token),
                          static_cast<uint8_t>(token >> 8),
                          static_cast<uint8_t>(token >> 16),
                          static_cast<uint8_t>(token >> 24)};
      XXH3_64bits_update(&state, bytes, sizeof(bytes));
    }
    return XXH3_64bits_digest(&state);
  }
}

// Appends to `out` the chained hashes of every full block of `tokens`,
// continuing the chain after `parent`. Returns the last hash (or `parent`
// when no block was full). A `block_tokens` of 0 hashes nothing.
inline BlockHash AppendChainedHashes(BlockHash parent,
                                     std::span<const TokenId> tokens,
                                     uint32_t block_tokens,
                                     std::vector<BlockHash>& out) {
  if (block_tokens == 0) return parent;
  const size_t full_blocks = tokens.size() / block_tokens;
  out.reserve(out.size() + full_blocks);
  for (size_t i = 0; i < full_blocks; ++i) {
    parent = HashBlock(parent, tokens.subspan(i * block_tokens, block_tokens));
    out.push_back(parent);
  }
  return parent;
}

// Chained hashes of the full blocks of a whole context.
inline std::vector<BlockHash> ChainedBlockHashes(std::span<const TokenId> tokens,
                                                 uint32_t block_tokens) {
  std::vector<BlockHash> out;
  AppendChainedHashes(kChainRootHash, tokens, block_tokens, out);
  return out;
}

// One session's hash chain, extended turn by turn. Each token is hashed once
// over the session's life: a turn hashes the partial block left by the
// previous one plus its own tokens, and keeps the new remainder for later.
// Not thread-safe; a session's turns are sequential anyway.
class SessionHasher {
 public:
  // Checks `block_tokens` (1..kMaxBlockTokens, as RouterConfig::Validate
  // does for the router's) and makes the hasher.
  static absl::StatusOr<SessionHasher> Create(SessionId session, uint32_t block_tokens) {
    if (block_tokens == 0 || block_tokens > kMaxBlockTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SessionHasher: block_tokens must be in 1..", kMaxBlockTokens,
          " (kMaxBlockTokens), got ", block_tokens, " (session ", session, ")"));
    }
    return SessionHasher(session, block_tokens);
  }
  // The same, with the chain starting at `root` (ChainRootFor(adapter) for
  // requests of a LoRA adapter or a salted model).
  static absl::StatusOr<SessionHasher> Create(SessionId session, uint32_t block_tokens,
                                              BlockHash root) {
    absl::StatusOr<SessionHasher> hasher = Create(session, block_tokens);
    if (hasher.ok()) hasher->tail_ = root;
    return hasher;
  }

  // Unchecked form for a `block_tokens` already validated (e.g. the router's
  // config.block_tokens); prefer `Create`. Whatever the value, the hasher
  // stays defined: it reserves at most kMaxBlockTokens tokens up front and
  // past that allocates only for tokens it is given, and a 0 (which
  // RouterConfig::Validate and Create refuse) is treated as 1 so that
  // nothing divides by zero.
  SessionHasher(SessionId session, uint32_t block_tokens)
      : session_(session), block_tokens_(block_tokens == 0 ? 1 : block_tokens) {
    pending_.reserve(std::min(block_tokens_, kMaxBlockTokens));
  }

  // Adds context that is not a new turn (the model's output of the previous
  // turn): it becomes part of the next turn's prefix.
  void AppendContext(std::span<const TokenId> tokens) { Extend(tokens); }

  // Starts the next turn with its new tokens and returns the request to route.
  // Its prefix is every full block that existed before this call; its append
  // is the partial block carried over plus `new_tokens`, and its
  // appended_hashes are the blocks this call completed. The returned request
  // points into this hasher and stays valid until the hasher changes again.
  Request BeginTurn(std::span<const TokenId> new_tokens) {
    const size_t prefix_blocks = hashes_.size();
    const uint64_t append = pending_.size() + new_tokens.size();
    Extend(new_tokens);
    Request request;
    request.session = session_;
    request.turn = next_turn_++;
    request.prefix_hashes = std::span<const BlockHash>(hashes_).first(prefix_blocks);
    request.appended_hashes = std::span<const BlockHash>(hashes_).subspan(prefix_blocks);
    request.append_tokens = append;
    return request;
  }

  // Hashes of every full block seen so far (prefix and appended blocks).
  std::span<const BlockHash> hashes() const { return hashes_; }
  uint64_t total_tokens() const {
    return hashes_.size() * uint64_t{block_tokens_} + pending_.size();
  }
  // Tokens of the trailing block that is not full yet.
  size_t pending_tokens() const { return pending_.size(); }
  uint32_t next_turn() const { return next_turn_; }
  SessionId session() const { return session_; }

 private:
  void Extend(std::span<const TokenId> tokens) {
    if (!pending_.empty()) {
      const size_t take = std::min<size_t>(block_tokens_ - pending_.size(), tokens.size());
      pending_.insert(pending_.end(), tokens.begin(), tokens.begin() + take);
      tokens = tokens.subspan(take);
      if (pending_.size() < block_tokens_) return;
      tail_ = HashBlock(tail_, pending_);
      hashes_.push_back(tail_);
      pending_.clear();
    }
    tail_ = AppendChainedHashes(tail_, tokens, block_tokens_, hashes_);
    const size_t rest = tokens.size() % block_tokens_;
    pending_.assign(tokens.end() - rest, tokens.end());
  }

  SessionId session_;
  uint32_t block_tokens_;
  uint32_t next_turn_ = 0;
  BlockHash tail_ = kChainRootHash;
  std::vector<BlockHash> hashes_;
  std::vector<TokenId> pending_;
};

}  // namespace kvc_router
