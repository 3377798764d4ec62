// Tests of the EAR report's policies (policy/affinity_policies.hpp), each
// rule on hand-built cluster states: load-only, LMetric (with the report's
// warm-vs-cold example), sticky's rendezvous hashing (membership changes move
// ~1/N of the sessions, and only to or from the changed instance), unified's
// binding and high-cache override, the P/D variants, and ear's migration
// step: its triggers (pending prefill, memory), target choice, cooldown,
// never mid-request, no ping-pong under steady load; and ear's load control
// (which first turns wait at the gateway, and its bookkeeping); that every
// rule refuses an input count past any pool; and that no rule places work on
// a worker that is not routable (an open circuit breaker).
#include "kvc_router/policy/affinity_policies.hpp"

#include <catch2/catch.hpp>
#include <limits>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "kvc_router/detail/splitmix.hpp"
#include "kvc_router/testing/fake_cluster.hpp"
#include "test_support.hpp"

namespace kvc_router::policy {
namespace {

using testing::FakeCluster;
using testing::GrowingSession;

std::unique_ptr<AffinityPolicy> Make(AffinityRule rule, uint32_t instances,
                                     Topology topology = Topology::kColocated,
                                     uint32_t prefill = 0, AffinityPolicyOptions options = {}) {
  options.rule = rule;
  options.topology = topology;
  options.instances = instances;
  options.prefill_workers = prefill;
  options.block_tokens = 16;
  if (options.kv_capacity_tokens == 0) options.kv_capacity_tokens = 1 << 20;
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

TEST_CASE("every affinity rule refuses an input past any pool, naming it, and changes nothing",
          "[policy][ear]") {
  // Found by fuzz/policy_fuzzer.cpp: two such counts summed into an
  // instance's memory wrapped around to a total of zero live tokens.
  for (AffinityRule rule : {AffinityRule::kLoadOnly, AffinityRule::kLMetric, AffinityRule::kSticky,
                            AffinityRule::kUnified, AffinityRule::kEar}) {
    INFO(AffinityRuleName(rule));
    FakeCluster cluster(Topology::kColocated, 0, 2, 100000);
    auto policy = Make(rule, 2);
    GrowingSession s{7};
    PolicyRequest r = s.Next(0, 3);
    r.input_tokens = kMaxCapacityTokens + 1;
    const absl::StatusOr<Placement> refused = policy->Place(r, cluster);
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(test::Message(refused.status()),
               Catch::Contains("input_tokens " + std::to_string(kMaxCapacityTokens + 1)));
    CHECK(policy->binding(7) == kNoWorker);
    CHECK(policy->live_context_tokens() == 0);
    CHECK(policy->live_sessions() == 0);
    r.input_tokens = 3 * 16;
    CHECK(policy->Place(r, cluster).ok());
  }
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

TEST_CASE("every affinity rule avoids instances that are not routable and places their sessions "
          "anew",
          "[policy][ear][health]") {
  const uint64_t seed = GENERATE(take(4, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  kvc_router::detail::SplitMix64 rng(seed);
  for (AffinityRule rule : {AffinityRule::kLoadOnly, AffinityRule::kLMetric, AffinityRule::kSticky,
                            AffinityRule::kUnified, AffinityRule::kEar}) {
    INFO("rule " << AffinityRuleName(rule));
    FakeCluster cluster(Topology::kColocated, 0, 4, 1 << 20);
    auto policy = Make(rule, 4);
    for (WorkerId d = 0; d < 4; ++d) cluster.load(d).running_requests = rng.Next() % 5;
    GrowingSession s{1};
    auto first = policy->Place(s.Next(0, 10), cluster);
    REQUIRE(first.ok());
    const WorkerId home = first->instance;
    policy->OnFinished(s.Next(0, 0), *first, cluster);
    // Its instance stops answering: nothing new lands there, whatever the loads say.
    cluster.down.assign(4, false);
    cluster.down[home] = true;
    cluster.load(home).running_requests = 0;  // its tickets were released
    cluster.load(home).pending_prefill_tokens = 0;
    for (SessionId id = 100; id < 160; ++id) {
      for (WorkerId d = 0; d < 4; ++d) {
        if (d != home) cluster.load(d).running_requests = 1 + rng.Next() % 5;
      }
      GrowingSession other{id};
      auto p = policy->Place(other.Next(id, 1 + rng.Next() % 20), cluster);
      REQUIRE(p.ok());
      CHECK(p->instance != home);
      if (rule == AffinityRule::kSticky && RendezvousInstance(id, 4) != home) {
        CHECK(p->instance == RendezvousInstance(id, 4));  // only the down instance's sessions move
      }
    }
    // The session bound there is placed anew (a KV move from an instance
    // that does not answer is not planned).
    auto next = policy->Place(s.Next(1, 2), cluster);
    REQUIRE(next.ok());
    CHECK(next->instance != home);
    CHECK(next->migrate_from == kNoWorker);
    if (rule == AffinityRule::kUnified || rule == AffinityRule::kEar) {
      CHECK(policy->binding(1) == next->instance);
    }
    // What the estimate held of the down instance is not counted on when it
    // returns (it may come back empty).
    CHECK(policy->EstimatedHitTokens(home, s.chain) == 0);
    policy->OnFinished(s.Next(1, 0), *next, cluster);
    // With no instance routable nothing is decided and nothing changes.
    const WorkerId bound = policy->binding(1);
    const uint64_t live = policy->live_context_tokens();
    cluster.down.assign(4, true);
    auto none = policy->Place(s.Next(2, 1), cluster);
    REQUIRE_FALSE(none.ok());
    CHECK(none.status().code() == absl::StatusCode::kUnavailable);
    CHECK(absl::StrContains(none.status().message(), "none of the 4 instances is routable"));
    CHECK(policy->binding(1) == bound);
    CHECK(policy->live_context_tokens() == live);
    // Back up: sticky's session returns to its rendezvous instance; the
    // bindings of unified and ear stay where the session went.
    cluster.down.assign(4, false);
    auto back = policy->Place(s.Next(3, 1), cluster);
    REQUIRE(back.ok());
    if (rule == AffinityRule::kSticky) CHECK(back->instance == home);
    if (rule == AffinityRule::kUnified || rule == AffinityRule::kEar) {
      CHECK(back->instance == next->instance);
    }
  }
}

TEST_CASE("ear: turns still running on a down instance do not pin the session placed anew",
          "[policy][ear][health][migration]") {
  FakeCluster cluster(Topology::kColocated, 0, 3, 1 << 20);
  AffinityPolicyOptions options;
  options.hot_prefill_tokens = 1000;
  options.migration_cooldown_s = 0;
  options.session_idle_s = 1e6;
  auto ear = Make(AffinityRule::kEar, 3, Topology::kColocated, 0, options);
  GrowingSession s{1};
  const PolicyRequest first = s.Next(0, 10);
  auto stuck = ear->Place(first, cluster);  // runs on, never finishes in this test
  REQUIRE(stuck.ok());
  const WorkerId home = stuck->instance;
  cluster.down.assign(3, false);
  cluster.down[home] = true;
  const PolicyRequest second = s.Next(1, 2);
  auto moved = ear->Place(second, cluster);
  REQUIRE(moved.ok());
  REQUIRE(moved->instance != home);
  ear->OnFinished(second, *moved, cluster);
  ear->OnFinished(first, *stuck, cluster);  // late, from the old instance: ignored
  // Its new instance turns hot: the session has nothing in flight there, so it may move.
  cluster.load(moved->instance).pending_prefill_tokens = 50000;
  cluster.now = 10;
  auto third = ear->Place(s.Next(2, 1), cluster);
  REQUIRE(third.ok());
  CHECK(third->migrate_from == moved->instance);
  CHECK(third->instance != home);
}

TEST_CASE("ear moves the sessions of a draining instance with their KV; unified places them anew",
          "[policy][ear][health][migration]") {
  for (AffinityRule rule : {AffinityRule::kEar, AffinityRule::kUnified}) {
    INFO("rule " << AffinityRuleName(rule));
    FakeCluster cluster(Topology::kColocated, 0, 3, 1 << 20);
    AffinityPolicyOptions options;
    options.migration_cooldown_s = 1e9;  // a drain does not wait for the cooldown
    options.session_idle_s = 1e6;
    auto policy = Make(rule, 3, Topology::kColocated, 0, options);
    GrowingSession s{1};
    const PolicyRequest first = s.Next(0, 10);
    auto p = policy->Place(first, cluster);
    REQUIRE(p.ok());
    const WorkerId home = p->instance;
    policy->OnFinished(first, *p, cluster);
    cluster.down.assign(3, false);
    cluster.drain.assign(3, false);
    cluster.down[home] = cluster.drain[home] = true;
    cluster.load((home + 1) % 3).pending_prefill_tokens = 500;  // the other one is lighter
    const WorkerId lighter = (home + 2) % 3;
    auto next = policy->Place(s.Next(1, 2), cluster);
    REQUIRE(next.ok());
    CHECK(next->instance == (rule == AffinityRule::kEar ? lighter : next->instance));
    CHECK(next->instance != home);
    if (rule == AffinityRule::kEar) {
      CHECK(next->migrate_from == home);
      CHECK(next->estimated_hit_tokens == first.input_tokens);  // the move brings the context
      CHECK(policy->migrations() == 1);
    } else {
      CHECK(next->migrate_from == kNoWorker);
    }
  }
}

TEST_CASE("affinity policies on P/D: prefill workers that are not routable take nothing",
          "[policy][ear][health]") {
  for (AffinityRule rule : {AffinityRule::kLoadOnly, AffinityRule::kEar}) {
    INFO("rule " << AffinityRuleName(rule));
    FakeCluster cluster(Topology::kDisaggregated, 3, 2, 1 << 20);
    auto policy = Make(rule, 2, Topology::kDisaggregated, 3);
    cluster.prefill(0).pending_prefill_tokens = 10;
    cluster.prefill(1).pending_prefill_tokens = 0;
    cluster.prefill(2).pending_prefill_tokens = 50;
    cluster.prefill_down = {false, true, false};
    GrowingSession s{7};
    auto p = policy->Place(s.Next(0, 4), cluster);
    REQUIRE(p.ok());
    CHECK(p->prefill == 0);  // 1 is lightest but does not answer
    cluster.prefill_down = {true, true, true};
    auto none = policy->Place(s.Next(1, 1), cluster);
    REQUIRE_FALSE(none.ok());
    CHECK(none.status().code() == absl::StatusCode::kUnavailable);
    CHECK(absl::StrContains(none.status().message(), "none of the 3 prefill workers is routable"));
  }
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
  options.high_cache_fraction = 0.5;
  // Values outside the enums (a cast from unchecked input) name themselves.
  options.rule = static_cast<AffinityRule>(9);
  auto bad_rule = AffinityPolicy::Create(options);
  REQUIRE_FALSE(bad_rule.ok());
  CHECK_THAT(test::Message(bad_rule.status()), Catch::Contains("rule 9 is not an AffinityRule"));
  options.rule = AffinityRule::kEar;
  options.topology = static_cast<Topology>(5);
  auto bad_topology = AffinityPolicy::Create(options);
  REQUIRE_FALSE(bad_topology.ok());
  CHECK_THAT(test::Message(bad_topology.status()),
             Catch::Contains("topology 5 is not a Topology"));
  auto policy = Make(AffinityRule::kLMetric, 4);
  FakeCluster smaller(Topology::kColocated, 0, 3, 100000);
  GrowingSession s{1};
  auto p = policy->Place(s.Next(0, 1), smaller);
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(test::Message(p.status()), Catch::Contains("4 instances"));
}


// ear on four instances with T_hot = 1,000 tokens, 16-token blocks and the
// fixed target rule (a target stays under T_hot / 2); the cost rule has its
// own tests.
std::unique_ptr<AffinityPolicy> MakeEar(uint64_t capacity = 1 << 20, double cooldown_s = 60) {
  AffinityPolicyOptions options;
  options.hot_prefill_tokens = 1000;
  options.migration_cost.enabled = false;
  options.memory_move_max_pending_tokens = 500;
  options.migration_cooldown_s = cooldown_s;
  options.session_idle_s = 1e6;
  options.kv_capacity_tokens = capacity;
  auto policy = Make(AffinityRule::kEar, 4, Topology::kColocated, 0, options);
  return policy;
}

// Places the next turn of `s` and finishes it at once.
Placement Turn(AffinityPolicy& policy, FakeCluster& cluster, GrowingSession& s, uint64_t id,
               size_t new_blocks) {
  const PolicyRequest request = s.Next(id, new_blocks);
  absl::StatusOr<Placement> p = policy.Place(request, cluster);
  REQUIRE(p.ok());
  policy.OnFinished(request, *p, cluster);
  return *p;
}

TEST_CASE("ear: a cool instance keeps its sessions; a hot one sends the next turn to the "
          "lightest cool instance with the KV",
          "[policy][ear][migration]") {
  FakeCluster cluster(Topology::kColocated, 0, 4, 100000);
  auto ear = MakeEar();
  CHECK(ear->name() == "ear");
  GrowingSession s{1};
  const Placement first = Turn(*ear, cluster, s, 0, 10);
  CHECK(first.instance == 0);
  CHECK(first.migrate_from == kNoWorker);
  // At the threshold is not hot.
  cluster.load(0).pending_prefill_tokens = 1000;
  cluster.load(0).running_requests = 5;
  const Placement cool = Turn(*ear, cluster, s, 1, 2);
  CHECK(cool.instance == 0);
  CHECK(cool.migrate_from == kNoWorker);
  // Hot: instance 1 is lightest but would not stay cool after the turn
  // (480 + 32 > 500), 2 and 3 would; 3 has less pending prefill.
  cluster.load(0).pending_prefill_tokens = 1001;
  cluster.load(1).pending_prefill_tokens = 480;
  cluster.load(2).pending_prefill_tokens = 400;
  cluster.load(3).pending_prefill_tokens = 100;
  const PolicyRequest next = s.Next(2, 2);
  const std::optional<MigrationPlan> plan = ear->PlanMigration(next, cluster);
  REQUIRE(plan.has_value());
  CHECK(plan->from == 0);
  CHECK(plan->to == 3);
  CHECK(plan->trigger == MigrationTrigger::kHotPrefill);
  CHECK(plan->context_tokens == 12 * 16);
  CHECK(ear->binding(1) == 0);  // planning changes nothing
  absl::StatusOr<Placement> moved = ear->Place(next, cluster);
  REQUIRE(moved.ok());
  CHECK(moved->instance == 3);
  CHECK(moved->migrate_from == 0);
  CHECK(moved->booking == Booking::kSession);
  CHECK(ear->binding(1) == 3);
  CHECK(ear->migrations() == 1);
  // Never mid-request: the turn is still running.
  cluster.load(3).pending_prefill_tokens = 5000;
  CHECK_FALSE(ear->PlanMigration(s.Next(3, 1), cluster).has_value());
}

TEST_CASE("ear on P/D: the prefill worker with the least work, its own cache counted",
          "[policy][ear]") {
  FakeCluster cluster(Topology::kDisaggregated, 3, 2, 1 << 20);
  auto ear = Make(AffinityRule::kEar, 2, Topology::kDisaggregated, 3);
  CHECK(ear->name() == "ear-pd");
  GrowingSession s{1};
  // An idle cluster: prefill worker 0 (lowest id) computes the 640-token prompt.
  Placement first = Turn(*ear, cluster, s, 0, 40);
  CHECK(first.prefill == 0);
  // The next prompt (800 tokens) shares those 640: 0 with 300 queued does
  // 300 + 160 of work, 1 and 2 would do 800 from scratch.
  cluster.prefill(0).pending_prefill_tokens = 300;
  Placement second = Turn(*ear, cluster, s, 1, 10);
  CHECK(second.prefill == 0);
  CHECK(second.estimated_hit_tokens == 640);  // what prefill worker 0 computed before
  CHECK(second.instance == first.instance);  // the binding on D holds
  // A queue longer than what the cache saves sends it elsewhere: 0 now
  // caches 800 of the next 960 tokens, 900 + 160 > 960 on idle 1.
  cluster.prefill(0).pending_prefill_tokens = 900;
  CHECK(Turn(*ear, cluster, s, 2, 10).prefill == 1);
  // load-only-pd, by contrast, never looks at the cache.
  auto load_only = Make(AffinityRule::kLoadOnly, 2, Topology::kDisaggregated, 3);
  FakeCluster other(Topology::kDisaggregated, 3, 2, 1 << 20);
  GrowingSession t{2};
  CHECK(Turn(*load_only, other, t, 0, 40).prefill == 0);
  other.prefill(0).pending_prefill_tokens = 300;
  CHECK(Turn(*load_only, other, t, 1, 10).prefill == 1);
}

TEST_CASE("ear: a new session goes where the prefill it waits for and does is least",
          "[policy][ear]") {
  FakeCluster cluster(Topology::kColocated, 0, 4, 100000);
  auto ear = MakeEar();
  // Session 1 (a 640-token prompt) lands on 0 and stays cached there.
  GrowingSession first{1};
  REQUIRE(Turn(*ear, cluster, first, 0, 40).instance == 0);
  // A fork of it: 0 caches 640 of its 800 tokens, so 0's 100 queued tokens
  // plus 160 to compute beat 1's 0 + 800, although 1 runs nothing.
  cluster.load(0).pending_prefill_tokens = 100;
  cluster.load(0).running_requests = 6;
  GrowingSession fork{2, first.chain};
  CHECK(Turn(*ear, cluster, fork, 1, 10).instance == 0);
  // When 0's queue outweighs what its cache saves (700 + 160 > 800), the
  // fork goes to an empty instance: the cache is only worth the work it saves.
  cluster.load(0).pending_prefill_tokens = 700;
  GrowingSession fork2{3, first.chain};
  CHECK(Turn(*ear, cluster, fork2, 2, 10).instance == 1);
  // Equal work: fewer running requests, then fewer tokens of live contexts
  // bound there (0 holds 640 + 800, 1 holds 800, 2 and 3 nothing), then the
  // lowest id.
  const uint32_t running[] = {2, 3, 2, 2};
  for (WorkerId d = 0; d < 4; ++d) {
    cluster.load(d).pending_prefill_tokens = 50;
    cluster.load(d).running_requests = running[d];
  }
  CHECK(ear->committed_tokens(0) == 1440);
  CHECK(ear->committed_tokens(1) == 800);
  GrowingSession fresh{4};
  CHECK(Turn(*ear, cluster, fresh, 3, 20).instance == 2);
  GrowingSession fresh2{5};
  CHECK(Turn(*ear, cluster, fresh2, 4, 20).instance == 3);  // 2 now holds 320
  GrowingSession fresh3{6};
  cluster.load(3).running_requests = 1;  // fewer running beats less memory
  GrowingSession fresh4{7};
  CHECK(Turn(*ear, cluster, fresh3, 5, 20).instance == 3);
  cluster.load(3).running_requests = 2;
  cluster.load(2).pending_prefill_tokens = 49;  // less work beats both
  CHECK(Turn(*ear, cluster, fresh4, 6, 20).instance == 2);
}

TEST_CASE("ear (cost rule): a move must save T_hot tokens of prefill after paying for the KV",
          "[policy][ear][migration]") {
  FakeCluster cluster(Topology::kColocated, 0, 4, 100000);
  AffinityPolicyOptions options;
  options.hot_prefill_tokens = 1000;
  options.session_idle_s = 1e6;
  // Prefill 1 ms per token; moving KV 0.5 ms per token plus 100 ms: a
  // 192-token context costs 100 + 96 = 196 tokens of prefill time to move.
  options.migration_cost.prefill_per_token_s = 1e-3;
  options.migration_cost.transfer_per_token_s = 0.5e-3;
  options.migration_cost.transfer_setup_s = 0.1;
  auto ear = Make(AffinityRule::kEar, 4, Topology::kColocated, 0, options);
  GrowingSession s{1};
  REQUIRE(Turn(*ear, cluster, s, 0, 10).instance == 0);
  REQUIRE(Turn(*ear, cluster, s, 1, 2).instance == 0);  // context 12 blocks = 192 tokens
  // The next turn appends 32 tokens. Home has 2,000 queued; a target saves
  // 2,000 - pending - 32 - 196 tokens, and must save at least 1,000.
  cluster.load(0).pending_prefill_tokens = 2000;
  cluster.load(1).pending_prefill_tokens = 773;  // saves 999: not enough
  cluster.load(2).pending_prefill_tokens = 900;
  cluster.load(3).pending_prefill_tokens = 900;
  const PolicyRequest next = s.Next(2, 2);
  CHECK_FALSE(ear->PlanMigration(next, cluster).has_value());
  cluster.load(1).pending_prefill_tokens = 772;  // saves exactly 1,000
  std::optional<MigrationPlan> plan = ear->PlanMigration(next, cluster);
  REQUIRE(plan.has_value());
  CHECK(plan->to == 1);
  CHECK(plan->trigger == MigrationTrigger::kHotPrefill);
  // The fixed rule refuses every target here (772 + 32 and 900 + 32 are
  // above T_hot / 2).
  options.migration_cost.enabled = false;
  auto fixed = Make(AffinityRule::kEar, 4, Topology::kColocated, 0, options);
  FakeCluster quiet(Topology::kColocated, 0, 4, 100000);
  GrowingSession t{1};
  REQUIRE(Turn(*fixed, quiet, t, 0, 10).instance == 0);
  REQUIRE(Turn(*fixed, quiet, t, 1, 2).instance == 0);
  for (WorkerId d = 0; d < 4; ++d) {
    quiet.load(d).pending_prefill_tokens = cluster.load(d).pending_prefill_tokens;
  }
  CHECK_FALSE(fixed->PlanMigration(t.Next(2, 2), quiet).has_value());
  // A slower link prices the move out: 5 ms per token makes it 1,060 tokens.
  options.migration_cost.enabled = true;
  options.migration_cost.transfer_per_token_s = 5e-3;
  auto slow = Make(AffinityRule::kEar, 4, Topology::kColocated, 0, options);
  FakeCluster idle(Topology::kColocated, 0, 4, 100000);
  GrowingSession u{1};
  REQUIRE(Turn(*slow, idle, u, 0, 10).instance == 0);
  REQUIRE(Turn(*slow, idle, u, 1, 2).instance == 0);
  idle.load(0).pending_prefill_tokens = 2000;
  idle.load(1).pending_prefill_tokens = 0;
  idle.load(2).pending_prefill_tokens = 0;
  idle.load(3).pending_prefill_tokens = 0;
  CHECK_FALSE(slow->PlanMigration(u.Next(2, 2), idle).has_value());  // saves 2000-32-1060 < 1000
  idle.load(0).pending_prefill_tokens = 2100;
  plan = slow->PlanMigration(u.Next(3, 2), idle);
  REQUIRE(plan.has_value());
  CHECK(plan->to == 1);
}

TEST_CASE("ear: when no instance can take the session, the binding stays", "[policy][ear][migration]") {
  FakeCluster cluster(Topology::kColocated, 0, 4, 100000);
  SECTION("every other instance is warm") {
    auto ear = MakeEar();
    GrowingSession s{2};
    REQUIRE(Turn(*ear, cluster, s, 0, 10).instance == 0);
    cluster.load(0).pending_prefill_tokens = 50000;
    for (WorkerId d = 1; d < 4; ++d) cluster.load(d).pending_prefill_tokens = 600;
    const Placement p = Turn(*ear, cluster, s, 1, 1);
    CHECK(p.instance == 0);
    CHECK(p.migrate_from == kNoWorker);
  }
  SECTION("no other instance has room for the context") {
    // 1,000 tokens of KV per instance; other sessions fill 1..3.
    auto ear = MakeEar(/*capacity=*/1000);
    std::vector<GrowingSession> fillers;
    for (SessionId id = 10; id < 13; ++id) fillers.push_back(GrowingSession{id});
    GrowingSession s{2};
    REQUIRE(Turn(*ear, cluster, s, 0, 40).instance == 0);  // 640 tokens
    uint64_t id = 1;
    for (GrowingSession& f : fillers) {
      const Placement p = Turn(*ear, cluster, f, id++, 40);
      CHECK(p.instance != 0);  // 0 cannot hold another 640 tokens
    }
    for (WorkerId d = 1; d < 4; ++d) CHECK(ear->committed_tokens(d) == 640);
    cluster.load(0).pending_prefill_tokens = 50000;
    const Placement p = Turn(*ear, cluster, s, id, 1);
    CHECK(p.instance == 0);
    CHECK(p.migrate_from == kNoWorker);
  }
}

TEST_CASE("ear: an instance whose live contexts exceed K_d sheds the arriving session",
          "[policy][ear][migration]") {
  FakeCluster cluster(Topology::kColocated, 0, 4, 100000);
  auto ear = MakeEar(/*capacity=*/1000);
  // Sessions 1 and 2 bind to different instances (least work; equal work
  // goes to fewer running requests, then the lowest id).
  GrowingSession a{1};
  GrowingSession b{2};
  REQUIRE(Turn(*ear, cluster, a, 0, 30).instance == 0);
  // Make 0 look busy so b's first turn (equal work everywhere) goes elsewhere.
  cluster.load(0).running_requests = 1;
  const WorkerId b_home = Turn(*ear, cluster, b, 1, 10).instance;
  REQUIRE(b_home != 0);
  cluster.load(0).running_requests = 0;
  // a grows to 1,040 tokens on 0: more than K_d. Its next turn moves to the
  // lightest instance with room (3: 1 and 2 are busier).
  REQUIRE(Turn(*ear, cluster, a, 2, 35).instance == 0);
  CHECK(ear->committed_tokens(0) == 65 * 16);
  cluster.load(1).pending_prefill_tokens = 50;
  cluster.load(2).pending_prefill_tokens = 50;
  const PolicyRequest next = a.Next(3, 1);
  const std::optional<MigrationPlan> plan = ear->PlanMigration(next, cluster);
  // The context itself exceeds K_d everywhere: nothing can hold it.
  CHECK_FALSE(plan.has_value());
  // A smaller overflow: c (400 tokens) joins a smaller a2 on one instance.
  auto ear2 = MakeEar(/*capacity=*/1000);
  FakeCluster c2(Topology::kColocated, 0, 4, 100000);
  GrowingSession x{5};
  GrowingSession y{6};
  REQUIRE(Turn(*ear2, c2, x, 0, 30).instance == 0);  // 480
  c2.load(1).running_requests = 1;
  c2.load(2).running_requests = 1;
  c2.load(3).running_requests = 1;
  // Equal work everywhere for y (no overlap): 0 runs the fewest and still
  // fits 480 + 400.
  REQUIRE(Turn(*ear2, c2, y, 1, 25).instance == 0);
  // x grows past what 0 can hold beside y: 0 is memory-hot.
  REQUIRE(Turn(*ear2, c2, x, 2, 10).instance == 0);  // 640 + 400 > 1000
  CHECK(ear2->committed_tokens(0) == 1040);
  c2.load(2).pending_prefill_tokens = 10;
  c2.load(3).pending_prefill_tokens = 20;
  c2.load(1).pending_prefill_tokens = 30;
  const Placement moved = Turn(*ear2, c2, x, 3, 1);
  CHECK(moved.migrate_from == 0);
  CHECK(moved.instance == 2);
  CHECK(ear2->committed_tokens(0) == 400);
  CHECK(ear2->committed_tokens(2) == 41 * 16);
}

// Instance 0 holds x (6,400 tokens), y (4,000) and w (2,400): 12,800 live
// tokens on a 10,000-token pool. Fillers of 8,000 sit on 1 and 2, and one
// of `third` blocks on 3.
struct OverflowScene {
  FakeCluster cluster{Topology::kColocated, 0, 4, 100000};
  std::unique_ptr<AffinityPolicy> ear;
  GrowingSession x{1}, y{2}, w{3}, f1{11}, f2{12}, f3{13};
  uint64_t id = 0;

  OverflowScene(size_t third_blocks, bool lowers_overflow) {
    AffinityPolicyOptions options;
    options.hot_prefill_tokens = 1000;
    options.migration_cost.enabled = false;
    options.memory_move_max_pending_tokens = 500;
    options.session_idle_s = 1e6;
    options.kv_capacity_tokens = 10000;
    options.memory_move_lowers_overflow = lowers_overflow;
    ear = Make(AffinityRule::kEar, 4, Topology::kColocated, 0, options);
    REQUIRE(Turn(*ear, cluster, x, id++, 200).instance == 0);
    // Others look busier, so y and w join x on 0 while it has room.
    for (WorkerId d = 1; d < 4; ++d) cluster.load(d).running_requests = 1;
    REQUIRE(Turn(*ear, cluster, y, id++, 250).instance == 0);
    REQUIRE(Turn(*ear, cluster, w, id++, 150).instance == 0);
    REQUIRE(Turn(*ear, cluster, x, id++, 200).instance == 0);
    REQUIRE(ear->committed_tokens(0) == 12800);
    for (WorkerId d = 1; d < 4; ++d) cluster.load(d).running_requests = 0;
    cluster.load(0).running_requests = 5;
    REQUIRE(Turn(*ear, cluster, f1, id++, 500).instance == 1);
    REQUIRE(Turn(*ear, cluster, f2, id++, 500).instance == 2);
    REQUIRE(Turn(*ear, cluster, f3, id++, third_blocks).instance == 3);
    cluster.load(0).running_requests = 0;
  }
};

TEST_CASE("ear: a memory move may go where the session does not wholly fit when that lowers "
          "the overflow by T_hot",
          "[policy][ear][migration]") {
  SECTION("3 holds 4,960: moving x leaves 1,376 beyond K_d instead of 2,800") {
    OverflowScene scene(310, /*lowers_overflow=*/true);
    const std::optional<MigrationPlan> plan =
        scene.ear->PlanMigration(scene.x.Next(scene.id, 1), scene.cluster);
    REQUIRE(plan.has_value());
    CHECK(plan->from == 0);
    CHECK(plan->to == 3);
    CHECK(plan->trigger == MigrationTrigger::kMemory);
  }
  SECTION("3 holds 6,240: the move would save only 144 tokens, less than T_hot") {
    OverflowScene scene(390, /*lowers_overflow=*/true);
    CHECK_FALSE(scene.ear->PlanMigration(scene.x.Next(scene.id, 1), scene.cluster).has_value());
  }
  SECTION("switched off, only an instance that holds all of x qualifies") {
    OverflowScene scene(310, /*lowers_overflow=*/false);
    CHECK_FALSE(scene.ear->PlanMigration(scene.x.Next(scene.id, 1), scene.cluster).has_value());
  }
}

TEST_CASE("ear: a closed session is forgotten, with the memory counted for it",
          "[policy][ear]") {
  OverflowScene scene(310, /*lowers_overflow=*/true);
  scene.ear->OnSessionClosed(scene.y.id);
  CHECK(scene.ear->binding(scene.y.id) == kNoWorker);
  CHECK(scene.ear->committed_tokens(0) == 8800);
  // 0 now holds its live contexts: x has no reason to move.
  CHECK_FALSE(scene.ear->PlanMigration(scene.x.Next(scene.id, 1), scene.cluster).has_value());
  // Closing what the policy never saw, or twice, changes nothing.
  scene.ear->OnSessionClosed(999);
  scene.ear->OnSessionClosed(scene.y.id);
  CHECK(scene.ear->committed_tokens(0) == 8800);
}

TEST_CASE("ear: at most one move per session per cooldown", "[policy][ear][migration]") {
  FakeCluster cluster(Topology::kColocated, 0, 4, 100000);
  auto ear = MakeEar(1 << 20, /*cooldown_s=*/60);
  GrowingSession s{3};
  REQUIRE(Turn(*ear, cluster, s, 0, 10).instance == 0);
  cluster.now = 10;
  cluster.load(0).pending_prefill_tokens = 5000;
  const Placement first = Turn(*ear, cluster, s, 1, 1);
  REQUIRE(first.migrate_from == 0);
  const WorkerId home = first.instance;
  // The new home is hot at once; another cool instance exists.
  cluster.load(0).pending_prefill_tokens = 0;
  cluster.load(home).pending_prefill_tokens = 5000;
  cluster.now = 69.9;
  CHECK(Turn(*ear, cluster, s, 2, 1).migrate_from == kNoWorker);
  cluster.now = 70;
  const Placement second = Turn(*ear, cluster, s, 3, 1);
  CHECK(second.migrate_from == home);
  CHECK(ear->migrations() == 2);
}

TEST_CASE("ear: steady load never makes a session ping-pong (property)",
          "[policy][ear][migration][property]") {
  // Random but steady loads on 2..6 instances: whatever they are, a session
  // moves at most once over 200 turns (a second move would need the load to
  // change), and never back to where it came from.
  const uint64_t seed = GENERATE(take(50, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  kvc_router::detail::SplitMix64 rng(seed);
  const auto n = static_cast<uint32_t>(2 + rng.Next() % 5);
  FakeCluster cluster(Topology::kColocated, 0, n, 100000);
  AffinityPolicyOptions options;
  options.instances = n;
  options.hot_prefill_tokens = 1000;
  // Both target rules; the cost rule with a move that costs little (1 ms
  // of prefill per token, 0.1 ms per moved token).
  options.migration_cost.enabled = (seed & 1) != 0;
  options.migration_cost.prefill_per_token_s = 1e-3;
  options.migration_cost.transfer_per_token_s = 1e-4;
  options.migration_cost.transfer_setup_s = 0;
  options.memory_move_max_pending_tokens = 500;
  INFO("cost rule " << options.migration_cost.enabled);
  options.migration_cooldown_s = static_cast<double>(rng.Next() % 30);
  options.kv_capacity_tokens = 1 << 20;
  auto ear = Make(AffinityRule::kEar, n, Topology::kColocated, 0, options);
  for (WorkerId d = 0; d < n; ++d) {
    cluster.load(d).pending_prefill_tokens = rng.Next() % 2000;
    cluster.load(d).running_requests = static_cast<uint32_t>(rng.Next() % 4);
  }
  std::vector<GrowingSession> sessions;
  for (SessionId id = 0; id < 4; ++id) sessions.push_back(GrowingSession{id + 1});
  std::map<SessionId, std::vector<WorkerId>> homes;
  uint64_t request = 0;
  for (int turn = 0; turn < 200; ++turn) {
    cluster.now += 1.0 + static_cast<double>(rng.Next() % 10);
    GrowingSession& s = sessions[rng.Next() % sessions.size()];
    const Placement p = Turn(*ear, cluster, s, request++, 1 + rng.Next() % 3);
    std::vector<WorkerId>& h = homes[s.id];
    if (h.empty() || h.back() != p.instance) h.push_back(p.instance);
  }
  for (const auto& [session, h] : homes) {
    INFO("session " << session);
    CHECK(h.size() <= 2);
  }
}

TEST_CASE("ear: the idle time is learned from the gaps between turns", "[policy][ear]") {
  GapHistogram gaps;
  CHECK(gaps.count() == 0);
  for (int i = 1; i <= 100; ++i) gaps.Add(static_cast<double>(i));
  gaps.Add(-1);  // ignored
  gaps.Add(std::numeric_limits<double>::infinity());
  CHECK(gaps.count() == 100);
  // Within one bucket (2^(1/4), 19%) above the true quantile.
  CHECK(gaps.Quantile(0.95) >= 95.0);
  CHECK(gaps.Quantile(0.95) <= 95.0 * 1.19);
  CHECK(gaps.Quantile(0.5) >= 50.0);
  CHECK(gaps.Quantile(0.5) <= 50.0 * 1.19);

  // A session idle longer than the learned p95 gap stops counting.
  FakeCluster cluster(Topology::kColocated, 0, 4, 100000);
  AffinityPolicyOptions options;
  options.kv_capacity_tokens = 1 << 20;
  auto ear = Make(AffinityRule::kEar, 4, Topology::kColocated, 0, options);
  GrowingSession s{4};
  for (int turn = 0; turn < 20; ++turn) {
    cluster.now += 2.0;  // every gap is 2 s
    Turn(*ear, cluster, s, static_cast<uint64_t>(turn), 1);
  }
  const WorkerId home = ear->binding(4);
  CHECK(ear->committed_tokens(home) == 20 * 16);
  GrowingSession other{5};
  cluster.now += 10;  // far beyond 2 s
  Turn(*ear, cluster, other, 100, 1);
  CHECK(ear->committed_tokens(home) == (ear->binding(5) == home ? 16u : 0u));
}

TEST_CASE("ear: bad migration options are refused", "[policy][ear]") {
  AffinityPolicyOptions options;
  options.rule = AffinityRule::kEar;
  options.hot_prefill_tokens = 0;
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()), Catch::Contains("hot_prefill_tokens"));
  options = {};
  options.migration_cooldown_s = std::numeric_limits<double>::quiet_NaN();
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()), Catch::Contains("migration_cooldown_s"));
  options = {};
  options.idle_gap_quantile = 1;
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()), Catch::Contains("idle_gap_quantile"));
  options = {};
  options.migration_cost.prefill_per_token_s = 0;
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()),
             Catch::Contains("prefill_per_token_s must be > 0"));
  options.migration_cost.enabled = false;  // the fixed rule does not divide by it
  CHECK(AffinityPolicy::Create(options).ok());
  options = {};
  options.migration_cost.transfer_per_token_s = -1;
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()),
             Catch::Contains("migration_cost"));
}

