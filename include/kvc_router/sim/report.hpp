// kvc_router/sim/report.hpp
//
// Turns replay results into what people and scripts read: the terminal
// comparison table, JSON (top-level "policies" array; schema in
// docs/simulator.md), CSV (one row per policy) and the data files the gnuplot
// script (scripts/plot_replay.gnuplot) draws from.
//
// JSON and CSV are written by hand with fixed formats, in policy order, from
// simulated quantities only (never wall-clock time), so equal inputs give
// byte-identical files. Non-finite numbers are written as null (JSON) or an
// empty field (CSV).
//
//   kvc_router::sim::ReplayReport report{...};
//   std::string json = kvc_router::sim::FormatJson(report);
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvc_router/sim/metrics.hpp"
#include "kvc_router/sim/simulator.hpp"
#include "kvc_router/sim/trace.hpp"
#include "kvc_router/types.hpp"
#include "kvc_router/version.hpp"

namespace kvc_router::sim {

// Everything a report states besides the per-policy results.
struct ReplayReport {
  std::string workload;  // trace path or generator description
  TraceFormat format = TraceFormat::kSynthetic;
  uint64_t sessions = 0;
  uint64_t requests = 0;
  uint32_t block_tokens = 0;
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  double ideal_session_hit_rate = 0;
  double trace_span_s = 0;
  // Cluster and model.
  uint32_t prefill_workers = 0;
  uint32_t decode_workers = 0;
  uint32_t colocated_instances = 0;
  AdmissionConfig admission;
  uint32_t max_admit_attempts = 0;
  std::string transfer;  // "tcp", "rdma" or "custom"
  CostModel cost;
  LoopMode loop = LoopMode::kClosed;
  uint64_t seed = 0;
  std::vector<PolicyResult> results;

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
};

namespace detail {

inline std::string JsonNumber(double v, int precision = 6) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.*f", precision, v);
}

inline std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (u < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned>(u));
    } else {
      out.push_back(c);
    }
  }
  out += "\"";
  return out;
}

inline std::string JsonSummary(const Summary& s) {
  return absl::StrCat("{\"p50\": ", JsonNumber(s.p50), ", \"p90\": ", JsonNumber(s.p90),
                      ", \"p99\": ", JsonNumber(s.p99), ", \"mean\": ", JsonNumber(s.mean),
                      ", \"max\": ", JsonNumber(s.max), "}");
}

inline std::string_view AccountingName(CapacityAccounting a) {
  return a == CapacityAccounting::kConservative ? "conservative" : "incremental";
}

inline std::string CsvNumber(double v, int precision = 6) {
  if (!std::isfinite(v)) return "";
  return absl::StrFormat("%.*f", precision, v);
}

inline std::string Percent(double fraction) {
  return absl::StrFormat("%5.1f%%", 100.0 * fraction);
}

inline std::string Seconds(double v) {
  if (!std::isfinite(v)) return "     -";
  if (v < 10) return absl::StrFormat("%6.3f", v);
  if (v < 1000) return absl::StrFormat("%6.1f", v);
  return absl::StrFormat("%6.0f", v);
}

}  // namespace detail

