#include "kvc_router/admit.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kvc_router/detail/splitmix.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

AdmissionController Make(uint64_t capacity, double rho = 1.0, uint64_t tau_append = 100,
                         CapacityAccounting accounting = CapacityAccounting::kConservative) {
  AdmissionConfig config;
  config.capacity_tokens = capacity;
  config.high_water = rho;
  config.max_direct_append_tokens = tau_append;
  config.accounting = accounting;
  auto controller = AdmissionController::Create(config);
  REQUIRE(controller.ok());
  return std::move(*controller);
}

AdmitQuery Query(SessionId s, uint32_t turn, uint64_t append, uint64_t input) {
  return AdmitQuery{s, turn, append, input};
}

TEST_CASE("a new session is seeded on turn 0 and reseeded later", "[admit]") {
  AdmissionController d = Make(1000);
  auto first = d.Admit(Query(1, 0, 100, 100));
  REQUIRE(first.ok());
  CHECK(first->admitted);
  CHECK(first->mode == DecisionMode::kSeed);
  auto later = d.Admit(Query(2, 4, 10, 300));
  REQUIRE(later.ok());
  CHECK(later->mode == DecisionMode::kReseed);
  CHECK(d.used_tokens() == 400);
  CHECK(d.resident_tokens(2) == 300);
}

TEST_CASE("a resident session goes Direct while append and capacity allow", "[admit]") {
  AdmissionController d = Make(1000, 1.0, /*tau_append=*/100);
  REQUIRE(d.Admit(Query(1, 0, 200, 200))->admitted);
  auto direct = d.Admit(Query(1, 1, 100, 300));
  REQUIRE(direct.ok());
  CHECK(direct->admitted);
  CHECK(direct->mode == DecisionMode::kDirect);
  CHECK(d.used_tokens() == 300);  // the session now occupies its whole input
  auto large = d.Admit(Query(1, 2, 101, 401));
  CHECK_FALSE(large->admitted);
  CHECK(large->reason == RejectReason::kRealLargeAppend);
  CHECK(d.used_tokens() == 300);  // a rejection changes nothing
}

TEST_CASE("conservative accounting counts a resident session's input in full", "[admit]") {
  // used 600 (this session) + input 450 > 1000, although growth is only 150.
  AdmissionController d = Make(1000, 1.0, 1000, CapacityAccounting::kConservative);
  REQUIRE(d.Admit(Query(1, 0, 600, 600))->admitted);
  auto result = d.Admit(Query(1, 1, 50, 450));
  CHECK_FALSE(result->admitted);
  CHECK(result->reason == RejectReason::kNoDCapacity);

  AdmissionController inc = Make(1000, 1.0, 1000, CapacityAccounting::kIncremental);
  REQUIRE(inc.Admit(Query(1, 0, 600, 600))->admitted);
  auto grown = inc.Admit(Query(1, 1, 50, 650));
  CHECK(grown->admitted);
  CHECK(grown->mode == DecisionMode::kDirect);
  CHECK(inc.used_tokens() == 650);
  CHECK_FALSE(inc.Admit(Query(1, 2, 50, 1001))->admitted);
}

TEST_CASE("the high-water mark rho * K_d is the limit, inclusive", "[admit]") {
  AdmissionController d = Make(1000, 0.9);
  CHECK(d.budget_tokens() == 900);
  auto exact = d.Admit(Query(1, 0, 900, 900));
  CHECK(exact->admitted);
  auto over = d.Admit(Query(2, 0, 1, 1));
  CHECK_FALSE(over->admitted);
  CHECK(over->reason == RejectReason::kSessionNotResidentNoCapacity);
  CHECK(d.free_tokens() == 0);
}

TEST_CASE("the controller admits up to the exact floor(rho * K_d)", "[admit]") {
  // rho 0.7 of 90 tokens is 63 (the double product is 62.99999999999999).
  AdmissionController d = Make(90, 0.7);
  CHECK(d.budget_tokens() == 63);
  CHECK(d.Admit(Query(1, 0, 63, 63))->admitted);
  CHECK_FALSE(d.Admit(Query(2, 0, 1, 1))->admitted);
  // K_d past kMaxCapacityTokens is refused before anything is built.
  const auto huge = AdmissionController::Create(
      AdmissionConfig{.capacity_tokens = ~uint64_t{0}, .high_water = 1.0});
  CHECK(huge.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(huge.status()).find("capacity_tokens") != std::string::npos);
}

