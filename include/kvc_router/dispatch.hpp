// kvc_router/dispatch.hpp
//
// Algorithm 3, Dispatch(r): Route, ask the chosen decode worker to Admit,
// reset-on-success, retry up to epsilon times, then Fallback. Two forms:
//
//  * `StartDispatch` returns a `DispatchOp`, an I/O-free state machine for
//    async gateways. The op names the worker to ask; the caller sends the
//    admission RPC however it likes and feeds the answer back with
//    `OnAdmitResult`. No thread waits on anything, and no lock is held
//    between steps.
//
//      absl::StatusOr<DispatchOp<Index>> op = StartDispatch(*state, request);
//      while (op->awaiting_admit()) {
//        AdmitResult answer = /* RPC to op->admit_target() with op->admit_query() */;
//        op->OnAdmitResult(answer);
//      }
//      Decision decision = op->decision();   // Direct/Seed/Reseed/Fallback
//      /* run the request */
//      op->Complete();                        // or let the op go out of scope
//
//  * `Dispatch` is the blocking form over a `WorkerTransport`: it runs the
//    admission loop and then the request's steps on the transport.
//
// Bookkeeping (see docs/algorithm.md for why each choice was made):
//  - On admission of s on d: rejects[s,d] = 0 (unless v1), pin[s] = d,
//    inflight[d] += 1, assigned[d] += 1, and the index learns the prefix on d.
//  - On rejection: rejects[s,d] += 1 and d is not asked again in this Dispatch.
//  - Every answer's room (AdmitResult::room_tokens) is remembered for d; a
//    capacity rejection without one bounds d's room below the input. Only
//    RouterConfig::place_by_room reads it.
//  - Worker health: a worker-unavailable answer is a failure for d's circuit
//    breaker, any other answer closes it; every rejection adds to d's reject
//    pressure and an admission clears it (see route.hpp).
//  - Fallback: round-robin P and D (skipping open breakers); the fallback decode worker also counts
//    inflight and assigned, but pin and index are left alone.
//  - The inflight taken at placement is released exactly once: by
//    `Complete()`, or by the op's destructor when the caller's code returns
//    early or throws. A second `Complete()` is an error that changes nothing.
//
// Thread safety: ops of different requests may run on different threads at
// once; one op must not be used from two threads at the same time. The
// RoutingState must outlive its ops, and the request's hash array must live
// until the op has placed the request.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvc_router/concepts.hpp"
#include "kvc_router/detail/worker_mask.hpp"
#include "kvc_router/route.hpp"
#include "kvc_router/routing_state.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {
namespace detail {

// The index learns the request's whole chain on its decode worker: the
// prefix plus the blocks the append completed. Contiguous arrays (the
// SessionHasher's) are passed as they are; others are joined first.
template <CacheIndex Index>
void LearnPlacement(Index& index, WorkerId worker, const Request& request) {
  const auto& prefix = request.prefix_hashes;
  const auto& appended = request.appended_hashes;
  if (appended.empty()) {
    index.Learn(worker, request.session, prefix);
  } else if (prefix.empty() || prefix.data() + prefix.size() == appended.data()) {
    index.Learn(worker, request.session,
                std::span<const BlockHash>(prefix.empty() ? appended.data() : prefix.data(),
                                           prefix.size() + appended.size()));
  } else {
    std::vector<BlockHash> chain(prefix.begin(), prefix.end());
    chain.insert(chain.end(), appended.begin(), appended.end());
    index.Learn(worker, request.session, chain);
  }
}

}  // namespace detail

template <CacheIndex Index>
class DispatchOp {
 public:
  DispatchOp(DispatchOp&& other) noexcept { MoveFrom(other); }
  DispatchOp& operator=(DispatchOp&& other) noexcept {
    if (this != &other) {
      ReleaseIfPlaced();
      MoveFrom(other);
    }
    return *this;
  }
  DispatchOp(const DispatchOp&) = delete;
  DispatchOp& operator=(const DispatchOp&) = delete;
  ~DispatchOp() { ReleaseIfPlaced(); }

