// The property kit over the shipped indexes, and proof that it catches a
// broken one.
#include "kvc_router/testing/property_kit.hpp"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "kvc_router/admit.hpp"
#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

using testing::PropertyOptions;

PropertyOptions Options() {
  PropertyOptions options;
  options.seed = test::PropertySeed();
  options.scenarios = test::PropertyScenarios();
  return options;
}

template <class Index, class Make>
void RunEveryProperty(Make make, bool adaptive = false) {
  PropertyOptions options = Options();
  options.adaptive = adaptive;
  // The checks that hold with worker health on, too (health_test.cpp has
  // the breaker's own tests).
  SECTION("with worker health: invariants and bounded migration") {
    PropertyOptions health = options;
    health.worker_health = true;
    INFO("seed " << health.seed << ", " << health.scenarios << " scenarios per property");
    for (const absl::Status& s :
         {testing::CheckNoSilentOverload<Index>(make, health),
          testing::CheckResetOnSuccess<Index>(make, health),
          testing::CheckBoundedMigration<Index>(make, health),
          testing::CheckDeterminism<Index>(make, health)}) {
      INFO(s.message());
      CHECK(s.ok());
    }
  }
  INFO("seed " << options.seed << ", " << options.scenarios << " scenarios per property");
  SECTION("Theorem 1: no starvation") {
    const absl::Status s = testing::CheckStarvationFreedom<Index>(make, options);
    INFO(s.message());
    CHECK(s.ok());
  }
  SECTION("Theorem 2: fast path") {
    const absl::Status s = testing::CheckFastPath<Index>(make, options);
    INFO(s.message());
    CHECK(s.ok());
  }
  SECTION("no silent overload") {
    const absl::Status s = testing::CheckNoSilentOverload<Index>(make, options);
    INFO(s.message());
    CHECK(s.ok());
  }
  SECTION("reset-on-success") {
    const absl::Status s = testing::CheckResetOnSuccess<Index>(make, options);
    INFO(s.message());
    CHECK(s.ok());
  }
  SECTION("bounded migration") {
    const absl::Status s = testing::CheckBoundedMigration<Index>(make, options);
    INFO(s.message());
    CHECK(s.ok());
  }
  SECTION("determinism") {
    const absl::Status s = testing::CheckDeterminism<Index>(make, options);
    INFO(s.message());
    CHECK(s.ok());
  }
  SECTION("inflight returns to zero") {
    const absl::Status s = testing::CheckInflightReturnsToZero<Index>(make, options);
    INFO(s.message());
    CHECK(s.ok());
  }
}

TEST_CASE("property kit over the naive index", "[property][kit]") {
  RunEveryProperty<NaiveIndex>(&test::MakeNaiveIndex);
}

TEST_CASE("property kit over the estimate index", "[property][kit]") {
  RunEveryProperty<EstimateIndex>(&test::MakeEstimateIndex);
}

// kvc-adaptive's Route (place_by_room) and workers (the cost rule) keep every
// guarantee the seed's algorithms have.
TEST_CASE("property kit over kvc-adaptive's Route and admission", "[property][kit][adaptive]") {
  RunEveryProperty<NaiveIndex>(&test::MakeNaiveIndex, /*adaptive=*/true);
}

// Claims worker 0 holds more of every prefix than it could.
class BoastfulIndex {
 public:
  explicit BoastfulIndex(uint32_t workers) : inner_(workers) {}
  size_t num_workers() const { return inner_.num_workers(); }
  void Overlap(std::span<const BlockHash> prefix, std::span<uint32_t> out) const {
    inner_.Overlap(prefix, out);
    out[0] = static_cast<uint32_t>(prefix.size()) + 5;
  }
  void Learn(WorkerId d, SessionId s, std::span<const BlockHash> h) { inner_.Learn(d, s, h); }
  void ForgetSession(WorkerId d, SessionId s) { inner_.ForgetSession(d, s); }

 private:
  NaiveIndex inner_;
};

// Learns nothing at all.
struct AmnesicIndex {
  uint32_t workers;
  size_t num_workers() const { return workers; }
  void Overlap(std::span<const BlockHash>, std::span<uint32_t> out) const {
    std::fill(out.begin(), out.end(), 0);
  }
  void Learn(WorkerId, SessionId, std::span<const BlockHash>) {}
  void ForgetSession(WorkerId, SessionId) {}
};