TEST_CASE("ear arrival window: a share of the first turn's own prefill, keyed by the input no "
          "instance caches",
          "[policy][ear][arrival-window]") {
  FakeCluster cluster(Topology::kColocated, 0, 2, 100000);
  auto ear = Make(AffinityRule::kEar, 2);
  const AffinityPolicyOptions defaults;
  const DirectCostModel& cost = defaults.migration_cost;
  GrowingSession first{1};
  PolicyRequest r = first.Next(0, 1000);  // 16,000 tokens, nothing cached
  ArrivalOrder order = ear->ArrivalWindow(r, cluster);
  CHECK(order.key == 16000);
  CHECK(order.window_s == Approx(defaults.arrival_window_fraction * cost.PrefillSeconds(16000, 0)));
  CHECK(order.window_s > 0);
  CHECK(order.window_s < defaults.max_arrival_window_s);
  // Asking changes nothing: the same answer again, and Place still sees a
  // new session.
  CHECK(ear->ArrivalWindow(r, cluster).window_s == order.window_s);
  REQUIRE(ear->Place(r, cluster).ok());
  ear->OnFinished(r, *ear->Place(first.Next(1, 0), cluster), cluster);

  SECTION("a fork of a placed session waits for its uncached part only") {
    GrowingSession fork{2};
    fork.chain = first.chain;
    const PolicyRequest f = fork.Next(2, 10);  // 160 new tokens on 16,000 cached
    const ArrivalOrder o = ear->ArrivalWindow(f, cluster);
    CHECK(o.key == 160);
    CHECK(o.window_s ==
          Approx(defaults.arrival_window_fraction * cost.PrefillSeconds(160, 16000)));
  }
  SECTION("a prefix cached only on an instance that is not routable does not count") {
    GrowingSession fork{2};
    fork.chain = first.chain;
    const WorkerId home = ear->binding(1);
    REQUIRE(home != kNoWorker);
    cluster.down.assign(2, false);
    cluster.down[home] = true;
    const ArrivalOrder o = ear->ArrivalWindow(fork.Next(2, 10), cluster);
    CHECK(o.key == 16160);
  }
  SECTION("a long first prompt waits at most max_arrival_window_s") {
    GrowingSession huge{3};
    const ArrivalOrder o = ear->ArrivalWindow(huge.Next(2, 10000), cluster);
    CHECK(o.key == 160000);
    CHECK(o.window_s == defaults.max_arrival_window_s);
  }
  SECTION("a placed session's turns, other rules and a zero fraction get no window") {
    GrowingSession again{1};
    CHECK(ear->ArrivalWindow(again.Next(2, 1000), cluster).window_s == 0);
    for (AffinityRule rule : {AffinityRule::kLoadOnly, AffinityRule::kLMetric,
                              AffinityRule::kSticky, AffinityRule::kUnified}) {
      INFO(AffinityRuleName(rule));
      GrowingSession fresh{4};
      CHECK(Make(rule, 2)->ArrivalWindow(fresh.Next(2, 1000), cluster).window_s == 0);
    }
    AffinityPolicyOptions off;
    off.arrival_window_fraction = 0;
    GrowingSession fresh{4};
    CHECK(Make(AffinityRule::kEar, 2, Topology::kColocated, 0, off)
              ->ArrivalWindow(fresh.Next(2, 1000), cluster)
              .window_s == 0);
  }
  SECTION("bad settings are refused, naming them") {
    AffinityPolicyOptions bad;
    bad.arrival_window_fraction = 1.5;
    CHECK_THAT(test::Message(AffinityPolicy::Create(bad).status()),
               Catch::Contains("arrival_window_fraction"));
    bad = {};
    bad.max_arrival_window_s = std::numeric_limits<double>::quiet_NaN();
    CHECK_THAT(test::Message(AffinityPolicy::Create(bad).status()),
               Catch::Contains("max_arrival_window_s"));
  }
}

