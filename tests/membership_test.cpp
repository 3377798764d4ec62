// Elastic membership: RoutingState::Add/Drain/Remove{Decode,Prefill}Worker
// and the indexes' ResizeWorkers / ForgetWorker.
#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvc_router/detail/splitmix.hpp"
#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/index/fast_index.hpp"
#include "kvc_router/index/kv_event_index.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "kvc_router/routing_state.hpp"
#include "kvc_router/testing/property_kit.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

static_assert(ElasticCacheIndex<NaiveIndex>);
static_assert(ElasticCacheIndex<EstimateIndex>);
static_assert(ElasticCacheIndex<FastIndex>);
static_assert(ElasticCacheIndex<KvEventIndex>);

template <class Index>
std::unique_ptr<RoutingState<Index>> MakeState(uint32_t decode, uint32_t prefill, Index index) {
  RouterConfig config;
  config.num_decode_workers = decode;
  config.num_prefill_workers = prefill;
  auto state = RoutingState<Index>::Create(config, std::move(index));
  REQUIRE(state.ok());
  return std::move(*state);
}

// Drives one request to placement, every worker admitting.
template <class Index>
DispatchOp<Index> PlaceAdmitted(RoutingState<Index>& state, const Request& request) {
  auto op = StartDispatch(state, request);
  REQUIRE(op.ok());
  while (op->awaiting_admit()) {
    REQUIRE(op->OnAdmitResult(AdmitResult::Admitted(
                                  request.turn == 0 ? DecisionMode::kSeed : DecisionMode::kReseed))
                .ok());
  }
  return std::move(*op);
}

TEST_CASE("an added decode worker takes new sessions; the index grows", "[membership]") {
  auto state = MakeState(2, 1, NaiveIndex(2));
  std::vector<BlockHash> prefix = test::TestChain(4, 1);
  { auto op = PlaceAdmitted(*state, Request{.session = 1, .prefix_hashes = prefix}); }
  { auto op = PlaceAdmitted(*state, Request{.session = 2, .prefix_hashes = {}}); }
  auto added = state->AddDecodeWorker();
  REQUIRE(added.ok());
  CHECK(*added == 2);
  CHECK(state->num_decode_workers() == 3);
  CHECK(state->decode_status(2) == WorkerStatus::kActive);
  CHECK(state->ReadIndex([](const NaiveIndex& index) { return index.num_workers(); }) == 3);
  // Least assigned: the new worker.
  auto op = PlaceAdmitted(*state, Request{.session = 3, .prefix_hashes = {}});
  CHECK(op.decision().decode == 2);
  // Residency of the old workers survived the growth.
  std::vector<uint32_t> overlap =
      state->ReadIndex([&](const NaiveIndex& index) { return test::OverlapOf(index, prefix); });
  CHECK(overlap == std::vector<uint32_t>{4, 0, 0});
}

