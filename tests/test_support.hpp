// Helpers shared by the test files (not part of the library).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvc_router/block_hash.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/index/naive_index.hpp"

namespace kvc_router::test {

// Scenarios per property: 10,000 by default; the sanitizer jobs lower it
// through KVC_ROUTER_PROPERTY_SCENARIOS.
inline uint32_t PropertyScenarios() {
  const char* env = std::getenv("KVC_ROUTER_PROPERTY_SCENARIOS");
  if (env == nullptr || *env == '\0') return 10000;
  return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
}

// Seed for property tests: KVC_ROUTER_SEED overrides the fixed default.
inline uint64_t PropertySeed() {
  const char* env = std::getenv("KVC_ROUTER_SEED");
  if (env == nullptr || *env == '\0') return 20261129;
  return std::strtoull(env, nullptr, 10);
}

inline std::string Message(const absl::Status& status) { return std::string(status.message()); }

inline EstimateIndex MakeEstimateIndex(const RouterConfig& config) {
  // Large enough never to evict inside a property scenario.
  return EstimateIndex(config.num_decode_workers, uint64_t{1} << 40, config.block_tokens);
}

inline NaiveIndex MakeNaiveIndex(const RouterConfig& config) {
  return NaiveIndex(config.num_decode_workers);
}

// Overlap per worker for `prefix`. The output starts poisoned, so an index
// that leaves a worker's slot unwritten fails the comparison.
template <class Index>
std::vector<uint32_t> OverlapOf(const Index& index, std::span<const BlockHash> prefix) {
  std::vector<uint32_t> out(index.num_workers(), 0xdeadbeef);
  index.Overlap(prefix, out);
  return out;
}

// A chain of `n` block hashes continuing after `parent`; `salt` tells chains apart.
inline std::vector<BlockHash> TestChain(size_t n, uint64_t salt,
                                        BlockHash parent = kChainRootHash) {
  std::vector<BlockHash> chain;
  for (size_t i = 0; i < n; ++i) {
    const TokenId token = static_cast<TokenId>(salt * 100003 + i);
    parent = HashBlock(parent, {&token, 1});
    chain.push_back(parent);
  }
  return chain;
}

}  // namespace kvc_router::test