// Load control on two instances of 10,000 tokens: with the default
// fraction 0.8, live contexts plus a new input may fill 16,000 tokens, and an
// average live context may be at most 4,000 (two per instance's 8,000).
struct LoadControlScene {
  FakeCluster cluster{Topology::kColocated, 0, 2, 100000};
  std::unique_ptr<AffinityPolicy> ear;
  uint64_t id = 0;

  explicit LoadControlScene(AffinityPolicyOptions options = {}) {
    options.session_idle_s = options.session_idle_s > 0 ? options.session_idle_s : 1e6;
    options.kv_capacity_tokens = 10000;
    ear = Make(AffinityRule::kEar, 2, Topology::kColocated, 0, options);
  }
  // A session of four turns, 50 blocks each: 3,200 live tokens.
  void FourTurns(GrowingSession& s) {
    for (int turn = 0; turn < 4; ++turn) Turn(*ear, cluster, s, id++, 50);
  }
  bool Holds(SessionId session, size_t blocks, double arrived_s) {
    GrowingSession fresh{session};
    return ear->HoldNewSession(fresh.Next(id, blocks), cluster, arrived_s);
  }
};

TEST_CASE("ear load control: a new session waits while live contexts would pass the memory "
          "fraction",
          "[policy][ear][load-control]") {
  LoadControlScene scene;
  // Nothing live: nothing is held, an input that fills the limit exactly
  // or one beyond all memory.
  CHECK_FALSE(scene.Holds(1, 1000, 0));
  CHECK_FALSE(scene.Holds(1, 5000, 0));
  std::vector<GrowingSession> live = {GrowingSession{1}, GrowingSession{2}, GrowingSession{3},
                                      GrowingSession{4}};
  for (GrowingSession& s : live) scene.FourTurns(s);
  REQUIRE(scene.ear->live_context_tokens() == 12800);
  REQUIRE(scene.ear->live_sessions() == 4);
  // 4 first turns and 12 later ones: (12 + 1) / (16 + 2).
  CHECK(scene.ear->return_rate() == Approx(13.0 / 18.0).margin(1e-3));  // barely faded
  // 12,800 + 4,000 > 16,000; 12,800 + 3,200 is not.
  CHECK(scene.Holds(10, 250, 0));
  CHECK_FALSE(scene.Holds(10, 200, 0));
  SECTION("an input larger than the limit on its own is never held") {
    CHECK(scene.Holds(10, 1000, 0));        // 16,000: fits once others leave
    CHECK_FALSE(scene.Holds(10, 1001, 0));  // 16,016: would wait for an empty cluster
  }
  SECTION("the wait is bounded by max_hold_s") {
    scene.cluster.now = 1000;
    CHECK(scene.Holds(10, 250, 400.1));
    CHECK_FALSE(scene.Holds(10, 250, 400));
  }
  SECTION("only a session's first turn, and only of a session not placed, is held") {
    // A later turn of a session the policy does not know (its gateway lost
    // the binding): turn 1, not placed.
    GrowingSession unknown{11};
    (void)unknown.Next(scene.id, 1);
    CHECK_FALSE(scene.ear->HoldNewSession(unknown.Next(scene.id, 250), scene.cluster, 0));
    GrowingSession bound{1};  // session 1 again, from its first turn
    CHECK_FALSE(scene.ear->HoldNewSession(bound.Next(scene.id, 250), scene.cluster, 0));
  }
  SECTION("an instance that is not routable lends no memory") {
    scene.cluster.down = {false, true};  // drained, or its breaker open: 8,000 tokens left
    CHECK(scene.Holds(10, 200, 0));      // 12,800 + 3,200 > 8,000
    CHECK(scene.Holds(10, 500, 0));      // 8,000: fits once others leave
    CHECK_FALSE(scene.Holds(10, 501, 0));  // beyond what the routable one holds
    scene.cluster.down = {true, true};   // nothing routable: Place answers, nothing waits
    CHECK_FALSE(scene.Holds(10, 200, 0));
    scene.cluster.down = {};
    CHECK_FALSE(scene.Holds(10, 200, 0));
  }
  SECTION("a session that closes frees its memory at once") {
    scene.ear->OnSessionClosed(1);
    CHECK(scene.ear->live_context_tokens() == 9600);
    CHECK_FALSE(scene.Holds(10, 250, 0));
  }
  SECTION("sessions idle past the idle time stop counting") {
    AffinityPolicyOptions options;
    options.session_idle_s = 50;
    LoadControlScene idle(options);
    std::vector<GrowingSession> four = {GrowingSession{1}, GrowingSession{2}, GrowingSession{3},
                                        GrowingSession{4}};
    for (GrowingSession& s : four) idle.FourTurns(s);
    CHECK(idle.Holds(10, 250, 0));
    idle.cluster.now = 51;
    CHECK_FALSE(idle.Holds(10, 250, 51));
    CHECK(idle.ear->live_context_tokens() == 0);
  }
  SECTION("a host tier counts as reusable memory") {
    AffinityPolicyOptions options;
    options.reusable_capacity_tokens = 20000;
    LoadControlScene tiered(options);
    for (GrowingSession& s : live) s = GrowingSession{s.id};
    for (GrowingSession& s : live) tiered.FourTurns(s);
    CHECK_FALSE(tiered.Holds(10, 250, 0));
    CHECK(tiered.Holds(10, 1500, 0));  // 12,800 + 24,000 > 32,000
  }
  SECTION("switched off, or under another rule, nothing is held") {
    AffinityPolicyOptions options;
    options.hold_new_sessions = false;
    LoadControlScene off(options);
    for (GrowingSession& s : live) s = GrowingSession{s.id};
    for (GrowingSession& s : live) off.FourTurns(s);
    CHECK_FALSE(off.Holds(10, 250, 0));
    AffinityPolicyOptions unified_options;
    unified_options.kv_capacity_tokens = 10000;
    auto unified = Make(AffinityRule::kUnified, 2, Topology::kColocated, 0, unified_options);
    uint64_t id = 0;
    for (GrowingSession& s : live) s = GrowingSession{s.id};
    for (GrowingSession& s : live) {
      for (int turn = 0; turn < 4; ++turn) Turn(*unified, scene.cluster, s, id++, 50);
    }
    GrowingSession fresh{10};
    CHECK_FALSE(unified->HoldNewSession(fresh.Next(id, 250), scene.cluster, 0));
    CHECK(unified->live_sessions() == 0);  // only ear counts live contexts
  }
}

