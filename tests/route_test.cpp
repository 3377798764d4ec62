#include "kvc_router/route.hpp"

#include <catch2/catch.hpp>
#include <vector>

#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "test_support.hpp"

namespace kvc_router {
namespace {

struct Arrays {
  std::vector<uint32_t> overlap;
  std::vector<uint32_t> rejects;
  std::vector<uint64_t> inflight;
  std::vector<uint64_t> assigned;

  explicit Arrays(size_t n) : overlap(n, 0), rejects(n, 0), inflight(n, 0), assigned(n, 0) {}

  RouteInputs Inputs(WorkerId pin = kNoWorker, const detail::WorkerMask* tried = nullptr) const {
    RouteInputs in;
    in.overlap = overlap;
    in.rejects = rejects;
    in.inflight = inflight;
    in.assigned = assigned;
    in.pin = pin;
    in.sticky_bonus = 1;
    in.reject_threshold = 3;
    in.tried = tried;
    return in;
  }
};

TEST_CASE("overlap plus sticky bonus is the primary key", "[route]") {
  Arrays a(4);
  a.overlap = {3, 5, 5, 1};
  CHECK(SelectDecodeWorker(a.Inputs()).worker == 1);  // tie 5/5 -> lower id
  // The pin's bonus lifts 4 blocks to 5, equal to worker 1; sticky breaks it.
  a.overlap = {3, 5, 4, 1};
  CHECK(SelectDecodeWorker(a.Inputs(/*pin=*/2)).worker == 2);
  // One more block elsewhere beats the bonus.
  a.overlap = {3, 6, 4, 1};
  CHECK(SelectDecodeWorker(a.Inputs(/*pin=*/2)).worker == 1);
}

TEST_CASE("sticky, then -inflight, then -assigned, then the lowest id", "[route]") {
  Arrays a(4);
  a.overlap = {2, 1, 2, 2};
  // Worker 1 pinned: 1+1 = 2 ties the primary with 0, 2, 3; sticky wins.
  CHECK(SelectDecodeWorker(a.Inputs(/*pin=*/1)).worker == 1);
  // No pin: inflight decides among 0, 2, 3.
  a.inflight = {5, 0, 2, 2};
  CHECK(SelectDecodeWorker(a.Inputs()).worker == 2);
  // Equal inflight: assigned decides.
  a.assigned = {0, 0, 9, 4};
  CHECK(SelectDecodeWorker(a.Inputs()).worker == 3);
  // Everything equal: lowest id.
  a.inflight = {1, 1, 1, 1};
  a.assigned = {7, 7, 7, 7};
  a.overlap = {0, 0, 0, 0};
  CHECK(SelectDecodeWorker(a.Inputs()).worker == 0);
}

TEST_CASE("the key is lexicographic, not a weighted sum", "[route]") {
  Arrays a(2);
  // A huge load on worker 0 never outweighs one block of overlap.
  a.overlap = {1, 0};
  a.inflight = {1'000'000, 0};
  a.assigned = {1'000'000, 0};
  CHECK(SelectDecodeWorker(a.Inputs()).worker == 0);
}

TEST_CASE("workers at tau_reject rejections are blacklisted", "[route]") {
  Arrays a(3);
  a.overlap = {9, 5, 1};
  a.rejects = {3, 2, 0};
  const RouteChoice choice = SelectDecodeWorker(a.Inputs(/*pin=*/0));
  CHECK(choice.worker == 1);
  CHECK_FALSE(choice.degenerate);
}

TEST_CASE("all blacklisted: the least-rejected worker, ties to the lowest id", "[route]") {
  Arrays a(4);
  a.overlap = {9, 9, 9, 9};
  a.rejects = {5, 3, 4, 3};
  RouteChoice choice = SelectDecodeWorker(a.Inputs());
  CHECK(choice.worker == 1);
  CHECK(choice.degenerate);
  // Tried workers are out of the degenerate branch too.
  detail::WorkerMask tried(4);
  tried.Insert(1);
  choice = SelectDecodeWorker(a.Inputs(kNoWorker, &tried));
  CHECK(choice.worker == 3);
  CHECK(choice.degenerate);
}

TEST_CASE("tried workers are excluded; all tried gives no worker", "[route]") {
  Arrays a(3);
  a.overlap = {5, 4, 3};
  detail::WorkerMask tried(3);
  tried.Insert(0);
  CHECK(SelectDecodeWorker(a.Inputs(kNoWorker, &tried)).worker == 1);
  tried.Insert(1);
  tried.Insert(2);
  const RouteChoice none = SelectDecodeWorker(a.Inputs(kNoWorker, &tried));
  CHECK(none.worker == kNoWorker);
  CHECK_FALSE(none.degenerate);
}

TEST_CASE("missing reject counters read as zero", "[route]") {
  Arrays a(2);
  a.overlap = {0, 1};
  RouteInputs in = a.Inputs();
  in.rejects = {};
  CHECK(SelectDecodeWorker(in).worker == 1);
}

TEST_CASE("Route reads the state's index, pins and loads without changing them", "[route]") {
  RouterConfig config;
  config.num_decode_workers = 3;
  auto state = RoutingState<NaiveIndex>::Create(config, NaiveIndex(3));
  REQUIRE(state.ok());
  std::vector<BlockHash> prefix = {11, 12, 13, 14};
  (*state)->WithIndex([&](NaiveIndex& index) {
    index.Learn(2, /*session=*/99, std::span<const BlockHash>(prefix).first(3));
    index.Learn(1, /*session=*/98, std::span<const BlockHash>(prefix).first(1));
  });
  Request request{.session = 5, .turn = 1, .prefix_hashes = prefix, .append_tokens = 10};
  CHECK(Route(**state, request) == RouteChoice{2, false});
  CHECK((*state)->num_sessions() == 0);  // routing alone remembers nothing
  CHECK((*state)->total_inflight() == 0);
}


TEST_CASE("place_by_room: a session with no residency goes where its input fits",
          "[route][adaptive]") {
  Arrays a(4);
  a.inflight = {0, 1, 2, 0};
  std::vector<uint64_t> room = {100, 5000, 5000, 900};
  RouteInputs in = a.Inputs();
  in.room = room;
  in.input_tokens = 1000;
  // Fits on 1 and 2 only; 1 has fewer in flight. The seed's order would take 0.
  CHECK(SelectDecodeWorker(in) == RouteChoice{1, false});
  RouteInputs seed = a.Inputs();
  CHECK(SelectDecodeWorker(seed) == RouteChoice{0, false});
  // Unknown room counts as fitting.
  room[3] = kUnknownRoomTokens;
  CHECK(SelectDecodeWorker(in) == RouteChoice{3, false});
  // Nothing fits: fewest in flight, then the most room.
  room = {100, 500, 500, 200};
  a.inflight = {1, 0, 0, 1};
  in = a.Inputs();
  in.room = room;
  in.input_tokens = 1000;
  CHECK(SelectDecodeWorker(in).worker == 1);
  // Blacklisted and tried workers stay out, as in the seed's order.
  a.rejects = {0, 3, 0, 0};
  in = a.Inputs();
  in.room = room;
  in.input_tokens = 1000;
  CHECK(SelectDecodeWorker(in).worker == 2);
}

TEST_CASE("place_by_room: any residency keeps the seed's lexicographic order", "[route][adaptive]") {
  Arrays a(3);
  a.overlap = {0, 0, 2};
  a.inflight = {0, 0, 9};
  std::vector<uint64_t> room = {1'000'000, 1'000'000, 0};
  RouteInputs in = a.Inputs(/*pin=*/2);
  in.room = room;
  in.input_tokens = 1000;
  CHECK(SelectDecodeWorker(in) == SelectDecodeWorker(a.Inputs(/*pin=*/2)));
  CHECK(SelectDecodeWorker(in).worker == 2);
}

TEST_CASE("place_by_room: the state learns room from admission answers", "[route][adaptive]") {
  RouterConfig config;
  config.num_decode_workers = 3;
  config.num_prefill_workers = 1;
  config.block_tokens = 10;
  config.place_by_room = true;
  auto state = RoutingState<NaiveIndex>::Create(config, test::MakeNaiveIndex(config));
  REQUIRE(state.ok());
  CHECK((*state)->learned_room(0) == kUnknownRoomTokens);
  Request r;
  r.session = 1;
  r.append_tokens = 500;
  auto op = StartDispatch(**state, r);
  REQUIRE(op.ok());
  REQUIRE(op->admit_target() == 0);
  // A capacity rejection without a figure bounds the room below the input.
  REQUIRE(op->OnAdmitResult(AdmitResult::Rejected(RejectReason::kSessionNotResidentNoCapacity)).ok());
  CHECK((*state)->learned_room(0) == 499);
  REQUIRE(op->admit_target() == 1);
  AdmitResult ok = AdmitResult::Admitted(DecisionMode::kSeed);
  ok.room_tokens = 7000;
  REQUIRE(op->OnAdmitResult(ok).ok());
  CHECK((*state)->learned_room(1) == 7000);
  REQUIRE(op->Complete().ok());
  // The next new session skips worker 0, which has no room for it.
  Request next;
  next.session = 2;
  next.append_tokens = 600;
  CHECK(Route(**state, next).worker == 2);  // 1 and 2 fit; 1 was assigned a session
  // Evicted from its pinned worker, session 1 loses its pin (and so is
  // placed by room next time) only under place_by_room.
  REQUIRE((*state)->pin(1) == 1);
  REQUIRE((*state)->OnSessionEvicted(0, 1).ok());
  CHECK((*state)->pin(1) == 1);  // evicted elsewhere: the pin stays
  REQUIRE((*state)->OnSessionEvicted(1, 1).ok());
  CHECK((*state)->pin(1) == kNoWorker);
  // Without place_by_room the seed's order asks 0 first.
  RouterConfig seed_config = config;
  seed_config.place_by_room = false;
  auto seed_state = RoutingState<NaiveIndex>::Create(seed_config, test::MakeNaiveIndex(seed_config));
  REQUIRE(seed_state.ok());
  CHECK(Route(**seed_state, next).worker == 0);
  // ... and an eviction keeps the seed's pin.
  auto op2 = StartDispatch(**seed_state, r);
  REQUIRE(op2.ok());
  REQUIRE(op2->OnAdmitResult(AdmitResult::Admitted(DecisionMode::kSeed)).ok());
  REQUIRE((*seed_state)->OnSessionEvicted(0, 1).ok());
  CHECK((*seed_state)->pin(1) == 0);
}

}  // namespace
}  // namespace kvc_router
