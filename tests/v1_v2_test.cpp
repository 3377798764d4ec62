// Seed §3.4: a transient burst against a long-lived session. Without
// reset-on-success (v1) the rejection counters only grow, every worker ends
// up blacklisted, and the degenerate branch moves the session round-robin,
// losing its KV each time. With reset-on-success (v2) the session stays put.
#include <catch2/catch.hpp>
#include <set>
#include <vector>

#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/testing/property_kit.hpp"

namespace kvc_router {
namespace {

struct Outcome {
  int direct = 0;
  int reseed = 0;
  int fallback = 0;
  int migrations = 0;
  int degenerate_routes = 0;
  int first_degenerate_turn = -1;
  bool all_blacklisted_at_end = false;
  std::set<WorkerId> pins_after_degenerate;
  uint32_t final_pin_rejects = 0;
};

constexpr int kTurns = 300;
constexpr int kFirstBurst = 70;   // 70 calm turns on one worker first
constexpr int kBurstEvery = 10;   // then one saturated turn in ten

Outcome Run(bool reset_on_success) {
  RouterConfig config;
  config.num_decode_workers = 4;
  config.num_prefill_workers = 1;
  config.max_admit_attempts = 2;  // the seed's evaluation setting
  config.reset_on_success = reset_on_success;
  auto state = RoutingState<EstimateIndex>::Create(
      config, EstimateIndex(4, /*capacity_tokens=*/0, config.block_tokens));
  REQUIRE(state.ok());

  Outcome out;
  testing::ScenarioRng rng(7);
  testing::SyntheticSession session;
  session.id = 42;
  WorkerId holder = kNoWorker;  // the worker whose cache holds the session's KV
  for (int turn = 0; turn < kTurns; ++turn) {
    const bool burst = turn >= kFirstBurst && (turn - kFirstBurst) % kBurstEvery == 0;
    const Request request = session.NextTurn(rng, 2, config.block_tokens, 5);
    const RouteChoice first = Route(**state, request);
    if (first.degenerate) {
      ++out.degenerate_routes;
      if (out.first_degenerate_turn < 0) out.first_degenerate_turn = turn;
    }
    const WorkerId pin_before = (*state)->pin(session.id);
    auto op = StartDispatch(**state, request);
    REQUIRE(op.ok());
    while (op->awaiting_admit()) {
      const WorkerId d = op->admit_target();
      AdmitResult answer;
      if (burst) {
        answer = AdmitResult::Rejected(RejectReason::kNoDCapacity);
      } else if (d == holder) {
        answer = AdmitResult::Admitted(DecisionMode::kDirect);
      } else {
        answer = AdmitResult::Admitted(turn == 0 ? DecisionMode::kSeed : DecisionMode::kReseed);
      }
      REQUIRE(op->OnAdmitResult(answer).ok());
    }
    const Decision decision = op->decision();
    REQUIRE(op->Complete().ok());
    switch (decision.mode) {
      case DecisionMode::kDirect:
        ++out.direct;
        break;
      case DecisionMode::kSeed:
      case DecisionMode::kReseed:
        if (turn > 0) ++out.reseed;
        holder = decision.decode;  // the KV moved; the old copy is gone
        break;
      case DecisionMode::kFallback:
        ++out.fallback;
        break;
    }
    if (decision.mode != DecisionMode::kFallback && pin_before != kNoWorker &&
        decision.decode != pin_before) {
      ++out.migrations;
    }
    if (out.first_degenerate_turn >= 0 && decision.mode != DecisionMode::kFallback) {
      out.pins_after_degenerate.insert(decision.decode);
    }
  }
  out.all_blacklisted_at_end = true;
  for (WorkerId d = 0; d < 4; ++d) {
    out.all_blacklisted_at_end &= (*state)->rejects(session.id, d) >= config.reject_threshold;
  }
  out.final_pin_rejects = (*state)->rejects(session.id, (*state)->pin(session.id));
  return out;
}

TEST_CASE("v1 thrashes after a transient burst; v2 stays on the fast path", "[v1v2]") {
  const Outcome v1 = Run(/*reset_on_success=*/false);
  const Outcome v2 = Run(/*reset_on_success=*/true);
  constexpr int kBursts = (kTurns - kFirstBurst + kBurstEvery - 1) / kBurstEvery;
  INFO("v1: direct " << v1.direct << " reseed " << v1.reseed << " fallback " << v1.fallback
                     << " migrations " << v1.migrations << " degenerate from turn "
                     << v1.first_degenerate_turn);
  INFO("v2: direct " << v2.direct << " reseed " << v2.reseed << " fallback " << v2.fallback
                     << " migrations " << v2.migrations);

  // v2: the bursts cost one fallback each and nothing else.
  CHECK(v2.fallback == kBursts);
  CHECK(v2.migrations == 0);
  CHECK(v2.reseed == 0);
  CHECK(v2.degenerate_routes == 0);
  CHECK(v2.direct == kTurns - 1 - kBursts);
  CHECK(v2.final_pin_rejects == 0);

  // v1: every worker ends blacklisted for the session, routing is stuck in
  // the degenerate branch, and the session is bounced between workers,
  // re-prefilling each time.
  CHECK(v1.all_blacklisted_at_end);
  CHECK(v1.first_degenerate_turn > 0);
  CHECK(v1.first_degenerate_turn < kTurns / 2);
  CHECK(v1.degenerate_routes >= kTurns / 2);
  CHECK(v1.pins_after_degenerate.size() >= 2);
  CHECK(v1.migrations >= 10);
  CHECK(v1.reseed == v1.migrations);
  CHECK(v1.fallback == kBursts);
  CHECK(v1.direct < v2.direct - 10);
}

}  // namespace
}  // namespace kvc_router
