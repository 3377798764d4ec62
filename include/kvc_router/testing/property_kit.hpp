// kvc_router/testing/property_kit.hpp
//
// The reusable property kit: the guarantees of the KVC-Router (Theorems 1
// and 2 and the invariants of seed §3.3) as randomized checks that anyone can
// run against their own cache index. Each check builds thousands of small
// seeded scenarios (|D| from 1 to 16, random capacities, append sizes, bursts
// of rejections), drives RoutingState + Dispatch through them, and returns
// OK or an error that says what broke and which seed reproduces it.
//
//   auto make_index = [](const kvc_router::RouterConfig& config) {
//     return MyIndex(config.num_decode_workers);
//   };
//   absl::Status s = kvc_router::testing::CheckAllProperties<MyIndex>(
//       make_index, {.seed = 42, .scenarios = 10000});
//   // in a Catch2 test: INFO(s.message()); REQUIRE(s.ok());
//
// The checks:
//  - CheckStarvationFreedom (Theorem 1): when some worker keeps admitting a
//    session, it is served Direct/Seed/Reseed within |D| * tau_reject attempts.
//  - CheckFastPath (Theorem 2): when the session's prefix is resident on its
//    pinned worker (by the index and in the worker's own cache), the append is
//    <= tau_append, the worker has room and has not blacklisted the session,
//    Dispatch answers Direct on that worker at the first attempt.
//  - CheckNoSilentOverload: with real AdmissionControllers as the workers, no
//    admission takes a worker past rho*K_d, and every placement went to a
//    worker that admitted it.
//  - CheckResetOnSuccess: v2 zeroes rejects[s,d] on every admission of s on d;
//    with the v1 switch the counters never decrease.
//  - CheckBoundedMigration: a session whose pinned worker is not blacklisted
//    is offered to that worker first, so it moves away only after a rejection
//    there (or after tau_reject of them, once blacklisted): migrations never
//    outnumber rejections on the pinned worker, and the rejections a session
//    absorbs before it settles elsewhere are at most (|D|-1) * tau_reject.
//  - CheckDeterminism: the same inputs give the same decisions, whatever the
//    layout of the state's hash maps.
//  - CheckInflightReturnsToZero: with ops completed, dropped, moved, completed
//    twice, and transports that fail or throw, inflight always equals the
//    placed-and-unfinished requests and ends at zero on every worker.
//  - CheckMembershipChurn (ElasticCacheIndex only; not in CheckAllProperties):
//    requests in flight while decode and prefill workers are added, drained
//    and removed (some while their admission RPC is out): inflight always
//    matches, no request is routed to a draining or removed worker, a
//    removed worker keeps no pin and no residency, everything ends at zero.
//
// Assumptions on the index under test: it answers overlap for what it was
// taught, and it does not evict within a scenario (scenarios stay far below
// the capacity a factory would normally give). `MakeIndex` is any callable
// `Index(const RouterConfig&)`.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvc_router/admit.hpp"
#include "kvc_router/block_hash.hpp"
#include "kvc_router/concepts.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/detail/splitmix.hpp"
#include "kvc_router/dispatch.hpp"
#include "kvc_router/route.hpp"
#include "kvc_router/routing_state.hpp"
#include "kvc_router/testing/scripted_transport.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::testing {

struct PropertyOptions {
  // Scenario i uses seed `seed + i`; a failure names that seed, and
  // {.seed = <it>, .scenarios = 1} replays exactly the failing scenario.
  uint64_t seed = 20261129;
  uint32_t scenarios = 10000;
  uint32_t max_decode_workers = 16;
  // Check kvc-adaptive's variant instead of the seed's: Route places
  // sessions with no residency by the room the workers report
  // (RouterConfig::place_by_room) and the workers' admission applies the
  // cost rule (AdmissionConfig::direct_cost) with incremental accounting
  // half of the time, as the seed's checks draw it.
  bool adaptive = false;
  // Worker health (RouterConfig::health) on. Off by default: Theorems 1 and
  // 2 are the seed's, for a router that asks every worker; with the breaker
  // a worker whose RPCs failed is skipped for a cooldown, so the fast path
  // additionally needs the pinned worker's breaker closed. The invariants
  // and bounded migration (counting a skipped open pin as a rejection) hold
  // either way.
  bool worker_health = false;
};

// Scenario randomness: the same stream on every platform and standard library.
class ScenarioRng {
 public:
  explicit ScenarioRng(uint64_t seed) : bits_(seed) {}
  uint64_t Next() { return bits_.Next(); }
  // Uniform in [lo, hi].
  uint64_t Uniform(uint64_t lo, uint64_t hi) { return lo + Next() % (hi - lo + 1); }
  bool Chance(uint32_t percent) { return Next() % 100 < percent; }

 private:
  kvc_router::detail::SplitMix64 bits_;
};

// A synthetic session: a chained block list that grows turn by turn.
struct SyntheticSession {
  SessionId id = 0;
  uint32_t turn = 0;
  std::vector<BlockHash> chain;
  // Blocks of `chain` that existed before the current turn.
  size_t prefix_blocks = 0;

  // Appends `blocks` new blocks (the turn's append) and returns the request.
  Request NextTurn(ScenarioRng& rng, size_t blocks, uint32_t block_tokens,
                   uint32_t extra_tokens) {
    prefix_blocks = chain.size();
    Grow(rng, blocks);
    Request request;
    request.session = id;
    request.turn = turn++;
    request.prefix_hashes = std::span<const BlockHash>(chain).first(prefix_blocks);
    request.appended_hashes = std::span<const BlockHash>(chain).subspan(prefix_blocks);
    request.append_tokens = blocks * uint64_t{block_tokens} + extra_tokens;
    return request;
  }
  // The model's output: more context, already on the decode worker.
  void Grow(ScenarioRng& rng, size_t blocks) {
    for (size_t i = 0; i < blocks; ++i) {
      const TokenId token = static_cast<TokenId>(rng.Next());
      chain.push_back(HashBlock(chain.empty() ? kChainRootHash : chain.back(),
                                std::span<const TokenId>(&token, 1)));
    }
  }
};

