// kvc_sim/report.hpp
//
// The last step of a replay: turns the per-policy results (metrics.hpp) and
// the configuration they were measured under into what people and scripts
// read. kvc-replay (sim/tools/kvc_replay.cpp) fills one `ReplayReport` and
// writes it four ways:
//   * FormatTable: the terminal comparison (one row per policy);
//   * FormatJson: every field, for scripts (schema in docs/simulator.md):
//     "tool", "version", "workload", "cluster" (shape, pools, load, the
//     router's and the cache-aware baselines' knobs), "cost_model" (the
//     hardware profile's constants) and a "policies" array in run order;
//   * FormatCsv: one row per policy;
//   * WritePlotData: the data files scripts/plot_replay.gnuplot draws.
//
// JSON is built with nlohmann::ordered_json, so keys keep the order written
// here, and holds simulated quantities only (never wall-clock time): equal
// inputs give byte-identical text. Non-finite numbers become null in JSON and
// an empty field in CSV.
//
//   kvc_router::sim::ReplayReport report = kvc_router::sim::ReplayReport::ForTrace(trace);
//   report.SetConfig(sim_config, policy_setup);
//   report.profile = "h100-8b";
//   report.link = "rdma-200g";
//   report.results.push_back(*kvc_router::sim::Simulator::Run(trace, policy, sim_config));
//   std::string json = kvc_router::sim::FormatJson(report);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvc_router/config.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_router/types.hpp"
#include "kvc_router/version.hpp"
#include "kvc_sim/cost_model.hpp"
#include "kvc_sim/metrics.hpp"
#include "kvc_sim/page_cache.hpp"
#include "kvc_sim/policies/cache_aware_dp.hpp"
#include "kvc_sim/policies/registry.hpp"
#include "kvc_sim/simulator.hpp"
#include "kvc_sim/trace.hpp"

namespace kvc_router::sim {

// Everything a report states besides the per-policy results.
struct ReplayReport {
  // The workload.
  std::string workload;  // trace path or generator description
  TraceFormat format = TraceFormat::kSynthetic;
  std::string preset;  // synthetic preset ("swe-bench", ...); empty for a trace file
  uint64_t seed = 0;   // synthetic generator seed
  uint64_t sessions = 0;
  uint64_t requests = 0;
  uint32_t block_tokens = 0;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  double ideal_session_hit_rate = 0;
  double trace_span_s = 0;
  // The TTFT no router can beat (ttft_floor.hpp); NaN until set.
  Summary ttft_floor_s = NoFloor();

  // The hardware: profile name, its KV link ("rdma-200g", "tcp-loopback", or
  // "custom" once transfer constants were overridden), cost model, host tier.
  std::string profile;
  std::string link;
  CostModel cost;
  HostTierConfig host_tier;

  // The cluster and the load.
  policy::ClusterShape cluster;
  AdmissionConfig admission;
  LoopMode loop = LoopMode::kClosed;
  uint32_t concurrency = 0;  // 0 = unlimited
  bool prefix_cache = true;
  // Whether each result carries its hit-rate bound (SimConfig::hit_bound).
  bool hit_bound = false;
  // Whether clients closed their sessions (SimConfig::close_sessions).
  bool close_sessions = false;

  // The policies' knobs: KVC's (alpha, tau_reject, epsilon with 0 = |D|,
  // v1/v2 reset), KV events, and the cache-aware baselines' options.
  RouterConfig router;
  bool kv_events = false;
  CacheAwareOptions cache_aware;

  // The policy marked "recommended": true in JSON; empty marks none.
  std::string recommended_policy;
  std::vector<PolicyResult> results;

  static Summary NoFloor() {
    std::vector<double> none;
    return Summary::Of(none);
  }

  static ReplayReport ForTrace(const Trace& trace) {
    ReplayReport report;
    report.workload = trace.description;
    report.format = trace.format;
    report.sessions = trace.sessions.size();
    report.requests = trace.turns.size();
    report.block_tokens = trace.block_tokens;
    report.input_tokens = trace.total_input_tokens();
    report.output_tokens = trace.total_output_tokens();
    report.ideal_session_hit_rate = trace.IdealSessionHitRate();
    report.trace_span_s = trace.span_s();
    return report;
  }

