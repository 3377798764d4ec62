// Tests of policy/arrival_windows.hpp, the gateway's side of
// RoutingPolicy::ArrivalWindow: who leaves when, in which order, and that no
// turn waits past its own window (a seeded property over random batches).
#include "kvc_router/policy/arrival_windows.hpp"

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "kvc_router/detail/splitmix.hpp"

namespace kvc_router::policy {
namespace {

using Ids = std::vector<uint64_t>;

TEST_CASE("arrival windows: a turn leaves when its window ends, with the shorter ones first",
          "[policy][arrival-window]") {
  ArrivalWindows w;
  CHECK(w.empty());
  CHECK(w.next_deadline_s() == std::numeric_limits<double>::infinity());
  w.Add(1, ArrivalOrder{0.30, 30000}, 0.000);  // long, arrived first
  w.Add(2, ArrivalOrder{0.01, 1000}, 0.001);
  w.Add(3, ArrivalOrder{0.05, 5000}, 0.002);
  CHECK(w.size() == 3);
  CHECK(w.next_deadline_s() == Approx(0.011));
  CHECK(w.Release(0.010).empty());  // nobody's window has ended
  CHECK(w.Release(w.next_deadline_s()) == Ids{2});
  CHECK(w.next_deadline_s() == Approx(0.052));
  CHECK(w.Release(w.next_deadline_s()) == Ids{3});
  CHECK(w.next_deadline_s() == Approx(0.300));
  CHECK(w.Release(w.next_deadline_s()) == Ids{1});
  CHECK(w.empty());
}

TEST_CASE("arrival windows: when a long window ends, shorter turns still waiting go first",
          "[policy][arrival-window]") {
  ArrivalWindows w;
  w.Add(1, ArrivalOrder{0.30, 30000}, 0.0);   // ends at 0.30
  w.Add(2, ArrivalOrder{0.05, 5000}, 0.28);   // ends at 0.33
  w.Add(3, ArrivalOrder{0.40, 40000}, 0.29);  // ends at 0.69, longer: stays
  w.Add(4, ArrivalOrder{0.01, 5000}, 0.295);  // same key as 2: arrival order
  CHECK(w.Release(0.30) == Ids{2, 4, 1});
  CHECK(w.size() == 1);
  CHECK(w.contains(3));
  CHECK_FALSE(w.contains(1));
}

TEST_CASE("arrival windows: a turn without a window passes only the shorter ones",
          "[policy][arrival-window]") {
  ArrivalWindows w;
  w.Add(1, ArrivalOrder{0.30, 30000}, 0.0);
  w.Add(2, ArrivalOrder{0.10, 1000}, 0.0);
  // A 20,000-token turn with no window: 2 goes before it, 1 keeps waiting.
  CHECK(w.Release(0.05, 20000) == Ids{2});
  CHECK(w.contains(1));
  // A key equal to a waiting one's sends that one too.
  CHECK(w.Release(0.06, 30000) == Ids{1});
}

TEST_CASE("arrival windows: a turn that must go now takes the shorter ones with it",
          "[policy][arrival-window]") {
  ArrivalWindows w;
  w.Add(1, ArrivalOrder{0.30, 30000}, 0.0);
  w.Add(2, ArrivalOrder{0.10, 1000}, 0.0);
  w.Add(3, ArrivalOrder{0.40, 40000}, 0.0);
  CHECK(w.ReleaseWith(7, 0.01).empty());  // not waiting
  CHECK(w.ReleaseWith(1, 0.01) == Ids{2, 1});
  CHECK(w.Remove(3));
  CHECK_FALSE(w.Remove(3));
  CHECK(w.empty());
}

TEST_CASE("arrival windows: no turn waits past its window, and each batch leaves in key order "
          "(seeded)",
          "[policy][arrival-window][property]") {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    detail::SplitMix64 rng(seed);
    auto uniform = [&rng] { return static_cast<double>(rng.Next() >> 11) * 0x1.0p-53; };
    ArrivalWindows w;
    std::map<uint64_t, std::pair<double, double>> deadline_key;  // id -> (deadline, key)
    double now = 0;
    uint64_t next_id = 0;
    size_t left = 0;
    const int steps = 20 + static_cast<int>(rng.Next() % 40);
    for (int step = 0; step < steps || !w.empty(); ++step) {
      INFO("seed " << seed << " step " << step);
      if (step < steps && rng.Next() % 3 != 0) {
        const double window = 0.25 * uniform();
        const double key = static_cast<double>(rng.Next() % 8);  // ties happen
        w.Add(next_id, ArrivalOrder{window, key}, now);
        deadline_key[next_id] = {now + window, key};
        ++next_id;
      }
      // Wake up no later than the earliest deadline, as a gateway does.
      now = std::min(now + 0.1 * uniform(), w.next_deadline_s());
      // Exactly the turns whose key is at most that of one whose window ended.
      double ended_key = -1;
      for (const auto& [id, dk] : deadline_key) {
        if (dk.first <= now) ended_key = std::max(ended_key, dk.second);
      }
      size_t due = 0;
      for (const auto& [id, dk] : deadline_key) due += dk.second <= ended_key ? 1 : 0;
      const Ids out = w.Release(now);
      CHECK(out.size() == due);
      std::vector<double> keys;
      for (uint64_t id : out) {
        REQUIRE(deadline_key.count(id) == 1);
        keys.push_back(deadline_key[id].second);
      }
      CHECK(std::is_sorted(keys.begin(), keys.end()));
      for (uint64_t id : out) deadline_key.erase(id);
      left += out.size();
      // Whatever still waits has time left.
      for (const auto& [id, dk] : deadline_key) {
        CHECK(w.contains(id));
        CHECK(dk.first > now);
      }
    }
    CHECK(left == next_id);
  }
}

}  // namespace
}  // namespace kvc_router::policy