TEST_CASE("ear load control: traffic of one-turn sessions is not held", "[policy][ear][load-control]") {
  for (const double min_rate : {0.5, 0.0}) {
    INFO("hold_min_return_rate " << min_rate);
    AffinityPolicyOptions options;
    options.hold_min_return_rate = min_rate;
    LoadControlScene scene(options);
    // Ten sessions of one turn that ended (closed): none came back.
    for (SessionId gone = 100; gone < 110; ++gone) {
      GrowingSession s{gone};
      Turn(*scene.ear, scene.cluster, s, scene.id++, 10);
      scene.ear->OnSessionClosed(gone);
    }
    std::vector<GrowingSession> live = {GrowingSession{1}, GrowingSession{2}, GrowingSession{3},
                                        GrowingSession{4}};
    for (GrowingSession& s : live) Turn(*scene.ear, scene.cluster, s, scene.id++, 200);
    REQUIRE(scene.ear->live_context_tokens() == 12800);
    CHECK(scene.ear->return_rate() == Approx(1.0 / 16.0).margin(1e-3));  // 14 first turns, no later one
    CHECK(scene.Holds(10, 250, 0) == (min_rate == 0.0));
  }
}

TEST_CASE("ear load control: the return rate follows the traffic as it changes",
          "[policy][ear][load-control]") {
  LoadControlScene scene;
  CHECK(scene.ear->return_rate() == Approx(0.5));  // the prior
  // Agentic traffic: sessions of eight turns.
  for (SessionId s = 1; s <= 600; ++s) {
    GrowingSession g{s};
    for (int turn = 0; turn < 8; ++turn) Turn(*scene.ear, scene.cluster, g, scene.id++, 1);
    scene.ear->OnSessionClosed(s);
  }
  CHECK(scene.ear->return_rate() == Approx(7.0 / 8.0).margin(0.01));
  // Then one-turn traffic: within a few windows the rate follows it down.
  for (SessionId s = 1000; s < 1000 + 3 * static_cast<SessionId>(kReturnRateWindow); ++s) {
    GrowingSession g{s};
    Turn(*scene.ear, scene.cluster, g, scene.id++, 1);
    scene.ear->OnSessionClosed(s);
  }
  CHECK(scene.ear->return_rate() < 0.05);
}

