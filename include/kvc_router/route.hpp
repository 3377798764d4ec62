// kvc_router/route.hpp
//
// Algorithm 1, Route(r, Σ): choose the decode worker to ask first.
//
//  1. Workers whose rejection counter for the session reached tau_reject are
//     blacklisted; workers already tried in the current Dispatch are excluded.
//  2. If nothing is left, the degenerate branch picks the least-rejected
//     untried worker (ties: lowest id).
//  3. Otherwise the candidates are ranked by the 4-tuple
//       (overlap + alpha*sticky, sticky, -inflight, -assigned)
//     compared lexicographically, never folded into one number; the final tie
//     goes to the lowest worker id, so decisions are deterministic.
// Route never looks at capacity: that reaches it only through rejections.
// Elastic membership: draining and removed workers are never candidates
// (RoutingState::DrainDecodeWorker / RemoveDecodeWorker).
// Worker health (health.hpp): workers whose circuit breaker is open are left
// out like tried ones, unless no other untried worker is left, in which case
// they are asked anyway. Rejections a worker answered since it last admitted
// (RoutingState::reject_pressure) count as inflight load, but only when the
// session has no pin and no candidate has overlap: the order for sessions
// with residency is the seed's.
// (Beyond the seed, RouterConfig::place_by_room ranks sessions that have no
// residency, neither a pin nor overlap on any candidate, by the room the
// workers reported instead; see RouteInputs::room. Off by default.)
//
// `SelectDecodeWorker` is the algorithm over plain arrays (no locks, no
// index); `Route` applies it to a RoutingState. Both are pure: Route takes the
// state's lock shared and changes nothing.
//
//   kvc_router::RouteChoice choice = kvc_router::Route(*state, request);
//   if (choice.worker != kvc_router::kNoWorker) { ... }
#pragma once

#include <cstdint>
#include <span>
#include <tuple>

#include "absl/container/inlined_vector.h"
#include "absl/synchronization/mutex.h"
#include "kvc_router/concepts.hpp"
#include "kvc_router/detail/worker_mask.hpp"
#include "kvc_router/routing_state.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {

struct RouteChoice {
  // kNoWorker when every decode worker was already tried (the seed's ⊥).
  WorkerId worker = kNoWorker;
  // True when every untried worker was blacklisted (Algorithm 1, line 4).
  bool degenerate = false;

  friend constexpr bool operator==(const RouteChoice&, const RouteChoice&) = default;
};

// Everything Algorithm 1 reads, for one session, as arrays indexed by worker.
struct RouteInputs {
  std::span<const uint32_t> overlap;    // |prefix ∩ resident[d]| in blocks
  std::span<const uint32_t> rejects;    // rejects[s,d]; empty means all zero
  std::span<const uint64_t> inflight;   // inflight[d]
  std::span<const uint64_t> assigned;   // assigned[d]
  WorkerId pin = kNoWorker;             // pin[s]
  uint32_t sticky_bonus = 1;            // alpha
  uint32_t reject_threshold = 3;        // tau_reject
  const detail::WorkerMask* tried = nullptr;  // excluded; may be null
  // place_by_room: the room each worker last reported (kUnknownRoomTokens
  // when unknown) and the request's input. Empty: the seed's order always.
  // When the session has no pin and no non-blacklisted candidate has
  // overlap, candidates are ranked by
  //   (room >= input_tokens, -inflight, -assigned, room), ties: lowest id.
  std::span<const uint64_t> room;
  uint64_t input_tokens = 0;
  // Worker health: workers to leave out while any other untried one is
  // left (open circuit breakers); may be null.
  const detail::WorkerMask* unhealthy = nullptr;
  // Rejections since each worker's last admission; empty means all zero.
  // Added to inflight when the session has no pin and no candidate overlap.
  std::span<const uint64_t> pressure;
};

namespace detail {

// The non-excluded, non-blacklisted worker with the largest key(d) (strictly
// larger only, so an equal key keeps the lower id); when every such worker is
// blacklisted, the non-excluded one with the fewest rejections
// (degenerate = true).
template <class Excluded, class Key>
RouteChoice LargestKeyOrLeastRejected(const RouteInputs& in, Excluded excluded, Key key) {
  const auto num_workers = static_cast<WorkerId>(in.overlap.size());
  auto rejects_on = [&](WorkerId d) -> uint32_t {
    return d < in.rejects.size() ? in.rejects[d] : 0;
  };
  WorkerId best = kNoWorker;
  decltype(key(WorkerId{0})) best_key{};
  WorkerId least_rejected = kNoWorker;
  for (WorkerId d = 0; d < num_workers; ++d) {
    if (excluded(d)) continue;
    const uint32_t rejects = rejects_on(d);
    if (least_rejected == kNoWorker || rejects < rejects_on(least_rejected)) {
      least_rejected = d;
    }
    if (rejects >= in.reject_threshold) continue;  // blacklisted
    const auto k = key(d);
    if (best == kNoWorker || k > best_key) {
      best = d;
      best_key = k;
    }
  }
  if (best != kNoWorker) return RouteChoice{best, false};
  return RouteChoice{least_rejected, least_rejected != kNoWorker};
}

}  // namespace detail

