#include "kvc_router/health.hpp"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "kvc_router/testing/scripted_transport.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

using State = RoutingState<NaiveIndex>;
using testing::ScriptedTransport;

struct FakeClock {
  std::shared_ptr<absl::Time> now = std::make_shared<absl::Time>(absl::UnixEpoch());
  Clock AsClock() const {
    return [now = now] { return *now; };
  }
  void Advance(absl::Duration d) const { *now += d; }
};

const absl::Time kT0 = absl::UnixEpoch();

TEST_CASE("a breaker opens after N failures in the window, probes, and closes", "[health]") {
  HealthConfig config;  // 3 failures in 10 s, 5 s cooldown
  CircuitBreaker breaker;
  CHECK(breaker.state(config, kT0) == BreakerState::kClosed);
  breaker.OnFailure(config, kT0);
  breaker.OnFailure(config, kT0 + absl::Seconds(1));
  CHECK(breaker.state(config, kT0 + absl::Seconds(1)) == BreakerState::kClosed);
  CHECK(breaker.Routable(config, kT0 + absl::Seconds(1)));
  breaker.OnFailure(config, kT0 + absl::Seconds(2));
  CHECK(breaker.state(config, kT0 + absl::Seconds(2)) == BreakerState::kOpen);
  CHECK_FALSE(breaker.Routable(config, kT0 + absl::Seconds(6)));
  CHECK(breaker.times_opened() == 1);
  // Cooldown over: half-open, one probe at a time.
  const absl::Time probe = kT0 + absl::Seconds(7);
  CHECK(breaker.state(config, probe) == BreakerState::kHalfOpen);
  CHECK(breaker.Routable(config, probe));
  breaker.OnSend(config, probe);
  CHECK_FALSE(breaker.Routable(config, probe));
  // The probe fails: open again for a whole cooldown.
  breaker.OnFailure(config, probe + absl::Seconds(1));
  CHECK(breaker.state(config, probe + absl::Seconds(5)) == BreakerState::kOpen);
  CHECK(breaker.times_opened() == 2);
  // The next probe is answered: closed.
  const absl::Time second = probe + absl::Seconds(7);
  CHECK(breaker.Routable(config, second));
  breaker.OnSend(config, second);
  breaker.OnAnswer();
  CHECK(breaker.state(config, second) == BreakerState::kClosed);
  CHECK(breaker.Routable(config, second));
}

TEST_CASE("failures spread wider than the window never open the breaker", "[health]") {
  HealthConfig config;
  CircuitBreaker breaker;
  for (int i = 0; i < 20; ++i) {
    breaker.OnFailure(config, kT0 + absl::Seconds(11) * i);
    breaker.OnFailure(config, kT0 + absl::Seconds(11) * i + absl::Seconds(1));
  }
  CHECK(breaker.state(config, kT0 + absl::Seconds(300)) == BreakerState::kClosed);
  // An answer in between also resets the count.
  breaker.OnFailure(config, kT0 + absl::Seconds(400));
  breaker.OnFailure(config, kT0 + absl::Seconds(400));
  breaker.OnAnswer();
  breaker.OnFailure(config, kT0 + absl::Seconds(400));
  CHECK(breaker.state(config, kT0 + absl::Seconds(400)) == BreakerState::kClosed);
}

TEST_CASE("an abandoned probe does not wedge a half-open breaker", "[health]") {
  HealthConfig config;
  config.failure_threshold = 1;
  CircuitBreaker breaker;
  breaker.OnFailure(config, kT0);
  const absl::Time probe = kT0 + config.open_cooldown;
  breaker.OnSend(config, probe);
  CHECK_FALSE(breaker.Routable(config, probe + absl::Seconds(1)));
  CHECK(breaker.Routable(config, probe + config.open_cooldown));
}