inline std::string FormatJson(const ReplayReport& r) {
  using detail::JsonNumber;
  using detail::JsonString;
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"tool\": \"kvc-replay\",\n  \"version\": \"", kVersionString, "\",\n");
  absl::StrAppend(&out, "  \"workload\": {\"source\": ", JsonString(r.workload),
                  ", \"format\": ", JsonString(TraceFormatName(r.format)),
                  ", \"sessions\": ", r.sessions, ", \"requests\": ", r.requests,
                  ", \"block_tokens\": ", r.block_tokens, ", \"input_tokens\": ", r.input_tokens,
                  ", \"output_tokens\": ", r.output_tokens,
                  ", \"ideal_session_hit_rate\": ", JsonNumber(r.ideal_session_hit_rate),
                  ", \"span_s\": ", JsonNumber(r.trace_span_s, 3), "},\n");
  absl::StrAppend(
      &out, "  \"cluster\": {\"prefill_workers\": ", r.prefill_workers,
      ", \"decode_workers\": ", r.decode_workers,
      ", \"colocated_instances\": ", r.colocated_instances,
      ", \"kv_capacity_tokens\": ", r.admission.capacity_tokens,
      ", \"high_water\": ", JsonNumber(r.admission.high_water, 4),
      ", \"max_direct_append_tokens\": ", r.admission.max_direct_append_tokens,
      ", \"accounting\": ", JsonString(detail::AccountingName(r.admission.accounting)),
      ", \"max_admit_attempts\": ", r.max_admit_attempts, ", \"loop\": ",
      JsonString(r.loop == LoopMode::kClosed ? "closed" : "open"), ", \"seed\": ", r.seed, "},\n");
  const CostModel& c = r.cost;
  absl::StrAppend(
      &out, "  \"cost_model\": {\"transfer\": ", JsonString(r.transfer),
      ", \"prefill_overhead_s\": ", JsonNumber(c.prefill_overhead_s, 9),
      ", \"prefill_per_token_s\": ", JsonNumber(c.prefill_per_token_s, 9),
      ", \"prefill_attention_s\": ", JsonNumber(c.prefill_attention_s, 12),
      ", \"decode_step_base_s\": ", JsonNumber(c.decode_step_base_s, 9),
      ", \"decode_step_per_request_s\": ", JsonNumber(c.decode_step_per_request_s, 9),
      ", \"decode_step_per_context_token_s\": ", JsonNumber(c.decode_step_per_context_token_s, 12),
      ", \"kv_bytes_per_token\": ", c.kv_bytes_per_token,
      ", \"transfer_setup_s\": ", JsonNumber(c.transfer_setup_s, 9),
      ", \"transfer_bytes_per_s\": ", JsonNumber(c.transfer_bytes_per_s, 0),
      ", \"admit_rpc_s\": ", JsonNumber(c.admit_rpc_s, 9), "},\n");
  out += "  \"policies\": [";
  for (size_t i = 0; i < r.results.size(); ++i) {
    const PolicyResult& p = r.results[i];
    out += i == 0 ? "\n" : ",\n";
    absl::StrAppend(&out, "    {\"name\": ", JsonString(p.name),
                    ", \"topology\": ", JsonString(policy::TopologyName(p.topology)),
                    ", \"prefill_workers\": ", p.prefill_workers, ", \"instances\": ", p.instances,
                    ", \"requests\": ", p.requests, ",\n");
    absl::StrAppend(&out, "     \"modes\": {");
    for (int m = 0; m < kNumDecisionModes; ++m) {
      const auto mode = static_cast<DecisionMode>(m);
      absl::StrAppend(&out, m == 0 ? "" : ", ", JsonString(DecisionModeName(mode)), ": ",
                      JsonNumber(p.mode_share(mode)));
    }
    absl::StrAppend(&out, "},\n     \"mode_counts\": {");
    for (int m = 0; m < kNumDecisionModes; ++m) {
      absl::StrAppend(&out, m == 0 ? "" : ", ",
                      JsonString(DecisionModeName(static_cast<DecisionMode>(m))), ": ",
                      p.mode_counts[m]);
    }
    absl::StrAppend(&out, "},\n     \"hit_rate\": ", JsonNumber(p.hit_rate()),
                    ",\n     \"ttft_s\": ", detail::JsonSummary(p.ttft_s),
                    ",\n     \"e2e_s\": ", detail::JsonSummary(p.e2e_s),
                    ",\n     \"ttft_by_mode_s\": {");
    for (int m = 0; m < kNumDecisionModes; ++m) {
      absl::StrAppend(&out, m == 0 ? "" : ", ",
                      JsonString(DecisionModeName(static_cast<DecisionMode>(m))), ": ",
                      detail::JsonSummary(p.ttft_by_mode_s[m]));
    }
    absl::StrAppend(&out, "},\n     \"worker_ttft_p90_s\": {\"median\": ",
                    JsonNumber(p.worker_ttft_p90_median_s), ", \"max\": ",
                    JsonNumber(p.worker_ttft_p90_max_s), "},\n     \"rejections\": {");
    for (int k = 1; k < kNumRejectReasons; ++k) {
      absl::StrAppend(&out, k == 1 ? "" : ", ",
                      JsonString(RejectReasonName(static_cast<RejectReason>(k))), ": ",
                      p.rejections[k]);
    }
    absl::StrAppend(
        &out, "},\n     \"admit_attempts\": ", p.admit_attempts, ", \"migrations\": ", p.migrations,
        ", \"evictions\": ", p.evictions, ", \"memory_waits\": ", p.memory_waits,
        ", \"oversize_requests\": ", p.oversize_requests,
        ",\n     \"tokens\": {\"input\": ", p.input_tokens, ", \"output\": ", p.output_tokens,
        ", \"cached\": ", p.cached_tokens, ", \"prefilled_on_prefill_workers\": ",
        p.prefill_tokens_remote, ", \"prefilled_on_instances\": ", p.prefill_tokens_local,
        ", \"kv_transferred\": ", p.kv_transfer_tokens, "}, \"kv_transfer_bytes\": ",
        p.kv_transfer_bytes, ",\n     \"peak_kv_used_tokens\": ", p.peak_used_tokens,
        ", \"kv_budget_tokens\": ", p.budget_tokens,
        ", \"makespan_s\": ", JsonNumber(p.makespan_s, 3),
        ", \"trace_span_s\": ", JsonNumber(p.trace_span_s, 3),
        ", \"amplification\": ", JsonNumber(p.amplification, 4), ", \"events\": ", p.events, "}");
  }
  out += r.results.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

