// kvc_router/admit.hpp
//
// Algorithm 2, Admit(d, r): the decode worker's own, authoritative admission
// decision, packaged as a reusable controller with its own bookkeeping of
// which sessions the worker holds and how many tokens each occupies.
//
// A serving stack embeds one `AdmissionController` per decode worker and
// answers the router's admission RPC with `Admit`; the simulator models a
// worker with the same class. The decision:
//   used   = tokens of all sessions resident here
//   cap_ok = used + input_len <= rho * K_d        (kConservative, the seed's)
//          = used - resident(s) + input_len <= rho * K_d   (kIncremental)
//   resident session:  Direct if append <= tau_append and cap_ok,
//                      else "real-large-append" or "no-d-capacity";
//                      beyond the seed, with direct_cost enabled, also
//                      "real-large-append" when the append here (after the
//                      queued prefill) would be slower than a reseed;
//   otherwise:         Seed (turn 0) or Reseed (turn > 0) if cap_ok,
//                      else "session-not-resident-no-capacity".
// An admitted session occupies its whole input from then on; decoding adds
// tokens with `AddTokens`; `ReleaseSession` and `EvictLeastRecentlyUsed` free
// them. Under either accounting an admission never takes the pool past
// rho*K_d (no silent overload); decode growth may use the headroom up to K_d.
//
// Not thread-safe: it lives in the worker's scheduler loop. Wrap it in a
// mutex if several threads answer admission RPCs.
//
//   auto admit = kvc_router::AdmissionController::Create({.capacity_tokens = 92104});
//   absl::StatusOr<kvc_router::AdmitResult> result = admit->Admit(query);
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/config.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {

class AdmissionController {
 public:
  static absl::StatusOr<AdmissionController> Create(const AdmissionConfig& config) {
    if (absl::Status status = config.Validate(); !status.ok()) return status;
    return AdmissionController(config);
  }

  // Decides without changing anything (for dry runs and tests).
  absl::StatusOr<AdmitResult> Evaluate(const AdmitQuery& query) const {
    if (query.input_tokens < query.append_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Admit: session ", query.session, " has input_tokens ", query.input_tokens,
          " smaller than its append_tokens ", query.append_tokens));
    }
    auto it = sessions_.find(query.session);
    const bool resident = it != sessions_.end();
    const uint64_t resident_tokens = resident ? it->second.tokens : 0;
    const uint64_t base = config_.accounting == CapacityAccounting::kConservative
                              ? used_tokens_
                              : used_tokens_ - resident_tokens;
    const bool cap_ok = query.input_tokens <= budget_tokens_ &&
                        base <= budget_tokens_ - query.input_tokens;
    if (resident) {
      if (query.append_tokens > config_.max_direct_append_tokens) {
        return AdmitResult::Rejected(RejectReason::kRealLargeAppend);
      }
      if (config_.direct_cost.enabled &&
          config_.direct_cost.DirectSeconds(query.append_tokens, query.input_tokens,
                                            queued_prefill_tokens_) >
              config_.direct_cost.ReseedSeconds(query.input_tokens)) {
        return AdmitResult::Rejected(RejectReason::kRealLargeAppend);
      }
      if (!cap_ok) return AdmitResult::Rejected(RejectReason::kNoDCapacity);
      return AdmitResult::Admitted(DecisionMode::kDirect);
    }
    if (!cap_ok) return AdmitResult::Rejected(RejectReason::kSessionNotResidentNoCapacity);
    return AdmitResult::Admitted(query.turn == 0 ? DecisionMode::kSeed
                                                 : DecisionMode::kReseed);
  }

  // Decides and, when admitted, books the session at its full input and marks
  // one request of it as running (see `OnRequestFinished`). The answer
  // carries the room left (room_tokens()).
  absl::StatusOr<AdmitResult> Admit(const AdmitQuery& query) {
    absl::StatusOr<AdmitResult> result = Evaluate(query);
    if (!result.ok()) return result;
    if (result->admitted) {
      Session& session = sessions_[query.session];
      used_tokens_ = used_tokens_ - session.tokens + query.input_tokens;
      if (session.running > 0) busy_tokens_ -= session.tokens;
      busy_tokens_ += query.input_tokens;
      session.tokens = query.input_tokens;
      ++session.running;
      Touch(query.session, session);
    }
    result->room_tokens = room_tokens();
    return result;
  }

  // A request admitted earlier finished; its session stays resident.
  absl::Status OnRequestFinished(SessionId session_id) {
    auto it = sessions_.find(session_id);
    if (it == sessions_.end() || it->second.running == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "OnRequestFinished: session ", session_id, " has no running request here"));
    }
    if (--it->second.running == 0) busy_tokens_ -= it->second.tokens;
    Touch(session_id, it->second);
    return absl::OkStatus();
  }

  // Tokens produced by decoding join the session's resident KV. Refused
  // (nothing changes) past the physical pool K_d.
  absl::Status AddTokens(SessionId session_id, uint64_t tokens) {
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat("AddTokens: session ", session_id,
                                              " is not resident"));
    }
    if (tokens > config_.capacity_tokens - used_tokens_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "AddTokens: ", tokens, " more tokens for session ", session_id,
          " would pass the pool of ", config_.capacity_tokens, " (", used_tokens_,
          " used)"));
    }
    it->second.tokens += tokens;
    used_tokens_ += tokens;
    if (it->second.running > 0) busy_tokens_ += tokens;
    return absl::OkStatus();
  }

  // Frees a session's tokens (it ended or the cache dropped it).
  absl::Status ReleaseSession(SessionId session_id) {
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat("ReleaseSession: session ", session_id,
                                              " is not resident"));
    }
    used_tokens_ -= it->second.tokens;
    if (it->second.running > 0) busy_tokens_ -= it->second.tokens;
    lru_.erase(it->second.last_use);
    sessions_.erase(it);
    return absl::OkStatus();
  }

  // Evicts whole sessions with no running request, least recently used first,
  // until `tokens_needed` tokens are free below rho*K_d. When even every idle
  // session would not free that much, evicts nothing: a cache is not thrown
  // away for a request that cannot fit anyway. Returns the evicted sessions
  // in eviction order.
  std::vector<SessionId> EvictLeastRecentlyUsed(uint64_t tokens_needed) {
    return Evict(tokens_needed, /*spare=*/false, 0);
  }
  // The same, but never evicts `keep` (a resident session making room for itself).
  std::vector<SessionId> EvictLeastRecentlyUsedExcept(uint64_t tokens_needed, SessionId keep) {
    return Evict(tokens_needed, /*spare=*/true, keep);
  }

  bool IsResident(SessionId session_id) const { return sessions_.contains(session_id); }
  uint64_t resident_tokens(SessionId session_id) const {
    auto it = sessions_.find(session_id);
    return it == sessions_.end() ? 0 : it->second.tokens;
  }
  uint64_t used_tokens() const { return used_tokens_; }
  // floor(rho * K_d).
  uint64_t budget_tokens() const { return budget_tokens_; }
  // Room left under the high-water mark.
  uint64_t free_tokens() const {
    return used_tokens_ >= budget_tokens_ ? 0 : budget_tokens_ - used_tokens_;
  }
  // The worker's queued prefill work, tokens (its scheduler keeps it
  // current); read only by the cost rule (AdmissionConfig::direct_cost).
  void set_queued_prefill_tokens(uint64_t tokens) { queued_prefill_tokens_ = tokens; }

  // Tokens an admission could still take: the room below rho*K_d plus the
  // KV of sessions with no running request (what Evict can reclaim).
  uint64_t room_tokens() const {
    return busy_tokens_ >= budget_tokens_ ? 0 : budget_tokens_ - busy_tokens_;
  }
  size_t num_sessions() const { return sessions_.size(); }
  const AdmissionConfig& config() const { return config_; }

 private:
  struct Session {
    uint64_t tokens = 0;
    uint32_t running = 0;
    uint64_t last_use = 0;  // key in lru_; 0 = not yet in it
  };

  explicit AdmissionController(const AdmissionConfig& config)
      : config_(config), budget_tokens_(config.budget_tokens()) {}

  std::vector<SessionId> Evict(uint64_t tokens_needed, bool spare, SessionId keep) {
    std::vector<SessionId> evicted;
    uint64_t reachable = free_tokens();
    for (auto it = lru_.begin(); it != lru_.end() && reachable < tokens_needed; ++it) {
      const Session& session = sessions_.find(it->second)->second;
      if (session.running == 0 && !(spare && it->second == keep)) reachable += session.tokens;
    }
    if (reachable < tokens_needed) return evicted;
    for (auto it = lru_.begin(); it != lru_.end() && free_tokens() < tokens_needed;) {
      const SessionId id = it->second;
      auto session = sessions_.find(id);
      if (session->second.running > 0 || (spare && id == keep)) {
        ++it;
        continue;
      }
      used_tokens_ -= session->second.tokens;
      sessions_.erase(session);
      it = lru_.erase(it);
      evicted.push_back(id);
    }
    return evicted;
  }

  void Touch(SessionId id, Session& session) {
    if (session.last_use != 0) lru_.erase(session.last_use);
    session.last_use = ++use_clock_;
    lru_.emplace(session.last_use, id);
  }

  AdmissionConfig config_;
  uint64_t budget_tokens_;
  uint64_t used_tokens_ = 0;
  // Tokens of sessions with a running request: what eviction cannot reclaim.
  uint64_t busy_tokens_ = 0;
  uint64_t use_clock_ = 0;
  uint64_t queued_prefill_tokens_ = 0;
  absl::flat_hash_map<SessionId, Session> sessions_;
  // Use tick -> session, oldest first.
  std::map<uint64_t, SessionId> lru_;
};

}  // namespace kvc_router