TEST_CASE("a drained worker finishes what runs there and gets nothing new", "[membership]") {
  auto state = MakeState(2, 1, NaiveIndex(2));
  std::vector<BlockHash> prefix = test::TestChain(4, 2);
  auto running = PlaceAdmitted(*state, Request{.session = 1, .prefix_hashes = prefix});
  REQUIRE(running.decision().decode == 0);
  REQUIRE(state->DrainDecodeWorker(0).ok());
  CHECK(state->decode_status(0) == WorkerStatus::kDraining);
  // The last active worker cannot leave.
  CHECK(state->DrainDecodeWorker(1).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(state->RemoveDecodeWorker(1).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(state->inflight(0) == 1);
  CHECK(running.Complete().ok());
  CHECK(state->inflight(0) == 0);
  // The session's next turn moves, although its prefix is resident on 0.
  auto next = PlaceAdmitted(*state, Request{.session = 1, .turn = 1, .prefix_hashes = prefix});
  CHECK(next.decision().decode == 1);
  CHECK(next.decision().mode == DecisionMode::kReseed);
  for (SessionId s = 10; s < 20; ++s) {
    auto op = PlaceAdmitted(*state, Request{.session = s, .prefix_hashes = {}});
    CHECK(op.decision().decode == 1);
  }
}

TEST_CASE("a removed worker's pins, counters and residency are forgotten; its slot is reused",
          "[membership]") {
  auto state = MakeState(3, 1, FastIndex(3, 0, 24));
  std::vector<BlockHash> prefix = test::TestChain(6, 3);
  auto running = PlaceAdmitted(*state, Request{.session = 1, .prefix_hashes = prefix});
  REQUIRE(running.decision().decode == 0);
  // A rejection on worker 0 for session 2.
  {
    auto op = StartDispatch(*state, Request{.session = 2, .prefix_hashes = {}});
    REQUIRE(op.ok());
    // Every worker refuses it once (then it falls back).
    while (op->awaiting_admit()) {
      REQUIRE(op->OnAdmitResult(AdmitResult::Rejected(RejectReason::kNoDCapacity)).ok());
    }
  }
  REQUIRE(state->rejects(2, 0) == 1);
  REQUIRE(state->RemoveDecodeWorker(0).ok());
  CHECK(state->decode_status(0) == WorkerStatus::kRemoved);
  CHECK(state->pin(1) == kNoWorker);
  CHECK(state->rejects(2, 0) == 0);
  CHECK(state->assigned(0) == 0);
  CHECK(state->ReadIndex([](const FastIndex& index) { return index.resident_blocks(0); }) == 0);
  CHECK(state->LearnResidency(0, 1, prefix).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(state->RemoveDecodeWorker(0).code() == absl::StatusCode::kNotFound);
  // Its request is still running: the slot is not reused yet.
  CHECK(state->inflight(0) == 1);
  auto other = state->AddDecodeWorker();
  REQUIRE(other.ok());
  CHECK(*other == 3);
  CHECK(running.Complete().ok());
  CHECK(state->inflight(0) == 0);
  // Now it is.
  auto reused = state->AddDecodeWorker();
  REQUIRE(reused.ok());
  CHECK(*reused == 0);
  // The session reseeds elsewhere or on the fresh worker; never Direct.
  auto next = PlaceAdmitted(*state, Request{.session = 1, .turn = 1, .prefix_hashes = prefix});
  CHECK(next.decision().mode == DecisionMode::kReseed);
  CHECK(next.Complete().ok());
  CHECK(state->total_inflight() == 0);
}

TEST_CASE("an answer from a worker removed while the RPC was out is not used", "[membership]") {
  auto state = MakeState(2, 1, NaiveIndex(2));
  auto op = StartDispatch(*state, Request{.session = 1, .prefix_hashes = {}});
  REQUIRE(op.ok());
  REQUIRE(op->admit_target() == 0);
  REQUIRE(state->RemoveDecodeWorker(0).ok());
  REQUIRE(op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kSeed)).ok());
  REQUIRE(op->awaiting_admit());
  CHECK(op->admit_target() == 1);
  CHECK(state->rejects(1, 0) == 0);
  REQUIRE(op->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kSeed)).ok());
  CHECK(op->decision().decode == 1);
  CHECK(state->inflight(0) == 0);
}

TEST_CASE("prefill workers join, drain and leave", "[membership]") {
  auto state = MakeState(1, 2, NaiveIndex(1));
  REQUIRE(state->RemovePrefillWorker(0).ok());
  for (SessionId s = 1; s <= 4; ++s) {
    auto op = PlaceAdmitted(*state, Request{.session = s, .prefix_hashes = {}});
    CHECK(op.decision().prefill == 1);
  }
  CHECK(state->RemovePrefillWorker(1).code() == absl::StatusCode::kFailedPrecondition);
  auto added = state->AddPrefillWorker();
  REQUIRE(added.ok());
  CHECK(*added == 0);
  REQUIRE(state->DrainPrefillWorker(1).ok());
  for (SessionId s = 5; s <= 8; ++s) {
    auto op = PlaceAdmitted(*state, Request{.session = s, .prefix_hashes = {}});
    CHECK(op.decision().prefill == 0);
  }
  auto third = state->AddPrefillWorker();
  REQUIRE(third.ok());
  CHECK(*third == 2);
  CHECK(state->num_prefill_workers() == 3);
}

