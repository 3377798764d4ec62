#include "kvc_router/dispatch.hpp"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "kvc_router/testing/scripted_transport.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

using testing::ScriptedTransport;
using Step = ScriptedTransport::Step;
using State = RoutingState<NaiveIndex>;

std::unique_ptr<State> MakeState(uint32_t decode, uint32_t prefill = 2,
                                 uint32_t attempts = 0, bool reset = true) {
  RouterConfig config;
  config.num_decode_workers = decode;
  config.num_prefill_workers = prefill;
  config.max_admit_attempts = attempts;
  config.reset_on_success = reset;
  auto state = State::Create(config, NaiveIndex(decode));
  REQUIRE(state.ok());
  return std::move(*state);
}

// Admission answers by worker: admitted as `mode`, or rejected.
struct Answers {
  std::map<WorkerId, AdmitResult> by_worker;
  AdmitResult otherwise = AdmitResult::Rejected(RejectReason::kNoDCapacity);
  ScriptedTransport::AdmitFunction Fn() {
    return [this](WorkerId d, const AdmitQuery&) -> absl::StatusOr<AdmitResult> {
      auto it = by_worker.find(d);
      return it == by_worker.end() ? otherwise : it->second;
    };
  }
};

TEST_CASE("a first turn is seeded: round-robin P, KV to D, decode on D", "[dispatch]") {
  auto state = MakeState(3, 2);
  Answers answers;
  answers.otherwise = AdmitResult::Admitted(DecisionMode::kSeed);
  ScriptedTransport transport(answers.Fn());
  std::vector<BlockHash> prefix = {1, 2, 3};
  Request request{.session = 7, .turn = 0, .prefix_hashes = prefix, .append_tokens = 5};
  auto decision = Dispatch(*state, request, transport);
  REQUIRE(decision.ok());
  CHECK(*decision == Decision{DecisionMode::kSeed, 0, 0});
  REQUIRE(transport.calls().size() == 4);
  CHECK(transport.calls()[0].step == Step::kAdmit);
  CHECK(transport.calls()[1].step == Step::kPrefill);
  CHECK(transport.calls()[2].step == Step::kTransferKv);
  CHECK(transport.calls()[3].step == Step::kDecode);
  CHECK(state->pin(7) == 0);
  CHECK(state->assigned(0) == 1);
  CHECK(state->inflight(0) == 0);  // completed
  // The index learned the placement: the next turn prefers worker 0.
  std::vector<uint32_t> overlap(3);
  state->ReadIndex([&](const NaiveIndex& index) { index.Overlap(prefix, overlap); });
  CHECK(overlap == std::vector<uint32_t>{3, 0, 0});
  // The next seed goes to the next prefill worker.
  Request other{.session = 8, .turn = 0, .prefix_hashes = {}, .append_tokens = 5};
  auto second = Dispatch(*state, other, transport);
  REQUIRE(second.ok());
  CHECK(second->prefill == 1);
}

TEST_CASE("Direct runs on the decode worker alone", "[dispatch]") {
  auto state = MakeState(2);
  Answers answers;
  answers.otherwise = AdmitResult::Admitted(DecisionMode::kDirect);
  ScriptedTransport transport(answers.Fn());
  Request request{.session = 1, .turn = 3, .prefix_hashes = {}, .append_tokens = 5};
  auto decision = Dispatch(*state, request, transport);
  REQUIRE(decision.ok());
  CHECK(*decision == Decision{DecisionMode::kDirect, kNoWorker, 0});
  REQUIRE(transport.calls().size() == 2);
  CHECK(transport.calls()[1].step == Step::kRunDirect);
}

TEST_CASE("rejections bump counters, exclude the worker and move on", "[dispatch]") {
  auto state = MakeState(3);
  std::vector<BlockHash> prefix = {1, 2};
  state->WithIndex([&](NaiveIndex& index) {
    index.Learn(2, 99, prefix);
    index.Learn(1, 98, std::span<const BlockHash>(prefix).first(1));
  });
  Answers answers;
  answers.by_worker[0] = AdmitResult::Admitted(DecisionMode::kReseed);
  ScriptedTransport transport(answers.Fn());
  Request request{.session = 5, .turn = 2, .prefix_hashes = prefix, .append_tokens = 1};
  auto op = StartDispatch(*state, request);
  REQUIRE(op.ok());
  CHECK(op->admit_target() == 2);  // most overlap
  REQUIRE(op->OnAdmitResult(AdmitResult::Rejected(RejectReason::kNoDCapacity)).ok());
  CHECK(op->admit_target() == 1);  // worker 2 tried: next best
  CHECK(op->last_reject_reason() == RejectReason::kNoDCapacity);
  REQUIRE(op->OnAdmitResult(AdmitResult::Rejected(RejectReason::kRealLargeAppend)).ok());
  CHECK(op->admit_target() == 0);
  REQUIRE(op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kReseed)).ok());
  CHECK(op->placed());
  CHECK(op->attempts() == 3);
  CHECK(op->decision().mode == DecisionMode::kReseed);
  CHECK(op->decision().decode == 0);
  CHECK(state->rejects(5, 2) == 1);
  CHECK(state->rejects(5, 1) == 1);
  CHECK(state->rejects(5, 0) == 0);
  CHECK(state->inflight(0) == 1);
  CHECK(op->Complete().ok());
  CHECK(state->inflight(0) == 0);
}

