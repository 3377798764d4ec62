// kvc_sim/instance.hpp
//
// The simulated workers. A `SimInstance` is a decode worker (P/D topology)
// or a colocated instance; a `SimPrefillWorker` is a member of the P pool.
//
// An instance keeps KV in one of two ways, chosen by the policy it serves:
//  * Policies that use decode-worker admission (KVC): the pool IS the
//    library's AdmissionController, the seed's whole-session model. It
//    answers the router's admission RPCs (Algorithm 2) and books every
//    request that occupies KV there, so it never passes rho*K_d. Admitted
//    sessions stay resident after their request until evicted, least
//    recently used first; transient requests (KVC's Fallback) are booked
//    under a pseudo session id and released when they finish. When only idle
//    sessions stand in the way of an admission, they are evicted (never the
//    one asking) and admission decides again: a real worker's evictable
//    cache does not block admission.
//  * Every other policy: a page-granular LRU prefix cache of K_d tokens
//    (page_cache.hpp), as SGLang's radix cache keeps it, optionally spilling
//    to a host tier.
// Cache hits come from the instance, never from a router's estimate.
//
// Work lanes: a GPU timeline (gpu_timeline.hpp) on which local prefill
// chunks and decode steps share every iteration; one FIFO inbound KV link.
// A prefill worker has one FIFO prefill lane and, unless the policy models
// vanilla P/D, its own page cache.
//
// Single-threaded; owned by the Simulator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvc_router/admit.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/types.hpp"
#include "kvc_sim/cost_model.hpp"
#include "kvc_sim/gpu_timeline.hpp"
#include "kvc_sim/page_cache.hpp"

namespace kvc_router::sim {

// Pseudo session ids of transient bookings: the high bit never appears in
// trace session ids.
inline constexpr SessionId kTransientSessionBit = SessionId{1} << 63;

class SimInstance {
 public:
  SimInstance(AdmissionController admission, PageCache pages, const CostModel& cost,
              bool admission_pool, bool prefix_cache, uint32_t block_tokens)
      : pages(std::move(pages)),
        gpu(cost),
        admission_(std::move(admission)),
        admission_pool_(admission_pool),
        prefix_cache_(prefix_cache),
        block_tokens_(block_tokens) {}

  // True when KV is kept by the AdmissionController (KVC); false: `pages`.
  bool admission_pool() const { return admission_pool_; }
  uint64_t used_tokens() const {
    return admission_pool_ ? admission_.used_tokens() : pages.used_tokens();
  }
  uint64_t capacity_tokens() const {
    return admission_pool_ ? admission_.config().capacity_tokens : pages.capacity_tokens();
  }

  // Tokens a request of `session` would reuse here now (see the file comment).
  uint64_t CachedTokens(SessionId session, uint32_t segment, uint64_t reusable_tokens,
                        std::span<const BlockHash> input_chain, uint64_t input_tokens) const {
    if (!prefix_cache_) return 0;
    uint64_t session_hit = 0;
    if (auto it = held_.find(session); it != held_.end() && it->second.segment == segment) {
      // Only what the held chain covers: a turn served elsewhere (a Fallback,
      // a move and back) or an output that found no room leaves it short of
      // the previous context, and admission has already re-booked the whole
      // input, so the booked size says nothing about what is here.
      const std::span<const BlockHash> held = it->second.chain;
      if (!held.empty() && held.size() <= input_chain.size() &&
          input_chain[held.size() - 1] == held.back()) {
        session_hit = std::min(reusable_tokens, it->second.tokens);
      }
    }
    size_t run = 0;
    while (run < input_chain.size() && block_refs_.contains(input_chain[run])) ++run;
    const uint64_t block_hit = static_cast<uint64_t>(run) * block_tokens_;
    return std::min(input_tokens, std::max(session_hit, block_hit));
  }

  // True when the instance holds the session's KV of context generation `segment`.
  bool HoldsContext(SessionId session, uint32_t segment) const {
    auto it = held_.find(session);
    return it != held_.end() && it->second.segment == segment && admission_.IsResident(session);
  }

  // Algorithm 2 with eviction of idle sessions (never `query.session`) when
  // only they stand in the way. Books on success. Evicted sessions are
  // appended to `evicted`.
  void SetQueuedPrefill(uint64_t tokens) { admission_.set_queued_prefill_tokens(tokens); }

  AdmitResult AdmitEvicting(const AdmitQuery& query, std::vector<SessionId>& evicted) {
    absl::StatusOr<AdmitResult> result = admission_.Admit(query);
    if (!result.ok()) return AdmitResult::Rejected(RejectReason::kNoDCapacity);
    if (result->admitted) return *result;
    if (result->reason != RejectReason::kNoDCapacity &&
        result->reason != RejectReason::kSessionNotResidentNoCapacity) {
      return *result;
    }
    const bool resident = admission_.IsResident(query.session);
    const uint64_t held = admission_.resident_tokens(query.session);
    const uint64_t needed =
        resident && admission_.config().accounting == CapacityAccounting::kIncremental
            ? query.input_tokens - std::min(query.input_tokens, held)
            : query.input_tokens;
    if (needed > admission_.budget_tokens()) return *result;
    if (admission_.free_tokens() >= needed) return *result;
    EvictIdle(needed, resident ? query.session : kNoSession, evicted);
    result = admission_.Admit(query);
    if (!result.ok()) return AdmitResult::Rejected(RejectReason::kNoDCapacity);
    return *result;
  }

