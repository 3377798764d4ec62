// Shared set-up for the benchmarks: a realistically populated routing state.
//
// Population (the same for the fast index and the naive baseline):
//  - background: sessions of 512-block chains placed round-robin over the
//    decode workers until at least 256k (block, worker) entries exist;
//  - the queried session: a `blocks`-long chain, fully resident on its pinned
//    worker (worker |D|/2);
//  - every other worker holds the chain's shared system prompt (its first
//    min(64, blocks/8) blocks), and one worker in four also holds an older,
//    random-length prefix of the chain (a stale copy from an earlier
//    placement), so overlaps differ across workers and the bisection has
//    real steps to find.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvc_router/kvc_router.hpp"
#include "kvc_router/testing/property_kit.hpp"

namespace kvc_router::bench {

inline constexpr uint64_t kBackgroundEntries = 256 * 1024;
inline constexpr size_t kBackgroundChain = 512;

inline std::vector<BlockHash> MakeChain(size_t n, uint64_t salt) {
  std::vector<BlockHash> chain;
  chain.reserve(n);
  BlockHash parent = kChainRootHash;
  for (size_t i = 0; i < n; ++i) {
    const TokenId token[2] = {static_cast<TokenId>(salt), static_cast<TokenId>(i)};
    parent = HashBlock(parent, token);
    chain.push_back(parent);
  }
  return chain;
}

template <class Index>
struct RouteSetup {
  std::unique_ptr<RoutingState<Index>> state;
  std::vector<BlockHash> chain;
  Request request;
  WorkerId pinned = 0;
  uint64_t entries = 0;
};

template <class Index>
RouteSetup<Index> BuildRouteSetup(uint32_t num_workers, size_t blocks, Index index) {
  RouteSetup<Index> setup;
  RouterConfig config;
  config.num_decode_workers = num_workers;
  config.num_prefill_workers = 2;
  auto state = RoutingState<Index>::Create(config, std::move(index));
  setup.state = std::move(*state);
  RoutingState<Index>& s = *setup.state;

  SessionId next_session = 1'000'000;
  for (uint64_t placed = 0; placed < kBackgroundEntries; placed += kBackgroundChain) {
    const WorkerId worker = static_cast<WorkerId>(next_session % num_workers);
    (void)s.LearnResidency(worker, next_session, MakeChain(kBackgroundChain, next_session));
    ++next_session;
  }
  setup.entries = kBackgroundEntries;

  setup.chain = MakeChain(blocks, 7);
  const std::span<const BlockHash> chain(setup.chain);
  setup.pinned = num_workers / 2;
  const size_t system_prompt = std::min<size_t>(64, blocks / 8);
  testing::ScenarioRng rng(num_workers * 131 + blocks);
  for (WorkerId d = 0; d < num_workers; ++d) {
    if (d == setup.pinned) continue;
    size_t run = system_prompt;
    if (rng.Chance(25)) run = rng.Uniform(system_prompt, blocks - 1);
    (void)s.LearnResidency(d, next_session++, chain.first(run));
    setup.entries += run;
  }
  // Pin the session: it was placed on `pinned`, which holds the whole chain.
  setup.request = Request{.session = 42, .turn = 1, .prefix_hashes = chain, .append_tokens = 300};
  (void)s.LearnResidency(setup.pinned, 42, chain);
  setup.entries += blocks;
  auto op = StartDispatch(s, setup.request);
  (void)op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kDirect));
  (void)op->Complete();
  return setup;
}

}  // namespace kvc_router::bench
