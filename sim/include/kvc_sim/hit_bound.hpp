// kvc_sim/hit_bound.hpp
//
// How many input tokens a router could at most have served from cache,
// given the cluster's total KV memory and the order in which requests
// reached the engines. A replay's hit rate says what a policy got; this says
// what was there to get, so "0.745 against an ideal of 0.89" (ear without
// load control) can be read as "0.745 against at most 0.90 with this much
// memory, and 0.80 for one LRU pool" when the sessions' live contexts do
// not fit (docs/simulator.md, "Hit-rate bound").
//
// The bound is Belady's offline optimum (furthest next use, with bypass) over
// one pool as large as every pool of the cluster together, at block
// granularity. For the page-cache policies it is an upper bound on cached
// tokens for the same order because it relaxes everything a real cluster
// imposes:
//   * one pool instead of several: no duplicate copies, no fragmentation;
//   * any cached block counts, not only an unbroken leading prefix;
//   * running requests pin and reserve nothing, and a block may be dropped
//     the moment its last use is known;
//   * the partial block that ends a session's previous context is free.
// Furthest-next-use is optimal for unit-size pages when a missed page may
// also be left uncached; blocks that first appear as output are compulsory
// misses for every cache, so they do not disturb that argument. One thing
// is stricter than some policies: a request's output blocks enter the pool
// with its input, while KVC's admission pools take the output only at the
// end (and D->P backups copy contexts while they run), so for those
// policies the figure is a reference that sim/tests/hit_bound_test.cpp
// checks on seeded workloads rather than a proof.
//
// Beside the bound it replays the same order through one pool of the same
// size managed as the engines manage theirs: least recently used first,
// deepest block first among equals, and only an unbroken leading prefix
// counts (but, as above, nothing pinned or reserved, and outputs inserted
// with their input). That reference is not a bound (a router that splits
// sessions well across pools can beat it); it shows what eviction by recency
// alone costs: on 32 claude-code sessions at h100-8b the optimum is 0.899,
// one LRU pool 0.797, ear without load control 0.745 (docs/policies.md;
// with it, ear makes an order on which one LRU pool keeps 0.896 and gets
// 0.884). With `close_sessions` a session's last request leaves the pages
// only it kept at the front of the eviction order, as PageCache::Close does.
//
// Memory: about 24 bytes per block of every request in the order.
//
//   std::vector<uint32_t> order = ...;  // Trace::turns indices, as prefills began
//   absl::StatusOr<kvc_router::sim::HitBound> bound =
//       kvc_router::sim::OfflineHitBound(trace, order, 8 * 362000);
//   double best = bound->hit_rate();
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <queue>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_sim/trace.hpp"

namespace kvc_router::sim {

struct HitBound {
  uint64_t hit_tokens = 0;      // the most tokens any cache of that size serves
  uint64_t lru_hit_tokens = 0;  // what one LRU pool of that size serves
  uint64_t input_tokens = 0;    // input tokens of the requests in the order
  double hit_rate() const { return Share(hit_tokens); }
  double lru_hit_rate() const { return Share(lru_hit_tokens); }

 private:
  double Share(uint64_t tokens) const {
    return input_tokens == 0 ? 0.0
                             : static_cast<double>(tokens) / static_cast<double>(input_tokens);
  }
};

namespace hit_bound_detail {

// One pool of `capacity_blocks` pages with the engines' eviction order.
// Returns the cached input tokens of the requests in `order`.
// With `close_sessions`, a session's last request leaves the pages it was
// the last to use at the front of the eviction order (PageCache::Close).
inline uint64_t OnePoolLru(const Trace& trace, std::span<const uint32_t> order,
                           uint64_t capacity_blocks, bool close_sessions) {
  // Eviction key: (tick of last use, -depth): oldest first, deepest first.
  // Closed pages get tick 0 and a fresh negative second key, so they go
  // first, in the order they were closed.
  using Key = std::pair<uint64_t, int64_t>;
  std::map<Key, BlockHash> by_age;
  absl::flat_hash_map<BlockHash, Key> pages;
  // Who last kept each page, and whether more than one session did.
  struct Keeper {
    uint32_t session;
    bool shared;
  };
  absl::flat_hash_map<BlockHash, Keeper> keepers;
  uint64_t tick = 0, hit_tokens = 0;
  int64_t closed = std::numeric_limits<int64_t>::min();
  for (uint32_t index : order) {
    const TraceTurn& t = trace.turns[index];
    const std::span<const BlockHash> context = trace.ContextChain(t);
    ++tick;
    uint64_t leading = 0;
    bool broken = false;
    for (uint32_t b = 0; b < context.size(); ++b) {
      const Key key{tick, -static_cast<int64_t>(b)};
      auto it = pages.find(context[b]);
      if (it != pages.end()) {
        if (b < t.input_blocks && !broken) ++leading;
        by_age.erase(it->second);
        it->second = key;
      } else {
        if (b < t.input_blocks) broken = true;
        if (capacity_blocks == 0) continue;
        if (pages.size() >= capacity_blocks) {
          auto oldest = by_age.begin();
          pages.erase(oldest->second);
          by_age.erase(oldest);
        }
        pages.emplace(context[b], key);
      }
      by_age.emplace(key, context[b]);
      if (close_sessions) {
        auto [k, fresh] = keepers.try_emplace(context[b], Keeper{t.session, false});
        if (!fresh && k->second.session != t.session) k->second = Keeper{t.session, true};
      }
    }
    // The partial block after the previous context is reused with it whole.
    const uint64_t tail =
        leading >= t.prefix_blocks ? t.reusable_tokens % trace.block_tokens : 0;
    hit_tokens += std::min(t.input_tokens, leading * trace.block_tokens + tail);
    if (close_sessions && t.turn + 1 == trace.sessions[t.session].num_turns) {
      // Deepest first, as PageCache::Close; pages other sessions kept too stay.
      for (size_t b = context.size(); b-- > 0;) {
        auto it = pages.find(context[b]);
        auto k = keepers.find(context[b]);
        if (it == pages.end() || k == keepers.end() || k->second.shared) continue;
        by_age.erase(it->second);
        it->second = Key{0, closed++};
        by_age.emplace(it->second, context[b]);
      }
    }
  }
  return hit_tokens;
}

}  // namespace hit_bound_detail

// `order` lists indices into `trace.turns`, each at most once, in the order
// the requests reached the engines (the simulator uses the order their
// prefills began). Requests left out (refused ones) neither use nor fill the
// cache. `close_sessions` gives the LRU reference the clients' session close
// (SimConfig::close_sessions); the optimum needs no such hint.
inline absl::StatusOr<HitBound> OfflineHitBound(const Trace& trace,
                                                std::span<const uint32_t> order,
                                                uint64_t capacity_tokens,
                                                bool close_sessions = false) {
  if (trace.block_tokens == 0) return absl::InvalidArgumentError("hit bound: block_tokens is 0");
  std::vector<bool> seen(trace.turns.size(), false);
  for (uint32_t turn : order) {
    if (turn >= trace.turns.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("hit bound: turn ", turn, " is not in the trace (", trace.turns.size(),
                       " requests)"));
    }
    if (seen[turn]) {
      return absl::InvalidArgumentError(absl::StrCat("hit bound: turn ", turn, " is listed twice"));
    }
    seen[turn] = true;
  }

