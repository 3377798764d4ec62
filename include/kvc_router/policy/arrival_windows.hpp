// kvc_router/policy/arrival_windows.hpp
//
// The gateway's side of RoutingPolicy::ArrivalWindow, without I/O or clocks
// of its own: new sessions' first turns waiting for shorter ones that arrive
// with them. A gateway adds a turn with the window and key the policy gave
// it, asks Release whenever something happens (a turn arrives, a window may
// have ended) and sends what it returns, in that order, on to load control;
// it sleeps until next_deadline_s(). The simulator and kvc-gateway both keep
// their windows here, so the rule is written once:
//
//   - a turn waits at most its own window;
//   - when a turn's window ends, it and every waiting turn with a key no
//     larger leave together, smallest key first (ties: arrival order);
//   - a turn that gets no window goes behind the waiting turns whose keys
//     are no larger than its own and ahead of the longer ones (Release with
//     its key, then send it).
//
//   kvc_router::policy::ArrivalWindows windows;
//   const ArrivalOrder order = policy.ArrivalWindow(request, cluster);
//   if (order.window_s > 0) windows.Add(id, order, now);
//   for (uint64_t ready : windows.Release(now)) SendToLoadControl(ready);
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvc_router/policy/policy.hpp"

namespace kvc_router::policy {

class ArrivalWindows {
 public:
  // `id` waits until now_s + order.window_s at the latest. Ids are the
  // caller's (a turn index, a queue position) and must be unique among the
  // waiting ones.
  void Add(uint64_t id, const ArrivalOrder& order, double now_s) {
    waiting_.push_back(Waiting{id, order.key, now_s + order.window_s});
  }

  // The ids that leave now, smallest key first: every waiting id whose key
  // is at most `key_floor` or at most the key of one whose window has ended
  // by now_s. They no longer wait.
  std::vector<uint64_t> Release(double now_s,
                                double key_floor = -std::numeric_limits<double>::infinity()) {
    double key = key_floor;
    for (const Waiting& w : waiting_) {
      if (w.deadline_s <= now_s) key = std::max(key, w.key);
    }
    std::vector<Waiting> leaving;
    std::erase_if(waiting_, [&](const Waiting& w) {
      if (w.key > key) return false;
      leaving.push_back(w);
      return true;
    });
    std::stable_sort(leaving.begin(), leaving.end(),
                     [](const Waiting& a, const Waiting& b) { return a.key < b.key; });
    std::vector<uint64_t> ids;
    ids.reserve(leaving.size());
    for (const Waiting& w : leaving) ids.push_back(w.id);
    return ids;
  }

  // The ids that leave when `id` must go now (a later turn of its session
  // arrived; see Release): `id` and those with keys no larger. Empty when
  // `id` does not wait.
  std::vector<uint64_t> ReleaseWith(uint64_t id, double now_s) {
    for (const Waiting& w : waiting_) {
      if (w.id == id) return Release(now_s, w.key);
    }
    return {};
  }

  // Forgets `id` (its client went away); false when it was not waiting.
  bool Remove(uint64_t id) {
    return std::erase_if(waiting_, [id](const Waiting& w) { return w.id == id; }) > 0;
  }

  bool contains(uint64_t id) const {
    return std::any_of(waiting_.begin(), waiting_.end(),
                       [id](const Waiting& w) { return w.id == id; });
  }
  size_t size() const { return waiting_.size(); }
  bool empty() const { return waiting_.empty(); }
  // When the earliest window ends; infinity when nothing waits.
  double next_deadline_s() const {
    double next = std::numeric_limits<double>::infinity();
    for (const Waiting& w : waiting_) next = std::min(next, w.deadline_s);
    return next;
  }

 private:
  struct Waiting {
    uint64_t id = 0;
    double key = 0;
    double deadline_s = 0;
  };
  // In arrival order; a handful at a time (one batch of agents), so linear
  // scans beat any index.
  std::vector<Waiting> waiting_;
};

}  // namespace kvc_router::policy
