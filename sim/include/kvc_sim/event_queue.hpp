// kvc_sim/event_queue.hpp
//
// The simulator's agenda: a binary min-heap of events ordered by
// (time, sequence). The sequence number is assigned at push, so events at
// the same instant pop in the order they were scheduled: the replay never
// depends on heap internals or on anything but its inputs. Push and pop are
// O(log n).
//
//   kvc_router::sim::EventQueue<MyPayload> queue;
//   queue.Push(1.5, payload);
//   while (!queue.empty()) { auto event = queue.Pop(); ... }
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvc_router::sim {

template <class Payload>
class EventQueue {
 public:
  struct Event {
    double time = 0;
    uint64_t sequence = 0;
    Payload payload{};
  };

  void Push(double time, Payload payload) {
    heap_.push_back(Event{time, next_sequence_++, std::move(payload)});
    std::push_heap(heap_.begin(), heap_.end(), Later);
  }
  // Removes and returns the earliest event. Precondition: !empty().
  Event Pop() {
    std::pop_heap(heap_.begin(), heap_.end(), Later);
    Event event = std::move(heap_.back());
    heap_.pop_back();
    return event;
  }
  const Event& Top() const { return heap_.front(); }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  uint64_t pushed() const { return next_sequence_; }

 private:
  // std::push_heap builds a max-heap; "greater" puts the earliest on top.
  static bool Later(const Event& a, const Event& b) {
    if (a.time != b.time) return a.time > b.time;
    return a.sequence > b.sequence;
  }

  std::vector<Event> heap_;
  uint64_t next_sequence_ = 0;
};

}  // namespace kvc_router::sim