TEST_CASE("the kit catches an index that misleads routing", "[property][kit]") {
  auto make = [](const RouterConfig& c) { return BoastfulIndex(c.num_decode_workers); };
  PropertyOptions options;
  options.scenarios = 500;
  const absl::Status fast = testing::CheckFastPath<BoastfulIndex>(make, options);
  CHECK(fast.code() == absl::StatusCode::kInternal);
  CHECK(test::Message(fast).find("Theorem 2") != std::string::npos);
  CHECK(test::Message(fast).find("replay with") != std::string::npos);
  const absl::Status migration = testing::CheckBoundedMigration<BoastfulIndex>(make, options);
  CHECK(migration.code() == absl::StatusCode::kInternal);
  CHECK(test::Message(migration).find("asked first") != std::string::npos);
}

TEST_CASE("the kit refuses to pass when its premise is never met", "[property][kit]") {
  auto make = [](const RouterConfig& c) { return AmnesicIndex{c.num_decode_workers}; };
  PropertyOptions options;
  options.scenarios = 200;
  const absl::Status fast = testing::CheckFastPath<AmnesicIndex>(make, options);
  CHECK(fast.code() == absl::StatusCode::kInternal);
  CHECK(test::Message(fast).find("tested nothing") != std::string::npos);
}

TEST_CASE("a failing scenario replays from the seed it names", "[property][kit]") {
  auto make = [](const RouterConfig& c) { return BoastfulIndex(c.num_decode_workers); };
  PropertyOptions options;
  options.scenarios = 500;
  const std::string message = test::Message(testing::CheckFastPath<BoastfulIndex>(make, options));
  const size_t at = message.find("scenario seed ");
  REQUIRE(at != std::string::npos);
  PropertyOptions replay;
  replay.seed = std::stoull(message.substr(at + 14));
  replay.scenarios = 1;
  CHECK(test::Message(testing::CheckFastPath<BoastfulIndex>(make, replay)) == message);
}

// --- The theorems' premises are needed: counterexamples -------------------

std::unique_ptr<RoutingState<NaiveIndex>> TheoremState(uint32_t decode, uint32_t epsilon) {
  RouterConfig config;
  config.num_decode_workers = decode;
  config.num_prefill_workers = 1;
  config.reject_threshold = 3;
  config.max_admit_attempts = epsilon;
  auto state = RoutingState<NaiveIndex>::Create(config, NaiveIndex(decode));
  REQUIRE(state.ok());
  return std::move(*state);
}

// Runs one Dispatch with `answer(d, query)` as the admission RPC and
// completes it; returns the decision and adds the attempts to `*attempts`.
template <class Answer>
Decision RunOnce(RoutingState<NaiveIndex>& state, const Request& request, Answer answer,
                 uint64_t* attempts = nullptr) {
  auto op = StartDispatch(state, request);
  REQUIRE(op.ok());
  while (op->awaiting_admit()) {
    REQUIRE(op->OnAdmitResult(answer(op->admit_target(), op->admit_query())).ok());
  }
  if (attempts != nullptr) *attempts += op->attempts();
  const Decision decision = op->decision();
  REQUIRE(op->Complete().ok());
  return decision;
}