TEST_CASE("ear load control: not when an instance cannot hold two average contexts",
          "[policy][ear][load-control]") {
  for (const double fraction : {0.8, 1.0}) {
    INFO("hold_memory_fraction " << fraction);
    AffinityPolicyOptions options;
    options.hold_memory_fraction = fraction;
    LoadControlScene scene(options);
    // Two sessions of 4,800 tokens: more than 0.8 x 10,000 / 2 each, less
    // than 10,000 / 2.
    GrowingSession a{1}, b{2};
    for (GrowingSession* s : {&a, &b}) {
      for (int turn = 0; turn < 3; ++turn) Turn(*scene.ear, scene.cluster, *s, scene.id++, 100);
    }
    REQUIRE(scene.ear->live_context_tokens() == 9600);
    // 9,600 + 12,000 passes both limits (16,000 and 20,000).
    CHECK(scene.Holds(10, 750, 0) == (fraction == 1.0));
  }
}

TEST_CASE("ear load control: the live totals match the per-instance counts (property)",
          "[policy][ear][load-control][property]") {
  const uint64_t seed = GENERATE(take(30, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  kvc_router::detail::SplitMix64 rng(seed);
  FakeCluster cluster(Topology::kColocated, 0, 3, 100000);
  AffinityPolicyOptions options;
  options.instances = 3;
  options.hot_prefill_tokens = 100;
  options.migration_cooldown_s = 0;
  options.session_idle_s = 20;
  options.kv_capacity_tokens = 3000;
  options.max_bindings = 6;
  auto ear = Make(AffinityRule::kEar, 3, Topology::kColocated, 0, options);
  std::map<SessionId, GrowingSession> sessions;
  uint64_t request = 0;
  for (int step = 0; step < 300; ++step) {
    cluster.now += static_cast<double>(rng.Next() % 8);
    for (WorkerId d = 0; d < 3; ++d) cluster.load(d).pending_prefill_tokens = rng.Next() % 300;
    const SessionId id = 1 + rng.Next() % 10;
    if (rng.Next() % 6 == 0) {
      ear->OnSessionClosed(id);
      sessions.erase(id);
    } else {
      auto [it, inserted] = sessions.try_emplace(id, GrowingSession{id});
      const PolicyRequest r = it->second.Next(request++, 1 + rng.Next() % 20);
      (void)ear->HoldNewSession(r, cluster, cluster.now);
      absl::StatusOr<Placement> p = ear->Place(r, cluster);
      REQUIRE(p.ok());
      // The session just placed is bound and counted, with its request in flight.
      REQUIRE(ear->binding(id) == p->instance);
      REQUIRE(ear->live_sessions() >= 1);
      REQUIRE(ear->committed_tokens(p->instance) >= r.input_tokens);
      if (rng.Next() % 4 != 0) ear->OnFinished(r, *p, cluster);
    }
    uint64_t sum = 0;
    uint32_t counted = 0;
    for (WorkerId d = 0; d < 3; ++d) sum += ear->committed_tokens(d);
    for (SessionId s = 1; s <= 10; ++s) counted += ear->binding(s) != kNoWorker;
    REQUIRE(ear->live_context_tokens() == sum);
    REQUIRE(ear->live_sessions() <= counted);
    REQUIRE((ear->live_sessions() == 0) == (sum == 0));
  }
}

TEST_CASE("ear load control: bad options are refused, naming the value", "[policy][ear][load-control]") {
  AffinityPolicyOptions options;
  options.hold_memory_fraction = 0;
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()),
             Catch::Contains("hold_memory_fraction must be in (0, 1], got 0"));
  options.hold_memory_fraction = std::numeric_limits<double>::quiet_NaN();
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()),
             Catch::Contains("hold_memory_fraction"));
  options = {};
  options.hold_min_return_rate = 1.5;
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()),
             Catch::Contains("hold_min_return_rate must be in [0, 1], got 1.5"));
  options = {};
  options.max_hold_s = std::numeric_limits<double>::infinity();
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()),
             Catch::Contains("max_hold_s must be finite"));
  options = {};
  options.kv_capacity_tokens = 1000;
  options.reusable_capacity_tokens = 999;
  CHECK_THAT(test::Message(AffinityPolicy::Create(options).status()),
             Catch::Contains("reusable_capacity_tokens (999) must be 0 or at least"));
  options.reusable_capacity_tokens = 1000;
  CHECK(AffinityPolicy::Create(options).ok());
}

