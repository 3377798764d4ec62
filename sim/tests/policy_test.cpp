// Tests of the policy interface and the policies: the registry, vanilla P/D
// round-robin, SGLang-style cache-aware selection (dp and pd-sglang), and
// the KVC-Router driven through ClusterView::Admit.
#include "kvc_sim/policies/registry.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kvc_router/admit.hpp"
#include "kvc_router/testing/fake_cluster.hpp"
#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

using policy::Booking;
using policy::ClusterView;
using policy::InstanceLoad;
using policy::Placement;
using policy::PolicyRequest;
using policy::Topology;

using testing::FakeCluster;
using Session = testing::GrowingSession;

PolicySetup Env() {
  PolicySetup setup;
  setup.cluster = {.prefill_workers = 2, .decode_workers = 3, .colocated_instances = 0};
  setup.router.block_tokens = 16;
  setup.router.max_admit_attempts = 2;
  setup.admission.capacity_tokens = 10000;
  return setup;
}

std::unique_ptr<policy::RoutingPolicy> Make(const std::string& name, const PolicySetup& setup) {
  absl::StatusOr<MadePolicy> made = MakePolicy(name, setup);
  REQUIRE(made.ok());
  return std::move(made->policy);
}

TEST_CASE("policy registry: names, descriptions and errors", "[policy]") {
  std::vector<std::string> names;
  for (const PolicyInfo& info : ListPolicies()) {
    names.emplace_back(info.name);
    CHECK_FALSE(info.description.empty());
  }
  CHECK(names == std::vector<std::string>{"kvc", "kvc-v1", "kvc-colo", "kvc-adaptive",
                                          "kvc-adaptive-colo", "pd", "pd-sglang", "dp",
                                          "load-only", "lmetric", "sticky", "unified", "ear",
                                          "load-only-pd", "lmetric-pd", "sticky-pd",
                                          "unified-pd", "ear-pd"});
  for (const PolicyInfo& info : ListPolicies()) {
    auto policy = Make(std::string(info.name), Env());
    CHECK(policy->name() == info.name);
    CHECK(policy->topology() == info.topology);
  }
  CHECK(Make("kvc", Env())->uses_admission());
  CHECK_FALSE(Make("pd", Env())->uses_admission());
  CHECK_FALSE(Make("pd-sglang", Env())->uses_admission());
  // Vanilla P/D is the only policy whose engines neither cache on P nor send deltas.
  CHECK_FALSE(MakePolicy("pd", Env())->engine.prefill_cache);
  CHECK_FALSE(MakePolicy("pd", Env())->engine.delta_transfer);
  CHECK(MakePolicy("pd-sglang", Env())->engine.delta_transfer);
  auto unknown = MakePolicy("ear-colo", Env());
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(test::Message(unknown.status()), Catch::Contains("known: kvc, kvc-v1, kvc-colo"));
  PolicySetup no_p = Env();
  no_p.cluster.prefill_workers = 0;
  CHECK_FALSE(MakePolicy("kvc", no_p).ok());
  CHECK_FALSE(MakePolicy("pd", no_p).ok());
  CHECK_FALSE(MakePolicy("pd-sglang", no_p).ok());
  CHECK(MakePolicy("kvc-colo", no_p).ok());
  CHECK(ExpandPolicyNames({"all"}).size() == ListPolicies().size());
  CHECK(ExpandPolicyNames({"kvc", "dp"}) == std::vector<std::string>{"kvc", "dp"});
}