// Algorithm 1 on arrays. All spans but `rejects` have one entry per worker.
inline RouteChoice SelectDecodeWorker(const RouteInputs& in) {
  const auto num_workers = static_cast<WorkerId>(in.overlap.size());
  auto was_tried = [&](WorkerId d) { return in.tried != nullptr && in.tried->Contains(d); };
  // Unhealthy workers count as tried unless nothing else is left.
  bool skip_unhealthy = false;
  if (in.unhealthy != nullptr) {
    for (WorkerId d = 0; d < num_workers && !skip_unhealthy; ++d) {
      skip_unhealthy = !was_tried(d) && !in.unhealthy->Contains(d);
    }
  }
  auto is_tried = [&](WorkerId d) {
    return was_tried(d) || (skip_unhealthy && in.unhealthy->Contains(d));
  };
  // Whether no usable candidate holds any of the session's prefix.
  auto no_overlap = [&] {
    for (WorkerId d = 0; d < num_workers; ++d) {
      const bool blacklisted = d < in.rejects.size() && in.rejects[d] >= in.reject_threshold;
      if (!is_tried(d) && !blacklisted && in.overlap[d] > 0) return false;
    }
    return true;
  };
  // The pin is residency too (a prefix shorter than a block leaves no
  // overlap): only a session with neither is placed by room, and only for
  // such a session do rejections count as load.
  const bool no_residency =
      in.pin == kNoWorker && (!in.room.empty() || !in.pressure.empty()) && no_overlap();
  if (no_residency && !in.room.empty()) {
    return detail::LargestKeyOrLeastRejected(in, is_tried, [&](WorkerId d) {
      const uint64_t room = d < in.room.size() ? in.room[d] : kUnknownRoomTokens;
      return std::tuple<bool, int64_t, int64_t, uint64_t>{
          room >= in.input_tokens, -static_cast<int64_t>(in.inflight[d]),
          -static_cast<int64_t>(in.assigned[d]), room};
    });
  }
  const bool fresh = no_residency && !in.pressure.empty();
  auto pressure_on = [&](WorkerId d) -> uint64_t {
    return fresh && d < in.pressure.size() ? in.pressure[d] : 0;
  };
  // The seed's lexicographic key; larger is better in every component.
  return detail::LargestKeyOrLeastRejected(in, is_tried, [&](WorkerId d) {
    const bool sticky = d == in.pin;
    return std::tuple<uint64_t, bool, int64_t, int64_t>{
        uint64_t{in.overlap[d]} + (sticky ? in.sticky_bonus : 0), sticky,
        -static_cast<int64_t>(in.inflight[d] + pressure_on(d)),
        -static_cast<int64_t>(in.assigned[d])};
  });
}

namespace detail {

// Route against a state whose mutex the caller holds (shared is enough).
// `overlap` is scratch space, resized here.
template <CacheIndex Index, class OverlapBuffer>
RouteChoice RouteLocked(const RoutingState<Index>& state, const Request& request,
                        const WorkerMask* tried, OverlapBuffer& overlap) {
  const RouterConfig& config = state.config();
  overlap.assign(config.num_decode_workers, 0);
  const auto& index = StateAccess::Index(state);
  index.Overlap(request.prefix_hashes, std::span<uint32_t>(overlap.data(), overlap.size()));

  RouteInputs in;
  in.overlap = std::span<const uint32_t>(overlap.data(), overlap.size());
  in.inflight = StateAccess::Inflight(state);
  in.assigned = StateAccess::Assigned(state);
  in.sticky_bonus = config.sticky_bonus;
  in.reject_threshold = config.reject_threshold;
  in.tried = tried;
  // Draining and removed workers count as tried (built only when there are).
  const auto& status = StateAccess::DecodeStatus(state);
  WorkerMask excluded;
  for (WorkerId d = 0; d < status.size(); ++d) {
    if (status[d] == WorkerStatus::kActive) continue;
    if (in.tried == tried) {
      excluded = tried != nullptr ? *tried : WorkerMask(config.num_decode_workers);
      in.tried = &excluded;
    }
    excluded.Insert(d);
  }
  if (config.place_by_room) {
    in.room = StateAccess::LearnedRoom(state);
    in.input_tokens = MakeAdmitQuery(request, config.block_tokens).input_tokens;
  }
  // Reject pressure and health: a clock read and a pass over the workers
  // only when some worker has pressure or an open breaker.
  const auto& health = StateAccess::Health(state);
  const bool any_pressure = StateAccess::AnyPressure(state);
  const bool any_open = health.config().enabled && health.any_open();
  const absl::Time now =
      any_pressure || any_open ? StateAccess::Now(state) : absl::InfinitePast();
  // Reject pressure, copied only when some worker has any.
  absl::InlinedVector<uint64_t, 64> pressure;
  for (WorkerId d = 0; any_pressure && d < config.num_decode_workers; ++d) {
    const uint64_t p = StateAccess::PressureOf(state, d, now);
    if (p == 0) continue;
    if (pressure.empty()) pressure.assign(config.num_decode_workers, 0);
    pressure[d] = p;
  }
  in.pressure = std::span<const uint64_t>(pressure.data(), pressure.size());
  // Open circuit breakers (worker health); built only when there is one.
  WorkerMask unhealthy;
  if (any_open) {
    bool any = false;
    for (WorkerId d = 0; d < config.num_decode_workers; ++d) {
      if (health.Routable(d, now)) continue;
      if (!any) unhealthy = WorkerMask(config.num_decode_workers);
      any = true;
      unhealthy.Insert(d);
    }
    if (any) in.unhealthy = &unhealthy;
  }
  const auto& sessions = StateAccess::Sessions(state);
  if (auto it = sessions.find(request.session); it != sessions.end()) {
    in.pin = it->second.pin;
    in.rejects = it->second.rejects;
  }
  return SelectDecodeWorker(in);
}

}  // namespace detail

// Algorithm 1 for `request` against the current state, with nothing tried
// yet. Thread-safe; changes nothing.
template <CacheIndex Index>
RouteChoice Route(const RoutingState<Index>& state, const Request& request) {
  absl::InlinedVector<uint32_t, 64> overlap;
  absl::ReaderMutexLock lock(&detail::StateAccess::Mutex(state));
  return detail::RouteLocked(state, request, nullptr, overlap);
}

}  // namespace kvc_router
