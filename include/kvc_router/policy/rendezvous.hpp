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
inline WorkerId RendezvousInstance(SessionId session, uint32_t instances) {
  WorkerId best = 0;
  uint64_t best_weight = 0;
  for (WorkerId d = 0; d < instances; ++d) {
    const uint64_t w = RendezvousWeight(session, d);
    if (d == 0 || w > best_weight) {
      best = d;
      best_weight = w;
    }
  }
  return best;
}

}  // namespace kvc_router::policy
