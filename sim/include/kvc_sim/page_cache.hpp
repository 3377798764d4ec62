// kvc_sim/page_cache.hpp
//
// A page-granular prefix cache with LRU eviction, the way SGLang's radix
// cache (and vLLM's prefix cache) keep KV: the pool holds pages (here: trace
// blocks of `block_tokens`), a request reuses the leading run of its chain
// that is cached, running requests pin what they use, and when room is
// needed the least recently used unpinned page goes first. Chained hashes
// name whole prefixes, so a page is only reachable through its parent and a
// parent is touched whenever a child is: evicting the least recently used
// page, deepest first on ties, always evicts a leaf, as a radix tree does.
//
// Pages are trace blocks, but engines cache token by token (SGLang's default
// page size is 1): the tokens of a kept context after its last full block
// are remembered as that page's tail and reused by a request that continues
// exactly that context. Tails are smaller than a page and not charged.
//
// An optional host tier (HiCache, LMCache, a Mooncake store) receives the
// pages the GPU pool evicts; a later request whose chain continues in the
// host tier reloads those pages instead of recomputing them.
//
// Memory: used = cached pages (pinned or not) + reservations of running
// requests (their uncached input and their output). A request starts only
// when its whole footprint fits under the capacity; nothing runs unbooked.
//
//   PageCache cache(/*capacity_tokens=*/360000, /*block_tokens=*/512, {});
//   PageCache::Match m = cache.Lookup(chain);
//   PageCache::Lease lease;
//   if (cache.Reserve(lease, chain, m, footprint_tokens)) { ... cache.Release(lease, context); }
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvc_router/types.hpp"

namespace kvc_router::sim {

struct HostTierConfig {
  // Tokens of KV each worker's host tier holds; 0 = no host tier.
  uint64_t capacity_tokens = 0;
  // Host -> GPU reload bandwidth, bytes per second.
  double reload_bytes_per_s = 25e9;
};

class PageCache {
 public:
  struct Match {
    uint32_t gpu_blocks = 0;   // leading blocks cached on the GPU
    uint32_t host_blocks = 0;  // the blocks after them found in the host tier
    uint32_t tail_tokens = 0;  // tokens after gpu_blocks, continuing a kept context
  };
  // What one running request holds: the pages it pinned and its reservation.
  struct Lease {
    std::span<const BlockHash> pinned;
    uint64_t reserved_tokens = 0;
    bool active = false;
  };

  PageCache(uint64_t capacity_tokens, uint32_t block_tokens, bool enabled, HostTierConfig host)
      : capacity_tokens_(capacity_tokens),
        block_tokens_(block_tokens),
        enabled_(enabled),
        host_(host) {}

  // What `chain` finds cached. `context_tokens`: how many leading tokens of
  // the request are a context that `owner` (its session) kept earlier; the
  // tail after that context's last full block is reused when every full
  // block before it is on the GPU and the same owner left it.
  Match Lookup(std::span<const BlockHash> chain, uint64_t context_tokens = 0,
               uint64_t owner = 0) const {
    Match m;
    if (!enabled_) return m;
    while (m.gpu_blocks < chain.size() && pages_.contains(chain[m.gpu_blocks])) ++m.gpu_blocks;
    size_t i = m.gpu_blocks;
    while (i < chain.size() && host_pages_.contains(chain[i])) ++i;
    m.host_blocks = static_cast<uint32_t>(i - m.gpu_blocks);
    const uint64_t context_blocks = context_tokens / block_tokens_;
    if (context_blocks > 0 && m.gpu_blocks == context_blocks && context_blocks <= chain.size()) {
      auto it = tails_.find(chain[context_blocks - 1]);
      const uint64_t wanted = context_tokens - context_blocks * block_tokens_;
      // The kept tail is a prefix of what the request continues with (the
      // same context, perhaps before its output was added).
      if (it != tails_.end() && it->second.owner == owner && m.host_blocks == 0) {
        m.tail_tokens = static_cast<uint32_t>(std::min<uint64_t>(it->second.tokens, wanted));
      }
    }
    return m;
  }

