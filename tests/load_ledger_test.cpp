// Tests of policy/load_ledger.hpp: what a gateway books per placed request
// (pending prefill on the prefill side, a running request on the instance),
// that each ticket gives it back exactly once whatever path it takes
// (first token, finish, destructor, move, a second Finish), bad placements
// and shapes refused without a trace, ear running on the ledger alone, the
// per-worker circuit breakers a gateway feeds (routable, probes), and
// instances joining at runtime.
#include "kvc_router/policy/load_ledger.hpp"

#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "kvc_router/detail/splitmix.hpp"
#include "kvc_router/policy/affinity_policies.hpp"
#include "kvc_router/testing/fake_cluster.hpp"
#include "test_support.hpp"

namespace kvc_router::policy {
namespace {

Placement On(WorkerId instance, WorkerId prefill = kNoWorker) {
  Placement p;
  p.instance = instance;
  p.prefill = prefill;
  p.booking = Booking::kSession;
  return p;
}

// ear on `instances` colocated instances, 16-token blocks, sessions never idle.
std::unique_ptr<AffinityPolicy> MakeEar(uint32_t instances, uint64_t hot_prefill_tokens) {
  AffinityPolicyOptions options;
  options.rule = AffinityRule::kEar;
  options.instances = instances;
  options.block_tokens = 16;
  options.kv_capacity_tokens = 1 << 20;
  options.hot_prefill_tokens = hot_prefill_tokens;
  options.session_idle_s = 1e6;
  auto ear = AffinityPolicy::Create(options);
  REQUIRE(ear.ok());
  return std::move(*ear);
}

TEST_CASE("load ledger: a colocated request's prefill and slot come back once each",
          "[policy][ledger]") {
  auto ledger = LoadLedger::Create(Topology::kColocated, 3, 0);
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  CHECK(l.num_instances() == 3);
  CHECK(l.num_prefill_workers() == 0);
  absl::StatusOr<LoadLedger::Ticket> a = l.Start(On(1), 5000);
  REQUIRE(a.ok());
  absl::StatusOr<LoadLedger::Ticket> b = l.Start(On(1), 700);
  REQUIRE(b.ok());
  CHECK(l.instance_load(1).pending_prefill_tokens == 5700);
  CHECK(l.instance_load(1).running_requests == 2);
  CHECK(l.instance_load(0).running_requests == 0);
  a->FirstToken();
  a->FirstToken();  // once only
  CHECK(l.instance_load(1).pending_prefill_tokens == 700);
  CHECK(l.instance_load(1).running_requests == 2);
  a->Finish();
  a->Finish();
  CHECK(a->finished());
  CHECK(l.instance_load(1).running_requests == 1);
  {
    // Moved: the new owner gives the load back, the old one nothing.
    LoadLedger::Ticket moved = std::move(*b);
    CHECK(b->finished());
    b->Finish();
    CHECK(l.instance_load(1).running_requests == 1);
    // Dropped without a first token (a transport that threw): both return.
  }
  CHECK(l.instance_load(1).pending_prefill_tokens == 0);
  CHECK(l.instance_load(1).running_requests == 0);
}

TEST_CASE("load ledger: on P/D the prefill worker holds the prefill until the first token",
          "[policy][ledger]") {
  auto ledger = LoadLedger::Create(Topology::kDisaggregated, 2, 2);
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  absl::StatusOr<LoadLedger::Ticket> t = l.Start(On(0, 1), 9000);
  REQUIRE(t.ok());
  CHECK(l.prefill_load(1).pending_prefill_tokens == 9000);
  CHECK(l.prefill_load(1).running_requests == 1);
  CHECK(l.instance_load(0).pending_prefill_tokens == 0);
  CHECK(l.instance_load(0).running_requests == 1);
  t->FirstToken();
  CHECK(l.prefill_load(1).pending_prefill_tokens == 0);
  CHECK(l.prefill_load(1).running_requests == 0);
  CHECK(l.instance_load(0).running_requests == 1);
  t->Finish();
  CHECK(l.instance_load(0).running_requests == 0);
}

TEST_CASE("load ledger: bad shapes and placements are refused and book nothing",
          "[policy][ledger]") {
  CHECK_THAT(test::Message(LoadLedger::Create(Topology::kColocated, 0, 0).status()),
             Catch::Contains("instances must be in 1.."));
  CHECK_THAT(test::Message(LoadLedger::Create(Topology::kColocated, 4, 2).status()),
             Catch::Contains("colocated topology has no prefill workers"));
  CHECK_THAT(test::Message(LoadLedger::Create(Topology::kDisaggregated, 4, 0).status()),
             Catch::Contains("needs 1.."));
  CHECK_THAT(test::Message(LoadLedger::Create(static_cast<Topology>(7), 4, 0).status()),
             Catch::Contains("topology 7 is not a Topology"));
  auto ledger = LoadLedger::Create(Topology::kDisaggregated, 2, 1);
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  CHECK_THAT(test::Message(l.Start(On(2, 0), 10).status()), Catch::Contains("instance 2"));
  CHECK_THAT(test::Message(l.Start(On(kNoWorker), 10).status()), Catch::Contains("instance"));
  CHECK_THAT(test::Message(l.Start(On(0, 1), 10).status()), Catch::Contains("prefill worker 1"));
  const uint64_t wrapped = uint64_t{100} - uint64_t{300};  // an input minus a larger hit
  CHECK_THAT(test::Message(l.Start(On(0, 0), wrapped).status()),
             Catch::Contains("prefill_tokens 18446744073709551416"));
  for (WorkerId d = 0; d < 2; ++d) {
    CHECK(l.instance_load(d).running_requests == 0);
    CHECK(l.instance_load(d).pending_prefill_tokens == 0);
  }
  CHECK(l.prefill_load(0).pending_prefill_tokens == 0);
  AdmitQuery query;
  CHECK_THAT(test::Message(l.Admit(0, query).status()), Catch::Contains("no admission RPC"));
}

TEST_CASE("load ledger: a rebooked prefill is what is given back, and only while pending",
          "[policy][ledger]") {
  auto ledger = LoadLedger::Create(Topology::kDisaggregated, 2, 1);
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  absl::StatusOr<LoadLedger::Ticket> local = l.Start(On(1), 1000);
  absl::StatusOr<LoadLedger::Ticket> remote = l.Start(On(0, 0), 300);
  REQUIRE(local.ok());
  REQUIRE(remote.ok());
  // A KV move that failed: the whole 9000-token context is prefilled.
  REQUIRE(local->Rebook(9000).ok());
  CHECK(local->prefill_tokens() == 9000);
  CHECK(l.instance_load(1).pending_prefill_tokens == 9000);
  REQUIRE(remote->Rebook(100).ok());  // downwards too
  CHECK(l.prefill_load(0).pending_prefill_tokens == 100);
  CHECK(l.instance_load(0).pending_prefill_tokens == 0);
  absl::Status too_big = local->Rebook(kvc_router::kMaxCapacityTokens + 1);
  CHECK(too_big.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(too_big.message(), "prefill_tokens"));
  CHECK(l.instance_load(1).pending_prefill_tokens == 9000);
  local->FirstToken();
  CHECK(l.instance_load(1).pending_prefill_tokens == 0);
  absl::Status late = local->Rebook(5);
  CHECK(late.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(l.instance_load(1).pending_prefill_tokens == 0);
  remote->Finish();
  CHECK(remote->Rebook(5).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(l.prefill_load(0).pending_prefill_tokens == 0);
  CHECK(l.prefill_load(0).running_requests == 0);
}

TEST_CASE("load ledger: the loads always equal the open tickets' sums (property)",
          "[policy][ledger][property]") {
  const uint64_t seed = GENERATE(take(20, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  kvc_router::detail::SplitMix64 rng(seed);
  auto ledger = LoadLedger::Create(Topology::kDisaggregated, 3, 2);
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  struct Open {
    std::optional<LoadLedger::Ticket> ticket;
    Placement at;
    uint64_t prefill = 0;
    bool first = false;
  };
  std::vector<Open> open;
  for (int step = 0; step < 400; ++step) {
    const uint64_t action = rng.Next() % 5;
    if (action == 0 || open.empty()) {
      Open o;
      o.at = On(static_cast<WorkerId>(rng.Next() % 3),
                rng.Next() % 2 == 0 ? kNoWorker : static_cast<WorkerId>(rng.Next() % 2));
      o.prefill = rng.Next() % 4 == 0 ? 0 : rng.Next() % 10000;  // a fully cached prompt: 0
      absl::StatusOr<LoadLedger::Ticket> t = l.Start(o.at, o.prefill);
      REQUIRE(t.ok());
      o.ticket.emplace(std::move(*t));
      open.push_back(std::move(o));
    } else {
      Open& o = open[rng.Next() % open.size()];
      if (action == 4) {  // a KV move that failed or brought less: still open
        const uint64_t rebooked = rng.Next() % 20000;
        const absl::Status rebook = o.ticket->Rebook(rebooked);
        REQUIRE(rebook.ok() == !o.first);
        if (rebook.ok()) o.prefill = rebooked;
      } else if (action == 1) {
        o.ticket->FirstToken();
        o.first = true;
      } else if (action == 2) {
        o.ticket->Finish();
      } else {
        o.ticket.reset();  // dropped
      }
      if (action == 2 || action == 3) {
        std::swap(o, open.back());
        open.pop_back();
      }
    }
    std::vector<InstanceLoad> want(3), want_p(2);
    for (const Open& o : open) {
      ++want[o.at.instance].running_requests;
      if (o.first) continue;
      if (o.at.prefill == kNoWorker) {
        want[o.at.instance].pending_prefill_tokens += o.prefill;
      } else {
        want_p[o.at.prefill].pending_prefill_tokens += o.prefill;
        ++want_p[o.at.prefill].running_requests;
      }
    }
    for (WorkerId d = 0; d < 3; ++d) {
      REQUIRE(l.instance_load(d).running_requests == want[d].running_requests);
      REQUIRE(l.instance_load(d).pending_prefill_tokens == want[d].pending_prefill_tokens);
    }
    for (WorkerId p = 0; p < 2; ++p) {
      REQUIRE(l.prefill_load(p).running_requests == want_p[p].running_requests);
      REQUIRE(l.prefill_load(p).pending_prefill_tokens == want_p[p].pending_prefill_tokens);
    }
  }
}

TEST_CASE("load ledger: ear runs on what the gateway sent and moves a session off a busy instance",
          "[policy][ledger][ear]") {
  double now = 0;
  auto ledger = LoadLedger::Create(Topology::kColocated, 2, 0, [&now] { return now; });
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  auto ear = MakeEar(2, /*hot_prefill_tokens=*/1000);
  testing::GrowingSession s{1};
  PolicyRequest first = s.Next(0, 20);
  absl::StatusOr<Placement> p = ear->Place(first, l);
  REQUIRE(p.ok());
  CHECK(p->instance == 0);
  CHECK(p->estimated_hit_tokens == 0);  // nothing cached anywhere yet
  {
    absl::StatusOr<LoadLedger::Ticket> t = l.Start(*p, first.input_tokens - p->estimated_hit_tokens);
    REQUIRE(t.ok());
    CHECK(l.instance_load(0).pending_prefill_tokens == 320);
    t->FirstToken();
  }  // finished
  ear->OnFinished(first, *p, l);
  // Other sessions' long prompts now wait on instance 0.
  std::vector<LoadLedger::Ticket> busy;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<LoadLedger::Ticket> t = l.Start(On(0), 40000);
    REQUIRE(t.ok());
    busy.push_back(std::move(*t));
  }
  now = 5;
  const PolicyRequest next = s.Next(1, 2);
  p = ear->Place(next, l);
  REQUIRE(p.ok());
  CHECK(p->instance == 1);
  CHECK(p->migrate_from == 0);
  // The move brings the 320-token context: only the 32 appended tokens are
  // prefill work on instance 1, which is what the gateway books.
  CHECK(p->estimated_hit_tokens == 320);
  absl::StatusOr<LoadLedger::Ticket> moved = l.Start(*p, next.input_tokens - p->estimated_hit_tokens);
  REQUIRE(moved.ok());
  CHECK(l.instance_load(1).pending_prefill_tokens == 32);
  moved->Finish();
  busy.clear();
  CHECK(l.instance_load(0).pending_prefill_tokens == 0);
  CHECK(l.instance_load(0).running_requests == 0);
}

TEST_CASE("load ledger: an instance that stops answering is not routable until a probe answers",
          "[policy][ledger][health]") {
  double now = 0;
  HealthConfig health;  // 3 failures within 10 s open; 5 s cooldown
  auto ledger = LoadLedger::Create(Topology::kDisaggregated, 2, 2, [&now] { return now; }, health);
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  CHECK(l.routable(0));
  CHECK(l.routable(1));
  // Two lost requests are normal under load; failures older than the window are forgotten.
  l.ReportUnavailable(1);
  l.ReportUnavailable(1);
  now = 11;
  l.ReportUnavailable(1);
  CHECK(l.routable(1));
  CHECK(l.instance_breaker(1) == BreakerState::kClosed);
  l.ReportUnavailable(1);
  now = 12;
  l.ReportUnavailable(1);
  CHECK_FALSE(l.routable(1));
  CHECK(l.instance_breaker(1) == BreakerState::kOpen);
  CHECK(l.instance_breaker_openings(1) == 1);
  CHECK(l.routable(0));  // the others are untouched
  // After the cooldown one probe may go: the next ticket started there.
  now = 17;
  CHECK(l.instance_breaker(1) == BreakerState::kHalfOpen);
  CHECK(l.routable(1));
  {
    absl::StatusOr<LoadLedger::Ticket> probe = l.Start(On(1, 0), 10);
    REQUIRE(probe.ok());
    CHECK_FALSE(l.routable(1));  // one probe at a time
  }
  l.ReportUnavailable(1);  // the probe failed: open for another cooldown
  CHECK_FALSE(l.routable(1));
  CHECK(l.instance_breaker_openings(1) == 2);
  now = 22;
  REQUIRE(l.Start(On(1, 0), 10).ok());
  l.ReportAnswered(1);  // the probe answered: closed
  CHECK(l.routable(1));
  CHECK(l.instance_breaker(1) == BreakerState::kClosed);
  // Prefill workers have their own breakers.
  for (int i = 0; i < 3; ++i) l.ReportPrefillUnavailable(0);
  CHECK_FALSE(l.prefill_routable(0));
  CHECK(l.prefill_routable(1));
  CHECK(l.routable(0));
  l.ReportPrefillAnswered(0);
  CHECK(l.prefill_routable(0));
}

TEST_CASE("load ledger: a drained instance is not routable until resumed; its requests finish",
          "[policy][ledger][health]") {
  auto ledger = LoadLedger::Create(Topology::kColocated, 3, 0);
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  absl::StatusOr<LoadLedger::Ticket> running = l.Start(On(1), 100);
  REQUIRE(running.ok());
  REQUIRE(l.SetDrained(1, true).ok());
  CHECK(l.drained(1));
  CHECK_FALSE(l.routable(1));
  CHECK(l.routable(0));
  running->Finish();  // what ran there finishes as usual
  CHECK(l.instance_load(1).running_requests == 0);
  CHECK_FALSE(l.routable(1));
  CHECK(l.draining(1));  // drained and answering: its KV can still be moved
  CHECK_FALSE(l.draining(0));
  for (int i = 0; i < 3; ++i) l.ReportUnavailable(1);
  CHECK_FALSE(l.draining(1));  // it stopped answering too: nothing to move from
  l.ReportAnswered(1);
  const absl::Status unknown = l.SetDrained(3, true);
  CHECK(unknown.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(unknown.message(), "instance 3 is not one of the 3"));
  CHECK(l.routable(0));
  REQUIRE(l.SetDrained(1, false).ok());
  CHECK(l.routable(1));
}

TEST_CASE("load ledger: health can be off, and bad thresholds are refused", "[policy][ledger][health]") {
  HealthConfig off;
  off.enabled = false;
  auto ledger = LoadLedger::Create(Topology::kColocated, 2, 0, nullptr, off);
  REQUIRE(ledger.ok());
  for (int i = 0; i < 10; ++i) (*ledger)->ReportUnavailable(0);
  CHECK((*ledger)->routable(0));
  HealthConfig bad;
  bad.failure_threshold = 0;
  auto refused = LoadLedger::Create(Topology::kColocated, 2, 0, nullptr, bad);
  REQUIRE_FALSE(refused.ok());
  CHECK(absl::StrContains(refused.status().message(), "failure_threshold"));
}

TEST_CASE("load ledger: ear moves a session off an instance that stopped answering",
          "[policy][ledger][ear][health]") {
  double now = 0;
  auto ledger = LoadLedger::Create(Topology::kColocated, 3, 0, [&now] { return now; });
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  auto ear = MakeEar(3, AffinityPolicyOptions().hot_prefill_tokens);
  testing::GrowingSession s{1};
  PolicyRequest first = s.Next(0, 20);
  absl::StatusOr<Placement> p = ear->Place(first, l);
  REQUIRE(p.ok());
  const WorkerId home = p->instance;
  // Its turns fail there: the gateway reports each and the ticket gives its load back.
  for (int i = 0; i < 3; ++i) {
    REQUIRE(l.Start(*p, first.input_tokens).ok());
    l.ReportUnavailable(home);
    now += 1;
  }
  ear->OnFinished(first, *p, l);
  CHECK_FALSE(l.routable(home));
  // The idle instance would win on load; it is not routable, so the session
  // and new ones go elsewhere.
  const PolicyRequest next = s.Next(1, 2);
  p = ear->Place(next, l);
  REQUIRE(p.ok());
  CHECK(p->instance != home);
  CHECK(p->migrate_from == kNoWorker);
  CHECK(ear->binding(1) == p->instance);
  testing::GrowingSession fresh{2};
  absl::StatusOr<Placement> q = ear->Place(fresh.Next(2, 3), l);
  REQUIRE(q.ok());
  CHECK(q->instance != home);
}

TEST_CASE("load ledger: an instance joins at runtime; ear sends new sessions there, bound ones stay",
          "[policy][ledger][ear][membership]") {
  double now = 0;
  auto ledger = LoadLedger::Create(Topology::kColocated, 2, 0, [&now] { return now; });
  REQUIRE(ledger.ok());
  LoadLedger& l = **ledger;
  auto ear = MakeEar(2, AffinityPolicyOptions().hot_prefill_tokens);
  // Two sessions, one per instance, each with a turn still prefilling.
  std::vector<testing::GrowingSession> sessions{{1}, {2}, {3}};
  std::vector<LoadLedger::Ticket> open;
  std::vector<WorkerId> home;
  for (int i = 0; i < 2; ++i) {
    const PolicyRequest first = sessions[i].Next(i, 20);
    absl::StatusOr<Placement> p = ear->Place(first, l);
    REQUIRE(p.ok());
    home.push_back(p->instance);
    absl::StatusOr<LoadLedger::Ticket> t = l.Start(*p, first.input_tokens);
    REQUIRE(t.ok());
    open.push_back(std::move(*t));
    ear->OnFinished(first, *p, l);
  }
  CHECK(home[0] != home[1]);
  // The view grows first: until the policy grows too, Place refuses the
  // mismatch and changes nothing.
  absl::StatusOr<WorkerId> joined = l.AddInstance();
  REQUIRE(joined.ok());
  CHECK(*joined == 2);
  CHECK(l.num_instances() == 3);
  CHECK(l.routable(2));
  CHECK_FALSE(l.drained(2));
  CHECK(l.instance_load(2).running_requests == 0);
  const PolicyRequest third = sessions[2].Next(2, 20);
  absl::StatusOr<Placement> refused = ear->Place(third, l);
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ear->binding(3) == kNoWorker);
  absl::StatusOr<WorkerId> grown = ear->AddInstance();
  REQUIRE(grown.ok());
  CHECK(*grown == 2);
  CHECK(ear->committed_tokens(2) == 0);
  // A new session goes to the idle newcomer; the bound ones stay home.
  absl::StatusOr<Placement> p = ear->Place(third, l);
  REQUIRE(p.ok());
  CHECK(p->instance == 2);
  absl::StatusOr<LoadLedger::Ticket> t = l.Start(*p, third.input_tokens);
  REQUIRE(t.ok());
  CHECK(l.instance_load(2).pending_prefill_tokens == third.input_tokens);
  t->Finish();
  ear->OnFinished(third, *p, l);
  open.clear();
  for (int i = 0; i < 2; ++i) {
    const PolicyRequest next = sessions[i].Next(10 + i, 2);
    absl::StatusOr<Placement> q = ear->Place(next, l);
    REQUIRE(q.ok());
    CHECK(q->instance == home[i]);
    CHECK(q->migrate_from == kNoWorker);
    ear->OnFinished(next, *q, l);
  }
  // It can be drained like the others.
  REQUIRE(l.SetDrained(2, true).ok());
  CHECK_FALSE(l.routable(2));
}

TEST_CASE("load ledger: sticky on a grown cluster moves ~1/N of its sessions, all to the newcomer",
          "[policy][ledger][membership]") {
  constexpr uint32_t kInstances = 8;
  constexpr int kSessions = 4000;
  auto ledger = LoadLedger::Create(Topology::kColocated, kInstances, 0);
  REQUIRE(ledger.ok());
  AffinityPolicyOptions options;
  options.rule = AffinityRule::kSticky;
  options.instances = kInstances;
  options.block_tokens = 16;
  auto sticky = AffinityPolicy::Create(options);
  REQUIRE(sticky.ok());
  std::vector<WorkerId> before;
  for (SessionId id = 1; id <= kSessions; ++id) {
    testing::GrowingSession s{id};
    absl::StatusOr<Placement> p = (*sticky)->Place(s.Next(id, 2), **ledger);
    REQUIRE(p.ok());
    before.push_back(p->instance);
  }
  REQUIRE((*ledger)->AddInstance().ok());
  REQUIRE((*sticky)->AddInstance().ok());
  int moved = 0;
  for (SessionId id = 1; id <= kSessions; ++id) {
    testing::GrowingSession s{id};
    absl::StatusOr<Placement> p = (*sticky)->Place(s.Next(id, 3), **ledger);
    REQUIRE(p.ok());
    if (p->instance != before[id - 1]) {
      ++moved;
      CHECK(p->instance == kInstances);  // only to the newcomer
    }
  }
  CHECK(static_cast<double>(moved) / kSessions == Approx(1.0 / (kInstances + 1)).margin(0.02));
}

TEST_CASE("load ledger: instances join up to kMaxWorkers, then are refused by name",
          "[policy][ledger][membership]") {
  auto ledger = LoadLedger::Create(Topology::kColocated, kMaxWorkers - 1, 0);
  REQUIRE(ledger.ok());
  absl::StatusOr<WorkerId> last = (*ledger)->AddInstance();
  REQUIRE(last.ok());
  CHECK(*last == kMaxWorkers - 1);
  absl::StatusOr<WorkerId> refused = (*ledger)->AddInstance();
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(refused.status().message(), "AddInstance"));
  CHECK((*ledger)->num_instances() == kMaxWorkers);
  AffinityPolicyOptions options;
  options.rule = AffinityRule::kEar;
  options.instances = kMaxWorkers;
  auto ear = AffinityPolicy::Create(options);
  REQUIRE(ear.ok());
  CHECK((*ear)->AddInstance().status().code() == absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace kvc_router::policy
