// Tests of the EAR report's policies (policy/affinity_policies.hpp), each
// rule on hand-built cluster states: load-only, LMetric (with the report's
// warm-vs-cold example), sticky's rendezvous hashing (membership changes move
// ~1/N of the sessions, and only to or from the changed instance), unified's
// binding and high-cache override, and the P/D variants.
#include "kvc_router/policy/affinity_policies.hpp"

#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "kvc_router/detail/splitmix.hpp"
#include "kvc_router/testing/fake_cluster.hpp"
#include "test_support.hpp"

namespace kvc_router::policy {
namespace {

using testing::FakeCluster;
using testing::GrowingSession;

std::unique_ptr<AffinityPolicy> Make(AffinityRule rule, uint32_t instances,
                                     Topology topology = Topology::kColocated,
                                     uint32_t prefill = 0) {
  AffinityPolicyOptions options;
  options.rule = rule;
  options.topology = topology;
  options.instances = instances;
  options.prefill_workers = prefill;
  options.block_tokens = 16;
  options.kv_capacity_tokens = 1 << 20;
  auto policy = AffinityPolicy::Create(options);
  REQUIRE(policy.ok());
  return std::move(*policy);
}

TEST_CASE("load-only: the fewest running requests, ties to the lowest id", "[policy][ear]") {
  FakeCluster cluster(Topology::kColocated, 0, 4, 100000);
  auto policy = Make(AffinityRule::kLoadOnly, 4);
  CHECK(policy->name() == "load-only");
  cluster.load(0).running_requests = 3;
  cluster.load(1).running_requests = 1;
  cluster.load(2).running_requests = 1;
  cluster.load(3).running_requests = 2;
  GrowingSession s{1};
  auto p = policy->Place(s.Next(0, 10), cluster);
  REQUIRE(p.ok());
  CHECK(p->instance == 1);
  CHECK(p->booking == Booking::kSession);
  CHECK(p->prefill == kNoWorker);
  cluster.load(1).running_requests = 9;
  p = policy->Place(s.Next(1, 1), cluster);
  REQUIRE(p.ok());
  CHECK(p->instance == 2);  // load only: the session's cache on 1 does not matter
}

TEST_CASE("lmetric: the report's warm-vs-cold example", "[policy][ear]") {
  // A policy that placed a session's 7,504-token first turn on instance 0
  // (an idle cluster: every score is 0; the smaller prefill term, then id 0,
  // wins); the session's next turn has 10,000 tokens.
  struct Warm {
    std::unique_ptr<AffinityPolicy> policy = Make(AffinityRule::kLMetric, 2);
    FakeCluster cluster{Topology::kColocated, 0, 2, 1 << 20};
    GrowingSession session{1};
    PolicyRequest next;
    Warm() {
      const PolicyRequest first = session.Next(0, 469);
      auto p0 = policy->Place(first, cluster);
      REQUIRE(p0.ok());
      REQUIRE(p0->instance == 0);
      policy->OnFinished(first, *p0, cluster);
      next = session.Next(1, 156);
      REQUIRE(next.input_tokens == 10000);
      REQUIRE(policy->EstimatedHitTokens(0, next.input_hashes) == 7504);
    }
    WorkerId Place() {
      auto p = policy->Place(next, cluster);
      REQUIRE(p.ok());
      return p->instance;
    }
  };
  {
    // Warm: (0 + 2,496) x 5 = 12,480; cold: (0 + 10,000) x 1 = 10,000: cold wins.
    Warm w;
    w.cluster.load(0).running_requests = 5;
    w.cluster.load(1).running_requests = 1;
    CHECK(w.Place() == 1);
  }
  {
    // Two requests on the cold one: 20,000 > 12,480, warm wins.
    Warm w;
    w.cluster.load(0).running_requests = 5;
    w.cluster.load(1).running_requests = 2;
    CHECK(w.Place() == 0);
  }
  {
    // Pending prefill counts as load.
    Warm w;
    w.cluster.load(0).running_requests = 5;
    w.cluster.load(0).pending_prefill_tokens = 100000;
    w.cluster.load(1).running_requests = 2;
    CHECK(w.Place() == 1);
  }
}

TEST_CASE("sticky: a session always lands on its rendezvous instance", "[policy][ear]") {
  FakeCluster cluster(Topology::kColocated, 0, 8, 100000);
  auto policy = Make(AffinityRule::kSticky, 8);
  std::vector<int> per_instance(8, 0);
  for (SessionId id = 1; id <= 4000; ++id) {
    GrowingSession s{id};
    auto p = policy->Place(s.Next(id, 2), cluster);
    REQUIRE(p.ok());
    CHECK(p->instance == RendezvousInstance(id, 8));
    ++per_instance[p->instance];
    // Load does not move it.
    cluster.load(p->instance).running_requests += 100;
    auto again = policy->Place(s.Next(id + 100000, 1), cluster);
    REQUIRE(again.ok());
    CHECK(again->instance == p->instance);
    cluster.load(p->instance).running_requests -= 100;
  }
  for (int n : per_instance) CHECK(n == Approx(500).margin(100));  // spread evenly
}

TEST_CASE("sticky: adding or removing one of N instances moves ~1/N of the sessions",
          "[policy][ear][property]") {
  const uint64_t seed = GENERATE(take(3, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  kvc_router::detail::SplitMix64 rng(seed);
  constexpr int kSessions = 20000;
  const uint32_t n = 4 + static_cast<uint32_t>(rng.Next() % 12);
  int moved_on_add = 0, moved_on_remove = 0;
  for (int i = 0; i < kSessions; ++i) {
    const SessionId session = rng.Next();
    const WorkerId before = RendezvousInstance(session, n);
    const WorkerId grown = RendezvousInstance(session, n + 1);
    if (grown != before) {
      ++moved_on_add;
      CHECK(grown == n);  // only to the new instance
    }
    // Removing the last instance moves exactly its sessions.
    const WorkerId shrunk = RendezvousInstance(session, n - 1);
    if (shrunk != before) {
      ++moved_on_remove;
      CHECK(before == n - 1);
    }
  }
  CHECK(static_cast<double>(moved_on_add) / kSessions == Approx(1.0 / (n + 1)).margin(0.02));
  CHECK(static_cast<double>(moved_on_remove) / kSessions == Approx(1.0 / n).margin(0.02));
}

TEST_CASE("unified: new sessions by load, later turns follow the binding", "[policy][ear]") {
  FakeCluster cluster(Topology::kColocated, 0, 3, 1 << 20);
  auto policy = Make(AffinityRule::kUnified, 3);
  cluster.load(0).running_requests = 4;
  cluster.load(1).running_requests = 1;
  cluster.load(2).running_requests = 2;
  GrowingSession s{1};
  auto p0 = policy->Place(s.Next(0, 50), cluster);
  REQUIRE(p0.ok());
  CHECK(p0->instance == 1);  // LMetric: 800 x 1 beats 800 x 2 and 800 x 4
  CHECK(policy->binding(1) == 1);
  // Instance 1 becomes the busiest: the session stays (affinity by default).
  cluster.load(1).running_requests = 50;
  cluster.load(1).pending_prefill_tokens = 500000;
  auto p1 = policy->Place(s.Next(1, 5), cluster);
  REQUIRE(p1.ok());
  CHECK(p1->instance == 1);
  // A new session that shares more than half of its input with what
  // instance 1 caches (a fork of session 1) follows that cache.
  GrowingSession fork{2, s.chain};
  auto f = policy->Place(fork.Next(2, 10), cluster);
  REQUIRE(f.ok());
  CHECK(f->instance == 1);
  // One that shares less goes by load.
  GrowingSession other{3, std::vector<BlockHash>(s.chain.begin(), s.chain.begin() + 10)};
  auto o = policy->Place(other.Next(3, 40), cluster);
  REQUIRE(o.ok());
  CHECK(o->instance == 2);
  CHECK(policy->binding(3) == 2);
}

TEST_CASE("unified: bindings are bounded, the oldest forgotten first", "[policy][ear]") {
  FakeCluster cluster(Topology::kColocated, 0, 2, 1 << 20);
  AffinityPolicyOptions options;
  options.rule = AffinityRule::kUnified;
  options.instances = 2;
  options.block_tokens = 16;
  options.max_bindings = 3;
  auto policy = AffinityPolicy::Create(options);
  REQUIRE(policy.ok());
  for (SessionId id = 1; id <= 5; ++id) {
    GrowingSession s{id};
    REQUIRE((*policy)->Place(s.Next(id, 2), cluster).ok());
  }
  CHECK((*policy)->binding(1) == kNoWorker);
  CHECK((*policy)->binding(2) == kNoWorker);
  CHECK((*policy)->binding(3) != kNoWorker);
  CHECK((*policy)->binding(5) != kNoWorker);
}

TEST_CASE("affinity policies on P/D: the rule picks D, the least pending prefill picks P",
          "[policy][ear]") {
  FakeCluster cluster(Topology::kDisaggregated, 3, 2, 1 << 20);
  auto policy = Make(AffinityRule::kLoadOnly, 2, Topology::kDisaggregated, 3);
  CHECK(policy->name() == "load-only-pd");
  CHECK(policy->topology() == Topology::kDisaggregated);
  cluster.prefill(0).pending_prefill_tokens = 9000;
  cluster.prefill(1).pending_prefill_tokens = 3000;
  cluster.prefill(2).pending_prefill_tokens = 3000;
  cluster.prefill(1).running_requests = 2;
  cluster.load(0).running_requests = 7;
  GrowingSession s{1};
  auto p = policy->Place(s.Next(0, 10), cluster);
  REQUIRE(p.ok());
  CHECK(p->prefill == 2);
  CHECK(p->instance == 1);
  CHECK(cluster.asked.empty());  // no admission RPCs
}

TEST_CASE("affinity policies: bad options and a mismatched cluster are refused", "[policy][ear]") {
  AffinityPolicyOptions options;
  options.instances = 0;
  CHECK_FALSE(AffinityPolicy::Create(options).ok());
  options.instances = 4;
  options.topology = Topology::kDisaggregated;
  options.prefill_workers = 0;
  auto no_p = AffinityPolicy::Create(options);
  REQUIRE_FALSE(no_p.ok());
  CHECK_THAT(test::Message(no_p.status()), Catch::Contains("prefill_workers"));
  options.topology = Topology::kColocated;
  options.high_cache_fraction = 1.5;
  CHECK_FALSE(AffinityPolicy::Create(options).ok());
  auto policy = Make(AffinityRule::kLMetric, 4);
  FakeCluster smaller(Topology::kColocated, 0, 3, 100000);
  GrowingSession s{1};
  auto p = policy->Place(s.Next(0, 1), smaller);
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(test::Message(p.status()), Catch::Contains("4 instances"));
}

}  // namespace
}  // namespace kvc_router::policy