  // True while the op waits for an admission answer from `admit_target()`.
  bool awaiting_admit() const { return stage_ == Stage::kAwaitingAdmit; }
  // True once the request has a decision and holds its inflight slot.
  bool placed() const { return stage_ == Stage::kPlaced; }
  bool completed() const { return stage_ == Stage::kCompleted; }

  // The decode worker to ask next (valid while awaiting_admit()).
  WorkerId admit_target() const { return target_; }
  // What to send it.
  const AdmitQuery& admit_query() const { return query_; }
  // Admission attempts made so far (rejections plus the success, if any).
  uint32_t attempts() const { return attempts_; }
  // The final decision (valid once placed).
  const Decision& decision() const { return decision_; }
  // The last admission answer that was a rejection, if any.
  RejectReason last_reject_reason() const { return last_reject_; }

  // Feeds the answer of `admit_target()`. Errors (and changes nothing) when
  // the op is not waiting for an answer or the answer is malformed: a mode
  // or reason outside its enum, an admission as Fallback, or a rejection
  // without a reason.
  absl::Status OnAdmitResult(const AdmitResult& result) {
    if (stage_ != Stage::kAwaitingAdmit) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DispatchOp::OnAdmitResult: session ", request_.session,
          " is not waiting for an admission answer"));
    }
    // An answer decoded from the wire may carry any byte in its enums.
    if (static_cast<int>(result.mode) >= kNumDecisionModes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DispatchOp::OnAdmitResult: worker ", target_, " answered session ",
          request_.session, " with decision mode ", static_cast<int>(result.mode),
          ", which is not a DecisionMode (0..", kNumDecisionModes - 1, ")"));
    }
    if (static_cast<int>(result.reason) >= kNumRejectReasons) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DispatchOp::OnAdmitResult: worker ", target_, " answered session ",
          request_.session, " with reject reason ", static_cast<int>(result.reason),
          ", which is not a RejectReason (0..", kNumRejectReasons - 1, ")"));
    }
    if (result.admitted && result.mode == DecisionMode::kFallback) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DispatchOp::OnAdmitResult: worker ", target_,
          " admitted session ", request_.session,
          " with mode fallback; admission answers direct, seed or reseed"));
    }
    if (!result.admitted && result.reason == RejectReason::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DispatchOp::OnAdmitResult: worker ", target_, " rejected session ",
          request_.session, " without a reason"));
    }
    absl::MutexLock lock(&detail::StateAccess::Mutex(*state_));
    auto& session = detail::StateAccess::TouchSession(*state_, request_.session,
                                                       detail::StateAccess::Now(*state_));
    // Elastic membership: the worker was removed while the RPC was out. Its
    // answer cannot be used (nothing runs there any more) and says nothing
    // about the session: ask the next worker.
    if (detail::StateAccess::DecodeStatus(*state_)[target_] == WorkerStatus::kRemoved) {
      tried_.Insert(target_);
      AdvanceLocked(session);
      return absl::OkStatus();
    }
    ++attempts_;
    const absl::Time now = detail::StateAccess::Now(*state_);
    auto& health = detail::StateAccess::Health(*state_);
    if (result.reason == RejectReason::kWorkerUnavailable) {
      health.OnFailure(target_, now);
    } else {
      health.OnAnswer(target_);
    }
    detail::StateAccess::NotePressure(*state_, target_, result.admitted, now);
    auto& room = detail::StateAccess::LearnedRoom(*state_);
    if (result.room_tokens != kUnknownRoomTokens) {
      room[target_] = result.room_tokens;
    } else if (result.reason == RejectReason::kNoDCapacity ||
               result.reason == RejectReason::kSessionNotResidentNoCapacity) {
      // No room for this input: at most one token less.
      room[target_] = std::min(room[target_], query_.input_tokens - (query_.input_tokens > 0));
    }
    if (result.admitted) {
      if (state_->config().reset_on_success && target_ < session.rejects.size()) {
        session.rejects[target_] = 0;
      }
      session.pin = target_;
      decision_ = Decision{result.mode,
                           result.mode == DecisionMode::kDirect
                               ? kNoWorker
                               : detail::StateAccess::NextPrefill(*state_),
                           target_};
      detail::LearnPlacement(detail::StateAccess::Index(*state_), target_, request_);
      TakeInflightLocked(session);
      return absl::OkStatus();
    }
    last_reject_ = result.reason;
    if (session.rejects.size() <= target_) {
      session.rejects.resize(state_->config().num_decode_workers, 0);
    }
    ++session.rejects[target_];
    tried_.Insert(target_);
    AdvanceLocked(session);
    return absl::OkStatus();
  }

  // Ends the request: releases the inflight slot taken at placement. Calling
  // it while still awaiting admission abandons the dispatch. Errors on a
  // second call.
  absl::Status Complete() {
    if (stage_ == Stage::kCompleted || state_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DispatchOp::Complete: the request of session ", request_.session,
          " was already completed"));
    }
    ReleaseIfPlaced();
    stage_ = Stage::kCompleted;
    return absl::OkStatus();
  }

 private:
  template <CacheIndex I>
  friend absl::StatusOr<DispatchOp<I>> StartDispatch(RoutingState<I>& state,
                                                     const Request& request);

  enum class Stage : uint8_t { kAwaitingAdmit, kPlaced, kCompleted };
  using SessionEntry = std::remove_reference_t<decltype(detail::StateAccess::TouchSession(
      std::declval<RoutingState<Index>&>(), SessionId{}, absl::Time{}))>;

  DispatchOp(RoutingState<Index>& state, const Request& request)
      : state_(&state),
        request_(request),
        query_(MakeAdmitQuery(request, state.config().block_tokens)),
        tried_() {}

  // Routes the next attempt, or falls back after epsilon attempts or when
  // every worker was tried.
  void AdvanceLocked(SessionEntry& session) {
    if (attempts_ < state_->config().effective_max_admit_attempts()) {
      const RouteChoice choice = detail::RouteLocked(*state_, request_, &tried_, overlap_);
      if (choice.worker != kNoWorker) {
        target_ = choice.worker;
        // A half-open breaker lets this request through as its probe.
        detail::StateAccess::Health(*state_).OnSend(target_, detail::StateAccess::Now(*state_));
        stage_ = Stage::kAwaitingAdmit;
        return;
      }
    }
    decision_ = Decision{DecisionMode::kFallback, detail::StateAccess::NextPrefill(*state_),
                         detail::StateAccess::NextDecode(*state_)};
    TakeInflightLocked(session);
  }

  void TakeInflightLocked(SessionEntry& session) {
    ++detail::StateAccess::Inflight(*state_)[decision_.decode];
    ++detail::StateAccess::Assigned(*state_)[decision_.decode];
    ++session.inflight;
    target_ = kNoWorker;
    stage_ = Stage::kPlaced;
  }

  void ReleaseIfPlaced() {
    if (stage_ != Stage::kPlaced || state_ == nullptr) return;
    absl::MutexLock lock(&detail::StateAccess::Mutex(*state_));
    --detail::StateAccess::Inflight(*state_)[decision_.decode];
    auto& sessions = detail::StateAccess::Sessions(*state_);
    // A placed session is never swept (its inflight is > 0), so it is here.
    if (auto it = sessions.find(request_.session); it != sessions.end()) {
      --it->second.inflight;
    }
    stage_ = Stage::kCompleted;
  }

  void MoveFrom(DispatchOp& other) {
    state_ = std::exchange(other.state_, nullptr);
    request_ = other.request_;
    query_ = other.query_;
    tried_ = std::move(other.tried_);
    overlap_ = std::move(other.overlap_);
    decision_ = other.decision_;
    target_ = other.target_;
    attempts_ = other.attempts_;
    last_reject_ = other.last_reject_;
    stage_ = std::exchange(other.stage_, Stage::kCompleted);
  }

  RoutingState<Index>* state_ = nullptr;
  Request request_;
  AdmitQuery query_;
  detail::WorkerMask tried_;
  absl::InlinedVector<uint32_t, 16> overlap_;
  Decision decision_;
  WorkerId target_ = kNoWorker;
  uint32_t attempts_ = 0;
  RejectReason last_reject_ = RejectReason::kNone;
  Stage stage_ = Stage::kCompleted;
};