  // The session now holds `chain` (context generation `segment`), `tokens`
  // tokens with the partial block after it, here.
  void HoldChain(SessionId session, uint32_t segment, std::span<const BlockHash> chain,
                 uint64_t tokens) {
    if (!prefix_cache_) return;
    Held& held = held_[session];
    const std::span<const BlockHash> old = held.chain;
    size_t keep = 0;
    if (held.segment == segment && !old.empty() && old.size() <= chain.size() &&
        chain[old.size() - 1] == old.back()) {
      keep = old.size();
    } else {
      for (BlockHash hash : old) Unref(hash);
    }
    for (size_t i = keep; i < chain.size(); ++i) ++block_refs_[chain[i]];
    held.segment = segment;
    held.chain = chain;
    held.tokens = tokens;
  }

  // A request of a booked session finished: its output joins the session's
  // KV if the pool has room below rho*K_d (idle sessions are evicted for it),
  // and the session becomes idle.
  void FinishSessionRequest(SessionId session, uint32_t segment, uint64_t output_tokens,
                            std::span<const BlockHash> context_chain,
                            std::vector<SessionId>& evicted) {
    if (!admission_.IsResident(session)) return;
    if (output_tokens > 0) {
      if (admission_.free_tokens() < output_tokens) {
        // The finishing session is still running, so it is never chosen.
        for (SessionId id : admission_.EvictLeastRecentlyUsed(output_tokens)) {
          Dropped(id);
          evicted.push_back(id);
        }
      }
      if (admission_.free_tokens() >= output_tokens &&
          admission_.AddTokens(session, output_tokens).ok()) {
        auto it = held_.find(session);
        const uint64_t input = it == held_.end() ? 0 : it->second.tokens;
        HoldChain(session, segment, context_chain, input + output_tokens);
      }
    }
    (void)admission_.OnRequestFinished(session);
  }

  void ReleaseTransient(SessionId pseudo) { (void)admission_.ReleaseSession(pseudo); }

  // The client closed `session` after its last request finished: an
  // admission pool frees it at once instead of waiting for LRU to reach it,
  // and reports it in `evicted` as the worker's KV events would; a page
  // cache lets the pages only that session kept go first (PageCache::Close).
  void CloseSession(SessionId session, std::span<const BlockHash> context_chain, uint64_t owner,
                    std::vector<SessionId>& evicted) {
    if (!admission_pool_) {
      pages.Close(context_chain, owner);
      return;
    }
    if (admission_.IsResident(session) && admission_.ReleaseSession(session).ok()) {
      Dropped(session);
      evicted.push_back(session);
    }
  }

  // Fault injection (faults.hpp): the instance restarts its KV pool and
  // loses every session with nothing running (appended to `evicted`), or,
  // keeping a page cache, every page no running request pins. Returns the
  // page-cache tokens lost.
  uint64_t Crash(std::vector<SessionId>& evicted) {
    if (!admission_pool_) return pages.DropUnpinned();
    for (SessionId id : admission_.EvictLeastRecentlyUsed(admission_.room_tokens())) {
      Dropped(id);
      evicted.push_back(id);
    }
    return 0;
  }

  // Drops a booked session's cache entry when it is released or evicted.
  void Dropped(SessionId session) {
    auto it = held_.find(session);
    if (it == held_.end()) return;
    for (BlockHash hash : it->second.chain) Unref(hash);
    held_.erase(it);
  }

  const AdmissionController& admission() const { return admission_; }
  AdmissionController& admission() { return admission_; }

  // The page-granular cache (policies without admission).
  PageCache pages;
  // Work lanes and load, maintained by the Simulator.
  GpuTimeline gpu;
  uint64_t gpu_version = 0;  // wake-ups of older versions are stale
  bool gpu_dirty = false;
  double link_free_at = 0;
  uint32_t running_requests = 0;
  uint64_t peak_used_tokens = 0;
  std::deque<uint32_t> waiting;  // requests waiting for KV memory, FIFO

 private:
  static constexpr SessionId kNoSession = ~SessionId{0};

  struct Held {
    uint32_t segment = 0;
    std::span<const BlockHash> chain;
    uint64_t tokens = 0;  // what the chain and the partial block after it hold
  };

  void Unref(BlockHash hash) {
    auto it = block_refs_.find(hash);
    if (it != block_refs_.end() && --it->second == 0) block_refs_.erase(it);
  }

  // Evicts idle sessions, least recently used first, until `needed` tokens
  // are free below rho*K_d; `keep` (a resident session asking for room) is
  // never evicted.
  void EvictIdle(uint64_t needed, SessionId keep, std::vector<SessionId>& evicted) {
    for (SessionId id : keep == kNoSession ? admission_.EvictLeastRecentlyUsed(needed)
                                           : admission_.EvictLeastRecentlyUsedExcept(needed, keep)) {
      Dropped(id);
      evicted.push_back(id);
    }
  }

  AdmissionController admission_;
  bool admission_pool_;
  bool prefix_cache_;
  uint32_t block_tokens_;
  // Blocks held by resident sessions, with the number of sessions holding each.
  absl::flat_hash_map<BlockHash, uint32_t> block_refs_;
  absl::flat_hash_map<SessionId, Held> held_;
};

struct SimPrefillWorker {
  explicit SimPrefillWorker(PageCache cache) : pages(std::move(cache)) {}
  // Prefix cache of the prefill engine (disabled for vanilla P/D).
  PageCache pages;
  double free_at = 0;
  uint64_t pending_prefill_tokens = 0;
  uint32_t running_requests = 0;
  // Inbound link for D -> P KV backups (kv_backup), busy until then.
  double backup_link_free_at = 0;
};

}  // namespace kvc_router::sim
