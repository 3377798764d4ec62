#include "kvc_router/routing_state.hpp"

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

using State = RoutingState<NaiveIndex>;

struct FakeClock {
  std::shared_ptr<absl::Time> now = std::make_shared<absl::Time>(absl::UnixEpoch());
  Clock AsClock() const {
    return [now = now] { return *now; };
  }
  void Advance(absl::Duration d) const { *now += d; }
};

// Places one request of `session` on some worker and returns the open op.
DispatchOp<NaiveIndex> Place(State& state, SessionId session) {
  Request request{.session = session, .turn = 0, .prefix_hashes = {}, .append_tokens = 1};
  auto op = StartDispatch(state, request);
  REQUIRE(op.ok());
  REQUIRE(op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kSeed)).ok());
  return std::move(*op);
}

TEST_CASE("Create refuses bad configs and mismatched indexes", "[routing_state]") {
  RouterConfig config;
  config.num_decode_workers = 0;
  CHECK(State::Create(config, NaiveIndex(0)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  config.num_decode_workers = 3;
  auto mismatch = State::Create(config, NaiveIndex(2));
  CHECK(mismatch.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(mismatch.status()).find("covers 2 workers") != std::string::npos);
  CHECK(State::Create(config, NaiveIndex(3), Clock()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("idle sessions are forgotten after the TTL, busy ones never", "[routing_state]") {
  FakeClock clock;
  RouterConfig config;
  config.num_decode_workers = 2;
  config.session_idle_ttl = absl::Minutes(10);
  auto state = State::Create(config, NaiveIndex(2), clock.AsClock());
  REQUIRE(state.ok());
  { auto done = Place(**state, 1); }           // idle from now on
  auto busy = Place(**state, 2);               // still in flight
  CHECK((*state)->num_sessions() == 2);
  clock.Advance(absl::Minutes(9));
  CHECK((*state)->ExpireIdleSessions() == 0);
  clock.Advance(absl::Minutes(2));
  CHECK((*state)->ExpireIdleSessions() == 1);
  CHECK((*state)->pin(1) == kNoWorker);
  CHECK((*state)->pin(2) != kNoWorker);
  REQUIRE(busy.Complete().ok());
  clock.Advance(absl::Minutes(11));
  CHECK((*state)->ExpireIdleSessions() == 1);
  CHECK((*state)->num_sessions() == 0);
}

TEST_CASE("new sessions sweep expired ones on their own", "[routing_state]") {
  FakeClock clock;
  RouterConfig config;
  config.num_decode_workers = 1;
  config.session_idle_ttl = absl::Minutes(4);
  auto state = State::Create(config, NaiveIndex(1), clock.AsClock());
  REQUIRE(state.ok());
  for (SessionId s = 0; s < 100; ++s) Place(**state, s).Complete().IgnoreError();
  CHECK((*state)->num_sessions() == 100);
  clock.Advance(absl::Minutes(5));
  Place(**state, 1000).Complete().IgnoreError();
  CHECK((*state)->num_sessions() == 1);
}

TEST_CASE("max_sessions bounds memory, dropping the least recently seen", "[routing_state]") {
  FakeClock clock;
  RouterConfig config;
  config.num_decode_workers = 2;
  config.max_sessions = 64;
  auto state = State::Create(config, NaiveIndex(2), clock.AsClock());
  REQUIRE(state.ok());
  auto keep = Place(**state, 0);  // in flight: never dropped
  for (SessionId s = 1; s < 10'000; ++s) {
    clock.Advance(absl::Seconds(1));
    Place(**state, s).Complete().IgnoreError();
    REQUIRE((*state)->num_sessions() <= 65);
  }
  CHECK((*state)->pin(0) != kNoWorker);
  CHECK((*state)->pin(9'999) != kNoWorker);  // the most recent survive
  CHECK((*state)->pin(1) == kNoWorker);
}

TEST_CASE("ForgetSession and OnSessionEvicted check their arguments", "[routing_state]") {
  RouterConfig config;
  config.num_decode_workers = 2;
  auto state = State::Create(config, NaiveIndex(2));
  REQUIRE(state.ok());
  CHECK((*state)->ForgetSession(5).code() == absl::StatusCode::kNotFound);
  auto op = Place(**state, 5);
  const absl::Status busy = (*state)->ForgetSession(5);
  CHECK(busy.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(test::Message(busy).find("in flight") != std::string::npos);
  REQUIRE(op.Complete().ok());
  CHECK((*state)->ForgetSession(5).ok());
  CHECK((*state)->OnSessionEvicted(2, 5).code() == absl::StatusCode::kInvalidArgument);
  CHECK((*state)->LearnResidency(7, 5, {}).code() == absl::StatusCode::kInvalidArgument);

  std::vector<BlockHash> chain = {4, 5, 6};
  REQUIRE((*state)->LearnResidency(1, 5, chain).ok());
  Request request{.session = 5, .turn = 1, .prefix_hashes = chain, .append_tokens = 1};
  CHECK(Route(**state, request).worker == 1);
  REQUIRE((*state)->OnSessionEvicted(1, 5).ok());
  std::vector<uint32_t> overlap(2);
  (*state)->ReadIndex([&](const NaiveIndex& index) { index.Overlap(chain, overlap); });
  CHECK(overlap == std::vector<uint32_t>{0, 0});
}

}  // namespace
}  // namespace kvc_router
