#include "kvc_router/config.hpp"

#include <catch2/catch.hpp>
#include <string>

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
}

}  // namespace
}  // namespace kvc_router