TEST_CASE("health thresholds are validated, naming the field", "[health][config]") {
  struct Bad {
    std::string field;
    HealthConfig config;
  };
  HealthConfig zero_threshold;
  zero_threshold.failure_threshold = 0;
  HealthConfig zero_window;
  zero_window.failure_window = absl::ZeroDuration();
  HealthConfig infinite_cooldown;
  infinite_cooldown.open_cooldown = absl::InfiniteDuration();
  HealthConfig negative_cooldown;
  negative_cooldown.open_cooldown = -absl::Seconds(1);
  for (const Bad& bad : {Bad{"failure_threshold", zero_threshold},
                         Bad{"failure_window", zero_window},
                         Bad{"open_cooldown", infinite_cooldown},
                         Bad{"open_cooldown", negative_cooldown}}) {
    INFO(bad.field);
    absl::Status status = bad.config.Validate();
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(test::Message(status).find(bad.field) != std::string::npos);
    RouterConfig router;
    router.health = bad.config;
    CHECK(test::Message(router.Validate()).find("RouterConfig.health") != std::string::npos);
    CHECK(State::Create(router, NaiveIndex(1)).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  CHECK(HealthConfig{}.Validate().ok());
}

// The operator's probe of issue 10: worker 0 refuses every admission RPC.
struct DeadWorkerCluster {
  uint32_t asked_dead = 0;
  bool dead = true;
  ScriptedTransport::AdmitFunction Fn() {
    return [this](WorkerId d, const AdmitQuery&) -> absl::StatusOr<AdmitResult> {
      if (d == 0) {
        ++asked_dead;
        if (dead) return absl::UnavailableError("connection refused");
        return AdmitResult::Admitted(DecisionMode::kSeed);
      }
      return AdmitResult::Admitted(DecisionMode::kSeed);
    };
  }
};

std::unique_ptr<State> HealthState(uint32_t decode, const FakeClock& clock, bool health) {
  RouterConfig config;
  config.num_decode_workers = decode;
  config.num_prefill_workers = 1;
  config.health.enabled = health;
  auto state = State::Create(config, NaiveIndex(decode), clock.AsClock());
  REQUIRE(state.ok());
  return std::move(*state);
}

TEST_CASE("a dead worker is asked at most a handful of times by 50 new sessions",
          "[health][dispatch]") {
  const bool health = GENERATE(true, false);
  INFO("health " << health);
  FakeClock clock;
  auto state = HealthState(4, clock, health);
  DeadWorkerCluster cluster;
  ScriptedTransport transport(cluster.Fn());
  std::vector<DispatchOp<NaiveIndex>> running;  // some requests stay in flight
  for (SessionId s = 1; s <= 50; ++s) {
    Request request{.session = s, .turn = 0, .prefix_hashes = {}, .append_tokens = 10};
    auto op = StartDispatch(*state, request);
    REQUIRE(op.ok());
    while (op->awaiting_admit()) {
      auto answer = transport.Admit(op->admit_target(), op->admit_query());
      REQUIRE(op->OnAdmitResult(answer.ok() ? *answer
                                            : AdmitResult::Rejected(RejectReason::kWorkerUnavailable))
                  .ok());
    }
    REQUIRE(op->placed());
    CHECK(op->decision().decode != 0);
    if (s % 3 == 0) running.push_back(std::move(*op));
    clock.Advance(absl::Milliseconds(100));
  }
  // With the breaker: asked until it opens (3 failures). Without it, reject
  // pressure alone keeps the dead worker from looking least loaded: it is
  // asked again only once the others carry more requests in flight than it
  // has failures (before either, all 50 asked it first).
  CHECK(cluster.asked_dead <= (health ? 3u : 10u));
  CHECK(cluster.asked_dead >= 1);
  running.clear();
  CHECK(state->total_inflight() == 0);
}

TEST_CASE("with the breaker open, worker 0 is skipped even by a session pinned there",
          "[health][dispatch]") {
  FakeClock clock;
  auto state = HealthState(2, clock, true);
  DeadWorkerCluster cluster;
  cluster.dead = false;
  ScriptedTransport transport(cluster.Fn());
  std::vector<BlockHash> prefix = test::TestChain(8, 1);
  Request first{.session = 1, .turn = 0, .prefix_hashes = prefix, .append_tokens = 10};
  REQUIRE(Dispatch(*state, first, transport).ok());
  REQUIRE(state->pin(1) == 0);
  // Worker 0 dies; three sessions' RPCs to it fail (each reseeds on 1).
  cluster.dead = true;
  for (SessionId s = 1; s <= 3; ++s) {
    Request again{.session = 1, .turn = static_cast<uint32_t>(s), .prefix_hashes = prefix,
                  .append_tokens = 10};
    auto decision = Dispatch(*state, again, transport);
    REQUIRE(decision.ok());
    CHECK(decision->decode == 1);
    // Session 1 follows its residency back to 0 until the breaker opens.
    state->WithIndex([&](NaiveIndex& index) { index.ForgetSession(1, 1); });
    REQUIRE(state->LearnResidency(0, 1, prefix).ok());
    REQUIRE(state->ForgetSession(1).ok());
  }
  CHECK(cluster.asked_dead == 4);  // the first, answered, and three failures
  CHECK(state->worker_health(0) == BreakerState::kOpen);
  CHECK(state->breaker_opens(0) == 1);
  // Open: the prefix resident on 0 no longer draws requests there.
  Request resident{.session = 1, .turn = 9, .prefix_hashes = prefix, .append_tokens = 10};
  auto decision = Dispatch(*state, resident, transport);
  REQUIRE(decision.ok());
  CHECK(decision->decode == 1);
  CHECK(cluster.asked_dead == 4);
}

TEST_CASE("a recovered worker comes back after the cooldown", "[health][dispatch]") {
  FakeClock clock;
  RouterConfig config;
  config.num_decode_workers = 3;
  config.health.failure_threshold = 1;
  auto created = State::Create(config, NaiveIndex(3), clock.AsClock());
  REQUIRE(created.ok());
  State& state = **created;
  DeadWorkerCluster cluster;
  ScriptedTransport transport(cluster.Fn());
  SessionId next = 1;
  auto dispatch_new = [&] {
    Request request{.session = next++, .turn = 0, .prefix_hashes = {}, .append_tokens = 10};
    auto decision = Dispatch(state, request, transport);
    REQUIRE(decision.ok());
    return *decision;
  };
  // The first new session asks 0 (lowest id on a tie), which fails once: open.
  CHECK(dispatch_new().decode == 1);
  CHECK(cluster.asked_dead == 1);
  CHECK(state.worker_health(0) == BreakerState::kOpen);
  for (int i = 0; i < 10; ++i) CHECK(dispatch_new().decode != 0);
  CHECK(cluster.asked_dead == 1);
  // Still open one second before the cooldown ends.
  clock.Advance(config.health.open_cooldown - absl::Seconds(1));
  CHECK(dispatch_new().decode != 0);
  CHECK(cluster.asked_dead == 1);
  // The worker recovers; after the cooldown and the pressure window the next
  // new session is its probe (least assigned), which closes the breaker.
  cluster.dead = false;
  clock.Advance(config.health.failure_window);
  CHECK(state.worker_health(0) == BreakerState::kHalfOpen);
  CHECK(state.reject_pressure(0) == 0);
  CHECK(dispatch_new().decode == 0);
  CHECK(cluster.asked_dead == 2);
  CHECK(state.worker_health(0) == BreakerState::kClosed);
  CHECK(dispatch_new().decode == 0);  // still the least assigned
}

TEST_CASE("capacity rejections steer new sessions away but not resident ones",
          "[health][route]") {
  FakeClock clock;
  auto state = HealthState(2, clock, true);
  // Worker 0 is full for new sessions; worker 1 admits.
  bool zero_full = true;
  ScriptedTransport transport([&](WorkerId d, const AdmitQuery&) -> absl::StatusOr<AdmitResult> {
    if (d == 0 && zero_full) {
      return AdmitResult::Rejected(RejectReason::kSessionNotResidentNoCapacity);
    }
    return AdmitResult::Admitted(d == 0 ? DecisionMode::kDirect : DecisionMode::kSeed);
  });
  Request a{.session = 1, .turn = 0, .prefix_hashes = {}, .append_tokens = 10};
  REQUIRE(Dispatch(*state, a, transport).ok());
  CHECK(transport.calls()[0].decode == 0);  // tie: lowest id asked first
  CHECK(state->reject_pressure(0) == 1);
  // The next new session asks worker 1 first: 0's rejection counts as load.
  const size_t before = transport.calls().size();
  Request b{.session = 2, .turn = 0, .prefix_hashes = {}, .append_tokens = 10};
  auto placed_b = Dispatch(*state, b, transport);
  REQUIRE(placed_b.ok());
  CHECK(transport.calls()[before].decode == 1);
  CHECK(placed_b->decode == 1);
  // A session whose prefix is resident on 0 still asks 0 first (Route's order).
  std::vector<BlockHash> prefix = test::TestChain(4, 7);
  REQUIRE(state->LearnResidency(0, 3, prefix).ok());
  zero_full = false;
  const size_t before_c = transport.calls().size();
  Request c{.session = 3, .turn = 1, .prefix_hashes = prefix, .append_tokens = 10};
  auto placed_c = Dispatch(*state, c, transport);
  REQUIRE(placed_c.ok());
  CHECK(transport.calls()[before_c].decode == 0);
  CHECK(*placed_c == Decision{DecisionMode::kDirect, kNoWorker, 0});
  // The admission cleared 0's pressure; it is old news after the window anyway.
  CHECK(state->reject_pressure(0) == 0);
}

TEST_CASE("with reject pressure off, Route keeps the seed's order for new sessions",
          "[health][route]") {
  FakeClock clock;
  RouterConfig config;
  config.num_decode_workers = 2;
  config.num_prefill_workers = 1;
  config.health.enabled = false;
  config.reject_pressure = false;
  auto state = State::Create(config, NaiveIndex(2), clock.AsClock());
  REQUIRE(state.ok());
  ScriptedTransport transport([&](WorkerId d, const AdmitQuery&) -> absl::StatusOr<AdmitResult> {
    if (d == 0) return AdmitResult::Rejected(RejectReason::kSessionNotResidentNoCapacity);
    return AdmitResult::Admitted(DecisionMode::kSeed);
  });
  for (SessionId session = 1; session <= 3; ++session) {
    const size_t before = transport.calls().size();
    Request r{.session = session, .turn = 0, .prefix_hashes = {}, .append_tokens = 10};
    auto placed = Dispatch(**state, r, transport);
    REQUIRE(placed.ok());
    // (0, 0, -inflight, -assigned): worker 0 ties or wins on load, so it is asked first
    // every time, as the seed's Route does, however often it refused.
    CHECK(transport.calls()[before].decode == 0);
    CHECK((*state)->reject_pressure(0) == 0);
  }
}

TEST_CASE("reject pressure is forgotten after the failure window", "[health][route]") {
  FakeClock clock;
  auto state = HealthState(2, clock, false);
  Request a{.session = 1, .turn = 0, .prefix_hashes = {}, .append_tokens = 10};
  auto op = StartDispatch(*state, a);
  REQUIRE(op.ok());
  REQUIRE(op->admit_target() == 0);
  REQUIRE(op->OnAdmitResult(AdmitResult::Rejected(RejectReason::kNoDCapacity)).ok());
  CHECK(state->reject_pressure(0) == 1);
  clock.Advance(HealthConfig{}.failure_window + absl::Seconds(1));
  CHECK(state->reject_pressure(0) == 0);
}

TEST_CASE("when every worker's breaker is open, Dispatch still asks one", "[health][dispatch]") {
  FakeClock clock;
  auto state = HealthState(2, clock, true);
  uint32_t asked = 0;
  ScriptedTransport transport([&](WorkerId, const AdmitQuery&) -> absl::StatusOr<AdmitResult> {
    ++asked;
    return absl::DeadlineExceededError("timeout");
  });
  for (SessionId s = 1; s <= 10; ++s) {
    Request request{.session = s, .turn = 0, .prefix_hashes = {}, .append_tokens = 10};
    auto decision = Dispatch(*state, request, transport);
    REQUIRE(decision.ok());
    CHECK(decision->mode == DecisionMode::kFallback);
  }
  CHECK(state->worker_health(0) == BreakerState::kOpen);
  CHECK(state->worker_health(1) == BreakerState::kOpen);
  // Both open: each Dispatch still asks (and falls back), never hangs or fails.
  CHECK(asked >= 10);
  CHECK(state->total_inflight() == 0);
}

}  // namespace
}  // namespace kvc_router