TEST_CASE("kvc-adaptive: workers with the cost rule, backups on the session's home P",
          "[policy][adaptive]") {
  const PolicySetup env = Env();
  absl::StatusOr<MadePolicy> adaptive = MakePolicy("kvc-adaptive", env);
  REQUIRE(adaptive.ok());
  REQUIRE(adaptive->engine.admission.has_value());
  const AdmissionConfig& workers = *adaptive->engine.admission;
  CHECK(workers.accounting == CapacityAccounting::kIncremental);
  CHECK(workers.direct_cost.enabled);
  CHECK(workers.direct_cost.transfer_per_token_s > 0);
  CHECK(workers.max_direct_append_tokens == ~uint64_t{0});
  CHECK(workers.capacity_tokens == env.admission.capacity_tokens);
  CHECK(adaptive->engine.kv_backup);
  absl::StatusOr<MadePolicy> colo = MakePolicy("kvc-adaptive-colo", env);
  REQUIRE(colo.ok());
  CHECK(colo->engine.admission->direct_cost.transfer_per_token_s == 0);
  CHECK_FALSE(colo->engine.kv_backup);
  // The seed's policies keep the cluster's admission and no backup.
  CHECK_FALSE(MakePolicy("kvc", env)->engine.admission.has_value());

  // Seeds prefill on the session's backup home, and every admitted turn
  // plans a backup there; the seed's kvc plans none.
  FakeCluster cluster(Topology::kDisaggregated, 2, 3, 10000);
  for (SessionId id = 1; id <= 6; ++id) {
    Session s{id, {}};
    const PolicyRequest r = s.Next(id, 4);
    auto p = adaptive->policy->Place(r, cluster);
    REQUIRE(p.ok());
    REQUIRE(p->mode == DecisionMode::kSeed);
    CHECK(p->prefill == policy::RendezvousInstance(id, 2));
    adaptive->policy->OnFinished(r, *p, cluster);
    const std::optional<policy::BackupPlan> plan = adaptive->policy->PlanBackup(r, *p);
    REQUIRE(plan.has_value());
    CHECK(plan->prefill == p->prefill);
    CHECK(plan->decode == p->instance);
    CHECK(plan->session == id);
    CHECK(plan->context_tokens == r.context_hashes.size() * 16);
  }
  auto kvc = MakePolicy("kvc", env);
  Session s{9, {}};
  const PolicyRequest r = s.Next(1, 4);
  auto p = kvc->policy->Place(r, cluster);
  REQUIRE(p.ok());
  CHECK_FALSE(kvc->policy->PlanBackup(r, *p).has_value());
}

TEST_CASE("pd: round-robin prefill and decode, every turn transient", "[policy]") {
  FakeCluster cluster(Topology::kDisaggregated, 2, 3, 10000);
  PdRoundRobinPolicy pd(2, 3);
  Session s{7, {}};
  for (uint64_t i = 0; i < 6; ++i) {
    auto p = pd.Place(s.Next(i, 2), cluster);
    REQUIRE(p.ok());
    CHECK(p->prefill == i % 2);
    CHECK(p->instance == i % 3);
    CHECK(p->booking == Booking::kTransient);
    CHECK(p->mode == (i == 0 ? DecisionMode::kSeed : DecisionMode::kReseed));
  }
  CHECK(cluster.asked.empty());
}

TEST_CASE("dp: follows the cache above the threshold, balances otherwise", "[policy]") {
  FakeCluster cluster(Topology::kColocated, 0, 3, 100000);
  CacheAwareOptions options;
  options.cache_threshold = 0.5;
  options.eviction_interval_s = 0;
  CacheAwareDpPolicy dp(3, 16, options);
  Session a{1, {}}, b{2, {}}, c{3, {}};
  // New sessions go to the smallest tree (ties: lowest id).
  auto pa = dp.Place(a.Next(1, 30), cluster);
  auto pb = dp.Place(b.Next(2, 10), cluster);
  auto pc = dp.Place(c.Next(3, 10), cluster);
  REQUIRE((pa.ok() && pb.ok() && pc.ok()));
  CHECK(pa->instance == 0);
  CHECK(pb->instance == 1);
  CHECK(pc->instance == 2);
  CHECK(pa->booking == Booking::kSession);
  CHECK(pa->prefill == kNoWorker);
  // b's next turn matches 10 of 12 blocks on instance 1: follow the cache.
  auto pb2 = dp.Place(b.Next(4, 2), cluster);
  REQUIRE(pb2.ok());
  CHECK(pb2->instance == 1);
  // A match below the threshold (1 block of 21) goes to the smallest tree.
  Session d{4, std::vector<BlockHash>(a.chain.begin(), a.chain.begin() + 1)};
  auto pd = dp.Place(d.Next(5, 20), cluster);
  REQUIRE(pd.ok());
  CHECK(pd->instance == 2);
}