  // One event per block a request reads (its input) or produces (the blocks
  // its output completes). Only reads can hit.
  struct Event {
    BlockHash hash;
    uint32_t request;  // position in `order`
    bool read;
  };
  std::vector<Event> events;
  for (uint32_t r = 0; r < order.size(); ++r) {
    const TraceTurn& t = trace.turns[order[r]];
    const std::span<const BlockHash> context = trace.ContextChain(t);
    for (uint32_t b = 0; b < context.size(); ++b) {
      events.push_back(Event{context[b], r, b < t.input_blocks});
    }
  }

  // next[p]: the position of the next read of events[p].hash that the cache
  // must serve, or kNever. A block produced again later is free to rebuild,
  // so keeping it across that point is worth nothing.
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> next(events.size(), kNever);
  {
    absl::flat_hash_map<BlockHash, uint64_t> upcoming;
    for (size_t p = events.size(); p-- > 0;) {
      auto it = upcoming.find(events[p].hash);
      next[p] = it == upcoming.end() ? kNever : it->second;
      upcoming[events[p].hash] = events[p].read ? p : kNever;
    }
  }

  const uint64_t capacity_blocks = capacity_tokens / trace.block_tokens;
  absl::flat_hash_map<BlockHash, uint64_t> cached;  // hash -> its next read
  // Max-heap on next read; entries whose next read changed are stale.
  std::priority_queue<std::pair<uint64_t, BlockHash>> furthest;
  std::vector<uint64_t> hit_blocks(order.size(), 0);
  for (size_t p = 0; p < events.size(); ++p) {
    const Event& e = events[p];
    auto it = cached.find(e.hash);
    if (it != cached.end()) {
      if (e.read) ++hit_blocks[e.request];
      if (next[p] == kNever) {
        cached.erase(it);
      } else {
        it->second = next[p];
        furthest.emplace(next[p], e.hash);
      }
      continue;
    }
    if (next[p] == kNever || capacity_blocks == 0) continue;
    if (cached.size() >= capacity_blocks) {
      while (true) {
        const auto [when, hash] = furthest.top();
        auto victim = cached.find(hash);
        if (victim != cached.end() && victim->second == when) break;
        furthest.pop();
      }
      // Keep what is read sooner; the new block may be the one left out.
      if (furthest.top().first < next[p]) continue;
      cached.erase(furthest.top().second);
      furthest.pop();
    }
    cached.emplace(e.hash, next[p]);
    furthest.emplace(next[p], e.hash);
  }

  // The optimum maximises block hits over the whole order, not per request,
  // so the sum is clipped once: clipping each request could undercount.
  HitBound bound;
  uint64_t blocks = 0, tails = 0;
  for (uint32_t r = 0; r < order.size(); ++r) {
    const TraceTurn& t = trace.turns[order[r]];
    blocks += hit_blocks[r];
    tails += t.reusable_tokens % trace.block_tokens;
    bound.input_tokens += t.input_tokens;
  }
  bound.hit_tokens = std::min(bound.input_tokens, blocks * trace.block_tokens + tails);
  bound.lru_hit_tokens =
      hit_bound_detail::OnePoolLru(trace, order, capacity_blocks, close_sessions);
  return bound;
}

}  // namespace kvc_router::sim