TEST_CASE("after epsilon rejections: Fallback with round-robin P and D", "[dispatch]") {
  auto state = MakeState(4, 3, /*attempts=*/2);
  Answers answers;  // everyone rejects
  ScriptedTransport transport(answers.Fn());
  Request request{.session = 5, .turn = 2, .prefix_hashes = {}, .append_tokens = 1};
  std::vector<Decision> decisions;
  for (int i = 0; i < 3; ++i) {
    transport.ClearCalls();
    auto decision = Dispatch(*state, request, transport);
    REQUIRE(decision.ok());
    decisions.push_back(*decision);
    CHECK(transport.calls().size() == 3);  // two admits, one fallback run
    CHECK(transport.calls().back().step == Step::kRunFallback);
  }
  CHECK(decisions[0] == Decision{DecisionMode::kFallback, 0, 0});
  CHECK(decisions[1] == Decision{DecisionMode::kFallback, 1, 1});
  CHECK(decisions[2] == Decision{DecisionMode::kFallback, 2, 2});
  CHECK(state->pin(5) == kNoWorker);  // fallback does not pin
  uint32_t total = 0;
  for (WorkerId d = 0; d < 4; ++d) total += state->rejects(5, d);
  CHECK(total == 6);
}

TEST_CASE("epsilon = |D| tries every worker once, then falls back", "[dispatch]") {
  auto state = MakeState(3);
  Answers answers;
  ScriptedTransport transport(answers.Fn());
  Request request{.session = 5, .turn = 2, .prefix_hashes = {}, .append_tokens = 1};
  auto decision = Dispatch(*state, request, transport);
  REQUIRE(decision.ok());
  CHECK(decision->mode == DecisionMode::kFallback);
  for (WorkerId d = 0; d < 3; ++d) CHECK(state->rejects(5, d) == 1);
}

TEST_CASE("reset-on-success clears the counter of the admitting worker only", "[dispatch]") {
  for (bool v2 : {true, false}) {
    INFO((v2 ? "v2" : "v1"));
    auto state = MakeState(2, 1, 0, /*reset=*/v2);
    Answers answers;
    ScriptedTransport transport(answers.Fn());
    Request request{.session = 5, .turn = 1, .prefix_hashes = {}, .append_tokens = 1};
    REQUIRE(Dispatch(*state, request, transport).ok());  // both reject
    REQUIRE(Dispatch(*state, request, transport).ok());
    CHECK(state->rejects(5, 0) == 2);
    CHECK(state->rejects(5, 1) == 2);
    answers.by_worker[0] = AdmitResult::Admitted(DecisionMode::kDirect);
    auto decision = Dispatch(*state, request, transport);
    REQUIRE(decision.ok());
    CHECK(decision->decode == 0);
    CHECK(state->rejects(5, 0) == (v2 ? 0u : 2u));
    CHECK(state->rejects(5, 1) == 2);
  }
}

TEST_CASE("malformed answers and misuse are refused without changing state", "[dispatch]") {
  auto state = MakeState(2);
  Request request{.session = 5, .turn = 1, .prefix_hashes = {}, .append_tokens = 1};
  auto op = StartDispatch(*state, request);
  REQUIRE(op.ok());
  const absl::Status fallback_mode =
      op->OnAdmitResult(AdmitResult{true, DecisionMode::kFallback, RejectReason::kNone});
  CHECK(fallback_mode.code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(fallback_mode).find("fallback") != std::string::npos);
  const absl::Status no_reason = op->OnAdmitResult(AdmitResult{});
  CHECK(no_reason.code() == absl::StatusCode::kInvalidArgument);
  CHECK(state->rejects(5, 0) == 0);
  CHECK(op->attempts() == 0);
  REQUIRE(op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kDirect)).ok());
  CHECK(op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kDirect)).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(state->inflight(0) == 1);
  CHECK(op->Complete().ok());
  const absl::Status twice = op->Complete();
  CHECK(twice.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(test::Message(twice).find("already completed") != std::string::npos);
  CHECK(state->inflight(0) == 0);
  CHECK(state->assigned(0) == 1);
}