  // Starts a request: pins the first `match.gpu_blocks` pages of `chain` and
  // reserves `footprint_tokens` minus the pinned pages' tokens, evicting
  // unpinned pages for room. Returns false, changing nothing, when the
  // footprint cannot fit now (the caller waits for running requests).
  bool Reserve(Lease& lease, std::span<const BlockHash> chain, Match match,
               uint64_t footprint_tokens) {
    const uint64_t pinned_tokens = uint64_t{match.gpu_blocks} * block_tokens_;
    const uint64_t reserve = footprint_tokens - std::min(footprint_tokens, pinned_tokens);
    if (footprint_tokens > capacity_tokens_) return false;
    const std::span<const BlockHash> pinned = chain.first(match.gpu_blocks);
    // Decide before touching anything: the reused pages become unevictable.
    uint64_t newly_pinned = 0;
    for (BlockHash h : pinned) {
      auto it = pages_.find(h);
      if (it != pages_.end() && it->second.pins == 0) newly_pinned += block_tokens_;
    }
    const uint64_t evictable = cached_tokens_ - pinned_pages_ * block_tokens_ - newly_pinned;
    if (used_tokens() - evictable + reserve > capacity_tokens_) return false;
    // Pin first so eviction cannot take the pages this request reuses.
    ++clock_;
    for (BlockHash h : pinned) Pin(h, clock_);
    const bool room = MakeRoom(reserve);
    (void)room;  // guaranteed by the check above
    reserved_tokens_ += reserve;
    lease.pinned = pinned;
    lease.reserved_tokens = reserve;
    lease.active = true;
    return true;
  }

  // The request's prefill is done: the pages of `chain` (its input, of
  // `tokens` tokens; the pinned pages are its prefix) become cached and
  // shareable, as a radix cache inserts a request's prompt once computed.
  // They stay pinned until Release; their tokens move from the reservation
  // to the cache.
  void Publish(Lease& lease, std::span<const BlockHash> chain, uint64_t tokens,
               uint64_t owner = 0) {
    if (!enabled_ || !lease.active || chain.size() < lease.pinned.size()) return;
    ++clock_;
    for (size_t i = lease.pinned.size(); i < chain.size(); ++i) {
      auto [it, inserted] = pages_.try_emplace(chain[i]);
      if (inserted) {
        it->second.depth = static_cast<uint32_t>(i);
        cached_tokens_ += block_tokens_;
        const uint64_t moved = std::min<uint64_t>(block_tokens_, lease.reserved_tokens);
        lease.reserved_tokens -= moved;
        reserved_tokens_ -= moved;
      }
      it->second.tick = clock_;
      NoteOwner(it->second, owner);
      if (it->second.pins++ == 0) ++pinned_pages_;
    }
    lease.pinned = chain;
    RememberTail(chain, tokens, owner);
  }

  // Ends a request: its reservation is returned, its pins dropped, and the
  // pages of `keep` (its context of `keep_tokens` tokens; empty for a request
  // whose KV is dropped) are cached, leading pages first, as far as room
  // allows.
  void Release(Lease& lease, std::span<const BlockHash> keep, uint64_t keep_tokens = 0,
               uint64_t owner = 0) {
    if (!lease.active) return;
    reserved_tokens_ -= lease.reserved_tokens;
    ++clock_;
    const size_t kept = enabled_ ? PinLeadingPages(keep, owner) : 0;
    if (kept > 0 && kept == keep.size()) RememberTail(keep, keep_tokens, owner);
    for (BlockHash h : lease.pinned) Unpin(h);
    for (size_t i = 0; i < kept; ++i) Unpin(keep[i]);
    lease = Lease{};
    MaybeCompact();
  }

  // Pages of `chain` (a context of `tokens` tokens that `owner` kept) arrive
  // from elsewhere (a KV backup): they are cached, leading pages first, as
  // far as room allows without touching pinned pages, and are then as
  // evictable as any cached page. Returns how many leading pages are cached.
  size_t Insert(std::span<const BlockHash> chain, uint64_t tokens, uint64_t owner = 0) {
    if (!enabled_) return 0;
    ++clock_;
    const size_t kept = PinLeadingPages(chain, owner);
    if (kept > 0 && kept == chain.size()) RememberTail(chain, tokens, owner);
    for (size_t i = 0; i < kept; ++i) Unpin(chain[i]);
    MaybeCompact();
    return kept;
  }

  // The session that kept `chain` moved elsewhere (its KV was migrated):
  // its unpinned pages become the least recently used, deepest first, so
  // they are the first to go when room is needed. Pages other requests are
  // using stay as they are; a shared prefix another session touches again
  // becomes young again.
  void Demote(std::span<const BlockHash> chain) {
    if (!enabled_) return;
    for (BlockHash h : chain) {
      auto it = pages_.find(h);
      if (it == pages_.end() || it->second.pins != 0) continue;
      it->second.tick = 0;
      lru_.push_back(LruEntry{0, it->second.depth, h});
      std::push_heap(lru_.begin(), lru_.end(), Younger);
    }
  }