namespace detail {

inline std::string Where(const char* property, uint64_t seed) {
  return absl::StrCat(property, " violated (scenario seed ", seed,
                      "; replay with {.seed = ", seed, ", .scenarios = 1}): ");
}

// Sessions that share a common root (a system prompt) with probability 1/2.
inline SyntheticSession MakeSession(ScenarioRng& rng, SessionId id,
                                    const std::vector<BlockHash>& shared_root) {
  SyntheticSession session;
  session.id = id;
  if (rng.Chance(50)) {
    session.chain.assign(shared_root.begin(),
                         shared_root.begin() + rng.Uniform(0, shared_root.size()));
  }
  return session;
}

inline RouterConfig RandomConfig(ScenarioRng& rng, const PropertyOptions& options) {
  RouterConfig config;
  config.num_decode_workers = static_cast<uint32_t>(
      rng.Uniform(1, std::max<uint32_t>(1, options.max_decode_workers)));
  config.num_prefill_workers = static_cast<uint32_t>(rng.Uniform(0, 4));
  config.reject_threshold = static_cast<uint32_t>(rng.Uniform(1, 5));
  config.sticky_bonus = static_cast<uint32_t>(rng.Uniform(0, 2));
  config.max_admit_attempts =
      static_cast<uint32_t>(rng.Uniform(0, config.num_decode_workers));
  config.block_tokens = static_cast<uint32_t>(rng.Uniform(1, 64));
  config.place_by_room = options.adaptive;
  config.health.enabled = options.worker_health;
  return config;
}

// A clock that only moves when told to.
struct FakeClock {
  std::shared_ptr<absl::Time> now = std::make_shared<absl::Time>(absl::UnixEpoch());
  Clock AsClock() const {
    return [now = now] { return *now; };
  }
};

template <class Index, class MakeIndex>
absl::StatusOr<std::unique_ptr<RoutingState<Index>>> MakeState(MakeIndex& make_index,
                                                               const RouterConfig& config,
                                                               const FakeClock& clock) {
  return RoutingState<Index>::Create(config, make_index(config), clock.AsClock());
}

struct Trace {
  Decision decision;
  uint32_t attempts = 0;
  // Workers asked, in order, with their answers.
  std::vector<std::pair<WorkerId, AdmitResult>> asked;
};

// Runs the I/O-free Dispatch to placement. The op is returned placed, so the
// caller decides when it completes.
template <class Index, class AdmitFn>
absl::StatusOr<DispatchOp<Index>> DriveDispatch(RoutingState<Index>& state,
                                                const Request& request, AdmitFn&& admit,
                                                Trace& trace) {
  absl::StatusOr<DispatchOp<Index>> op = StartDispatch(state, request);
  if (!op.ok()) return op.status();
  while (op->awaiting_admit()) {
    const WorkerId target = op->admit_target();
    absl::StatusOr<AdmitResult> answer = admit(target, op->admit_query());
    const AdmitResult result =
        answer.ok() ? *answer : AdmitResult::Rejected(RejectReason::kWorkerUnavailable);
    trace.asked.emplace_back(target, result);
    if (absl::Status fed = op->OnAdmitResult(result); !fed.ok()) return fed;
  }
  trace.decision = op->decision();
  trace.attempts = op->attempts();
  return op;
}

inline AdmitResult RandomRejection(ScenarioRng& rng) {
  switch (rng.Uniform(0, 3)) {
    case 0:
      return AdmitResult::Rejected(RejectReason::kRealLargeAppend);
    case 1:
      return AdmitResult::Rejected(RejectReason::kNoDCapacity);
    case 2:
      return AdmitResult::Rejected(RejectReason::kSessionNotResidentNoCapacity);
    default:
      return AdmitResult::Rejected(RejectReason::kWorkerUnavailable);
  }
}

inline AdmitResult AdmitAs(const AdmitQuery& query, WorkerId worker, WorkerId pin) {
  if (worker == pin) return AdmitResult::Admitted(DecisionMode::kDirect);
  return AdmitResult::Admitted(query.turn == 0 ? DecisionMode::kSeed : DecisionMode::kReseed);
}

template <class Index>
absl::Status CheckInflightMatches(const RoutingState<Index>& state, uint64_t expected,
                                  const std::string& where) {
  if (state.total_inflight() != expected) {
    return absl::InternalError(absl::StrCat(where, "total inflight is ",
                                            state.total_inflight(), " but ", expected,
                                            " requests are placed and unfinished"));
  }
  return absl::OkStatus();
}

// Places `count` background sessions with an always-admitting worker set so
// that overlaps and loads are not trivially zero; some stay in flight.
template <class Index>
absl::Status PlaceBackground(RoutingState<Index>& state, ScenarioRng& rng,
                             std::vector<SyntheticSession>& sessions,
                             std::vector<DispatchOp<Index>>& in_flight,
                             const std::vector<BlockHash>& shared_root, SessionId first_id,
                             size_t count) {
  const uint32_t block_tokens = state.config().block_tokens;
  for (size_t i = 0; i < count; ++i) {
    sessions.push_back(MakeSession(rng, first_id + i, shared_root));
    SyntheticSession& s = sessions.back();
    const size_t turns = rng.Uniform(1, 3);
    for (size_t t = 0; t < turns; ++t) {
      Request request = s.NextTurn(rng, rng.Uniform(1, 8), block_tokens, 0);
      Trace trace;
      WorkerId pin = state.pin(s.id);
      auto op = DriveDispatch(state, request,
                              [&](WorkerId d, const AdmitQuery& q) -> absl::StatusOr<AdmitResult> {
                                return AdmitAs(q, d, pin);
                              },
                              trace);
      if (!op.ok()) return op.status();
      if (t + 1 == turns && rng.Chance(30)) {
        in_flight.push_back(std::move(*op));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace detail

// Theorem 1: a session that some worker keeps admitting is served
// Direct/Seed/Reseed within |D| * tau_reject admission attempts.
template <CacheIndex Index, class MakeIndex>
absl::Status CheckStarvationFreedom(MakeIndex make_index, const PropertyOptions& options = {}) {
  for (uint32_t i = 0; i < options.scenarios; ++i) {
    const uint64_t seed = options.seed + i;
    const std::string where = detail::Where("Theorem 1 (no starvation)", seed);
    ScenarioRng rng(seed);
    const RouterConfig config = detail::RandomConfig(rng, options);
    detail::FakeClock clock;
    auto state = detail::MakeState<Index>(make_index, config, clock);
    if (!state.ok()) return state.status();
    const uint32_t num_workers = config.num_decode_workers;

    std::vector<BlockHash> root;
    SyntheticSession root_owner;
    root_owner.Grow(rng, rng.Uniform(0, 6));
    root = root_owner.chain;
    std::vector<SyntheticSession> background;
    std::vector<DispatchOp<Index>> in_flight;
    if (absl::Status s = detail::PlaceBackground(**state, rng, background, in_flight, root,
                                                 1000, rng.Uniform(0, 6));
        !s.ok()) {
      return s;
    }

    // The session under test: some history of successes, then only the
    // workers in `fits` admit it.
    SyntheticSession target = detail::MakeSession(rng, 1, root);
    const size_t history = rng.Uniform(0, 4);
    for (size_t t = 0; t < history; ++t) {
      Request request = target.NextTurn(rng, rng.Uniform(1, 6), config.block_tokens, 0);
      detail::Trace trace;
      const WorkerId pin = (*state)->pin(target.id);
      auto op = detail::DriveDispatch(
          **state, request,
          [&](WorkerId d, const AdmitQuery& q) -> absl::StatusOr<AdmitResult> {
            return detail::AdmitAs(q, d, pin);
          },
          trace);
      if (!op.ok()) return op.status();
    }
    std::vector<bool> fits(num_workers, false);
    fits[rng.Uniform(0, num_workers - 1)] = true;
    for (uint32_t d = 0; d < num_workers; ++d) {
      if (rng.Chance(20)) fits[d] = true;
    }

    const uint64_t bound = uint64_t{num_workers} * config.reject_threshold;
    uint64_t attempts = 0;
    for (;;) {
      Request request = target.NextTurn(rng, rng.Uniform(0, 4), config.block_tokens,
                                        static_cast<uint32_t>(rng.Uniform(0, 5)));
      detail::Trace trace;
      const WorkerId pin = (*state)->pin(target.id);
      auto op = detail::DriveDispatch(
          **state, request,
          [&](WorkerId d, const AdmitQuery& q) -> absl::StatusOr<AdmitResult> {
            return fits[d] ? detail::AdmitAs(q, d, pin) : detail::RandomRejection(rng);
          },
          trace);
      if (!op.ok()) return op.status();
      attempts += trace.attempts;
      if (trace.decision.mode != DecisionMode::kFallback) {
        if (!fits[trace.decision.decode]) {
          return absl::InternalError(absl::StrCat(where, "placed on worker ",
                                                  trace.decision.decode,
                                                  " which never admits the session"));
        }
        break;
      }
      if (attempts > bound) break;
    }
    if (attempts > bound) {
      return absl::InternalError(absl::StrCat(
          where, "session not served after ", attempts, " attempts; bound |D|*tau_reject = ",
          bound, " (|D|=", num_workers, ", tau_reject=", config.reject_threshold,
          ", epsilon=", config.effective_max_admit_attempts(), ")"));
    }
  }
  return absl::OkStatus();
}

// Theorem 2: resident prefix + small append + capacity => Direct on the
// resident (pinned) worker at the first attempt.
template <CacheIndex Index, class MakeIndex>
absl::Status CheckFastPath(MakeIndex make_index, const PropertyOptions& options = {}) {
  uint64_t premises_met = 0;
  for (uint32_t i = 0; i < options.scenarios; ++i) {
    const uint64_t seed = options.seed + i;
    const std::string where = detail::Where("Theorem 2 (fast path)", seed);
    ScenarioRng rng(seed);
    const RouterConfig config = detail::RandomConfig(rng, options);
    detail::FakeClock clock;
    auto state = detail::MakeState<Index>(make_index, config, clock);
    if (!state.ok()) return state.status();
    const uint32_t num_workers = config.num_decode_workers;

    AdmissionConfig admission;
    admission.capacity_tokens = rng.Uniform(20'000, 400'000);
    admission.high_water = 0.5 + 0.5 * static_cast<double>(rng.Uniform(1, 100)) / 100.0;
    admission.max_direct_append_tokens = rng.Uniform(16, 8192);
    admission.accounting =
        rng.Chance(50) ? CapacityAccounting::kConservative : CapacityAccounting::kIncremental;
    admission.direct_cost.enabled = options.adaptive;
    AdmissionCluster cluster(num_workers, admission);

    SyntheticSession root_owner;
    root_owner.Grow(rng, rng.Uniform(0, 6));
    std::vector<SyntheticSession> sessions;
    for (SessionId id = 1; id <= rng.Uniform(1, 5); ++id) {
      sessions.push_back(detail::MakeSession(rng, id, root_owner.chain));
    }
    const size_t turns = rng.Uniform(2, 12);
    for (size_t t = 0; t < turns; ++t) {
      SyntheticSession& s = sessions[rng.Uniform(0, sessions.size() - 1)];
      // Some turns come during a burst in which random workers refuse.
      std::vector<bool> refuses(num_workers, false);
      if (rng.Chance(20)) {
        for (uint32_t d = 0; d < num_workers; ++d) refuses[d] = rng.Chance(50);
      }
      const uint64_t extra = rng.Uniform(0, config.block_tokens - 1);
      const size_t new_blocks =
          rng.Chance(10) ? rng.Uniform(0, 400) : rng.Uniform(0, 8);
      Request request =
          s.NextTurn(rng, new_blocks, config.block_tokens, static_cast<uint32_t>(extra));
      const AdmitQuery query = MakeAdmitQuery(request, config.block_tokens);

      // Theorem 2's premise, read off the index and the workers themselves.
      const WorkerId pin = (*state)->pin(s.id);
      bool premise = false;
      if (pin != kNoWorker && !refuses[pin]) {
        std::vector<uint32_t> overlap(num_workers, 0);
        (*state)->ReadIndex([&](const Index& index) {
          index.Overlap(request.prefix_hashes, overlap);
        });
        absl::StatusOr<AdmitResult> would = cluster.worker(pin).Evaluate(query);
        premise = overlap[pin] == request.prefix_hashes.size() &&
                  cluster.worker(pin).IsResident(s.id) && would.ok() && would->admitted &&
                  would->mode == DecisionMode::kDirect &&
                  (*state)->rejects(s.id, pin) < config.reject_threshold;
      }
      detail::Trace trace;
      auto op = detail::DriveDispatch(
          **state, request,
          [&](WorkerId d, const AdmitQuery& q) -> absl::StatusOr<AdmitResult> {
            if (refuses[d]) return AdmitResult::Rejected(RejectReason::kNoDCapacity);
            return cluster.Admit(d, q);
          },
          trace);
      if (!op.ok()) return op.status();
      if (premise) {
        premises_met += request.prefix_hashes.empty() ? 0 : 1;
        if (trace.decision.mode != DecisionMode::kDirect || trace.decision.decode != pin ||
            trace.attempts != 1) {
          return absl::InternalError(absl::StrCat(
              where, "session ", s.id, " turn ", request.turn, " resident on worker ", pin,
              " with append ", request.append_tokens, " got ",
              std::string(DecisionModeName(trace.decision.mode)), " on worker ", trace.decision.decode,
              " after ", trace.attempts, " attempts"));
        }
      }
      // The turn ran; its output joins the context on the decode worker.
      if (trace.decision.mode != DecisionMode::kFallback) {
        (void)cluster.worker(trace.decision.decode).OnRequestFinished(s.id);
        const size_t output_blocks = rng.Uniform(0, 3);
        s.Grow(rng, output_blocks);
        if (cluster.worker(trace.decision.decode)
                .AddTokens(s.id, output_blocks * uint64_t{config.block_tokens})
                .ok()) {
          (void)(*state)->LearnResidency(trace.decision.decode, s.id, s.chain);
        }
      }
    }
  }
  if (options.scenarios >= 100 && premises_met == 0) {
    return absl::InternalError(
        "Theorem 2 (fast path): no scenario met the premise with a non-empty prefix; "
        "the check tested nothing");
  }
  return absl::OkStatus();
}

// No silent overload: real admission controllers never pass rho*K_d, and the
// router only places requests where they were admitted.
template <CacheIndex Index, class MakeIndex>
absl::Status CheckNoSilentOverload(MakeIndex make_index, const PropertyOptions& options = {}) {
  for (uint32_t i = 0; i < options.scenarios; ++i) {
    const uint64_t seed = options.seed + i;
    const std::string where = detail::Where("No silent overload", seed);
    ScenarioRng rng(seed);
    const RouterConfig config = detail::RandomConfig(rng, options);
    detail::FakeClock clock;
    auto state = detail::MakeState<Index>(make_index, config, clock);
    if (!state.ok()) return state.status();
    const uint32_t num_workers = config.num_decode_workers;

    AdmissionConfig admission;
    admission.capacity_tokens = rng.Uniform(500, 60'000);
    admission.high_water = static_cast<double>(rng.Uniform(1, 100)) / 100.0;
    admission.max_direct_append_tokens = rng.Uniform(0, 4096);
    admission.accounting =
        rng.Chance(50) ? CapacityAccounting::kConservative : CapacityAccounting::kIncremental;
    admission.direct_cost.enabled = options.adaptive;
    AdmissionCluster cluster(num_workers, admission);

    std::vector<SyntheticSession> sessions;
    for (SessionId id = 1; id <= rng.Uniform(1, 8); ++id) {
      sessions.push_back(detail::MakeSession(rng, id, {}));
    }
    const size_t steps = rng.Uniform(5, 30);
    for (size_t t = 0; t < steps; ++t) {
      SyntheticSession& s = sessions[rng.Uniform(0, sessions.size() - 1)];
      Request request = s.NextTurn(rng, rng.Uniform(0, 60), config.block_tokens,
                                   static_cast<uint32_t>(rng.Uniform(0, 200)));
      detail::Trace trace;
      std::string overload;
      auto op = detail::DriveDispatch(
          **state, request,
          [&](WorkerId d, const AdmitQuery& q) -> absl::StatusOr<AdmitResult> {
            absl::StatusOr<AdmitResult> answer = cluster.Admit(d, q);
            const AdmissionController& worker = cluster.worker(d);
            if (answer.ok() && answer->admitted && worker.used_tokens() > worker.budget_tokens() &&
                overload.empty()) {
              overload = absl::StrCat("worker ", d, " admitted session ", q.session,
                                      " past rho*K_d: ", worker.used_tokens(), " > ",
                                      worker.budget_tokens());
            }
            return answer;
          },
          trace);
      if (!op.ok()) return op.status();
      if (!overload.empty()) return absl::InternalError(absl::StrCat(where, overload));
      if (trace.decision.mode != DecisionMode::kFallback) {
        const auto& last = trace.asked.back();
        if (last.first != trace.decision.decode || !last.second.admitted) {
          return absl::InternalError(absl::StrCat(
              where, "placed on worker ", trace.decision.decode,
              " but the last admission answer came from worker ", last.first));
        }
      }
      // Random decode growth, completions and cache evictions.
      if (trace.decision.mode != DecisionMode::kFallback) {
        AdmissionController& worker = cluster.worker(trace.decision.decode);
        (void)worker.AddTokens(s.id, rng.Uniform(0, 300));
        (void)worker.OnRequestFinished(s.id);
      }
      if (rng.Chance(25)) {
        const WorkerId d = static_cast<WorkerId>(rng.Uniform(0, num_workers - 1));
        for (SessionId evicted : cluster.worker(d).EvictLeastRecentlyUsed(rng.Uniform(0, 20'000))) {
          if (absl::Status st = (*state)->OnSessionEvicted(d, evicted); !st.ok()) return st;
        }
      }
      for (uint32_t d = 0; d < num_workers; ++d) {
        const AdmissionController& worker = cluster.worker(d);
        if (worker.used_tokens() > admission.capacity_tokens) {
          return absl::InternalError(absl::StrCat(where, "worker ", d, " holds ",
                                                  worker.used_tokens(),
                                                  " tokens, more than K_d = ",
                                                  admission.capacity_tokens));
        }
      }
    }
  }
  return absl::OkStatus();
}

// Reset-on-success (v2) and its absence (v1).
template <CacheIndex Index, class MakeIndex>
absl::Status CheckResetOnSuccess(MakeIndex make_index, const PropertyOptions& options = {}) {
  for (uint32_t i = 0; i < options.scenarios; ++i) {
    const uint64_t seed = options.seed + i;
    const std::string where = detail::Where("Reset-on-success", seed);
    ScenarioRng rng(seed);
    RouterConfig config = detail::RandomConfig(rng, options);
    config.reset_on_success = rng.Chance(75);
    detail::FakeClock clock;
    auto state = detail::MakeState<Index>(make_index, config, clock);
    if (!state.ok()) return state.status();
    const uint32_t num_workers = config.num_decode_workers;

    std::vector<SyntheticSession> sessions;
    for (SessionId id = 1; id <= rng.Uniform(1, 4); ++id) {
      sessions.push_back(detail::MakeSession(rng, id, {}));
    }
    // Each worker refuses with its own, drifting probability.
    std::vector<uint32_t> pressure(num_workers);
    for (auto& p : pressure) p = static_cast<uint32_t>(rng.Uniform(0, 100));
    const size_t steps = rng.Uniform(5, 40);
    for (size_t t = 0; t < steps; ++t) {
      if (rng.Chance(20)) {
        pressure[rng.Uniform(0, num_workers - 1)] = static_cast<uint32_t>(rng.Uniform(0, 100));
      }
      SyntheticSession& s = sessions[rng.Uniform(0, sessions.size() - 1)];
      Request request = s.NextTurn(rng, rng.Uniform(0, 4), config.block_tokens, 0);
      std::vector<uint32_t> before(num_workers);
      for (uint32_t d = 0; d < num_workers; ++d) before[d] = (*state)->rejects(s.id, d);
      const WorkerId pin = (*state)->pin(s.id);
      detail::Trace trace;
      auto op = detail::DriveDispatch(
          **state, request,
          [&](WorkerId d, const AdmitQuery& q) -> absl::StatusOr<AdmitResult> {
            return rng.Chance(pressure[d]) ? detail::RandomRejection(rng)
                                           : detail::AdmitAs(q, d, pin);
          },
          trace);
      if (!op.ok()) return op.status();
      for (uint32_t d = 0; d < num_workers; ++d) {
        uint32_t rejected_here = 0;
        for (const auto& [asked, answer] : trace.asked) rejected_here += asked == d && !answer.admitted;
        const uint32_t after = (*state)->rejects(s.id, d);
        const bool admitted_here = trace.decision.mode != DecisionMode::kFallback &&
                                   trace.decision.decode == d;
        const uint32_t expected =
            admitted_here && config.reset_on_success ? 0 : before[d] + rejected_here;
        if (after != expected) {
          return absl::InternalError(absl::StrCat(
              where, (config.reset_on_success ? "v2" : "v1"), ": rejects[", s.id, ",", d,
              "] went from ", before[d], " to ", after, " with ", rejected_here,
              " rejections", (admitted_here ? " and an admission" : ""), "; expected ",
              expected));
        }
      }
    }
  }
  return absl::OkStatus();
}

// Bounded migration: the pinned worker is asked first unless blacklisted, so
// every migration is paid for by rejections on the worker the session leaves.
template <CacheIndex Index, class MakeIndex>
absl::Status CheckBoundedMigration(MakeIndex make_index, const PropertyOptions& options = {}) {
  for (uint32_t i = 0; i < options.scenarios; ++i) {
    const uint64_t seed = options.seed + i;
    const std::string where = detail::Where("Bounded migration", seed);
    ScenarioRng rng(seed);
    RouterConfig config = detail::RandomConfig(rng, options);
    config.sticky_bonus = static_cast<uint32_t>(rng.Uniform(1, 2));
    detail::FakeClock clock;
    auto state = detail::MakeState<Index>(make_index, config, clock);
    if (!state.ok()) return state.status();
    const uint32_t num_workers = config.num_decode_workers;
    const uint32_t tau = config.reject_threshold;

    // Session-private chains: only placements put a session's blocks anywhere.
    std::vector<SyntheticSession> sessions;
    for (SessionId id = 1; id <= rng.Uniform(1, 4); ++id) {
      sessions.push_back(detail::MakeSession(rng, id, {}));
    }
    std::vector<uint64_t> migrations(sessions.size() + 1, 0);
    std::vector<uint64_t> pin_rejections(sessions.size() + 1, 0);
    // Rejections absorbed since the session's last success, and whether
    // some worker kept admitting it throughout.
    std::vector<uint64_t> episode(sessions.size() + 1, 0);
    std::vector<bool> fits(num_workers);
    for (uint32_t d = 0; d < num_workers; ++d) fits[d] = rng.Chance(60);
    const bool someone_fits = std::find(fits.begin(), fits.end(), true) != fits.end();
    const uint32_t flaky = static_cast<uint32_t>(rng.Uniform(0, 40));
    const size_t steps = rng.Uniform(5, 40);
    for (size_t t = 0; t < steps; ++t) {
      SyntheticSession& s = sessions[rng.Uniform(0, sessions.size() - 1)];
      Request request = s.NextTurn(rng, rng.Uniform(0, 4), config.block_tokens, 0);
      const WorkerId pin = (*state)->pin(s.id);
      const bool pin_blacklisted = pin != kNoWorker && (*state)->rejects(s.id, pin) >= tau;
      // An open breaker (worker health) skips the pin like a blacklist.
      const bool pin_unhealthy =
          pin != kNoWorker && (*state)->worker_health(pin) != BreakerState::kClosed;
      detail::Trace trace;
      // Workers in `fits` admit except for occasional flaky refusals; the
      // others always refuse.
      auto op = detail::DriveDispatch(
          **state, request,
          [&](WorkerId d, const AdmitQuery& q) -> absl::StatusOr<AdmitResult> {
            if (!fits[d] || rng.Chance(flaky)) return detail::RandomRejection(rng);
            return detail::AdmitAs(q, d, pin);
          },
          trace);
      if (!op.ok()) return op.status();
      if (pin != kNoWorker && !pin_blacklisted && !pin_unhealthy &&
          trace.asked.front().first != pin) {
        return absl::InternalError(absl::StrCat(
            where, "session ", s.id, " is pinned to worker ", pin, " (rejects ",
            (*state)->rejects(s.id, pin), " < tau ", tau, ") but worker ",
            trace.asked.front().first, " was asked first"));
      }
      bool pin_rejected = pin_unhealthy;
      if (pin_unhealthy) ++pin_rejections[s.id];
      for (const auto& [d, answer] : trace.asked) {
        if (!answer.admitted) {
          ++episode[s.id];
          if (d == pin) {
            pin_rejected = true;
            ++pin_rejections[s.id];
          }
        }
      }
      if (trace.decision.mode == DecisionMode::kFallback) continue;
      if (pin != kNoWorker && trace.decision.decode != pin) {
        ++migrations[s.id];
        if (!pin_rejected && !pin_blacklisted) {
          return absl::InternalError(absl::StrCat(
              where, "session ", s.id, " moved from worker ", pin, " to ",
              trace.decision.decode, " without a rejection on ", pin));
        }
        if (migrations[s.id] > pin_rejections[s.id]) {
          return absl::InternalError(absl::StrCat(
              where, "session ", s.id, " migrated ", migrations[s.id], " times after only ",
              pin_rejections[s.id], " rejections on its pinned workers"));
        }
      }
      if (someone_fits && flaky == 0 &&
          episode[s.id] > uint64_t{num_workers - 1} * tau) {
        return absl::InternalError(absl::StrCat(
            where, "session ", s.id, " absorbed ", episode[s.id],
            " rejections before settling; bound (|D|-1)*tau_reject = ",
            uint64_t{num_workers - 1} * tau));
      }
      episode[s.id] = 0;
      (void)(*state)->LearnResidency(trace.decision.decode, s.id, s.chain);
    }
  }
  return absl::OkStatus();
}

// Determinism: identical inputs give identical decisions, whatever the
// history of the state's hash maps.
template <CacheIndex Index, class MakeIndex>
absl::Status CheckDeterminism(MakeIndex make_index, const PropertyOptions& options = {}) {
  for (uint32_t i = 0; i < options.scenarios; ++i) {
    const uint64_t seed = options.seed + i;
    const std::string where = detail::Where("Determinism", seed);
    std::vector<std::pair<Decision, uint32_t>> runs[2];
    for (int run = 0; run < 2; ++run) {
      ScenarioRng rng(seed);
      const RouterConfig config = detail::RandomConfig(rng, options);
      detail::FakeClock clock;
      auto state = detail::MakeState<Index>(make_index, config, clock);
      if (!state.ok()) return state.status();
      if (run == 1) {
        // Grow and shrink the session map first: a different bucket layout
        // must not change any decision.
        std::vector<BlockHash> none;
        ScenarioRng junk(~seed);
        for (SessionId id = 0; id < 64; ++id) {
          const SessionId junk_id = (uint64_t{1} << 63) | junk.Next();
          Request request{junk_id, 0, none, 0, {}};
          auto op = StartDispatch(**state, request);
          if (!op.ok()) return op.status();
          op->Complete().IgnoreError();
          (void)(*state)->ForgetSession(junk_id);
        }
      }
      std::vector<SyntheticSession> sessions;
      SyntheticSession root_owner;
      root_owner.Grow(rng, rng.Uniform(0, 4));
      for (SessionId id = 1; id <= rng.Uniform(1, 6); ++id) {
        sessions.push_back(detail::MakeSession(rng, id, root_owner.chain));
      }
      std::vector<DispatchOp<Index>> open;
      const size_t steps = rng.Uniform(5, 30);
      for (size_t t = 0; t < steps; ++t) {
        SyntheticSession& s = sessions[rng.Uniform(0, sessions.size() - 1)];
        Request request = s.NextTurn(rng, rng.Uniform(0, 5), config.block_tokens, 0);
        const WorkerId pin = (*state)->pin(s.id);
        detail::Trace trace;
        auto op = detail::DriveDispatch(
            **state, request,
            [&](WorkerId d, const AdmitQuery& q) -> absl::StatusOr<AdmitResult> {
              return rng.Chance(35) ? detail::RandomRejection(rng) : detail::AdmitAs(q, d, pin);
            },
            trace);
        if (!op.ok()) return op.status();
        runs[run].emplace_back(trace.decision, trace.attempts);
        if (rng.Chance(50)) open.push_back(std::move(*op));
        if (!open.empty() && rng.Chance(40)) open.erase(open.begin());
      }
    }
    if (runs[0] != runs[1]) {
      size_t k = 0;
      while (k < runs[0].size() && runs[0][k] == runs[1][k]) ++k;
      return absl::InternalError(absl::StrCat(where, "decision ", k,
                                              " differs between two identical runs"));
    }
  }
  return absl::OkStatus();
}

// Inflight accounting: always equal to the placed and unfinished requests,
// back to zero at the end, whatever way requests end.
template <CacheIndex Index, class MakeIndex>
absl::Status CheckInflightReturnsToZero(MakeIndex make_index,
                                        const PropertyOptions& options = {}) {
  for (uint32_t i = 0; i < options.scenarios; ++i) {
    const uint64_t seed = options.seed + i;
    const std::string where = detail::Where("Inflight returns to zero", seed);
    ScenarioRng rng(seed);
    const RouterConfig config = detail::RandomConfig(rng, options);
    detail::FakeClock clock;
    auto state = detail::MakeState<Index>(make_index, config, clock);
    if (!state.ok()) return state.status();
    const uint32_t num_workers = config.num_decode_workers;

    std::vector<SyntheticSession> sessions;
    for (SessionId id = 1; id <= rng.Uniform(1, 6); ++id) {
      sessions.push_back(detail::MakeSession(rng, id, {}));
    }
    {
      std::vector<DispatchOp<Index>> open;
      const size_t steps = rng.Uniform(5, 40);
      for (size_t t = 0; t < steps; ++t) {
        SyntheticSession& s = sessions[rng.Uniform(0, sessions.size() - 1)];
        Request request = s.NextTurn(rng, rng.Uniform(0, 4), config.block_tokens, 0);
        const WorkerId pin = (*state)->pin(s.id);
        auto admit = [&](WorkerId d, const AdmitQuery& q) -> absl::StatusOr<AdmitResult> {
          if (rng.Chance(10)) return absl::DeadlineExceededError("admission RPC timed out");
          return rng.Chance(40) ? detail::RandomRejection(rng) : detail::AdmitAs(q, d, pin);
        };
        switch (rng.Uniform(0, 2)) {
          case 0: {  // I/O-free form, kept open for a while
            detail::Trace trace;
            auto op = detail::DriveDispatch(**state, request, admit, trace);
            if (!op.ok()) return op.status();
            open.push_back(std::move(*op));
            break;
          }
          case 1: {  // abandoned while waiting for admission
            auto op = StartDispatch(**state, request);
            if (!op.ok()) return op.status();
            if (rng.Chance(50)) {
              if (absl::Status st = op->Complete(); !st.ok()) return st;
            }
            break;
          }
          default: {  // blocking form over a transport that may fail or throw
            ScriptedTransport transport(admit);
            if (rng.Chance(50)) {
              transport.FailNext(
                  static_cast<ScriptedTransport::Step>(rng.Uniform(0, 5)),
                  rng.Chance(50) ? ScriptedTransport::Failure::kThrow
                                 : ScriptedTransport::Failure::kError);
            }
            try {
              (void)Dispatch(**state, request, transport);
            } catch (const TransportFailure&) {
              // The router must have released what it took.
            }
            break;
          }
        }
        if (absl::Status st = detail::CheckInflightMatches(**state, open.size(), where);
            !st.ok()) {
          return st;
        }
        if (!open.empty() && rng.Chance(45)) {
          const size_t k = rng.Uniform(0, open.size() - 1);
          switch (rng.Uniform(0, 2)) {
            case 0:
              if (absl::Status st = open[k].Complete(); !st.ok()) return st;
              if (open[k].Complete().ok()) {
                return absl::InternalError(absl::StrCat(where, "a second Complete() succeeded"));
              }
              break;
            case 1: {  // moved into a new owner, which then drops it
              DispatchOp<Index> moved = std::move(open[k]);
              if (open[k].Complete().ok()) {
                return absl::InternalError(
                    absl::StrCat(where, "Complete() on a moved-from op succeeded"));
              }
              break;
            }
            default:
              break;  // just dropped below
          }
          open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
        }
        if (absl::Status st = detail::CheckInflightMatches(**state, open.size(), where);
            !st.ok()) {
          return st;
        }
      }
    }
    for (uint32_t d = 0; d < num_workers; ++d) {
      if ((*state)->inflight(d) != 0) {
        return absl::InternalError(absl::StrCat(where, "worker ", d, " ends with inflight ",
                                                (*state)->inflight(d)));
      }
    }
    for (const SyntheticSession& s : sessions) {
      if ((*state)->session_inflight(s.id) != 0) {
        return absl::InternalError(absl::StrCat(where, "session ", s.id,
                                                " ends with requests in flight"));
      }
    }
  }
  return absl::OkStatus();
}

// Elastic membership under random churn (see the list at the top).
template <CacheIndex Index, class MakeIndex>
  requires ElasticCacheIndex<Index>
absl::Status CheckMembershipChurn(MakeIndex make_index, const PropertyOptions& options = {}) {
  for (uint32_t i = 0; i < options.scenarios; ++i) {
    const uint64_t seed = options.seed + i;
    const std::string where = detail::Where("Membership churn", seed);
    ScenarioRng rng(seed);
    RouterConfig config = detail::RandomConfig(rng, options);
    config.num_prefill_workers = static_cast<uint32_t>(rng.Uniform(1, 3));
    detail::FakeClock clock;
    auto state = detail::MakeState<Index>(make_index, config, clock);
    if (!state.ok()) return state.status();
    RoutingState<Index>& st = **state;
    std::vector<SyntheticSession> sessions;
    for (SessionId id = 1; id <= rng.Uniform(1, 8); ++id) {
      sessions.push_back(detail::MakeSession(rng, id, {}));
    }
    std::vector<DispatchOp<Index>> open;
    auto fail = [&](auto&&... what) {
      return absl::InternalError(absl::StrCat(where, what...));
    };
    const size_t steps = rng.Uniform(10, 120);
    for (size_t step = 0; step < steps; ++step) {
      const uint64_t action = rng.Uniform(0, 99);
      const uint32_t slots = st.num_decode_workers();
      if (action < 40) {
        SyntheticSession& s = sessions[rng.Uniform(0, sessions.size() - 1)];
        const Request request = s.NextTurn(rng, rng.Uniform(0, 3), config.block_tokens, 1);
        auto op = StartDispatch(st, request);
        if (!op.ok()) return op.status();
        while (op->awaiting_admit()) {
          const WorkerId target = op->admit_target();
          if (st.decode_status(target) != WorkerStatus::kActive) {
            return fail("session ", s.id, " was routed to non-active worker ", target);
          }
          if (rng.Chance(10)) (void)st.RemoveDecodeWorker(target);  // mid-RPC
          const uint64_t answer = rng.Uniform(0, 9);
          const AdmitResult result =
              answer < 6   ? AdmitResult::Admitted(request.turn == 0 ? DecisionMode::kSeed
                                                                     : DecisionMode::kReseed)
              : answer < 9 ? AdmitResult::Rejected(RejectReason::kNoDCapacity)
                           : AdmitResult::Rejected(RejectReason::kWorkerUnavailable);
          if (absl::Status fed = op->OnAdmitResult(result); !fed.ok()) return fed;
        }
        const WorkerId placed = op->decision().decode;
        if (st.decode_status(placed) != WorkerStatus::kActive) {
          return fail("session ", s.id, " was placed on non-active worker ", placed);
        }
        if (op->decision().prefill != kNoWorker &&
            st.prefill_status(op->decision().prefill) != WorkerStatus::kActive) {
          return fail("session ", s.id, " was prefilled on non-active prefill worker ",
                      op->decision().prefill);
        }
        if (op->decision().mode != DecisionMode::kFallback) {
          (void)st.LearnResidency(placed, s.id, s.chain);
        }
        if (rng.Chance(50)) open.push_back(std::move(*op));
      } else if (action < 65) {
        if (!open.empty()) {
          const size_t k = rng.Uniform(0, open.size() - 1);
          if (rng.Chance(50)) {
            if (absl::Status done = open[k].Complete(); !done.ok()) return done;
          }
          open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
        }
      } else if (action < 75) {
        if (auto added = st.AddDecodeWorker(); !added.ok()) return added.status();
      } else if (action < 82) {
        (void)st.DrainDecodeWorker(static_cast<WorkerId>(rng.Uniform(0, slots - 1)));
      } else if (action < 92) {
        const auto d = static_cast<WorkerId>(rng.Uniform(0, slots - 1));
        if (st.RemoveDecodeWorker(d).ok()) {
          std::vector<uint32_t> overlap(slots);
          for (const SyntheticSession& s : sessions) {
            if (st.pin(s.id) == d) return fail("session ", s.id, " is pinned to removed ", d);
            st.ReadIndex([&](const Index& index) { index.Overlap(s.chain, overlap); });
            if (overlap[d] != 0) {
              return fail("removed worker ", d, " still holds ", overlap[d], " blocks of session ",
                          s.id);
            }
          }
        }
      } else if (action < 96) {
        if (auto added = st.AddPrefillWorker(); !added.ok()) return added.status();
      } else {
        (void)st.RemovePrefillWorker(
            static_cast<WorkerId>(rng.Uniform(0, st.num_prefill_workers() - 1)));
      }
      std::vector<uint64_t> expected(st.num_decode_workers(), 0);
      for (const auto& op : open) {
        if (op.placed()) ++expected[op.decision().decode];
      }
      for (WorkerId d = 0; d < expected.size(); ++d) {
        if (st.inflight(d) != expected[d]) {
          return fail("worker ", d, " has inflight ", st.inflight(d), " but ", expected[d],
                      " requests are placed and unfinished there");
        }
      }
      if (st.num_active_decode_workers() == 0) return fail("no active decode worker is left");
    }
    open.clear();
    if (st.total_inflight() != 0) {
      return fail("inflight ", st.total_inflight(), " after every request ended");
    }
    for (const SyntheticSession& s : sessions) {
      if (st.session_inflight(s.id) != 0) {
        return fail("session ", s.id, " ends with requests in flight");
      }
    }
  }
  return absl::OkStatus();
}

// Runs every check; returns the first failure.
template <CacheIndex Index, class MakeIndex>
absl::Status CheckAllProperties(MakeIndex make_index, const PropertyOptions& options = {}) {
  for (auto check : {&CheckStarvationFreedom<Index, MakeIndex>, &CheckFastPath<Index, MakeIndex>,
                     &CheckNoSilentOverload<Index, MakeIndex>,
                     &CheckResetOnSuccess<Index, MakeIndex>,
                     &CheckBoundedMigration<Index, MakeIndex>,
                     &CheckDeterminism<Index, MakeIndex>,
                     &CheckInflightReturnsToZero<Index, MakeIndex>}) {
    if (absl::Status s = check(make_index, options); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace kvc_router::testing