// Starts Algorithm 3 for `request`: validates it and routes the first
// attempt. Errors (and changes nothing) on a request the router must refuse:
// more than max_prefix_blocks prefix or appended blocks, appended blocks
// that need more tokens than append_tokens, or an input_tokens that would
// overflow 64 bits.
template <CacheIndex Index>
absl::StatusOr<DispatchOp<Index>> StartDispatch(RoutingState<Index>& state,
                                                const Request& request) {
  const RouterConfig& config = state.config();
  if (request.prefix_hashes.size() > config.max_prefix_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StartDispatch: session ", request.session, " sent ",
        request.prefix_hashes.size(), " prefix blocks; the limit is ",
        config.max_prefix_blocks, " (RouterConfig.max_prefix_blocks)"));
  }
  if (request.appended_hashes.size() > config.max_prefix_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StartDispatch: session ", request.session, " sent ",
        request.appended_hashes.size(), " appended blocks; the limit is ",
        config.max_prefix_blocks, " (RouterConfig.max_prefix_blocks)"));
  }
  // |appended| * block_tokens > append_tokens, without the product overflowing.
  if (request.appended_hashes.size() > request.append_tokens / config.block_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StartDispatch: session ", request.session, " has ",
        request.appended_hashes.size(), " appended blocks of ", config.block_tokens,
        " tokens but only ", request.append_tokens, " append tokens"));
  }
  if (!request.input_tokens_fit(config.block_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StartDispatch: session ", request.session, " has input_tokens = ",
        request.prefix_hashes.size(), " prefix blocks * ", config.block_tokens,
        " tokens + ", request.append_tokens,
        " append tokens, which overflows 64 bits"));
  }
  DispatchOp<Index> op(state, request);
  absl::MutexLock lock(&detail::StateAccess::Mutex(state));
  auto& session = detail::StateAccess::TouchSession(state, request.session,
                                                     detail::StateAccess::Now(state));
  op.AdvanceLocked(session);
  return op;
}

