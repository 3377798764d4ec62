// AdmissionController's eviction never throws idle sessions away for room it
// cannot make (admit.hpp, EvictLeastRecentlyUsed).
#include <catch2/catch.hpp>

#include "kvc_router/admit.hpp"

namespace kvc_router {
namespace {

TEST_CASE("admit: eviction that cannot make enough room evicts nothing", "[admit][evict]") {
  auto admission = AdmissionController::Create({.capacity_tokens = 1000, .high_water = 1.0});
  REQUIRE(admission.ok());
  // Session 1 idle with 300 tokens, session 2 running with 600.
  REQUIRE(admission->Admit(AdmitQuery{1, 0, 300, 300})->admitted);
  REQUIRE(admission->OnRequestFinished(1).ok());
  REQUIRE(admission->Admit(AdmitQuery{2, 0, 600, 600})->admitted);
  // 500 more tokens: free 100 + idle 300 < 500, so session 1 stays.
  CHECK(admission->EvictLeastRecentlyUsed(500).empty());
  CHECK(admission->IsResident(1));
  CHECK(admission->used_tokens() == 900);
  // 350 is reachable: session 1 goes.
  const std::vector<SessionId> evicted = admission->EvictLeastRecentlyUsed(350);
  CHECK(evicted == std::vector<SessionId>{1});
  CHECK(admission->used_tokens() == 600);
  // A session sparing itself does not count its own tokens as reachable.
  REQUIRE(admission->OnRequestFinished(2).ok());
  CHECK(admission->EvictLeastRecentlyUsedExcept(500, 2).empty());
  CHECK(admission->IsResident(2));
}

}  // namespace
}  // namespace kvc_router
