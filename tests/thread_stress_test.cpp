// Many gateway threads dispatching and completing at once (run under TSan by
// the test command). Afterwards every invariant holds and inflight is zero;
// the gateway-side load ledger, shared the same way, ends at zero load.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <thread>
#include <vector>

#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/policy/load_ledger.hpp"
#include "kvc_router/testing/property_kit.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

// `n` sessions only gateway thread `thread` uses (ids thread * 1000 + i).
std::vector<testing::SyntheticSession> OwnedSessions(int thread, size_t n) {
  std::vector<testing::SyntheticSession> sessions(n);
  for (size_t i = 0; i < n; ++i) sessions[i].id = static_cast<SessionId>(thread) * 1000 + i;
  return sessions;
}

// The next turn of `s` (0-3 new blocks); its chain restarts past `max_blocks`.
Request NextTurn(testing::ScenarioRng& rng, testing::SyntheticSession& s, size_t max_blocks,
                 uint32_t block_tokens) {
  if (s.chain.size() > max_blocks) s.chain.resize(0);
  return s.NextTurn(rng, rng.Uniform(0, 3), block_tokens, 1);
}

TEST_CASE("concurrent dispatch keeps every invariant", "[tsan][threads]") {
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 3000;
  constexpr uint32_t kWorkers = 6;
  RouterConfig config;
  config.num_decode_workers = kWorkers;
  config.num_prefill_workers = 2;
  config.max_sessions = 16;  // fewer than the 32 sessions: sweeps race with dispatches
  auto created = RoutingState<EstimateIndex>::Create(
      config, EstimateIndex(kWorkers, 24 * 4000, config.block_tokens));
  REQUIRE(created.ok());
  RoutingState<EstimateIndex>& state = **created;

  const uint64_t seed = test::PropertySeed();
  INFO("seed " << seed);
  std::atomic<uint64_t> decisions{0};
  std::atomic<int> violations{0};
  std::atomic<bool> stop{false};

  auto gateway = [&](int thread) {
    testing::ScenarioRng rng(seed * 31 + static_cast<uint64_t>(thread));
    std::vector<testing::SyntheticSession> sessions = OwnedSessions(thread, 8);
    std::vector<DispatchOp<EstimateIndex>> open;
    for (int i = 0; i < kOpsPerThread; ++i) {
      testing::SyntheticSession& s = sessions[rng.Uniform(0, sessions.size() - 1)];
      auto op = StartDispatch(state, NextTurn(rng, s, 300, config.block_tokens));
      if (!op.ok()) {
        ++violations;
        continue;
      }
      while (op->awaiting_admit()) {
        const AdmitResult answer =
            rng.Chance(35) ? AdmitResult::Rejected(RejectReason::kNoDCapacity)
                           : AdmitResult::Admitted(DecisionMode::kReseed);
        if (!op->OnAdmitResult(answer).ok()) ++violations;
      }
      ++decisions;
      const Decision decision = op->decision();
      if (decision.mode != DecisionMode::kFallback &&
          state.rejects(s.id, decision.decode) != 0) {
        ++violations;  // reset-on-success
      }
      if (decision.mode != DecisionMode::kFallback && state.pin(s.id) != decision.decode) {
        ++violations;
      }
      if (rng.Chance(20)) {
        (void)state.OnSessionEvicted(static_cast<WorkerId>(rng.Uniform(0, kWorkers - 1)), s.id);
      }
      if (rng.Chance(50)) {
        open.push_back(std::move(*op));  // completes later, maybe on drop
      } else if (!op->Complete().ok()) {
        ++violations;
      }
      if (!open.empty() && rng.Chance(50)) {
        if (rng.Chance(50)) (void)open.front().Complete();
        open.erase(open.begin());
      }
    }
  };
  std::thread janitor([&] {
    std::vector<BlockHash> probe = {1, 2, 3};
    while (!stop.load()) {
      state.ExpireIdleSessions();
      (void)Route(state, Request{.session = 1, .turn = 1, .prefix_hashes = probe});
      (void)state.total_inflight();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(gateway, t);
  for (auto& t : threads) t.join();
  stop = true;
  janitor.join();

  CHECK(violations.load() == 0);
  CHECK(state.total_inflight() == 0);
  uint64_t assigned = 0;
  for (WorkerId d = 0; d < kWorkers; ++d) {
    CHECK(state.inflight(d) == 0);
    assigned += state.assigned(d);
  }
  CHECK(assigned == decisions.load());
  CHECK(decisions.load() == uint64_t{kThreads} * kOpsPerThread);
}

// Workers join, drain and leave while gateway threads dispatch, some
// answers failing as worker-unavailable (circuit breakers open and close).
TEST_CASE("concurrent dispatch under worker churn and failures", "[tsan][threads][membership]") {
  constexpr int kThreads = 3;
  constexpr int kOpsPerThread = 2000;
  RouterConfig config;
  config.num_decode_workers = 4;
  config.num_prefill_workers = 2;
  config.health.failure_threshold = 2;
  auto created = RoutingState<EstimateIndex>::Create(
      config, EstimateIndex(4, 24 * 4000, config.block_tokens));
  REQUIRE(created.ok());
  RoutingState<EstimateIndex>& state = **created;
  const uint64_t seed = test::PropertySeed();
  INFO("seed " << seed);
  std::atomic<int> violations{0};
  std::atomic<bool> stop{false};

  auto gateway = [&](int thread) {
    testing::ScenarioRng rng(seed * 17 + static_cast<uint64_t>(thread));
    std::vector<testing::SyntheticSession> sessions = OwnedSessions(thread, 6);
    std::vector<DispatchOp<EstimateIndex>> open;
    for (int i = 0; i < kOpsPerThread; ++i) {
      testing::SyntheticSession& s = sessions[rng.Uniform(0, sessions.size() - 1)];
      auto op = StartDispatch(state, NextTurn(rng, s, 200, config.block_tokens));
      if (!op.ok()) {
        ++violations;
        continue;
      }
      while (op->awaiting_admit()) {
        const uint64_t roll = rng.Uniform(0, 99);
        const AdmitResult answer =
            roll < 10   ? AdmitResult::Rejected(RejectReason::kWorkerUnavailable)
            : roll < 35 ? AdmitResult::Rejected(RejectReason::kNoDCapacity)
                        : AdmitResult::Admitted(DecisionMode::kReseed);
        if (!op->OnAdmitResult(answer).ok()) ++violations;
      }
      if (rng.Chance(50)) {
        open.push_back(std::move(*op));
      } else if (!op->Complete().ok()) {
        ++violations;
      }
      if (!open.empty() && rng.Chance(50)) open.erase(open.begin());
    }
  };
  std::thread operator_thread([&] {
    testing::ScenarioRng rng(seed);
    while (!stop.load()) {
      const uint32_t slots = state.num_decode_workers();
      const auto d = static_cast<WorkerId>(rng.Uniform(0, slots - 1));
      switch (rng.Uniform(0, 3)) {
        case 0:
          if (slots < 12 && !state.AddDecodeWorker().ok()) ++violations;
          break;
        case 1:
          (void)state.DrainDecodeWorker(d);
          break;
        case 2:
          (void)state.RemoveDecodeWorker(d);
          break;
        default:
          (void)state.num_active_decode_workers();
          (void)state.worker_health(d);
          break;
      }
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(gateway, t);
  for (auto& t : threads) t.join();
  stop = true;
  operator_thread.join();
  CHECK(violations.load() == 0);
  CHECK(state.total_inflight() == 0);
  CHECK(state.num_active_decode_workers() >= 1);
  for (WorkerId d = 0; d < state.num_decode_workers(); ++d) CHECK(state.inflight(d) == 0);
}

TEST_CASE("concurrent tickets on one load ledger all give their load back",
          "[tsan][threads][ledger]") {
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 2000;
  auto ledger = policy::LoadLedger::Create(policy::Topology::kDisaggregated, 4, 2);
  REQUIRE(ledger.ok());
  policy::LoadLedger& l = **ledger;
  std::atomic<bool> stop{false};
  std::atomic<int> refused{0};
  std::thread reader([&] {
    while (!stop.load()) {
      for (WorkerId d = 0; d < 4; ++d) (void)l.instance_load(d);
      for (WorkerId p = 0; p < 2; ++p) (void)l.prefill_load(p);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<policy::LoadLedger::Ticket> open;
      for (int i = 0; i < kOpsPerThread; ++i) {
        policy::Placement at;
        at.instance = static_cast<WorkerId>((t + i) % 4);
        at.prefill = i % 3 == 0 ? kNoWorker : static_cast<WorkerId>(i % 2);
        absl::StatusOr<policy::LoadLedger::Ticket> ticket = l.Start(at, 100 + i);
        if (!ticket.ok()) {
          ++refused;  // Catch's assertions are not thread-safe; checked below
          continue;
        }
        if (i % 2 == 0) ticket->FirstToken();
        open.push_back(std::move(*ticket));
        if (open.size() > 8) {
          open.front().Finish();
          open.erase(open.begin());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  stop = true;
  reader.join();
  CHECK(refused.load() == 0);
  for (WorkerId d = 0; d < 4; ++d) {
    CHECK(l.instance_load(d).running_requests == 0);
    CHECK(l.instance_load(d).pending_prefill_tokens == 0);
  }
  for (WorkerId p = 0; p < 2; ++p) {
    CHECK(l.prefill_load(p).running_requests == 0);
    CHECK(l.prefill_load(p).pending_prefill_tokens == 0);
  }
}

TEST_CASE("instances join a load ledger while tickets start and finish on every instance",
          "[tsan][threads][ledger][membership]") {
  constexpr int kThreads = 3;
  constexpr int kOpsPerThread = 2000;
  constexpr uint32_t kJoining = 12;
  auto ledger = policy::LoadLedger::Create(policy::Topology::kColocated, 2, 0);
  REQUIRE(ledger.ok());
  policy::LoadLedger& l = **ledger;
  std::atomic<int> refused{0};
  std::thread joiner([&] {
    for (uint32_t i = 0; i < kJoining; ++i) {
      if (!l.AddInstance().ok()) ++refused;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<policy::LoadLedger::Ticket> open;
      for (int i = 0; i < kOpsPerThread; ++i) {
        const uint32_t instances = l.num_instances();
        policy::Placement at;
        at.instance = static_cast<WorkerId>((t + i) % instances);
        for (WorkerId d = 0; d < instances; ++d) (void)l.routable(d);
        absl::StatusOr<policy::LoadLedger::Ticket> ticket = l.Start(at, 100 + i);
        if (!ticket.ok()) {
          ++refused;
          continue;
        }
        open.push_back(std::move(*ticket));
        if (open.size() > 8) {
          open.front().FirstToken();
          open.front().Finish();
          open.erase(open.begin());
        }
      }
    });
  }
  joiner.join();
  for (std::thread& t : threads) t.join();
  CHECK(refused.load() == 0);
  REQUIRE(l.num_instances() == 2 + kJoining);
  for (WorkerId d = 0; d < l.num_instances(); ++d) {
    CHECK(l.routable(d));
    CHECK(l.instance_load(d).running_requests == 0);
    CHECK(l.instance_load(d).pending_prefill_tokens == 0);
  }
}

}  // namespace
}  // namespace kvc_router