TEST_CASE("malformed queries are refused and change nothing", "[admit]") {
  AdmissionController d = Make(1000);
  auto bad = d.Admit(Query(1, 0, 50, 10));
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(test::Message(bad.status()).find("append_tokens") != std::string::npos);
  CHECK(d.num_sessions() == 0);
  CHECK(AdmissionController::Create(AdmissionConfig{.capacity_tokens = 0}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("decode growth may use the headroom up to K_d, not past it", "[admit]") {
  AdmissionController d = Make(1000, 0.5);
  REQUIRE(d.Admit(Query(1, 0, 500, 500))->admitted);
  CHECK(d.AddTokens(1, 400).ok());
  CHECK(d.used_tokens() == 900);
  CHECK(d.AddTokens(1, 101).code() == absl::StatusCode::kResourceExhausted);
  CHECK(d.used_tokens() == 900);
  CHECK(d.AddTokens(7, 1).code() == absl::StatusCode::kNotFound);
  // Above the budget, nothing new is admitted.
  CHECK_FALSE(d.Admit(Query(2, 0, 1, 1))->admitted);
}

TEST_CASE("release and LRU eviction free whole idle sessions", "[admit]") {
  AdmissionController d = Make(1000);
  REQUIRE(d.Admit(Query(1, 0, 100, 100))->admitted);
  REQUIRE(d.Admit(Query(2, 0, 200, 200))->admitted);
  REQUIRE(d.Admit(Query(3, 0, 300, 300))->admitted);
  REQUIRE(d.OnRequestFinished(1).ok());
  REQUIRE(d.OnRequestFinished(3).ok());
  CHECK(d.OnRequestFinished(3).code() == absl::StatusCode::kFailedPrecondition);
  // Session 2 still runs, so it is skipped; 1 is older than 3.
  CHECK(d.EvictLeastRecentlyUsed(450) == std::vector<SessionId>{1});
  CHECK(d.free_tokens() == 500);
  // A session asking for room for itself is spared.
  CHECK(d.EvictLeastRecentlyUsedExcept(700, /*keep=*/3).empty());
  // 900 free tokens are out of reach while session 2 runs: nothing is evicted.
  CHECK(d.EvictLeastRecentlyUsed(900).empty());
  CHECK(d.num_sessions() == 2);
  CHECK(d.EvictLeastRecentlyUsed(700) == std::vector<SessionId>{3});
  CHECK(d.num_sessions() == 1);
  CHECK(d.ReleaseSession(2).ok());
  CHECK(d.used_tokens() == 0);
  CHECK(d.ReleaseSession(2).code() == absl::StatusCode::kNotFound);
}

TEST_CASE("Evaluate decides like Admit without booking", "[admit]") {
  AdmissionController d = Make(1000);
  auto result = d.Evaluate(Query(1, 0, 10, 10));
  CHECK(result->admitted);
  CHECK(d.num_sessions() == 0);
  CHECK(d.used_tokens() == 0);
}


TEST_CASE("the cost rule serves an append Direct unless the queue makes a reseed faster",
          "[admit][adaptive]") {
  AdmissionConfig config;
  config.capacity_tokens = 1'000'000;
  config.max_direct_append_tokens = ~uint64_t{0};
  config.accounting = CapacityAccounting::kIncremental;
  config.direct_cost.enabled = true;
  auto d = AdmissionController::Create(config);
  REQUIRE(d.ok());
  REQUIRE(d->Admit(Query(1, 0, 90'000, 90'000))->admitted);
  REQUIRE(d->OnRequestFinished(1).ok());
  // A 30k-token append (far past the seed's tau_append of 8192) on an idle
  // worker: always cheaper than recomputing 120k tokens and moving them.
  const DirectCostModel& cost = config.direct_cost;
  CHECK(cost.DirectSeconds(30'000, 120'000, 0) < cost.ReseedSeconds(120'000));
  auto big = d->Admit(Query(1, 1, 30'000, 120'000));
  REQUIRE(big.ok());
  CHECK(big->admitted);
  CHECK(big->mode == DecisionMode::kDirect);
  REQUIRE(d->OnRequestFinished(1).ok());
  // Behind a queue longer than a reseed takes, the same kind of append is refused.
  const double reseed = cost.ReseedSeconds(125'000);
  const auto queued = static_cast<uint64_t>(reseed / cost.prefill_per_token_s) + 1;
  d->set_queued_prefill_tokens(queued);
  auto refused = d->Admit(Query(1, 2, 5'000, 125'000));
  REQUIRE(refused.ok());
  CHECK_FALSE(refused->admitted);
  CHECK(refused->reason == RejectReason::kRealLargeAppend);
  CHECK(d->resident_tokens(1) == 120'000);  // nothing changed
  d->set_queued_prefill_tokens(0);
  CHECK(d->Admit(Query(1, 2, 5'000, 125'000))->admitted);
  // tau_append stays a hard cap on top of the rule.
  config.max_direct_append_tokens = 1000;
  auto capped = AdmissionController::Create(config);
  REQUIRE(capped.ok());
  REQUIRE(capped->Admit(Query(2, 0, 500, 500))->admitted);
  CHECK(capped->Admit(Query(2, 1, 1001, 1501))->reason == RejectReason::kRealLargeAppend);
  // Bad cost figures are refused.
  config.direct_cost.prefill_attention_s = -1;
  CHECK_THAT(test::Message(AdmissionController::Create(config).status()),
             Catch::Contains("DirectCostModel"));
}

TEST_CASE("the cost rule never admits past rho * K_d (property)", "[admit][adaptive][property]") {
  const uint64_t seed = test::PropertySeed();
  kvc_router::detail::SplitMix64 rng(seed);
  for (int scenario = 0; scenario < 300; ++scenario) {
    AdmissionConfig config;
    config.capacity_tokens = 1000 + rng.Next() % 200'000;
    config.high_water = 0.5 + static_cast<double>(rng.Next() % 50) / 100.0;
    config.max_direct_append_tokens = rng.Next() % 2 == 0 ? ~uint64_t{0} : rng.Next() % 20'000;
    config.accounting = rng.Next() % 2 == 0 ? CapacityAccounting::kIncremental
                                            : CapacityAccounting::kConservative;
    config.direct_cost.enabled = true;
    auto d = AdmissionController::Create(config);
    REQUIRE(d.ok());
    std::vector<uint64_t> inputs(8, 0);
    for (int step = 0; step < 200; ++step) {
      INFO("seed " << seed << " scenario " << scenario << " step " << step);
      const SessionId s = rng.Next() % inputs.size();
      const uint64_t append = 1 + rng.Next() % (config.capacity_tokens / 2);
      d->set_queued_prefill_tokens(rng.Next() % 100'000);
      auto r = d->Admit(Query(s, inputs[s] == 0 ? 0 : 1, append, inputs[s] + append));
      REQUIRE(r.ok());
      if (r->admitted) {
        inputs[s] += append;
        REQUIRE(d->OnRequestFinished(s).ok());
      }
      CHECK(d->used_tokens() <= d->budget_tokens());
      CHECK(r->room_tokens <= d->budget_tokens());
      if (rng.Next() % 5 == 0) (void)d->EvictLeastRecentlyUsed(rng.Next() % config.capacity_tokens);
      for (SessionId x = 0; x < inputs.size(); ++x) {
        if (!d->IsResident(x)) inputs[x] = 0;
      }
    }
  }
}

TEST_CASE("the answer carries the room an admission could still take", "[admit][adaptive]") {
  AdmissionController d = Make(1000, 0.9);  // budget 900
  auto a = d.Admit(Query(1, 0, 300, 300));
  REQUIRE(a->admitted);
  CHECK(a->room_tokens == 600);  // session 1 is running
  REQUIRE(d.OnRequestFinished(1).ok());
  CHECK(d.room_tokens() == 900);  // idle sessions are reclaimable
  auto b = d.Admit(Query(2, 0, 700, 700));
  REQUIRE_FALSE(b->admitted);  // 300 + 700 > 900 without eviction
  CHECK(b->room_tokens == 900);
}

}  // namespace
}  // namespace kvc_router
