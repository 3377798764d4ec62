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

// kSession held the first `held_blocks` blocks (`held_tokens` tokens with
// the partial block after them) here; its next turn, `input` tokens of which
// `reusable` are its previous context, is admitted here. Returns the tokens
// the instance credits as cached.
uint64_t Credited(size_t held_blocks, uint64_t held_tokens, uint64_t reusable, uint64_t input) {
  const std::vector<BlockHash> chain = test::TestChain(6, 1);
  const std::span<const BlockHash> all(chain);
  SimInstance instance = KvcInstance();
  Admit(instance, 0, held_tokens, held_tokens);
  instance.HoldChain(kSession, 0, all.first(held_blocks), held_tokens);
  // Admission books the whole input, whatever was computed here before.
  Admit(instance, 1, input, input - reusable);
  return instance.CachedTokens(kSession, 0, reusable, all.first(input / kBlock), input);
}

TEST_CASE("sim instance: a session is credited only with the chain held for it",
          "[sim][instance]") {
  // The previous turn (40 tokens of context) ran on another worker: only the
  // 20 tokens of the turn before it were ever computed here.
  CHECK(Credited(2, 20, 40, 50) == 20);
  // The whole previous context is here, its partial last block included.
  CHECK(Credited(4, 45, 45, 55) == 45);
  // The same blocks, but the last 3 tokens (an output that found no room)
  // were never added here.
  CHECK(Credited(4, 42, 45, 55) == 42);
  // A chain short of the context: only what it holds.
  CHECK(Credited(3, 30, 45, 55) == 30);
}

}  // namespace
}  // namespace kvc_router::sim
