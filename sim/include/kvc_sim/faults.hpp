// kvc_sim/faults.hpp
//
// Fault injection for the simulator (SimConfig::faults; kvc-replay's
// --fault-* flags). Off by default. Every fault is drawn from one seeded
// SplitMix64 stream, so a faulty replay is as deterministic as a clean one.
//
//  * Crashes: every `crash_interval_s` on average (exponential gaps), one
//    instance, uniformly drawn, crashes: it loses the KV of every session
//    with nothing running there (an admission pool) or every page no running
//    request pins (a page cache); requests already running finish (the model
//    is a KV-pool restart, not lost requests). For `crash_downtime_s` it is
//    down: it answers no admission RPC, it is not `routable()` (an ideal
//    circuit breaker: the affinity rules route around it at once), and a
//    request placed there anyway (by a policy that does not read
//    routability, or before the crash and not started yet) starts only when
//    it is back (a gateway with no breaker retries it). When nothing a policy may use is
//    up, its turns wait at the gateway for the first instance back. The
//    policy hears of an admission pool's lost sessions through the
//    eviction-event path below; of a page cache's lost pages, nothing.
//  * Admission RPC timeouts: each admission RPC gets no answer with
//    probability `rpc_timeout_rate` (the worker decides nothing); the policy
//    sees an error, i.e. a worker-unavailable rejection.
//  * KV events: the eviction notifications the policy receives
//    (RoutingPolicy::OnEvicted, the router's KV-removal events) are dropped
//    with probability `event_drop_rate`, delivered twice with
//    `event_duplicate_rate`, and held back to the next delivery (reordered
//    after later events) with `event_reorder_rate`.
//
// RPC timeouts and event faults reach the policies that ask workers for
// admission (the KVC family); crashes reach every policy. Counts are in
// PolicyResult::faults.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/detail/splitmix.hpp"

namespace kvc_router::sim {

struct FaultConfig {
  uint64_t seed = 1;
  // Mean seconds between crashes (0 = none) and how long an instance stays down.
  double crash_interval_s = 0;
  double crash_downtime_s = 5;
  // Probabilities in [0, 1].
  double rpc_timeout_rate = 0;
  double event_drop_rate = 0;
  double event_duplicate_rate = 0;
  double event_reorder_rate = 0;

  bool any() const {
    return crash_interval_s > 0 || rpc_timeout_rate > 0 || event_drop_rate > 0 ||
           event_duplicate_rate > 0 || event_reorder_rate > 0;
  }

  absl::Status Validate() const {
    for (const auto& [name, p] : {std::pair<const char*, double>{"rpc_timeout_rate", rpc_timeout_rate},
                                  {"event_drop_rate", event_drop_rate},
                                  {"event_duplicate_rate", event_duplicate_rate},
                                  {"event_reorder_rate", event_reorder_rate}}) {
      if (!(p >= 0 && p <= 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("FaultConfig.", name, " must be a probability in [0, 1], got ", p));
      }
    }
    if (!(crash_interval_s >= 0) || !std::isfinite(crash_interval_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FaultConfig.crash_interval_s must be finite and >= 0 (0 = no crashes), got ",
          crash_interval_s));
    }
    if (!(crash_downtime_s >= 0) || !std::isfinite(crash_downtime_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FaultConfig.crash_downtime_s must be finite and >= 0, got ", crash_downtime_s));
    }
    return absl::OkStatus();
  }
};

// What the injected faults did during one replay.
struct FaultCounts {
  uint64_t crashes = 0;
  uint64_t sessions_lost = 0;  // sessions whose KV a crash dropped (admission pools)
  uint64_t cached_tokens_lost = 0;  // page-cache tokens a crash dropped (the others)
  // Placements refused because nothing the policy may use was up; each
  // waited for the first instance back.
  uint64_t turns_waited_for_instance = 0;
  uint64_t rpc_timeouts = 0;   // including RPCs to a crashed instance
  uint64_t events_dropped = 0;
  uint64_t events_duplicated = 0;
  uint64_t events_reordered = 0;
};

// The seeded draws.
class FaultDice {
 public:
  explicit FaultDice(uint64_t seed) : rng_(seed) {}
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(rng_.Next() >> 11) * 0x1.0p-53; }
  bool Chance(double p) { return p > 0 && Uniform() < p; }
  // Exponential with the given mean.
  double Exponential(double mean) { return -mean * std::log1p(-Uniform()); }
  uint32_t Below(uint32_t n) { return n == 0 ? 0 : static_cast<uint32_t>(rng_.Next() % n); }

 private:
  kvc_router::detail::SplitMix64 rng_;
};

}  // namespace kvc_router::sim
