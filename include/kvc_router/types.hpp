// kvc_router/types.hpp
//
// The vocabulary every other header speaks: worker, session and block-hash ids,
// the request the router decides about, the four decision modes and the
// admission-rejection reasons.
//
// Workers are dense small integers (0..|D|-1 for decode workers, 0..|P|-1 for
// prefill workers); a gateway keeps its own table from these ids to endpoints.
// A `Request` is a *view*: it refers to the caller's block-hash array and must
// not outlive it. Nothing here allocates, so this header stays cheap to include.
//
//   std::vector<kvc_router::BlockHash> hashes = ...;   // chained, one per block
//   kvc_router::Request req{.session = 42, .turn = 3,
//                           .prefix_hashes = hashes, .append_tokens = 310};
//   uint64_t tokens = req.input_tokens(/*block_tokens=*/24);
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

namespace kvc_router {

// Dense index of a decode or prefill worker inside the library.
using WorkerId = uint32_t;
// Session identifier assigned by the agent runtime upstream of the gateway.
using SessionId = uint64_t;
// Chained hash of one KV block: it names the whole prefix up to that block.
using BlockHash = uint64_t;
// Token id as produced by the tokenizer.
using TokenId = uint32_t;

// "No worker" (the seed's ⊥): returned when routing found no candidate, and
// used as the pin of a session that has never been placed.
inline constexpr WorkerId kNoWorker = std::numeric_limits<WorkerId>::max();

// One turn of one session, as seen by the router and by decode-worker admission.
struct Request {
  SessionId session = 0;
  // 0 for a session's first turn; decides Seed versus Reseed on admission.
  uint32_t turn = 0;
  // Chained hashes of the full blocks of the context that existed before this
  // turn's new tokens; these are what a worker may already hold.
  std::span<const BlockHash> prefix_hashes;
  // Tokens of this turn that are not covered by `prefix_hashes`.
  uint64_t append_tokens = 0;
  // Optional: chained hashes of the full blocks that this turn's tokens
  // complete (continuing `prefix_hashes`). They are already counted in
  // `append_tokens`; on placement the index learns them with the prefix, so
  // the next turn, whose prefix includes them, finds them resident.
  std::span<const BlockHash> appended_hashes;

  // input_len(r) = |prefix_hashes| * block_tokens + append_len. Meaningful
  // only when `input_tokens_fit(block_tokens)`; StartDispatch refuses
  // requests for which it does not.
  constexpr uint64_t input_tokens(uint32_t block_tokens) const {
    return static_cast<uint64_t>(prefix_hashes.size()) * block_tokens +
           append_tokens;
  }
  // False when input_len(r) does not fit in 64 bits (it would wrap).
  constexpr bool input_tokens_fit(uint32_t block_tokens) const {
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    const uint64_t blocks = static_cast<uint64_t>(prefix_hashes.size());
    if (block_tokens != 0 && blocks > kMax / block_tokens) return false;
    return blocks * block_tokens <= kMax - append_tokens;
  }
};

// How a request was finally served.
enum class DecisionMode : uint8_t {
  // The session's KV is resident on the decode worker: append-prefill there.
  kDirect,
  // First turn: a prefill worker computes the KV and ships it to the decode worker.
  kSeed,
  // Later turn whose KV is no longer (or never was) on the chosen decode worker.
  kReseed,
  // Every admission attempt failed: plain P/D disaggregation, round-robin P and D.
  kFallback,
};

inline constexpr int kNumDecisionModes = 4;

constexpr std::string_view DecisionModeName(DecisionMode mode) {
  switch (mode) {
    case DecisionMode::kDirect:
      return "direct";
    case DecisionMode::kSeed:
      return "seed";
    case DecisionMode::kReseed:
      return "reseed";
    case DecisionMode::kFallback:
      return "fallback";
  }
  return "unknown";
}

// Why a decode worker refused a request. The first three are Algorithm 2's
// reasons and keep the seed's exact log strings.
enum class RejectReason : uint8_t {
  kNone,
  // The session is resident but its append exceeds tau_append.
  kRealLargeAppend,
  // The session is resident but the pool would pass rho * K_d.
  kNoDCapacity,
  // The session is not resident and the pool cannot take its whole input.
  kSessionNotResidentNoCapacity,
  // Library extension: the admission RPC got no answer (timeout, connection
  // refused). Counted like a rejection so a dead worker is avoided.
  kWorkerUnavailable,
};

inline constexpr int kNumRejectReasons = 5;

constexpr std::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNone:
      return "none";
    case RejectReason::kRealLargeAppend:
      return "real-large-append";
    case RejectReason::kNoDCapacity:
      return "no-d-capacity";
    case RejectReason::kSessionNotResidentNoCapacity:
      return "session-not-resident-no-capacity";
    case RejectReason::kWorkerUnavailable:
      return "worker-unavailable";
  }
  return "unknown";
}

// AdmitResult::room_tokens of a worker that did not say.
inline constexpr uint64_t kUnknownRoomTokens = ~uint64_t{0};

// What a decode worker's admission (Algorithm 2) answered.
struct AdmitResult {
  bool admitted = false;
  // Direct, Seed or Reseed when admitted; ignored otherwise.
  DecisionMode mode = DecisionMode::kDirect;
  RejectReason reason = RejectReason::kNone;
  // Optional: tokens the worker could still admit after this answer (below
  // rho*K_d, counting the KV of sessions with nothing running as reclaimable).
  // A router may place sessions with no residency by it
  // (RouterConfig::place_by_room); the seed's algorithms ignore it.
  uint64_t room_tokens = kUnknownRoomTokens;

  static constexpr AdmitResult Admitted(DecisionMode mode) {
    return AdmitResult{true, mode, RejectReason::kNone};
  }
  static constexpr AdmitResult Rejected(RejectReason reason) {
    return AdmitResult{false, DecisionMode::kFallback, reason};
  }
};

// The few numbers admission needs: what crosses the admission RPC. It carries
// no block hashes, so the RPC stays small however long the context is.
struct AdmitQuery {
  SessionId session = 0;
  uint32_t turn = 0;
  uint64_t append_tokens = 0;
  uint64_t input_tokens = 0;
};

constexpr AdmitQuery MakeAdmitQuery(const Request& request,
                                    uint32_t block_tokens) {
  return AdmitQuery{request.session, request.turn, request.append_tokens,
                    request.input_tokens(block_tokens)};
}

// Where a request goes. `prefill` is kNoWorker for Direct, and for Seed,
// Reseed and Fallback when the cluster has no prefill pool (colocated
// instances prefill themselves).
struct Decision {
  DecisionMode mode = DecisionMode::kFallback;
  WorkerId prefill = kNoWorker;
  WorkerId decode = kNoWorker;

  friend constexpr bool operator==(const Decision&, const Decision&) = default;
};

}  // namespace kvc_router