  // The client closed the session that kept `chain` as `owner` (SGLang's
  // /close_session with its session-aware radix cache): the pages only it
  // kept become the least recently used, deepest first, so they go before
  // any context still in use. Pages other contexts kept too (a shared system
  // prompt) and pinned pages stay as they are; closed pages are not spilled
  // to a host tier.
  void Close(std::span<const BlockHash> chain, uint64_t owner) {
    if (!enabled_ || owner == 0) return;
    for (BlockHash h : chain) {
      auto it = pages_.find(h);
      if (it == pages_.end() || it->second.pins != 0 || it->second.shared ||
          it->second.owner != owner) {
        continue;
      }
      it->second.closed = true;
      it->second.tick = 0;
      lru_.push_back(LruEntry{0, it->second.depth, h});
      std::push_heap(lru_.begin(), lru_.end(), Younger);
    }
  }

  // The engine restarted its KV pool (fault injection): every page no
  // running request pins is gone, with its tail. Running requests pin their
  // chains from the root, so what stays is still reachable. The host tier
  // lives outside the GPU pool and keeps its pages. Returns the tokens lost.
  uint64_t DropUnpinned() {
    uint64_t dropped = 0;
    for (auto it = pages_.begin(); it != pages_.end();) {
      if (it->second.pins != 0) {
        ++it;
        continue;
      }
      tails_.erase(it->first);
      pages_.erase(it++);
      dropped += block_tokens_;
    }
    cached_tokens_ -= dropped;
    // The heap's entries for dropped pages are stale now: MakeRoom skips them.
    return dropped;
  }

  uint64_t used_tokens() const { return cached_tokens_ + reserved_tokens_; }
  uint64_t cached_tokens() const { return cached_tokens_; }
  uint64_t capacity_tokens() const { return capacity_tokens_; }
  uint64_t host_tokens() const { return host_tokens_; }
  uint64_t evicted_pages() const { return evicted_pages_; }
  bool enabled() const { return enabled_; }
  bool Contains(BlockHash page) const { return pages_.contains(page); }
  size_t pages() const { return pages_.size(); }

 private:
  struct Page {
    uint64_t tick = 0;
    uint32_t depth = 0;
    uint32_t pins = 0;
    uint64_t owner = 0;   // the context that last kept it (0: none named)
    bool shared = false;  // kept by more than one named context
    bool closed = false;  // its session closed and nothing touched it since
  };
  struct LruEntry {
    uint64_t tick;
    uint32_t depth;
    BlockHash hash;
  };
  // Min-heap order: oldest tick first, deepest first among equals.
  static bool Younger(const LruEntry& a, const LruEntry& b) {
    if (a.tick != b.tick) return a.tick > b.tick;
    return a.depth < b.depth;
  }

  // A context keeps `page` again: it is live, and shared once two keep it.
  static void NoteOwner(Page& page, uint64_t owner) {
    page.closed = false;
    if (owner == 0) return;
    if (page.owner != 0 && page.owner != owner) page.shared = true;
    page.owner = owner;
  }

  void RememberTail(std::span<const BlockHash> chain, uint64_t tokens, uint64_t owner) {
    if (chain.empty()) return;
    const uint64_t tail = tokens - std::min<uint64_t>(tokens, chain.size() * block_tokens_);
    if (tail > 0 && tail < block_tokens_) {
      Tail& t = tails_[chain.back()];
      // Another owner's tokens after the same page are other tokens.
      if (t.owner != owner) t = Tail{0, owner};
      t.tokens = std::max(t.tokens, static_cast<uint32_t>(tail));
    }
  }

  void Pin(BlockHash h, uint64_t tick) {
    auto it = pages_.find(h);
    if (it == pages_.end()) return;
    it->second.tick = tick;
    it->second.closed = false;
    if (it->second.pins++ == 0) ++pinned_pages_;
  }
  // An unpinned page becomes evictable: it enters the LRU heap.
  void Unpin(BlockHash h) {
    auto it = pages_.find(h);
    if (it == pages_.end() || it->second.pins == 0) return;
    if (--it->second.pins == 0) {
      --pinned_pages_;
      lru_.push_back(LruEntry{it->second.tick, it->second.depth, h});
      std::push_heap(lru_.begin(), lru_.end(), Younger);
    }
  }

  // Evicts unpinned pages, least recently used first, until `tokens` more
  // fit; evicts nothing when even all unpinned pages would not make room.
  // Caches and pins the leading pages of `chain` as far as room allows; the
  // caller unpins them once the whole chain is in, so room for a deeper page
  // never evicts a shallower one of the same chain. Returns how many.
  size_t PinLeadingPages(std::span<const BlockHash> chain, uint64_t owner) {
    size_t kept = 0;
    for (; kept < chain.size(); ++kept) {
      auto it = pages_.find(chain[kept]);
      if (it == pages_.end()) {
        if (!MakeRoom(block_tokens_)) break;
        it = pages_.emplace(chain[kept], Page{}).first;
        it->second.depth = static_cast<uint32_t>(kept);
        cached_tokens_ += block_tokens_;
      }
      it->second.tick = clock_;
      NoteOwner(it->second, owner);
      if (it->second.pins++ == 0) ++pinned_pages_;
    }
    return kept;
  }