  // Copies what the simulator and the policies were configured with.
  void SetConfig(const SimConfig& sim, const PolicySetup& setup) {
    cost = sim.cost;
    host_tier = sim.host_tier;
    cluster = sim.cluster;
    admission = sim.admission;
    loop = sim.loop;
    concurrency = sim.concurrency;
    prefix_cache = sim.prefix_cache;
    hit_bound = sim.hit_bound;
    close_sessions = sim.close_sessions;
    router = setup.router;
    kv_events = setup.kv_events;
    cache_aware = setup.cache_aware;
  }
};

namespace detail {

inline std::string_view AccountingName(CapacityAccounting a) {
  return a == CapacityAccounting::kConservative ? "conservative" : "incremental";
}

inline std::string_view LoopName(LoopMode loop) {
  return loop == LoopMode::kClosed ? "closed" : "open";
}

inline nlohmann::ordered_json JsonSummary(const Summary& s) {
  nlohmann::ordered_json j;
  j["p50"] = s.p50;
  j["p90"] = s.p90;
  j["p99"] = s.p99;
  j["mean"] = s.mean;
  j["max"] = s.max;
  return j;
}

inline std::string ModeKey(int m) {
  return std::string(DecisionModeName(static_cast<DecisionMode>(m)));
}

inline nlohmann::ordered_json JsonPolicy(const PolicyResult& p, bool recommended, bool hit_bound) {
  nlohmann::ordered_json j;
  j["name"] = p.name;
  j["recommended"] = recommended;
  j["topology"] = std::string(policy::TopologyName(p.topology));
  j["prefill_workers"] = p.prefill_workers;
  j["instances"] = p.instances;
  j["requests"] = p.requests;
  j["served"] = p.served();
  // (Sub-objects are built whole before they are added: a reference into an
  // ordered_json object does not survive the next key's insertion.)
  nlohmann::ordered_json modes = nlohmann::ordered_json::object();
  nlohmann::ordered_json counts = nlohmann::ordered_json::object();
  nlohmann::ordered_json by_mode = nlohmann::ordered_json::object();
  for (int m = 0; m < kNumDecisionModes; ++m) {
    modes[ModeKey(m)] = p.mode_share(static_cast<DecisionMode>(m));
    counts[ModeKey(m)] = p.mode_counts[m];
    by_mode[ModeKey(m)] = JsonSummary(p.ttft_by_mode_s[m]);
  }
  nlohmann::ordered_json rejections = nlohmann::ordered_json::object();
  for (int k = 1; k < kNumRejectReasons; ++k) {
    rejections[std::string(RejectReasonName(static_cast<RejectReason>(k)))] = p.rejections[k];
  }
  j["modes"] = std::move(modes);
  j["mode_counts"] = std::move(counts);
  j["hit_rate"] = p.hit_rate();
  j["hit_bound"] = hit_bound ? nlohmann::ordered_json(p.hit_bound()) : nlohmann::ordered_json();
  j["one_pool_lru_hit_rate"] =
      hit_bound ? nlohmann::ordered_json(p.one_pool_lru_hit_rate()) : nlohmann::ordered_json();
  j["ttft_s"] = JsonSummary(p.ttft_s);
  j["e2e_s"] = JsonSummary(p.e2e_s);
  j["ttft_by_mode_s"] = std::move(by_mode);
  j["worker_ttft_p90_s"] = {{"median", p.worker_ttft_p90_median_s},
                            {"max", p.worker_ttft_p90_max_s}};
  j["rejections"] = std::move(rejections);
  j["admit_attempts"] = p.admit_attempts;
  j["migrations"] = p.migrations;
  j["kv_migrations"] = p.kv_migrations;
  j["kv_migrated_tokens"] = p.kv_migrated_tokens;
  j["kv_backup_tokens"] = p.kv_backup_tokens;
  j["evictions"] = p.evictions;
  j["evicted_pages"] = p.evicted_pages;
  j["faults"] = {{"crashes", p.faults.crashes},
                 {"sessions_lost", p.faults.sessions_lost},
                 {"cached_tokens_lost", p.faults.cached_tokens_lost},
                 {"turns_waited_for_instance", p.faults.turns_waited_for_instance},
                 {"rpc_timeouts", p.faults.rpc_timeouts},
                 {"events_dropped", p.faults.events_dropped},
                 {"events_duplicated", p.faults.events_duplicated},
                 {"events_reordered", p.faults.events_reordered}};
  j["memory_waits"] = p.memory_waits;
  j["held_turns"] = p.held_turns;
  j["hold_wait_s"] = JsonSummary(p.hold_wait_s);
  j["arrival_window_turns"] = p.arrival_window_turns;
  j["arrival_window_wait_s"] = JsonSummary(p.arrival_window_wait_s);
  j["refused_oversize"] = p.refused_oversize;
  j["tokens"] = {{"input", p.input_tokens},
                 {"output", p.output_tokens},
                 {"cached", p.cached_tokens},
                 {"prefilled_on_prefill_workers", p.prefill_tokens_remote},
                 {"prefilled_on_instances", p.prefill_tokens_local},
                 {"kv_transferred", p.kv_transfer_tokens}};
  j["host_reload_tokens"] = p.host_reload_tokens;
  j["kv_transfer_bytes"] = p.kv_transfer_bytes;
  j["peak_kv_used_tokens"] = p.peak_used_tokens;
  j["kv_budget_tokens"] = p.budget_tokens;
  j["concurrency"] = p.concurrency;
  j["in_flight_mean"] = p.in_flight_mean;
  j["sessions_active_mean"] = p.sessions_active_mean;
  j["sessions_active_max"] = p.sessions_active_max;
  j["makespan_s"] = p.makespan_s;
  j["trace_span_s"] = p.trace_span_s;
  j["amplification"] = p.amplification;
  j["events"] = p.events;
  return j;
}

inline std::string CsvNumber(double v, int precision = 6) {
  if (!std::isfinite(v)) return "";
  return absl::StrFormat("%.*f", precision, v);
}

inline std::string Percent(double fraction) { return absl::StrFormat("%5.1f%%", 100.0 * fraction); }

inline std::string Seconds(double v) {
  if (!std::isfinite(v)) return "     -";
  if (v < 10) return absl::StrFormat("%6.3f", v);
  if (v < 1000) return absl::StrFormat("%6.1f", v);
  return absl::StrFormat("%6.0f", v);
}

}  // namespace detail

// The whole report as JSON (two-space indented, ending in a newline).
inline std::string FormatJson(const ReplayReport& r) {
  using Json = nlohmann::ordered_json;
  Json root;
  root["tool"] = "kvc-replay";
  root["version"] = kVersionString;

  // Sections are built whole, then added (see JsonPolicy).
  Json workload;
  workload["source"] = r.workload;
  workload["format"] = std::string(TraceFormatName(r.format));
  workload["preset"] = r.preset.empty() ? Json(nullptr) : Json(r.preset);
  workload["seed"] = r.seed;
  workload["sessions"] = r.sessions;
  workload["requests"] = r.requests;
  workload["block_tokens"] = r.block_tokens;
  workload["input_tokens"] = r.input_tokens;
  workload["output_tokens"] = r.output_tokens;
  workload["ideal_session_hit_rate"] = r.ideal_session_hit_rate;
  workload["span_s"] = r.trace_span_s;
  if (!std::isnan(r.ttft_floor_s.p90)) {
    workload["ttft_floor_s"] = {{"p50", r.ttft_floor_s.p50},
                                {"p90", r.ttft_floor_s.p90},
                                {"p99", r.ttft_floor_s.p99}};
  }

  root["workload"] = std::move(workload);

  Json cluster;
  cluster["profile"] = r.profile;
  cluster["prefill_workers"] = r.cluster.prefill_workers;
  cluster["decode_workers"] = r.cluster.decode_workers;
  cluster["colocated_instances"] = r.cluster.instances(policy::Topology::kColocated);
  cluster["kv_capacity_tokens"] = r.admission.capacity_tokens;
  cluster["high_water"] = r.admission.high_water;
  cluster["max_direct_append_tokens"] = r.admission.max_direct_append_tokens;
  cluster["accounting"] = std::string(detail::AccountingName(r.admission.accounting));
  cluster["host_tier"] = {{"capacity_tokens", r.host_tier.capacity_tokens},
                          {"reload_bytes_per_s", r.host_tier.reload_bytes_per_s}};
  cluster["loop"] = std::string(detail::LoopName(r.loop));
  cluster["concurrency"] = r.concurrency;
  cluster["prefix_cache"] = r.prefix_cache;
  cluster["close_sessions"] = r.close_sessions;
  // epsilon as configured (0 = |D|) and what it means on each topology.
  cluster["router"] = {
      {"sticky_bonus", r.router.sticky_bonus},
      {"reject_threshold", r.router.reject_threshold},
      {"max_admit_attempts", r.router.max_admit_attempts},
      {"effective_admit_attempts",
       {{"disaggregated", r.cluster.ApplyTo(r.router, policy::Topology::kDisaggregated)
                              .effective_max_admit_attempts()},
        {"colocated", r.cluster.ApplyTo(r.router, policy::Topology::kColocated)
                          .effective_max_admit_attempts()}}},
      {"reset_on_success", r.router.reset_on_success},
      {"kv_events", r.kv_events}};
  cluster["cache_aware"] = {{"cache_threshold", r.cache_aware.cache_threshold},
                            {"balance_abs_threshold", r.cache_aware.balance_abs_threshold},
                            {"balance_rel_threshold", r.cache_aware.balance_rel_threshold},
                            {"eviction_interval_s", r.cache_aware.eviction_interval_s},
                            {"max_tree_chars", r.cache_aware.max_tree_chars},
                            {"chars_per_token", r.cache_aware.chars_per_token}};

  root["cluster"] = std::move(cluster);

  const CostModel& c = r.cost;
  Json cost;
  cost["link"] = r.link;
  cost["prefill_overhead_s"] = c.prefill_overhead_s;
  cost["prefill_per_token_s"] = c.prefill_per_token_s;
  cost["prefill_attention_s"] = c.prefill_attention_s;
  cost["chunked_prefill_tokens"] = c.chunked_prefill_tokens;
  cost["decode_step_base_s"] = c.decode_step_base_s;
  cost["decode_step_per_request_s"] = c.decode_step_per_request_s;
  cost["decode_step_per_context_token_s"] = c.decode_step_per_context_token_s;
  cost["kv_bytes_per_token"] = c.kv_bytes_per_token;
  cost["transfer_setup_s"] = c.transfer_setup_s;
  cost["transfer_bytes_per_s"] = c.transfer_bytes_per_s;
  cost["admit_rpc_s"] = c.admit_rpc_s;

  root["cost_model"] = std::move(cost);

  Json policies = Json::array();
  for (const PolicyResult& p : r.results) {
    policies.push_back(
        detail::JsonPolicy(p, !r.recommended_policy.empty() && p.name == r.recommended_policy,
                          r.hit_bound));
  }
  root["policies"] = std::move(policies);
  // nlohmann writes non-finite doubles as null; `replace` keeps a trace path
  // that is not valid UTF-8 from throwing.
  return root.dump(2, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace) + "\n";
}

inline std::string FormatCsv(const ReplayReport& r) {
  using detail::CsvNumber;
  std::string out =
      "policy,topology,requests,direct,seed,reseed,fallback,hit_rate,ttft_p50_s,ttft_p90_s,"
      "ttft_p99_s,e2e_p50_s,e2e_p90_s,e2e_p99_s,worker_ttft_p90_median_s,worker_ttft_p90_max_s,"
      "rej_real_large_append,rej_no_d_capacity,rej_session_not_resident_no_capacity,"
      "rej_worker_unavailable,migrations,evictions,memory_waits,amplification,makespan_s,"
      "in_flight_mean,sessions_active_mean,refused_oversize,hit_bound,one_pool_lru_hit_rate,"
      "held_turns,hold_wait_p90_s\n";
  for (const PolicyResult& p : r.results) {
    absl::StrAppend(&out, p.name, ",", std::string(policy::TopologyName(p.topology)), ",",
                    p.requests);
    for (int m = 0; m < kNumDecisionModes; ++m) {
      absl::StrAppend(&out, ",", CsvNumber(p.mode_share(static_cast<DecisionMode>(m))));
    }
    absl::StrAppend(&out, ",", CsvNumber(p.hit_rate()), ",", CsvNumber(p.ttft_s.p50), ",",
                    CsvNumber(p.ttft_s.p90), ",", CsvNumber(p.ttft_s.p99), ",",
                    CsvNumber(p.e2e_s.p50), ",", CsvNumber(p.e2e_s.p90), ",",
                    CsvNumber(p.e2e_s.p99), ",", CsvNumber(p.worker_ttft_p90_median_s), ",",
                    CsvNumber(p.worker_ttft_p90_max_s));
    for (int k = 1; k < kNumRejectReasons; ++k) absl::StrAppend(&out, ",", p.rejections[k]);
    absl::StrAppend(&out, ",", p.migrations, ",", p.evictions, ",", p.memory_waits, ",",
                    CsvNumber(p.amplification, 4), ",", CsvNumber(p.makespan_s, 3), ",",
                    CsvNumber(p.in_flight_mean, 3), ",", CsvNumber(p.sessions_active_mean, 3), ",",
                    p.refused_oversize, ",",
                    r.hit_bound ? CsvNumber(p.hit_bound()) : std::string(), ",",
                    r.hit_bound ? CsvNumber(p.one_pool_lru_hit_rate()) : std::string(), ",",
                    p.held_turns, ",", p.held_turns > 0 ? CsvNumber(p.hold_wait_s.p90) : std::string(),
                    "\n");
  }
  return out;
}

// The terminal table. `replay_seconds` (wall-clock per policy, same order as
// the results) is optional and only shown here, never in JSON or CSV. The
// "infl/sess" column is the mean number of requests in flight and of active
// sessions over the makespan.
inline std::string FormatTable(const ReplayReport& r,
                               const std::vector<double>& replay_seconds = {}) {
  using detail::Percent;
  using detail::Seconds;
  std::string out;
  absl::StrAppend(&out, "workload: ", r.workload, "\n");
  absl::StrAppend(&out, "  ", r.sessions, " sessions, ", r.requests, " requests, ",
                  absl::StrFormat("%.1fM input tokens", static_cast<double>(r.input_tokens) / 1e6),
                  ", ideal session hit rate ", absl::StrFormat("%.3f", r.ideal_session_hit_rate),
                  ", trace span ", absl::StrFormat("%.0f s", r.trace_span_s), "\n");
  if (!std::isnan(r.ttft_floor_s.p90)) {
    absl::StrAppend(&out, "  TTFT floor p50/p90/p99 (each prefill alone, all reusable KV cached): ",
                    absl::StrFormat("%.3g / %.3g / %.3g s", r.ttft_floor_s.p50,
                                    r.ttft_floor_s.p90, r.ttft_floor_s.p99),
                    "\n");
  }
  const std::string epsilon = r.router.max_admit_attempts == 0
                                  ? std::string("|D|")
                                  : absl::StrCat(r.router.max_admit_attempts);
  absl::StrAppend(&out, "cluster: ", r.profile.empty() ? std::string("custom") : r.profile, ", ",
                  r.cluster.prefill_workers, "P+", r.cluster.decode_workers,
                  "D (colocated: ", r.cluster.instances(policy::Topology::kColocated),
                  " instances), K_d ", r.admission.capacity_tokens, ", rho ",
                  absl::StrFormat("%.2f", r.admission.high_water), ", tau_append ",
                  r.admission.max_direct_append_tokens, ", epsilon ", epsilon, ", tau_reject ",
                  r.router.reject_threshold, ", alpha ", r.router.sticky_bonus, ", ",
                  std::string(detail::AccountingName(r.admission.accounting)), " accounting\n");
  const std::string host_tier =
      r.host_tier.capacity_tokens == 0
          ? std::string("no host tier")
          : absl::StrCat("host tier ", r.host_tier.capacity_tokens, " tokens at ",
                         absl::StrFormat("%.1f GB/s", r.host_tier.reload_bytes_per_s / 1e9));
  const std::string concurrency = r.concurrency == 0 ? std::string("unlimited concurrency")
                                                     : absl::StrCat("concurrency ", r.concurrency);
  absl::StrAppend(&out, "  KV link ", r.link,
                  absl::StrFormat(" (%.1f GB/s)", r.cost.transfer_bytes_per_s / 1e9), ", ",
                  host_tier, ", ", std::string(detail::LoopName(r.loop)), " loop, ", concurrency,
                  r.prefix_cache ? "" : ", no prefix cache",
                  r.close_sessions ? ", sessions closed" : "", "\n\n");
  absl::StrAppend(&out,
                  "policy    topo   direct   seed reseed fallbk   hit |      TTFT p50/p90/p99 (s) |"
                  "       E2E p50/p90/p99 (s) | wrk TTFT p90 med/max |   rej  migr   ampl |"
                  "  infl/sess");
  if (!replay_seconds.empty()) out += "  replay";
  out += "\n";
  for (size_t i = 0; i < r.results.size(); ++i) {
    const PolicyResult& p = r.results[i];
    absl::StrAppend(
        &out,
        absl::StrFormat("%-9s %-5s",
                        p.name == r.recommended_policy ? absl::StrCat(p.name, "*") : p.name,
                        p.topology == policy::Topology::kDisaggregated ? "P/D" : "colo"),
        " ", Percent(p.mode_share(DecisionMode::kDirect)), " ",
        Percent(p.mode_share(DecisionMode::kSeed)), " ",
        Percent(p.mode_share(DecisionMode::kReseed)), " ",
        Percent(p.mode_share(DecisionMode::kFallback)), absl::StrFormat(" %5.3f", p.hit_rate()),
        " | ", Seconds(p.ttft_s.p50), " ", Seconds(p.ttft_s.p90), " ", Seconds(p.ttft_s.p99),
        "    | ", Seconds(p.e2e_s.p50), " ", Seconds(p.e2e_s.p90), " ", Seconds(p.e2e_s.p99),
        "    |      ", Seconds(p.worker_ttft_p90_median_s), " ", Seconds(p.worker_ttft_p90_max_s),
        "   | ",
        absl::StrFormat("%5d %5d %6.2f", p.total_rejections(), p.migrations,
                        std::isfinite(p.amplification) ? p.amplification : 0.0),
        " | ", absl::StrFormat("%5.1f/%-5.1f", p.in_flight_mean, p.sessions_active_mean));
    if (i < replay_seconds.size()) {
      absl::StrAppend(&out, absl::StrFormat("  %5.2fs", replay_seconds[i]));
    }
    out += "\n";
  }
  if (r.hit_bound && !r.results.empty()) {
    // What each run's hit rate could have been on its own request order,
    // with all pools as one: managed by LRU, and the offline optimum.
    out += "\nhit rate against all pools as one cache, same order (hit_bound.hpp):\n";
    out += "policy               hit  one LRU pool  optimum\n";
    for (const PolicyResult& p : r.results) {
      absl::StrAppend(&out, absl::StrFormat("%-18s %5.3f  %12.3f  %7.3f\n", p.name, p.hit_rate(),
                                            p.one_pool_lru_hit_rate(), p.hit_bound()));
    }
  }
  bool any_held = false;
  for (const PolicyResult& p : r.results) any_held = any_held || p.held_turns > 0;
  if (any_held) {
    // Load control's queue at the gateway: its waits are part of the TTFTs above.
    out += "\nturns that waited at the gateway (load control), share of requests, wait (s):\n";
    out += "policy            turns  share    p50    p90    max\n";
    for (const PolicyResult& p : r.results) {
      if (p.held_turns == 0) continue;
      const double share = static_cast<double>(p.held_turns) /
                           static_cast<double>(std::max<uint64_t>(p.requests, 1));
      absl::StrAppend(&out, absl::StrFormat("%-15s %7d %5.1f%% ", p.name, p.held_turns, 100 * share),
                      Seconds(p.hold_wait_s.p50), " ", Seconds(p.hold_wait_s.p90), " ",
                      Seconds(p.hold_wait_s.max), "\n");
    }
  }
  for (const PolicyResult& p : r.results) {
    if (p.name == r.recommended_policy) {
      absl::StrAppend(&out, "* recommended: what a gateway should run by default\n");
      break;
    }
  }
  return out;
}

// Writes the gnuplot inputs into `dir`: ttft_cdf.dat (one block per policy,
// "ttft_s cdf" rows, blocks separated by two blank lines, in policy order) and
// modes.dat (one row per policy: name direct seed reseed fallback, percent).
inline absl::Status WritePlotData(const ReplayReport& r, const std::string& dir) {
  std::ofstream cdf(dir + "/ttft_cdf.dat");
  std::ofstream modes(dir + "/modes.dat");
  if (!cdf || !modes) {
    return absl::UnavailableError(absl::StrCat("cannot write plot data in ", dir));
  }
  constexpr int kPoints = 400;
  for (size_t i = 0; i < r.results.size(); ++i) {
    const PolicyResult& p = r.results[i];
    if (i > 0) cdf << "\n\n";
    cdf << "# " << p.name << "\n";
    const std::vector<double>& v = p.ttft_sorted_s;
    for (int k = 0; k <= kPoints && !v.empty(); ++k) {
      const double q = static_cast<double>(k) / kPoints;
      cdf << absl::StrFormat("%.6g %.6f\n", std::max(1e-4, SortedPercentile(v, q)), q);
    }
    modes << absl::StrFormat(
        "%s %.3f %.3f %.3f %.3f\n", p.name, 100 * p.mode_share(DecisionMode::kDirect),
        100 * p.mode_share(DecisionMode::kSeed), 100 * p.mode_share(DecisionMode::kReseed),
        100 * p.mode_share(DecisionMode::kFallback));
  }
  cdf.close();
  modes.close();
  if (!cdf || !modes) {
    return absl::DataLossError(absl::StrCat("writing plot data in ", dir, " failed"));
  }
  return absl::OkStatus();
}

}  // namespace kvc_router::sim
