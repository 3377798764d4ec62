// KvcPolicy (policy/kvc_policy.hpp) against admission answers a real worker
// would never give: the policy must refuse them, not index arrays with them.
// (The simulator's tests, sim/tests/policy_test.cpp, cover the policy on
// well-behaved clusters.)
#include "kvc_router/policy/kvc_policy.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace kvc_router::policy {
namespace {

// A cluster whose every admission answer is `answer`.
class ScriptedCluster final : public ClusterView {
 public:
  ScriptedCluster(uint32_t instances, AdmitResult answer)
      : instances_(instances), answer_(answer) {}
  Topology topology() const override { return Topology::kDisaggregated; }
  uint32_t num_prefill_workers() const override { return 1; }
  uint32_t num_instances() const override { return instances_; }
  InstanceLoad instance_load(WorkerId) const override { return {}; }
  InstanceLoad prefill_load(WorkerId) const override { return {}; }
  double now_s() const override { return 0; }
  absl::StatusOr<AdmitResult> Admit(WorkerId, const AdmitQuery&) override {
    ++asked;
    return answer_;
  }

  int asked = 0;

 private:
  uint32_t instances_;
  AdmitResult answer_;
};

std::unique_ptr<KvcPolicy> MakePolicy(uint32_t decode) {
  KvcPolicyOptions options;
  options.router.num_decode_workers = decode;
  options.router.num_prefill_workers = 1;
  absl::StatusOr<std::unique_ptr<KvcPolicy>> policy = KvcPolicy::Create("kvc", options);
  REQUIRE(policy.ok());
  return std::move(*policy);
}

PolicyRequest FirstTurn(uint64_t id, SessionId session) {
  PolicyRequest request;
  request.id = id;
  request.request.session = session;
  request.request.append_tokens = 10;
  request.input_tokens = 10;
  return request;
}

// dispatch-2: the policy counted `++rejections[reason]` before the op saw the
// answer, so reason 200 wrote past the 5-entry array, and mode 7 was placed.
TEST_CASE("kvc policy refuses admission answers outside the enums", "[policy][kvc]") {
  const AdmitResult bad_answers[] = {
      AdmitResult{false, DecisionMode::kFallback, static_cast<RejectReason>(200)},
      AdmitResult{false, DecisionMode::kFallback, static_cast<RejectReason>(kNumRejectReasons)},
      AdmitResult{true, static_cast<DecisionMode>(7), RejectReason::kNone},
  };
  for (const AdmitResult& answer : bad_answers) {
    INFO("mode " << static_cast<int>(answer.mode) << " reason "
                 << static_cast<int>(answer.reason));
    auto policy = MakePolicy(2);
    ScriptedCluster cluster(2, answer);
    const absl::StatusOr<Placement> placed = policy->Place(FirstTurn(1, 9), cluster);
    CHECK(placed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(cluster.asked == 1);
    // Nothing placed: no inflight, no pin, no counters.
    CHECK(policy->state().total_inflight() == 0);
    CHECK(policy->state().pin(9) == kNoWorker);
    CHECK(policy->state().rejects(9, 0) == 0);
    CHECK(policy->state().rejects(9, 1) == 0);
  }
}

TEST_CASE("kvc policy counts well-formed rejections by reason", "[policy][kvc]") {
  auto policy = MakePolicy(2);
  ScriptedCluster cluster(2, AdmitResult::Rejected(RejectReason::kNoDCapacity));
  const absl::StatusOr<Placement> placed = policy->Place(FirstTurn(1, 9), cluster);
  REQUIRE(placed.ok());
  CHECK(placed->mode == DecisionMode::kFallback);
  CHECK(placed->admit_attempts == 2);
  CHECK(placed->rejections[static_cast<int>(RejectReason::kNoDCapacity)] == 2);
  int total = 0;
  for (uint32_t n : placed->rejections) total += static_cast<int>(n);
  CHECK(total == 2);
  policy->OnFinished(FirstTurn(1, 9), *placed, cluster);
  CHECK(policy->state().total_inflight() == 0);
}

TEST_CASE("kvc policy refuses a bad router config before building its index", "[policy][kvc]") {
  KvcPolicyOptions options;
  options.router.num_decode_workers = kMaxWorkers + 1;
  const auto too_many = KvcPolicy::Create("kvc", options);
  CHECK(too_many.status().code() == absl::StatusCode::kInvalidArgument);
  options.router.num_decode_workers = 2;
  options.router.block_tokens = kMaxBlockTokens + 1;
  const auto huge_blocks = KvcPolicy::Create("kvc", options);
  CHECK(huge_blocks.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(huge_blocks.status()).find("block_tokens") != std::string::npos);
}

}  // namespace
}  // namespace kvc_router::policy