TEST_CASE("dp: an imbalanced cluster overrides the cache", "[policy]") {
  FakeCluster cluster(Topology::kColocated, 0, 2, 100000);
  CacheAwareOptions options;
  options.balance_abs_threshold = 2;
  options.balance_rel_threshold = 1.5;
  CacheAwareDpPolicy dp(2, 16, options);
  Session a{1, {}};
  std::vector<WorkerId> chosen;
  for (uint64_t i = 0; i < 4; ++i) {
    auto p = dp.Place(a.Next(i, i == 0 ? 16 : 1), cluster);
    REQUIRE(p.ok());
    chosen.push_back(p->instance);
  }
  // Loads 0,1,2 in flight on instance 0 are within the thresholds; at 3 vs 0
  // the system is imbalanced and the least loaded instance wins.
  CHECK(chosen == std::vector<WorkerId>{0, 0, 0, 1});
  Placement finished;
  finished.instance = 0;
  for (int i = 0; i < 3; ++i) dp.OnFinished(PolicyRequest{}, finished, cluster);
  // Balanced again: the longest match wins, instance 1 (where turn 3 ran).
  auto back = dp.Place(a.Next(9, 1), cluster);
  REQUIRE(back.ok());
  CHECK(back->instance == 1);
}

TEST_CASE("kvc: admission answers come from the workers, v2 sticks to the pin", "[policy]") {
  FakeCluster cluster(Topology::kDisaggregated, 2, 3, 10000);
  auto kvc = Make("kvc", Env());
  Session s{9, {}};
  PolicyRequest r0 = s.Next(0, 20);
  auto p0 = kvc->Place(r0, cluster);
  REQUIRE(p0.ok());
  CHECK(p0->mode == DecisionMode::kSeed);
  CHECK(p0->booking == Booking::kAdmitted);
  CHECK(p0->prefill != kNoWorker);
  CHECK(p0->admit_attempts == 1);
  CHECK(cluster.worker(p0->instance).IsResident(9));
  kvc->OnFinished(r0, *p0, cluster);
  REQUIRE(cluster.worker(p0->instance).OnRequestFinished(9).ok());

  PolicyRequest r1 = s.Next(1, 2);
  auto p1 = kvc->Place(r1, cluster);
  REQUIRE(p1.ok());
  CHECK(p1->mode == DecisionMode::kDirect);
  CHECK(p1->instance == p0->instance);
  CHECK(p1->prefill == kNoWorker);
  kvc->OnFinished(r1, *p1, cluster);
  REQUIRE(cluster.worker(p1->instance).OnRequestFinished(9).ok());

  // Every worker full: two rejections (epsilon = 2), then a transient Fallback.
  Session big{10, {}};
  PolicyRequest huge = big.Next(2, 700);  // 11,200 tokens > rho * 10,000
  auto p2 = kvc->Place(huge, cluster);
  REQUIRE(p2.ok());
  CHECK(p2->mode == DecisionMode::kFallback);
  CHECK(p2->booking == Booking::kTransient);
  CHECK(p2->admit_attempts == 2);
  CHECK(p2->rejections[static_cast<int>(RejectReason::kSessionNotResidentNoCapacity)] == 2);
  kvc->OnFinished(huge, *p2, cluster);
}

TEST_CASE("kvc: an unreachable worker counts as worker-unavailable", "[policy]") {
  // The cluster claims 3 instances but the policy was built for 4: the
  // fourth admission RPC fails like a dead worker would.
  FakeCluster cluster(Topology::kDisaggregated, 1, 3, 10000);
  PolicySetup setup = Env();
  setup.cluster.decode_workers = 4;
  setup.router.max_admit_attempts = 0;  // epsilon = |D| = 4
  auto kvc = Make("kvc", setup);
  // Fill the three real workers so the router also tries the fourth.
  for (WorkerId d = 0; d < 3; ++d) {
    REQUIRE(cluster.worker(d).Admit(AdmitQuery{100 + d, 0, 9000, 9000})->admitted);
  }
  Session s{1, {}};
  auto p = kvc->Place(s.Next(0, 100), cluster);
  REQUIRE(p.ok());
  CHECK(p->mode == DecisionMode::kFallback);
  CHECK(p->rejections[static_cast<int>(RejectReason::kWorkerUnavailable)] == 1);
  CHECK(p->rejections[static_cast<int>(RejectReason::kSessionNotResidentNoCapacity)] == 3);
}

