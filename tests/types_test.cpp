#include "kvc_router/types.hpp"

#include <catch2/catch.hpp>
#include <vector>

namespace kvc_router {
namespace {

TEST_CASE("reject reasons keep the seed's exact log strings", "[types]") {
  CHECK(RejectReasonName(RejectReason::kRealLargeAppend) == "real-large-append");
  CHECK(RejectReasonName(RejectReason::kNoDCapacity) == "no-d-capacity");
  CHECK(RejectReasonName(RejectReason::kSessionNotResidentNoCapacity) ==
        "session-not-resident-no-capacity");
  CHECK(RejectReasonName(RejectReason::kWorkerUnavailable) == "worker-unavailable");
  CHECK(RejectReasonName(RejectReason::kNone) == "none");
}

TEST_CASE("decision modes have stable names", "[types]") {
  CHECK(DecisionModeName(DecisionMode::kDirect) == "direct");
  CHECK(DecisionModeName(DecisionMode::kSeed) == "seed");
  CHECK(DecisionModeName(DecisionMode::kReseed) == "reseed");
  CHECK(DecisionModeName(DecisionMode::kFallback) == "fallback");
}

TEST_CASE("input_len = |prefix| * block_tokens + append", "[types]") {
  std::vector<BlockHash> hashes(10, 1);
  Request request{.session = 3, .turn = 2, .prefix_hashes = hashes, .append_tokens = 7};
  CHECK(request.input_tokens(24) == 247);
  CHECK(request.input_tokens(512) == 5127);
  const AdmitQuery query = MakeAdmitQuery(request, 24);
  CHECK(query.session == 3);
  CHECK(query.turn == 2);
  CHECK(query.append_tokens == 7);
  CHECK(query.input_tokens == 247);
}

TEST_CASE("admit results say what they are", "[types]") {
  constexpr AdmitResult ok = AdmitResult::Admitted(DecisionMode::kReseed);
  static_assert(ok.admitted && ok.mode == DecisionMode::kReseed);
  constexpr AdmitResult no = AdmitResult::Rejected(RejectReason::kNoDCapacity);
  static_assert(!no.admitted && no.reason == RejectReason::kNoDCapacity);
}

}  // namespace
}  // namespace kvc_router