TEST_CASE("FastIndex and KvEventIndex grow past 64 workers keeping their entries",
          "[membership][fast_index]") {
  const uint32_t from = GENERATE(1u, 40u, 64u, 100u);
  const uint32_t to = from + GENERATE(1u, 25u, 65u, 200u);
  INFO("grow " << from << " -> " << to);
  FastIndex fast(from, 0, 16);
  KvEventIndex events(from);
  std::vector<std::vector<BlockHash>> chains;
  for (uint32_t d = 0; d < from; ++d) {
    chains.push_back(test::TestChain(1 + d % 5, 100 + d % 3));
    fast.Learn(d, d, chains.back());
    events.Learn(d, d, chains.back());
  }
  const uint64_t fast_entries = fast.entries();
  const uint64_t event_entries = events.entries();
  std::vector<std::vector<uint32_t>> before;
  for (const auto& chain : chains) before.push_back(test::OverlapOf(fast, chain));
  fast.ResizeWorkers(to);
  events.ResizeWorkers(to);
  CHECK(fast.num_workers() == to);
  CHECK(events.num_workers() == to);
  CHECK(fast.entries() == fast_entries);
  CHECK(events.entries() == event_entries);
  for (size_t i = 0; i < chains.size(); ++i) {
    std::vector<uint32_t> after = test::OverlapOf(fast, chains[i]);
    std::vector<uint32_t> after_events = test::OverlapOf(events, chains[i]);
    REQUIRE(after.size() == to);
    CHECK(std::vector<uint32_t>(after.begin(), after.begin() + from) == before[i]);
    CHECK(std::vector<uint32_t>(after_events.begin(), after_events.begin() + from) == before[i]);
    CHECK(std::count(after.begin() + from, after.end(), 0u) == to - from);
  }
  // The new workers hold blocks like the old ones.
  fast.Learn(to - 1, 999, chains[0]);
  CHECK(test::OverlapOf(fast, chains[0])[to - 1] == chains[0].size());
  // Forgetting a worker forgets exactly its blocks.
  fast.ForgetWorker(to - 1);
  events.ForgetWorker(0);
  CHECK(fast.entries() == fast_entries);
  CHECK(test::OverlapOf(events, chains[0])[0] == 0);
  CHECK(events.next_sequence(0) == 0);
}