TEST_CASE("cache-aware: launcher and Rust defaults are SGLang's", "[policy]") {
  const CacheAwareOptions launcher = CacheAwareOptions::Launcher();
  CHECK(launcher.cache_threshold == 0.3);
  CHECK(launcher.balance_abs_threshold == 64);
  CHECK(launcher.balance_rel_threshold == 1.5);
  CHECK(launcher.eviction_interval_s == 120);
  CHECK(launcher.max_tree_chars == uint64_t{1} << 26);
  const CacheAwareOptions rust = CacheAwareOptions::Rust();
  CHECK(rust.cache_threshold == 0.5);
  CHECK(rust.balance_abs_threshold == 32);
  CHECK(rust.balance_rel_threshold == 1.1);
  CacheAwareOptions bad;
  bad.balance_rel_threshold = 0.5;
  CHECK_FALSE(bad.Validate().ok());
  PolicySetup setup = Env();
  setup.cache_aware.cache_threshold = 2;
  auto refused = MakePolicy("dp", setup);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(test::Message(refused.status()), Catch::Contains("cache_threshold"));
}

TEST_CASE("cache-aware: the tree is trimmed every eviction interval, oldest sessions first",
          "[policy]") {
  FakeCluster cluster(Topology::kColocated, 0, 2, 100000);
  CacheAwareOptions options;
  options.eviction_interval_s = 120;
  options.max_tree_chars = 4 * 16 * 25;  // 25 blocks of 16 tokens at 4 chars per token
  CacheAwareSelector selector(2, 16, options);
  Session a{1, {}}, b{2, {}};
  cluster.now = 0;
  CHECK(selector.Select(a.Next(0, 20), cluster.now) == 0);
  selector.Done(0);
  cluster.now = 10;
  CHECK(selector.Select(b.Next(1, 20), cluster.now) == 1);
  selector.Done(1);
  cluster.now = 20;
  // b's second turn follows its cache to instance 1 (22 > 0.3 * 22 blocks).
  CHECK(selector.Select(b.Next(2, 2), cluster.now) == 1);
  selector.Done(1);
  CHECK(selector.tree_blocks(0) == 20);
  CHECK(selector.tree_blocks(1) == 22);
  // Before the next sweep nothing is trimmed, even above the bound.
  Session c{3, std::vector<BlockHash>(b.chain.begin(), b.chain.end())};
  cluster.now = 100;
  CHECK(selector.Select(c.Next(3, 10), cluster.now) == 1);
  selector.Done(1);
  CHECK(selector.tree_blocks(1) == 22 + 32);
  // At 120 s the sweep trims instance 1 to 25 blocks: b (older) goes first,
  // then c still exceeds the bound and goes too; instance 0 is within it.
  cluster.now = 130;
  Session d{4, {}};
  (void)selector.Select(d.Next(4, 1), cluster.now);
  CHECK(selector.tree_blocks(0) <= 21);
  CHECK(selector.tree_blocks(1) <= 25);
}

TEST_CASE("pd-sglang: prefill and decode chosen cache-aware, each pool on its own", "[policy]") {
  FakeCluster cluster(Topology::kDisaggregated, 2, 3, 100000);
  PdSglangPolicy pd(2, 3, 16, CacheAwareOptions::Launcher());
  Session a{1, {}}, b{2, {}};
  auto a0 = pd.Place(a.Next(0, 20), cluster);
  auto b0 = pd.Place(b.Next(1, 20), cluster);
  REQUIRE((a0.ok() && b0.ok()));
  // Fresh trees: the smallest tree wins, so the two sessions spread out.
  CHECK(a0->prefill == 0);
  CHECK(a0->instance == 0);
  CHECK(b0->prefill == 1);
  CHECK(b0->instance == 1);
  CHECK(a0->booking == Booking::kSession);
  pd.OnFinished(PolicyRequest{}, *a0, cluster);
  pd.OnFinished(PolicyRequest{}, *b0, cluster);
  // Later turns follow their caches on both sides.
  auto a1 = pd.Place(a.Next(2, 3), cluster);
  REQUIRE(a1.ok());
  CHECK(a1->prefill == 0);
  CHECK(a1->instance == 0);
  CHECK_FALSE(pd.uses_admission());
  CHECK(cluster.asked.empty());
}

}  // namespace
}  // namespace kvc_router::sim