  bool MakeRoom(uint64_t tokens) {
    if (tokens > capacity_tokens_) return false;
    if (used_tokens() + tokens <= capacity_tokens_) return true;
    const uint64_t evictable = cached_tokens_ - pinned_pages_ * block_tokens_;
    if (used_tokens() - evictable + tokens > capacity_tokens_) return false;
    while (used_tokens() + tokens > capacity_tokens_ && !lru_.empty()) {
      std::pop_heap(lru_.begin(), lru_.end(), Younger);
      const LruEntry e = lru_.back();
      lru_.pop_back();
      auto it = pages_.find(e.hash);
      // Stale entries: the page is gone, was touched again, or is pinned
      // (an unpin pushes a fresh entry).
      if (it == pages_.end() || it->second.tick != e.tick || it->second.pins != 0) continue;
      // A closed session's pages are not worth host memory.
      const bool closed = it->second.closed;
      pages_.erase(it);
      tails_.erase(e.hash);
      cached_tokens_ -= block_tokens_;
      ++evicted_pages_;
      if (!closed) SpillToHost(e.hash);
    }
    return used_tokens() + tokens <= capacity_tokens_;
  }

  void SpillToHost(BlockHash h) {
    if (host_.capacity_tokens < block_tokens_) return;
    ++host_clock_;
    auto [it, inserted] = host_pages_.try_emplace(h, host_clock_);
    if (!inserted) {
      it->second = host_clock_;
    } else {
      host_tokens_ += block_tokens_;
    }
    host_fifo_.push_back({host_clock_, h});
    while (host_tokens_ > host_.capacity_tokens && host_head_ < host_fifo_.size()) {
      const auto [tick, hash] = host_fifo_[host_head_++];
      auto jt = host_pages_.find(hash);
      if (jt == host_pages_.end() || jt->second != tick) continue;
      host_pages_.erase(jt);
      host_tokens_ -= block_tokens_;
    }
    if (host_head_ > 4096 && host_head_ * 2 > host_fifo_.size()) {
      host_fifo_.erase(host_fifo_.begin(), host_fifo_.begin() + static_cast<ptrdiff_t>(host_head_));
      host_head_ = 0;
    }
  }

  // Drops stale LRU entries (a page pinned and released again leaves its old
  // entry behind) once they outnumber live pages.
  void MaybeCompact() {
    if (lru_.size() < 4096 || lru_.size() < 4 * pages_.size()) return;
    std::vector<LruEntry> live;
    live.reserve(pages_.size());
    for (const LruEntry& e : lru_) {
      auto it = pages_.find(e.hash);
      if (it != pages_.end() && it->second.tick == e.tick && it->second.pins == 0) {
        live.push_back(e);
      }
    }
    // One entry per page is enough.
    std::sort(live.begin(), live.end(), [](const LruEntry& a, const LruEntry& b) {
      if (a.hash != b.hash) return a.hash < b.hash;
      return a.tick < b.tick;
    });
    live.erase(std::unique(live.begin(), live.end(),
                           [](const LruEntry& a, const LruEntry& b) { return a.hash == b.hash; }),
               live.end());
    lru_ = std::move(live);
    std::make_heap(lru_.begin(), lru_.end(), Younger);
  }

  uint64_t capacity_tokens_;
  uint32_t block_tokens_;
  bool enabled_;
  HostTierConfig host_;
  absl::flat_hash_map<BlockHash, Page> pages_;
  // Page -> tokens kept after it by a context that ended inside the next
  // page, and whose context that was.
  struct Tail {
    uint32_t tokens = 0;
    uint64_t owner = 0;
  };
  absl::flat_hash_map<BlockHash, Tail> tails_;
  std::vector<LruEntry> lru_;
  uint64_t clock_ = 0;
  uint64_t cached_tokens_ = 0;
  uint64_t reserved_tokens_ = 0;
  uint64_t evicted_pages_ = 0;
  uint64_t pinned_pages_ = 0;
  // Host tier: page -> tick of its latest spill; FIFO of spills for eviction.
  absl::flat_hash_map<BlockHash, uint64_t> host_pages_;
  std::vector<std::pair<uint64_t, BlockHash>> host_fifo_;
  size_t host_head_ = 0;
  uint64_t host_clock_ = 0;
  uint64_t host_tokens_ = 0;
};

}  // namespace kvc_router::sim