// Runs a placed decision's steps on the transport.
template <WorkerTransport Transport>
absl::Status RunDecision(Transport& transport, const Decision& decision,
                         const Request& request) {
  switch (decision.mode) {
    case DecisionMode::kDirect:
      return transport.RunDirect(decision.decode, request);
    case DecisionMode::kSeed:
    case DecisionMode::kReseed: {
      // Without a prefill pool the decode instance prefills for itself.
      if (decision.prefill == kNoWorker) return transport.RunDirect(decision.decode, request);
      if (absl::Status s = transport.Prefill(decision.prefill, request); !s.ok()) return s;
      if (absl::Status s = transport.TransferKv(decision.prefill, decision.decode, request);
          !s.ok()) {
        return s;
      }
      return transport.Decode(decision.decode, request);
    }
    case DecisionMode::kFallback:
      return transport.RunFallback(decision.prefill, decision.decode, request);
  }
  return absl::InternalError("RunDecision: unknown decision mode");
}

// Algorithm 3, blocking: admission loop over `transport.Admit`, then the
// request's steps. Returns the decision, or the first error of the
// transport's steps (or of validation). Inflight is released on every path,
// including an exception thrown by the transport, which propagates.
template <CacheIndex Index, WorkerTransport Transport>
absl::StatusOr<Decision> Dispatch(RoutingState<Index>& state, const Request& request,
                                  Transport& transport) {
  absl::StatusOr<DispatchOp<Index>> op = StartDispatch(state, request);
  if (!op.ok()) return op.status();
  while (op->awaiting_admit()) {
    absl::StatusOr<AdmitResult> answer = transport.Admit(op->admit_target(), op->admit_query());
    absl::Status fed = op->OnAdmitResult(
        answer.ok() ? *answer : AdmitResult::Rejected(RejectReason::kWorkerUnavailable));
    if (!fed.ok()) return fed;  // a malformed answer; the op's destructor cleans up
  }
  const Decision decision = op->decision();
  absl::Status ran = RunDecision(transport, decision, request);
  (void)op->Complete();
  if (!ran.ok()) return ran;
  return decision;
}

}  // namespace kvc_router
