#include "kvc_router/config.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/numeric/int128.h"
#include "kvc_router/detail/splitmix.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

using test::Message;

TEST_CASE("router defaults are the seed's", "[config]") {
  RouterConfig config;
  CHECK(config.sticky_bonus == 1);
  CHECK(config.reject_threshold == 3);
  CHECK(config.block_tokens == 24);
  CHECK(config.reset_on_success);
  config.num_decode_workers = 7;
  CHECK(config.effective_max_admit_attempts() == 7);  // epsilon = |D|
  config.max_admit_attempts = 2;
  CHECK(config.effective_max_admit_attempts() == 2);
  CHECK(config.Validate().ok());
}

TEST_CASE("admission defaults are the seed's", "[config]") {
  AdmissionConfig config;
  CHECK(config.capacity_tokens == 92104);
  CHECK(config.high_water == 0.95);
  CHECK(config.max_direct_append_tokens == 8192);
  CHECK(config.accounting == CapacityAccounting::kConservative);
  CHECK(config.budget_tokens() == 87498);  // floor(0.95 * 92104)
  CHECK(config.Validate().ok());
}

TEST_CASE("every invalid router value is refused with a message naming it", "[config]") {
  struct Case {
    const char* field;
    void (*mutate)(RouterConfig&);
  };
  const Case cases[] = {
      {"num_decode_workers", [](RouterConfig& c) { c.num_decode_workers = 0; }},
      {"at most", [](RouterConfig& c) { c.num_decode_workers = kMaxWorkers + 1; }},
      {"at most", [](RouterConfig& c) { c.num_prefill_workers = kMaxWorkers + 1; }},
      {"block_tokens", [](RouterConfig& c) { c.block_tokens = 0; }},
      {"block_tokens", [](RouterConfig& c) { c.block_tokens = kMaxBlockTokens + 1; }},
      {"block_tokens", [](RouterConfig& c) { c.block_tokens = 2'900'000'000u; }},
      {"reject_threshold", [](RouterConfig& c) { c.reject_threshold = 0; }},
      {"max_prefix_blocks", [](RouterConfig& c) { c.max_prefix_blocks = 0; }},
      {"session_idle_ttl", [](RouterConfig& c) { c.session_idle_ttl = absl::ZeroDuration(); }},
      {"max_sessions", [](RouterConfig& c) { c.max_sessions = 0; }},
  };
  for (const Case& c : cases) {
    RouterConfig config;
    c.mutate(config);
    const absl::Status status = config.Validate();
    INFO(c.field);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Message(status).find(c.field) != std::string::npos);
  }
}

TEST_CASE("every invalid admission value is refused with a message naming it", "[config]") {
  AdmissionConfig zero_capacity;
  zero_capacity.capacity_tokens = 0;
  CHECK(Message(zero_capacity.Validate()).find("capacity_tokens") != std::string::npos);
  for (double rho : {0.0, -0.5, 1.01, 2.0}) {
    AdmissionConfig config;
    config.high_water = rho;
    INFO(rho);
    CHECK(config.Validate().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Message(config.Validate()).find("high_water") != std::string::npos);
  }
  AdmissionConfig full;
  full.high_water = 1.0;
  CHECK(full.Validate().ok());
  CHECK(full.budget_tokens() == full.capacity_tokens);
  AdmissionConfig nan;
  nan.high_water = std::nan("");
  CHECK(Message(nan.Validate()).find("high_water") != std::string::npos);
}

TEST_CASE("block_tokens up to kMaxBlockTokens is accepted", "[config]") {
  RouterConfig config;
  config.block_tokens = kMaxBlockTokens;
  CHECK(config.Validate().ok());
  config.block_tokens = 1;
  CHECK(config.Validate().ok());
}

// rho-1: floor(rho * double(K_d)) lost a token whenever the double product
// fell just below an integer (0.7 * 90 = 62.99999999999999).
TEST_CASE("the budget is floor(rho * K_d) in exact arithmetic", "[config][admit]") {
  AdmissionConfig spot;
  spot.high_water = 0.7;
  spot.capacity_tokens = 90;
  CHECK(spot.budget_tokens() == 63);

  struct Fraction {
    double rho;
    uint64_t num;
    uint64_t den;
  };
  for (const Fraction& f : {Fraction{0.7, 7, 10}, Fraction{0.95, 19, 20}, Fraction{0.5, 1, 2},
                            Fraction{1.0, 1, 1}, Fraction{0.9, 9, 10}, Fraction{0.85, 17, 20},
                            Fraction{0.1, 1, 10}, Fraction{0.333, 333, 1000}}) {
    INFO("rho " << f.rho);
    AdmissionConfig config;
    config.high_water = f.rho;
    uint64_t wrong = 0;
    uint64_t first_wrong = 0;
    for (uint64_t k = 1; k <= 1'000'000; ++k) {
      config.capacity_tokens = k;
      if (config.budget_tokens() != k * f.num / f.den) {
        if (wrong++ == 0) first_wrong = k;
      }
    }
    INFO("first K_d with a wrong budget: " << first_wrong);
    CHECK(wrong == 0);
  }
}

TEST_CASE("the budget is exact up to kMaxCapacityTokens (seeded sample)",
          "[config][admit][property]") {
  const uint64_t seed = test::PropertySeed();
  INFO("seed " << seed << " (KVC_ROUTER_SEED)");
  detail::SplitMix64 rng(seed);
  struct Fraction {
    double rho;
    uint64_t num;
    uint64_t den;
  };
  const Fraction fractions[] = {{0.7, 7, 10},   {0.95, 19, 20},        {0.5, 1, 2},
                                {1.0, 1, 1},    {0.999, 999, 1000},    {0.123456, 123456, 1000000},
                                {0.01, 1, 100}, {0.3, 3, 10}};
  for (int i = 0; i < 200'000; ++i) {
    const Fraction& f = fractions[rng.Next() % std::size(fractions)];
    AdmissionConfig config;
    config.high_water = f.rho;
    config.capacity_tokens = 1 + rng.Next() % kMaxCapacityTokens;
    const uint64_t expected =
        absl::Uint128Low64(absl::uint128(config.capacity_tokens) * f.num / f.den);
    if (config.budget_tokens() != expected) {
      INFO("rho " << f.rho << " K_d " << config.capacity_tokens);
      REQUIRE(config.budget_tokens() == expected);
    }
  }
}

// admit-1: rho * K_d near 2^64 was cast to uint64 (undefined behaviour; 0 on
// x86-64), and past 2^53 the double budget could exceed K_d.
TEST_CASE("absurd K_d is refused and the budget never exceeds K_d", "[config][admit]") {
  constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();
  AdmissionConfig huge;
  huge.high_water = 1.0;
  huge.capacity_tokens = kMax64;
  const absl::Status refused = huge.Validate();
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(refused).find("capacity_tokens") != std::string::npos);
  // Still defined and exact when asked anyway.
  CHECK(huge.budget_tokens() == kMax64);
  huge.high_water = 0.5;
  CHECK(huge.budget_tokens() == kMax64 / 2);

  AdmissionConfig above_2_53;
  above_2_53.high_water = 1.0;
  above_2_53.capacity_tokens = (uint64_t{1} << 54) - 1;  // double(K_d) rounds up to 2^54
  CHECK(above_2_53.budget_tokens() == above_2_53.capacity_tokens);

  AdmissionConfig at_bound;
  at_bound.high_water = 1.0;
  at_bound.capacity_tokens = kMaxCapacityTokens;
  CHECK(at_bound.Validate().ok());
  CHECK(at_bound.budget_tokens() == kMaxCapacityTokens);
  at_bound.high_water = std::nextafter(1.0, 0.0);  // 0.9999999999999999
  CHECK(at_bound.budget_tokens() == kMaxCapacityTokens - 1);
  at_bound.capacity_tokens = kMaxCapacityTokens + 1;
  CHECK(at_bound.Validate().code() == absl::StatusCode::kInvalidArgument);

  // Any rho in (0, 1] and any K_d: budget <= K_d, and rho = 1 gives K_d.
  const uint64_t seed = test::PropertySeed();
  INFO("seed " << seed << " (KVC_ROUTER_SEED)");
  detail::SplitMix64 rng(seed);
  for (int i = 0; i < 100'000; ++i) {
    AdmissionConfig config;
    // A random double in (0, 1] (53 random bits), and K_d anywhere in uint64.
    config.high_water = static_cast<double>((rng.Next() >> 11) + 1) * 0x1p-53;
    config.capacity_tokens = rng.Next() >> (rng.Next() % 64);
    const uint64_t budget = config.budget_tokens();
    if (budget > config.capacity_tokens) {
      INFO("rho " << config.high_water << " K_d " << config.capacity_tokens);
      REQUIRE(budget <= config.capacity_tokens);
    }
    config.high_water = 1.0;
    if (config.budget_tokens() != config.capacity_tokens) {
      INFO("K_d " << config.capacity_tokens);
      REQUIRE(config.budget_tokens() == config.capacity_tokens);
    }
  }
  // Outside (0, 1] the budget is 0, never undefined.
  AdmissionConfig bad;
  bad.high_water = std::numeric_limits<double>::infinity();
  CHECK(bad.budget_tokens() == 0);
  bad.high_water = std::nan("");
  CHECK(bad.budget_tokens() == 0);
}

}  // namespace
}  // namespace kvc_router