// Theorem 2 as first written ("resident prefix, small append, room => Direct
// on the pinned worker at the first attempt") also needs rejects[s,d] <
// tau_reject: here s is pinned and resident on worker 1, which would answer
// Direct, but bursts of refusals left every counter at tau_reject, so Route
// takes the degenerate branch and asks worker 0 (fewest rejections, lowest id).
TEST_CASE("Theorem 2 needs the pinned worker not to have blacklisted the session",
          "[property][theorem]") {
  for (const uint32_t bursts : {3u, 2u}) {
    INFO(bursts << " bursts of refusals (tau_reject = 3)");
    auto state = TheoremState(/*decode=*/2, /*epsilon=*/2);
    AdmissionConfig admission;
    admission.capacity_tokens = 100'000;
    std::vector<AdmissionController> workers;
    for (int d = 0; d < 2; ++d) workers.push_back(*AdmissionController::Create(admission));
    auto real = [&](WorkerId d, const AdmitQuery& q) { return *workers[d].Admit(q); };
    auto refuse = [](WorkerId, const AdmitQuery&) {
      return AdmitResult::Rejected(RejectReason::kNoDCapacity);
    };

    const std::vector<BlockHash> chain = test::TestChain(4, 7);
    REQUIRE(state->LearnResidency(1, /*session=*/1, chain).ok());  // Route prefers worker 1
    Request turn{.session = 1, .turn = 0, .prefix_hashes = chain, .append_tokens = 10};
    const Decision seeded = RunOnce(*state, turn, real);
    REQUIRE(seeded == Decision{DecisionMode::kSeed, 0, 1});
    REQUIRE(workers[1].OnRequestFinished(1).ok());
    for (uint32_t b = 0; b < bursts; ++b) {  // both workers refuse: Fallback, pin stays
      turn.turn = 1 + b;
      REQUIRE(RunOnce(*state, turn, refuse).mode == DecisionMode::kFallback);
    }
    REQUIRE(state->pin(1) == 1);
    REQUIRE(state->rejects(1, 0) == bursts);
    REQUIRE(state->rejects(1, 1) == bursts);

    // Everything but the blacklist premise holds on worker 1.
    turn.turn = 1 + bursts;
    std::vector<uint32_t> overlap(2, 0);
    state->ReadIndex([&](const NaiveIndex& index) { index.Overlap(chain, overlap); });
    REQUIRE(overlap[1] == chain.size());
    REQUIRE(workers[1].IsResident(1));
    const auto would = workers[1].Evaluate(MakeAdmitQuery(turn, state->config().block_tokens));
    REQUIRE((would.ok() && would->admitted && would->mode == DecisionMode::kDirect));

    uint64_t attempts = 0;
    const Decision decision = RunOnce(*state, turn, real, &attempts);
    if (bursts >= state->config().reject_threshold) {
      // Counterexample: degenerate branch, Reseed on worker 0.
      CHECK(decision == Decision{DecisionMode::kReseed, 0, 0});
      CHECK(attempts == 1);
      CHECK(state->pin(1) == 0);
    } else {
      // With the premise rejects[s,d] < tau_reject the theorem holds.
      CHECK(decision == Decision{DecisionMode::kDirect, kNoWorker, 1});
      CHECK(attempts == 1);
    }
  }
}

// Theorem 1's |D| * tau_reject bound needs a worker that keeps admitting the
// session (the kit's premise). "Some worker has room at every Dispatch" is not
// enough when epsilon < |D|: if the worker with room is always one Route does
// not ask, the session is never served. With epsilon = |D| every Dispatch asks
// every worker, so it is served within that Dispatch.
TEST_CASE("Theorem 1 needs a fixed admitting worker when epsilon < |D|",
          "[property][theorem]") {
  const uint64_t seed = test::PropertySeed();
  INFO("seed " << seed << " (KVC_ROUTER_SEED)");
  testing::ScenarioRng rng(seed);
  constexpr uint32_t kWorkers = 3;
  for (const uint32_t epsilon : {1u, kWorkers}) {
    INFO("epsilon " << epsilon);
    auto state = TheoremState(kWorkers, epsilon);
    const uint64_t bound = uint64_t{kWorkers} * state->config().reject_threshold;
    uint64_t attempts = 0;
    uint32_t served = 0;
    const uint32_t dispatches = 40;
    for (uint32_t k = 0; k < dispatches; ++k) {
      Request request{.session = 1, .turn = k, .prefix_hashes = {}, .append_tokens = 10};
      // This Dispatch's worker with room: any worker but Route's first choice
      // (Route is deterministic, so the choice is known in advance).
      const WorkerId first = Route(*state, request).worker;
      const WorkerId room =
          static_cast<WorkerId>((first + 1 + rng.Uniform(0, kWorkers - 2)) % kWorkers);
      REQUIRE(room != first);
      const Decision decision = RunOnce(
          *state, request,
          [&](WorkerId d, const AdmitQuery&) {
            return d == room ? AdmitResult::Admitted(DecisionMode::kReseed)
                             : AdmitResult::Rejected(RejectReason::kNoDCapacity);
          },
          &attempts);
      if (decision.mode != DecisionMode::kFallback) {
        CHECK(decision.decode == room);
        ++served;
      }
    }
    if (epsilon < kWorkers) {
      // Counterexample: never served, far past the bound.
      CHECK(served == 0);
      CHECK(attempts == dispatches);
      CHECK(attempts > bound);
    } else {
      CHECK(served == dispatches);
      CHECK(attempts <= uint64_t{dispatches} * kWorkers);
    }
  }
}

}  // namespace
}  // namespace kvc_router
