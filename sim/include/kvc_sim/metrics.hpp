// kvc_sim/metrics.hpp
//
// What one replay of one policy measured (`PolicyResult`), and the summary
// statistics used to report it. Percentiles interpolate linearly between
// order statistics (the "type 7" definition of R and NumPy), over every
// served request (refused requests have no latency). All fields are derived from the simulated run only, so
// two runs with the same inputs give identical results.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvc_router/policy/policy.hpp"
#include "kvc_router/types.hpp"
#include "kvc_sim/faults.hpp"

namespace kvc_router::sim {

// Percentile `q` in [0, 1] of `sorted` (ascending); NaN when empty.
inline double SortedPercentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

struct Summary {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, max = 0;

  // Sorts `values` in place.
  static Summary Of(std::vector<double>& values) {
    Summary s;
    if (values.empty()) {
      s.p50 = s.p90 = s.p99 = s.mean = s.max = std::numeric_limits<double>::quiet_NaN();
      return s;
    }
    std::sort(values.begin(), values.end());
    s.p50 = SortedPercentile(values, 0.50);
    s.p90 = SortedPercentile(values, 0.90);
    s.p99 = SortedPercentile(values, 0.99);
    double sum = 0;
    for (double v : values) sum += v;
    s.mean = sum / static_cast<double>(values.size());
    s.max = values.back();
    return s;
  }
};

struct PolicyResult {
  std::string name;
  policy::Topology topology = policy::Topology::kDisaggregated;
  uint32_t prefill_workers = 0;
  uint32_t instances = 0;

  uint64_t requests = 0;
  // Served requests by mode (refused ones are in none).
  std::array<uint64_t, kNumDecisionModes> mode_counts{};
  // Token accounting: input = cached + prefilled (on P or locally).
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  uint64_t cached_tokens = 0;
  uint64_t prefill_tokens_remote = 0;  // prefilled on P workers
  uint64_t prefill_tokens_local = 0;   // prefilled on the serving instance
  uint64_t kv_transfer_tokens = 0;
  uint64_t kv_transfer_bytes = 0;
  // Of the cached tokens, those reloaded from a host tier.
  uint64_t host_reload_tokens = 0;
  // With SimConfig::hit_bound: the most input tokens caches as large as all
  // of this run's pools together could have served on this run's order
  // (hit_bound.hpp); and what one LRU pool of that size would have served.
  // Both 0 when not computed.
  uint64_t hit_bound_tokens = 0;
  uint64_t one_pool_lru_tokens = 0;

  Summary ttft_s;
  Summary e2e_s;
  std::array<Summary, kNumDecisionModes> ttft_by_mode_s{};
  // TTFT p90 of each instance that served requests: median and max over them.
  double worker_ttft_p90_median_s = 0;
  double worker_ttft_p90_max_s = 0;

  std::array<uint64_t, kNumRejectReasons> rejections{};
  uint64_t admit_attempts = 0;
  // Later turns placed (session-aware) on another instance than the one that
  // served the session's previous session-aware turn.
  uint64_t migrations = 0;
  // Of those, moves whose KV the policy migrated (Placement::migrate_from),
  // and the tokens of KV moved between instances.
  uint64_t kv_migrations = 0;
  uint64_t kv_migrated_tokens = 0;
  // D -> P KV backups (kv_backup): tokens streamed to prefill workers.
  uint64_t kv_backup_tokens = 0;
  // Sessions evicted from admission pools (KVC), and pages evicted from page
  // caches (every other policy; prefill workers included).
  uint64_t evictions = 0;
  uint64_t evicted_pages = 0;
  // What injected faults did (SimConfig::faults; all 0 without faults).
  FaultCounts faults;
  // Requests that waited for KV memory before starting, and requests whose
  // input and output exceed a worker's whole pool (refused, never run).
  uint64_t memory_waits = 0;
  uint64_t refused_oversize = 0;
  // Turns that waited at the gateway because the policy's load control held
  // them or a turn ahead of them (RoutingPolicy::HoldNewSession), and how
  // long each waited there before it was placed (counted in its TTFT; NaN
  // when none waited).
  uint64_t held_turns = 0;
  Summary hold_wait_s;
  // First turns that waited their arrival window for shorter ones
  // (RoutingPolicy::ArrivalWindow), and how long (in their TTFT too).
  uint64_t arrival_window_turns = 0;
  Summary arrival_window_wait_s;
  // Largest KV use seen on any instance, and the budget floor(rho*K_d).
  uint64_t peak_used_tokens = 0;
  uint64_t budget_tokens = 0;

  double first_arrival_s = 0;
  double makespan_s = 0;  // last finish - first arrival
  double trace_span_s = 0;
  // makespan / trace span; NaN when the trace has no span.
  double amplification = 0;
  uint64_t events = 0;
  // Client load: the concurrency limit (0 = none), and time averages over the
  // makespan of requests in flight (issue to finish) and of active sessions
  // (first arrival to last finish).
  uint32_t concurrency = 0;
  double in_flight_mean = 0;
  double sessions_active_mean = 0;
  uint64_t sessions_active_max = 0;

  // Every request's TTFT, ascending (for CDF plots).
  std::vector<double> ttft_sorted_s;

  uint64_t served() const { return requests - refused_oversize; }
  // Share of served requests.
  double mode_share(DecisionMode mode) const {
    return served() == 0 ? 0.0
                         : static_cast<double>(mode_counts[static_cast<int>(mode)]) /
                               static_cast<double>(served());
  }
  double hit_rate() const { return TokenShare(cached_tokens); }
  // hit_bound_tokens and one_pool_lru_tokens as shares of input_tokens,
  // comparable to hit_rate().
  double hit_bound() const { return TokenShare(hit_bound_tokens); }
  double one_pool_lru_hit_rate() const { return TokenShare(one_pool_lru_tokens); }
  double TokenShare(uint64_t tokens) const {
    return input_tokens == 0 ? 0.0
                             : static_cast<double>(tokens) / static_cast<double>(input_tokens);
  }
  uint64_t total_rejections() const {
    uint64_t total = 0;
    for (uint64_t n : rejections) total += n;
    return total;
  }
};

}  // namespace kvc_router::sim