TEST_CASE("ear: at the binding bound, the session being placed is never the one forgotten",
          "[policy][ear]") {
  // Every older binding was placed again after its queue entry: the queue
  // meets their stale entries first. The new session must keep its binding
  // (ear reads it right after binding) and the least recently placed other
  // session goes.
  FakeCluster cluster(Topology::kColocated, 0, 2, 1 << 20);
  AffinityPolicyOptions options;
  options.max_bindings = 2;
  auto ear = Make(AffinityRule::kEar, 2, Topology::kColocated, 0, options);
  GrowingSession a{1}, b{2}, c{3};
  uint64_t id = 0;
  Turn(*ear, cluster, a, id++, 2);
  Turn(*ear, cluster, b, id++, 2);
  Turn(*ear, cluster, a, id++, 2);
  Turn(*ear, cluster, b, id++, 2);
  const Placement placed = Turn(*ear, cluster, c, id++, 2);
  CHECK(ear->binding(3) == placed.instance);
  CHECK(ear->binding(1) == kNoWorker);
  CHECK(ear->binding(2) != kNoWorker);
  uint64_t committed = 0;
  for (WorkerId d = 0; d < 2; ++d) committed += ear->committed_tokens(d);
  CHECK(committed == ear->live_context_tokens());
  CHECK(ear->live_sessions() == 2);
}

}  // namespace
}  // namespace kvc_router::policy
