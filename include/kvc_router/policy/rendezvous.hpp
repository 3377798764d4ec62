// kvc_router/policy/rendezvous.hpp
//
// Rendezvous (highest-random-weight) hashing of a session over N workers:
// every worker gets a fixed-seed pseudo-random weight for the session and the
// heaviest wins. Adding or removing one of N workers moves only the ~1/N of
// the sessions that it wins or loses. `sticky` binds sessions with it, and
// kvc-adaptive picks each session's backup prefill worker with it.
//
//   kvc_router::WorkerId home = kvc_router::policy::RendezvousInstance(session, 8);
#pragma once

#include <cstdint>

#include "kvc_router/detail/splitmix.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::policy {

// Rendezvous weight of `worker` for `session`: a fixed-seed 64-bit mix.
inline uint64_t RendezvousWeight(SessionId session, WorkerId worker) {
  kvc_router::detail::SplitMix64 mix(session * 0x9e3779b97f4a7c15ULL ^ (uint64_t{worker} << 32) ^
                                     worker);
  (void)mix.Next();
  return mix.Next();
}

// The instance rendezvous hashing gives `session` among `instances`.
// The instance of highest weight among those `eligible` accepts, or
// kNoWorker when it accepts none. Leaving one instance out moves only the
// sessions whose highest weight it had.
template <typename Eligible>
WorkerId RendezvousInstance(SessionId session, uint32_t instances, Eligible eligible) {
  WorkerId best = kNoWorker;
  uint64_t best_weight = 0;
  for (WorkerId d = 0; d < instances; ++d) {
    if (!eligible(d)) continue;
    const uint64_t w = RendezvousWeight(session, d);
    if (best == kNoWorker || w > best_weight) {
      best = d;
      best_weight = w;
    }
  }
  return best;
}

inline WorkerId RendezvousInstance(SessionId session, uint32_t instances) {
  return RendezvousInstance(session, instances, [](WorkerId) { return true; });
}

}  // namespace kvc_router::policy