TEST_CASE("oversized requests are refused before anything changes", "[dispatch]") {
  RouterConfig config;
  config.num_decode_workers = 2;
  config.max_prefix_blocks = 4;
  auto state = State::Create(config, NaiveIndex(2));
  REQUIRE(state.ok());
  std::vector<BlockHash> five(5, 1);
  Request too_long{.session = 1, .turn = 0, .prefix_hashes = five, .append_tokens = 0};
  auto op = StartDispatch(**state, too_long);
  CHECK(op.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(op.status()).find("max_prefix_blocks") != std::string::npos);
  std::vector<BlockHash> two(2, 1);
  Request bad_append{.session = 1, .turn = 0, .prefix_hashes = {}, .append_tokens = 10,
                     .appended_hashes = two};
  CHECK(StartDispatch(**state, bad_append).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK((*state)->num_sessions() == 0);
}

// dispatch-1: |prefix| * block_tokens + append_tokens wrapped around 2^64,
// so admission was asked about an input smaller than its append.
TEST_CASE("a request whose input_tokens overflows 64 bits is refused", "[dispatch]") {
  auto state = MakeState(2);
  std::vector<BlockHash> prefix = {1, 2, 3};
  Request wraps{.session = 4, .turn = 1, .prefix_hashes = prefix,
                .append_tokens = ~uint64_t{0} - 10};  // + 3 * 24 passes 2^64
  CHECK_FALSE(wraps.input_tokens_fit(24));
  auto op = StartDispatch(*state, wraps);
  CHECK(op.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(op.status()).find("overflows") != std::string::npos);
  CHECK(state->num_sessions() == 0);
  CHECK(state->total_inflight() == 0);
  // The largest input that fits is accepted, and admission sees input >= append.
  Request largest{.session = 4, .turn = 1, .prefix_hashes = prefix,
                  .append_tokens = ~uint64_t{0} - 3 * 24};
  CHECK(largest.input_tokens_fit(24));
  auto ok = StartDispatch(*state, largest);
  REQUIRE(ok.ok());
  CHECK(ok->admit_query().input_tokens == ~uint64_t{0});
  CHECK(ok->admit_query().input_tokens >= ok->admit_query().append_tokens);
}

// dispatch-2: a mode or reason byte outside its enum (a bad RPC decoder) was
// accepted: placed with mode 7, counted with reason 200.
TEST_CASE("admission answers with out-of-range enum values are refused", "[dispatch]") {
  auto state = MakeState(2);
  Request request{.session = 6, .turn = 1, .prefix_hashes = {}, .append_tokens = 1};
  auto op = StartDispatch(*state, request);
  REQUIRE(op.ok());
  const WorkerId target = op->admit_target();
  const AdmitResult bad_answers[] = {
      AdmitResult{true, static_cast<DecisionMode>(7), RejectReason::kNone},
      AdmitResult{true, static_cast<DecisionMode>(kNumDecisionModes), RejectReason::kNone},
      AdmitResult{false, DecisionMode::kFallback, static_cast<RejectReason>(200)},
      AdmitResult{false, DecisionMode::kFallback, static_cast<RejectReason>(kNumRejectReasons)},
      AdmitResult{true, DecisionMode::kDirect, static_cast<RejectReason>(200)},
      AdmitResult{false, static_cast<DecisionMode>(255), RejectReason::kNoDCapacity},
  };
  for (const AdmitResult& answer : bad_answers) {
    INFO("mode " << static_cast<int>(answer.mode) << " reason "
                 << static_cast<int>(answer.reason));
    const absl::Status status = op->OnAdmitResult(answer);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    const std::string message = test::Message(status);
    CHECK((message.find("not a DecisionMode") != std::string::npos ||
           message.find("not a RejectReason") != std::string::npos));
    // Nothing changed: still waiting on the same worker, no counters, no pin.
    CHECK(op->awaiting_admit());
    CHECK(op->admit_target() == target);
    CHECK(op->attempts() == 0);
    CHECK(op->last_reject_reason() == RejectReason::kNone);
    CHECK(state->rejects(6, target) == 0);
    CHECK(state->pin(6) == kNoWorker);
    CHECK(state->total_inflight() == 0);
    CHECK(state->assigned(target) == 0);
  }
  // A well-formed answer is still taken afterwards.
  REQUIRE(op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kReseed)).ok());
  CHECK(op->decision().mode == DecisionMode::kReseed);
}

