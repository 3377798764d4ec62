// Tests of the simulated KVC worker (kvc_sim/instance.hpp): what a session
// is credited as cached is what the instance holds for it, never what
// admission has just booked.
#include "kvc_sim/instance.hpp"

#include <catch2/catch.hpp>
#include <span>
#include <vector>

#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

constexpr uint32_t kBlock = 10;
constexpr SessionId kSession = 7;

SimInstance KvcInstance() {
  AdmissionConfig config;
  config.capacity_tokens = 1000;
  absl::StatusOr<AdmissionController> admission = AdmissionController::Create(config);
  REQUIRE(admission.ok());
  return SimInstance(*std::move(admission), PageCache(1000, kBlock, true, {}), CostModel{},
                     /*admission_pool=*/true, /*prefix_cache=*/true, kBlock);
}

// Books turn `turn` of kSession with `input` tokens, `append` of them new.
void Admit(SimInstance& instance, uint32_t turn, uint64_t input, uint64_t append) {
  std::vector<SessionId> evicted;
  const AdmitResult result =
      instance.AdmitEvicting(AdmitQuery{kSession, turn, append, input}, evicted);
  REQUIRE(result.admitted);
}

TEST_CASE("sim instance: a session is credited only with the chain held for it",
          "[sim][instance]") {
  const std::vector<BlockHash> chain = test::TestChain(6, 1);
  const std::span<const BlockHash> all(chain);

  SECTION("the previous turn ran elsewhere: only the older context is here") {
    SimInstance instance = KvcInstance();
    Admit(instance, 0, 20, 20);
    instance.HoldChain(kSession, 0, all.first(2), 20);
    // Turn 1 (40 tokens of context) was served on another worker; turn 2
    // comes back with 50 tokens, 40 of them that context. Admission books
    // all 50 here, but only the 20 tokens of turn 0 were ever computed here.
    Admit(instance, 2, 50, 10);
    CHECK(instance.CachedTokens(kSession, 0, 40, all.first(5), 50) == 20);
  }
  SECTION("the whole previous context is held, its partial last block included") {
    SimInstance instance = KvcInstance();
    Admit(instance, 0, 40, 40);
    instance.HoldChain(kSession, 0, all.first(4), 45);
    Admit(instance, 1, 55, 10);
    CHECK(instance.CachedTokens(kSession, 0, 45, all.first(5), 55) == 45);
    // The same blocks, but the last 3 tokens (an output that found no room)
    // were never added here.
    instance.HoldChain(kSession, 0, all.first(4), 42);
    CHECK(instance.CachedTokens(kSession, 0, 45, all.first(5), 55) == 42);
    // A chain short of the context: only what it holds.
    instance.HoldChain(kSession, 0, all.first(3), 30);
    CHECK(instance.CachedTokens(kSession, 0, 45, all.first(5), 55) == 30);
  }
}

}  // namespace
}  // namespace kvc_router::sim