inline std::string FormatCsv(const ReplayReport& r) {
  using detail::CsvNumber;
  std::string out =
      "policy,topology,requests,direct,seed,reseed,fallback,hit_rate,ttft_p50_s,ttft_p90_s,"
      "ttft_p99_s,e2e_p50_s,e2e_p90_s,e2e_p99_s,worker_ttft_p90_median_s,worker_ttft_p90_max_s,"
      "rej_real_large_append,rej_no_d_capacity,rej_session_not_resident_no_capacity,"
      "rej_worker_unavailable,migrations,evictions,memory_waits,amplification,makespan_s\n";
  for (const PolicyResult& p : r.results) {
    absl::StrAppend(&out, p.name, ",", std::string(policy::TopologyName(p.topology)), ",", p.requests);
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
                    CsvNumber(p.amplification, 4), ",", CsvNumber(p.makespan_s, 3), "\n");
  }
  return out;
}

// The terminal table. `replay_seconds` (wall-clock per policy, same order as
// the results) is optional and only shown here, never in JSON or CSV.
inline std::string FormatTable(const ReplayReport& r, const std::vector<double>& replay_seconds = {}) {
  using detail::Percent;
  using detail::Seconds;
  std::string out;
  absl::StrAppend(&out, "workload: ", r.workload, "\n");
  absl::StrAppend(&out, "  ", r.sessions, " sessions, ", r.requests, " requests, ",
                  absl::StrFormat("%.1fM input tokens", static_cast<double>(r.input_tokens) / 1e6),
                  ", ideal session hit rate ", absl::StrFormat("%.3f", r.ideal_session_hit_rate),
                  ", trace span ", absl::StrFormat("%.0f s", r.trace_span_s), ", ",
                  r.loop == LoopMode::kClosed ? "closed" : "open", " loop\n");
  absl::StrAppend(&out, "cluster: ", r.prefill_workers, "P+", r.decode_workers,
                  "D (colocated: ", r.colocated_instances, " instances), K_d ",
                  r.admission.capacity_tokens, ", rho ", absl::StrFormat("%.2f", r.admission.high_water),
                  ", tau_append ", r.admission.max_direct_append_tokens, ", epsilon ",
                  r.max_admit_attempts, ", ", std::string(detail::AccountingName(r.admission.accounting)),
                  " accounting, KV transfer ", r.transfer,
                  absl::StrFormat(" (%.1f GB/s)", r.cost.transfer_bytes_per_s / 1e9), "\n\n");
  absl::StrAppend(&out,
                  "policy    topo   direct   seed reseed fallbk   hit |      TTFT p50/p90/p99 (s) |"
                  "       E2E p50/p90/p99 (s) | wrk TTFT p90 med/max |   rej  migr   ampl");
  if (!replay_seconds.empty()) out += "  replay";
  out += "\n";
  for (size_t i = 0; i < r.results.size(); ++i) {
    const PolicyResult& p = r.results[i];
    absl::StrAppend(
        &out, absl::StrFormat("%-9s %-5s", p.name,
                              p.topology == policy::Topology::kDisaggregated ? "P/D" : "colo"),
        " ", Percent(p.mode_share(DecisionMode::kDirect)), " ",
        Percent(p.mode_share(DecisionMode::kSeed)), " ", Percent(p.mode_share(DecisionMode::kReseed)),
        " ", Percent(p.mode_share(DecisionMode::kFallback)), absl::StrFormat(" %5.3f", p.hit_rate()),
        " | ", Seconds(p.ttft_s.p50), " ", Seconds(p.ttft_s.p90), " ", Seconds(p.ttft_s.p99),
        "    | ", Seconds(p.e2e_s.p50), " ", Seconds(p.e2e_s.p90), " ", Seconds(p.e2e_s.p99),
        "    |      ", Seconds(p.worker_ttft_p90_median_s), " ", Seconds(p.worker_ttft_p90_max_s),
        "   | ", absl::StrFormat("%5d %5d %6.2f", p.total_rejections(), p.migrations,
                                  std::isfinite(p.amplification) ? p.amplification : 0.0));
    if (i < replay_seconds.size()) absl::StrAppend(&out, absl::StrFormat("  %5.2fs", replay_seconds[i]));
    out += "\n";
  }
  return out;
}

// Writes the gnuplot inputs into `dir`: ttft_cdf.dat (one block per policy,
// "ttft_s cdf" rows, blocks separated by two blank lines, in policy order) and
// modes.dat (one row per policy: name direct seed reseed fallback, percent).
inline absl::Status WritePlotData(const ReplayReport& r, const std::string& dir) {
  std::ofstream cdf(dir + "/ttft_cdf.dat");
  std::ofstream modes(dir + "/modes.dat");
  if (!cdf || !modes) return absl::UnavailableError(absl::StrCat("cannot write plot data in ", dir));
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
    modes << absl::StrFormat("%s %.3f %.3f %.3f %.3f\n", p.name,
                             100 * p.mode_share(DecisionMode::kDirect),
                             100 * p.mode_share(DecisionMode::kSeed),
                             100 * p.mode_share(DecisionMode::kReseed),
                             100 * p.mode_share(DecisionMode::kFallback));
  }
  cdf.close();
  modes.close();
  if (!cdf || !modes) return absl::DataLossError(absl::StrCat("writing plot data in ", dir, " failed"));
  return absl::OkStatus();
}

}  // namespace kvc_router::sim
