// The property kit over the shipped indexes, and proof that it catches a
// broken one.
#include "kvc_router/testing/property_kit.hpp"

#include <catch2/catch.hpp>
#include <string>

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
void RunEveryProperty(Make make) {
  const PropertyOptions options = Options();
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

}  // namespace
}  // namespace kvc_router