TEST_CASE("inflight is released when the transport fails or throws", "[dispatch]") {
  const Step steps[] = {Step::kAdmit, Step::kRunDirect, Step::kPrefill, Step::kTransferKv,
                        Step::kDecode, Step::kRunFallback};
  for (Step step : steps) {
    for (auto failure : {ScriptedTransport::Failure::kError, ScriptedTransport::Failure::kThrow}) {
      INFO("step " << static_cast<int>(step) << " failure " << static_cast<int>(failure));
      auto state = MakeState(2, 1, /*attempts=*/1);
      Answers answers;
      if (step == Step::kRunDirect) answers.otherwise = AdmitResult::Admitted(DecisionMode::kDirect);
      if (step == Step::kPrefill || step == Step::kTransferKv || step == Step::kDecode) {
        answers.otherwise = AdmitResult::Admitted(DecisionMode::kSeed);
      }
      ScriptedTransport transport(answers.Fn());
      transport.FailNext(step, failure);
      Request request{.session = 3, .turn = 0, .prefix_hashes = {}, .append_tokens = 1};
      bool threw = false;
      absl::StatusOr<Decision> result;
      try {
        result = Dispatch(*state, request, transport);
      } catch (const testing::TransportFailure&) {
        threw = true;
      }
      if (failure == ScriptedTransport::Failure::kThrow) {
        CHECK(threw);
      } else if (step != Step::kAdmit) {
        CHECK(result.status().code() == absl::StatusCode::kUnavailable);
      } else {
        // A failed admission RPC is a worker-unavailable rejection -> fallback.
        REQUIRE(result.ok());
        CHECK(result->mode == DecisionMode::kFallback);
        CHECK(state->rejects(3, 0) == 1);
      }
      CHECK(state->total_inflight() == 0);
      CHECK(state->session_inflight(3) == 0);
    }
  }
}

TEST_CASE("a dropped or moved op releases exactly once", "[dispatch]") {
  auto state = MakeState(2);
  Request request{.session = 3, .turn = 0, .prefix_hashes = {}, .append_tokens = 1};
  {
    auto op = StartDispatch(*state, request);
    REQUIRE(op.ok());
    REQUIRE(op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kSeed)).ok());
    CHECK(state->inflight(0) == 1);
    DispatchOp<NaiveIndex> moved = std::move(*op);
    CHECK(state->inflight(0) == 1);
    CHECK(op->Complete().code() == absl::StatusCode::kFailedPrecondition);
    auto other = StartDispatch(*state, request);
    REQUIRE(other.ok());
    REQUIRE(other->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kDirect)).ok());
    CHECK(state->total_inflight() == 2);
    moved = std::move(*other);  // the first placement is released here
    CHECK(state->total_inflight() == 1);
  }
  CHECK(state->total_inflight() == 0);
  CHECK(state->session_inflight(3) == 0);
}

TEST_CASE("without a prefill pool, seeds prefill on the decode instance", "[dispatch]") {
  auto state = MakeState(2, /*prefill=*/0);
  Answers answers;
  answers.otherwise = AdmitResult::Admitted(DecisionMode::kSeed);
  ScriptedTransport transport(answers.Fn());
  Request request{.session = 3, .turn = 0, .prefix_hashes = {}, .append_tokens = 1};
  auto decision = Dispatch(*state, request, transport);
  REQUIRE(decision.ok());
  CHECK(decision->prefill == kNoWorker);
  CHECK(transport.calls().back().step == Step::kRunDirect);
}

TEST_CASE("appended blocks are learned with the prefix", "[dispatch]") {
  auto state = MakeState(2);
  std::vector<BlockHash> chain = {1, 2, 3, 4};
  std::vector<BlockHash> detached_tail = {3, 4};
  for (bool contiguous : {true, false}) {
    INFO("contiguous " << contiguous);
    Request request{.session = contiguous ? 10u : 11u,
                    .turn = 0,
                    .prefix_hashes = std::span<const BlockHash>(chain).first(2),
                    .append_tokens = 48,
                    .appended_hashes = contiguous ? std::span<const BlockHash>(chain).subspan(2)
                                                  : std::span<const BlockHash>(detached_tail)};
    auto op = StartDispatch(*state, request);
    REQUIRE(op.ok());
    const WorkerId target = op->admit_target();
    REQUIRE(op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kSeed)).ok());
    std::vector<uint32_t> overlap(2);
    state->ReadIndex([&](const NaiveIndex& index) { index.Overlap(chain, overlap); });
    CHECK(overlap[target] == 4);
  }
}

}  // namespace
}  // namespace kvc_router