// Random churn: requests in flight while decode and prefill workers join,
// drain and leave. Invariants after every step.
TEST_CASE("random churn leaks nothing and never routes to a removed worker",
          "[membership][property]") {
  const uint64_t base = test::PropertySeed();
  const uint32_t scenarios = std::max<uint32_t>(1, test::PropertyScenarios() / 50);
  for (uint32_t i = 0; i < scenarios; ++i) {
    const uint64_t seed = base + i;
    INFO("seed " << seed << " (KVC_ROUTER_SEED=" << seed << " replays it as scenario 0)");
    detail::SplitMix64 rng(seed);
    auto uniform = [&](uint64_t lo, uint64_t hi) { return lo + rng.Next() % (hi - lo + 1); };
    const auto decode = static_cast<uint32_t>(uniform(1, 6));
    auto state = MakeState(decode, static_cast<uint32_t>(uniform(1, 3)),
                           FastIndex(decode, 2000, 16));
    std::vector<DispatchOp<FastIndex>> ops;
    std::vector<std::vector<BlockHash>> chains;
    for (uint32_t s = 0; s < 8; ++s) chains.push_back(test::TestChain(uniform(0, 12), s));
    std::vector<uint32_t> turn(chains.size(), 0);
    const size_t steps = uniform(20, 200);
    for (size_t step = 0; step < steps; ++step) {
      const uint64_t action = uniform(0, 99);
      const uint32_t slots = state->num_decode_workers();
      if (action < 40) {
        const auto s = static_cast<SessionId>(uniform(0, chains.size() - 1));
        Request request{.session = s, .turn = turn[s]++, .prefix_hashes = chains[s],
                        .append_tokens = uniform(0, 50)};
        auto op = StartDispatch(*state, request);
        REQUIRE(op.ok());
        while (op->awaiting_admit()) {
          const WorkerId target = op->admit_target();
          REQUIRE(state->decode_status(target) == WorkerStatus::kActive);
          // Sometimes a worker leaves while the RPC is out.
          if (uniform(0, 9) == 0) (void)state->RemoveDecodeWorker(target);
          const uint64_t answer = uniform(0, 9);
          AdmitResult result = answer < 6   ? AdmitResult::Admitted(DecisionMode::kReseed)
                               : answer < 9 ? AdmitResult::Rejected(RejectReason::kNoDCapacity)
                                            : AdmitResult::Rejected(RejectReason::kWorkerUnavailable);
          REQUIRE(op->OnAdmitResult(result).ok());
        }
        REQUIRE(op->placed());
        const WorkerId placed = op->decision().decode;
        REQUIRE(placed < state->num_decode_workers());
        CHECK(state->decode_status(placed) == WorkerStatus::kActive);
        if (op->decision().prefill != kNoWorker) {
          CHECK(state->prefill_status(op->decision().prefill) == WorkerStatus::kActive);
        }
        if (uniform(0, 1) == 0) {
          ops.push_back(std::move(*op));
        }
      } else if (action < 65) {
        if (!ops.empty()) {
          const size_t k = uniform(0, ops.size() - 1);
          REQUIRE(ops[k].Complete().ok());
          ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(k));
        }
      } else if (action < 75) {
        REQUIRE(state->AddDecodeWorker().ok());
      } else if (action < 82) {
        (void)state->DrainDecodeWorker(static_cast<WorkerId>(uniform(0, slots - 1)));
      } else if (action < 92) {
        const auto d = static_cast<WorkerId>(uniform(0, slots - 1));
        const bool was_there = state->decode_status(d) != WorkerStatus::kRemoved;
        const absl::Status removed = state->RemoveDecodeWorker(d);
        if (removed.ok()) {
          REQUIRE(was_there);
          for (SessionId s = 0; s < chains.size(); ++s) CHECK(state->pin(s) != d);
          CHECK(state->ReadIndex([&](const FastIndex& index) { return index.resident_blocks(d); }) ==
                0);
        }
      } else if (action < 96) {
        REQUIRE(state->AddPrefillWorker().ok());
      } else {
        (void)state->RemovePrefillWorker(
            static_cast<WorkerId>(uniform(0, state->num_prefill_workers() - 1)));
      }
      // Invariants: inflight matches the open ops, per worker and in total;
      // at least one active decode worker; removed workers hold nothing.
      std::vector<uint64_t> expected(state->num_decode_workers(), 0);
      for (const auto& op : ops) ++expected[op.decision().decode];
      for (WorkerId d = 0; d < expected.size(); ++d) {
        REQUIRE(state->inflight(d) == expected[d]);
        if (state->decode_status(d) == WorkerStatus::kRemoved) {
          REQUIRE(state->ReadIndex(
                      [&](const FastIndex& index) { return index.resident_blocks(d); }) == 0);
          REQUIRE(state->assigned(d) == 0);
        }
      }
      REQUIRE(state->num_active_decode_workers() >= 1);
    }
    ops.clear();  // the destructors release what is left
    CHECK(state->total_inflight() == 0);
    for (SessionId s = 0; s < chains.size(); ++s) CHECK(state->session_inflight(s) == 0);
  }
}

}  // namespace
}  // namespace kvc_router

namespace kvc_router {
namespace {

// The property kit's reusable churn check, over every elastic index.
TEST_CASE("property kit: membership churn over every elastic index", "[membership][property][kit]") {
  testing::PropertyOptions options;
  options.seed = test::PropertySeed();
  options.scenarios = std::max<uint32_t>(1, test::PropertyScenarios() / 20);
  INFO("seed " << options.seed << ", " << options.scenarios << " scenarios");
  const absl::Status naive =
      testing::CheckMembershipChurn<NaiveIndex>(test::MakeNaiveIndex, options);
  INFO(naive.message());
  CHECK(naive.ok());
  const absl::Status estimate =
      testing::CheckMembershipChurn<EstimateIndex>(test::MakeEstimateIndex, options);
  INFO(estimate.message());
  CHECK(estimate.ok());
  const absl::Status fast = testing::CheckMembershipChurn<FastIndex>(
      [](const RouterConfig& c) { return FastIndex(c.num_decode_workers, 0, c.block_tokens); },
      options);
  INFO(fast.message());
  CHECK(fast.ok());
  const absl::Status events = testing::CheckMembershipChurn<KvEventIndex>(
      [](const RouterConfig& c) { return KvEventIndex(c.num_decode_workers); }, options);
  INFO(events.message());
  CHECK(events.ok());
}

}  // namespace
}  // namespace kvc_router
