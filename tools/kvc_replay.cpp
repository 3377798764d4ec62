// kvc-replay: replay an LLM serving trace through a simulated cluster under
// several routing policies and compare them side by side (Direct/Seed/
// Reseed/Fallback shares, prefix-cache hit rate, TTFT and E2E percentiles,
// per-worker TTFT, rejections, migrations, amplification).
//
//   kvc-replay --synthetic --json out.json --plot out.png
//   kvc-replay --trace data/traces/mooncake/conversation_trace.jsonl --format mooncake
//
// Everything the simulator does is in include/kvc_router/sim/ and the
// policies are in include/kvc_router/policy/; this file only parses flags,
// runs the replays and writes the outputs. See docs/simulator.md.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kvc_router/policy/registry.hpp"
#include "kvc_router/sim/report.hpp"
#include "kvc_router/sim/simulator.hpp"
#include "kvc_router/sim/synthetic.hpp"
#include "kvc_router/sim/trace.hpp"

extern char** environ;

namespace {

using kvc_router::sim::CostModel;
using kvc_router::sim::LoopMode;
using kvc_router::sim::SimConfig;
using kvc_router::sim::SyntheticConfig;
using kvc_router::sim::Trace;
using kvc_router::sim::TraceFormat;

constexpr int kExitUsage = 2;
constexpr int kExitFailure = 1;

struct Options {
  std::string trace_path;
  std::string format = "mooncake";
  bool synthetic = false;
  SyntheticConfig synth;
  std::optional<uint32_t> block_tokens;
  uint32_t hub_fanout = 8;
  std::vector<std::string> policies = {"kvc", "kvc-v1", "pd", "dp"};
  SimConfig sim;
  kvc_router::policy::PolicyEnvironment env;
  std::string transfer = "tcp";
  std::map<std::string, std::string> cost_overrides;
  std::string json_path, csv_path, plot_path, plot_script, title;
  bool quiet = false;
};

void PrintHelp() {
  std::string policies;
  for (const auto& info : kvc_router::policy::ListPolicies()) {
    absl::StrAppend(&policies, absl::StrFormat("    %-9s %s\n", std::string(info.name),
                                               std::string(info.description)));
  }
  const SyntheticConfig s;
  const CostModel c;
  std::cout << absl::StrCat(
      "usage: kvc-replay (--trace PATH [--format mooncake|multiturn] | --synthetic [generator flags])\n"
      "                  [--policies LIST] [cluster, cost and output flags]\n\n"
      "Replays a trace through a simulated cluster under each policy and prints one\n"
      "comparison table. Deterministic: the same inputs and --seed give the same results.\n\n"
      "input:\n"
      "  --trace PATH             JSONL trace to replay\n"
      "  --format F               mooncake (default) or multiturn\n"
      "  --block-tokens N         tokens per trace block (default 512; synthetic: ", s.block_tokens, ")\n"
      "  --hub-fanout N           mooncake: prefixes branching into N+ next blocks are shared\n"
      "                           prompts, not conversations (default 8)\n"
      "  --synthetic              generate an agentic workload instead (flags below)\n"
      "  --seed N                 generator seed (default ", s.seed, ")\n\n"
      "synthetic generator (defaults shaped like the seeds' SWE-bench replay):\n"
      "  --sessions N             sessions (", s.sessions, ")\n"
      "  --requests N             total requests (", s.requests, ")\n"
      "  --turns-sigma X          log-normal spread of turns per session (", s.turns_sigma, ")\n"
      "  --min-turns N            turns of the shortest session (", s.min_turns, ")\n"
      "  --session-interarrival S mean seconds between session starts (", s.session_interarrival_s, ")\n"
      "  --system-prompt-tokens N prompt shared by all sessions (", s.system_prompt_tokens, ")\n"
      "  --task-tokens N          median first-turn task prompt (", s.task_tokens_median, ")\n"
      "  --task-sigma X           (", s.task_tokens_sigma, ")\n"
      "  --append-tokens N        median new tokens per later turn (", s.append_tokens_median, ")\n"
      "  --append-sigma X         (", s.append_tokens_sigma, ")\n"
      "  --output-tokens N        median output tokens (", s.output_tokens_median, ")\n"
      "  --output-sigma X         (", s.output_tokens_sigma, ")\n"
      "  --tool-delay S           median tool/think delay between turns, seconds (", s.tool_delay_median_s, ")\n"
      "  --tool-delay-sigma X     (", s.tool_delay_sigma, ")\n"
      "  --max-context N          compaction threshold, tokens (", s.max_context_tokens, ")\n"
      "  --compacted-tokens N     median summary size after compaction (", s.compacted_tokens_median, ")\n\n"
      "policies:\n"
      "  --policies LIST          comma-separated (default kvc,kvc-v1,pd,dp); known:\n", policies,
      "\ncluster:\n"
      "  --prefill-workers N      |P| (2)\n"
      "  --decode-workers N       |D| (6)\n"
      "  --instances N            colocated instances (default |P|+|D|)\n"
      "  --kv-capacity N          K_d, tokens per decode worker / instance (92104)\n"
      "  --high-water X           rho (0.95)\n"
      "  --max-direct-append N    tau_append (8192)\n"
      "  --accounting A           conservative (default) or incremental\n"
      "  --admit-attempts N       epsilon, 0 = |D| (2, the seed's evaluation)\n"
      "  --reject-threshold N     tau_reject (3)\n"
      "  --sticky-bonus N         alpha (1)\n"
      "  --kv-events              KVC forgets sessions the workers evict\n"
      "  --cache-threshold X      dp: prefix match rate to follow the cache (0.5)\n"
      "  --balance-abs N          dp: absolute load imbalance threshold (32)\n"
      "  --balance-rel X          dp: relative load imbalance threshold (1.1)\n"
      "  --no-prefix-cache        instances never reuse KV (for checks)\n"
      "  --loop L                 closed (default): next turn after the previous one finished\n"
      "                           plus its delay; open: every turn at its trace time\n\n"
      "cost model (docs/simulator.md lists sources):\n"
      "  --transfer T             tcp (default, ", c.transfer_bytes_per_s / 1e9, " GB/s) or rdma (",
      CostModel::Rdma().transfer_bytes_per_s / 1e9, " GB/s)\n"
      "  --transfer-gbytes-per-s X, --transfer-setup S, --kv-bytes-per-token N,\n"
      "  --prefill-overhead S, --prefill-per-token S, --prefill-attention S,\n"
      "  --decode-step-base S, --decode-step-per-request S, --decode-step-per-token S,\n"
      "  --admit-rpc S            override single constants\n\n"
      "output:\n"
      "  --json PATH              results as JSON (top-level \"policies\" array)\n"
      "  --csv PATH               one row per policy\n"
      "  --plot PATH.png          TTFT CDF and mode shares, drawn by gnuplot\n"
      "  --plot-script PATH       the gnuplot script (default scripts/plot_replay.gnuplot)\n"
      "  --title TEXT             plot title\n"
      "  --quiet                  no progress line\n"
      "  --help                   this text\n");
}

template <class T>
bool ParseNumber(std::string_view text, T& out) {
  std::string s(text);
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  if constexpr (std::is_floating_point_v<T>) {
    const double v = std::strtod(s.c_str(), &end);
    if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
    out = static_cast<T>(v);
  } else {
    if (s[0] == '-') return false;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (errno != 0 || *end != '\0' || v > std::numeric_limits<T>::max()) return false;
    out = static_cast<T>(v);
  }
  return true;
}

absl::Status ParseArgs(int argc, char** argv, Options& o, bool& help) {
  std::vector<std::string> args(argv + 1, argv + argc);
  bool block_tokens_set = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inline_value;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
      return args[++i];
    };
    auto number = [&](auto& out) -> absl::Status {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (!ParseNumber(*v, out)) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": invalid number \"", *v, "\""));
      }
      return absl::OkStatus();
    };
    auto no_value = [&]() -> absl::Status {
      if (inline_value) return absl::InvalidArgumentError(absl::StrCat(flag, " takes no value"));
      return absl::OkStatus();
    };
    absl::Status st;
    if (flag == "--help" || flag == "-h") {
      help = true;
      return absl::OkStatus();
    } else if (flag == "--trace") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      o.trace_path = *v;
    } else if (flag == "--format") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (*v != "mooncake" && *v != "multiturn") {
        return absl::InvalidArgumentError(absl::StrCat("--format: expected mooncake or multiturn, got \"", *v, "\""));
      }
      o.format = *v;
    } else if (flag == "--synthetic") {
      st = no_value();
      o.synthetic = true;
    } else if (flag == "--block-tokens") {
      uint32_t b = 0;
      st = number(b);
      o.block_tokens = b;
      block_tokens_set = true;
    } else if (flag == "--hub-fanout") {
      st = number(o.hub_fanout);
    } else if (flag == "--seed") {
      st = number(o.synth.seed);
    } else if (flag == "--sessions") {
      st = number(o.synth.sessions);
    } else if (flag == "--requests") {
      st = number(o.synth.requests);
    } else if (flag == "--turns-sigma") {
      st = number(o.synth.turns_sigma);
    } else if (flag == "--min-turns") {
      st = number(o.synth.min_turns);
    } else if (flag == "--session-interarrival") {
      st = number(o.synth.session_interarrival_s);
    } else if (flag == "--system-prompt-tokens") {
      st = number(o.synth.system_prompt_tokens);
    } else if (flag == "--task-tokens") {
      st = number(o.synth.task_tokens_median);
    } else if (flag == "--task-sigma") {
      st = number(o.synth.task_tokens_sigma);
    } else if (flag == "--append-tokens") {
      st = number(o.synth.append_tokens_median);
    } else if (flag == "--append-sigma") {
      st = number(o.synth.append_tokens_sigma);
    } else if (flag == "--output-tokens") {
      st = number(o.synth.output_tokens_median);
    } else if (flag == "--output-sigma") {
      st = number(o.synth.output_tokens_sigma);
    } else if (flag == "--tool-delay") {
      st = number(o.synth.tool_delay_median_s);
    } else if (flag == "--tool-delay-sigma") {
      st = number(o.synth.tool_delay_sigma);
    } else if (flag == "--max-context") {
      st = number(o.synth.max_context_tokens);
    } else if (flag == "--compacted-tokens") {
      st = number(o.synth.compacted_tokens_median);
    } else if (flag == "--policies") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      o.policies.clear();
      for (absl::string_view name : absl::StrSplit(*v, ',', absl::SkipEmpty())) {
        o.policies.emplace_back(name);
      }
      if (o.policies.empty()) return absl::InvalidArgumentError("--policies: empty list");
    } else if (flag == "--prefill-workers") {
      st = number(o.sim.prefill_workers);
    } else if (flag == "--decode-workers") {
      st = number(o.sim.decode_workers);
    } else if (flag == "--instances") {
      st = number(o.sim.colocated_instances);
    } else if (flag == "--kv-capacity") {
      st = number(o.sim.admission.capacity_tokens);
    } else if (flag == "--high-water") {
      st = number(o.sim.admission.high_water);
    } else if (flag == "--max-direct-append") {
      st = number(o.sim.admission.max_direct_append_tokens);
    } else if (flag == "--accounting") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (*v == "conservative") {
        o.sim.admission.accounting = kvc_router::CapacityAccounting::kConservative;
      } else if (*v == "incremental") {
        o.sim.admission.accounting = kvc_router::CapacityAccounting::kIncremental;
      } else {
        return absl::InvalidArgumentError("--accounting: expected conservative or incremental");
      }
    } else if (flag == "--admit-attempts") {
      st = number(o.env.max_admit_attempts);
    } else if (flag == "--reject-threshold") {
      st = number(o.env.reject_threshold);
    } else if (flag == "--sticky-bonus") {
      st = number(o.env.sticky_bonus);
    } else if (flag == "--kv-events") {
      st = no_value();
      o.env.kv_events = true;
    } else if (flag == "--cache-threshold") {
      st = number(o.env.cache_aware.cache_threshold);
    } else if (flag == "--balance-abs") {
      st = number(o.env.cache_aware.balance_abs_threshold);
    } else if (flag == "--balance-rel") {
      st = number(o.env.cache_aware.balance_rel_threshold);
    } else if (flag == "--no-prefix-cache") {
      st = no_value();
      o.sim.prefix_cache = false;
    } else if (flag == "--loop") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (*v == "closed") {
        o.sim.loop = LoopMode::kClosed;
      } else if (*v == "open") {
        o.sim.loop = LoopMode::kOpen;
      } else {
        return absl::InvalidArgumentError("--loop: expected closed or open");
      }
    } else if (flag == "--transfer") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      if (*v != "tcp" && *v != "rdma") return absl::InvalidArgumentError("--transfer: expected tcp or rdma");
      o.transfer = *v;
    } else if (flag == "--transfer-gbytes-per-s" || flag == "--transfer-setup" ||
               flag == "--kv-bytes-per-token" || flag == "--prefill-overhead" ||
               flag == "--prefill-per-token" || flag == "--prefill-attention" ||
               flag == "--decode-step-base" || flag == "--decode-step-per-request" ||
               flag == "--decode-step-per-token" || flag == "--admit-rpc") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      o.cost_overrides[flag] = *v;
    } else if (flag == "--json" || flag == "--csv" || flag == "--plot" || flag == "--plot-script" ||
               flag == "--title") {
      absl::StatusOr<std::string> v = value();
      if (!v.ok()) return v.status();
      (flag == "--json"          ? o.json_path
       : flag == "--csv"         ? o.csv_path
       : flag == "--plot"        ? o.plot_path
       : flag == "--plot-script" ? o.plot_script
                                 : o.title) = *v;
    } else if (flag == "--quiet") {
      st = no_value();
      o.quiet = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag \"", args[i], "\" (see --help)"));
    }
    if (!st.ok()) return st;
  }
  if (o.synthetic == !o.trace_path.empty()) {
    return absl::InvalidArgumentError("give exactly one of --trace PATH and --synthetic");
  }
  if (o.synthetic && block_tokens_set) o.synth.block_tokens = *o.block_tokens;

  CostModel cost = o.transfer == "rdma" ? CostModel::Rdma() : CostModel::Tcp();
  for (const auto& [flag, text] : o.cost_overrides) {
    double v = 0;
    if (!ParseNumber(text, v)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": invalid number \"", text, "\""));
    }
    if (flag == "--transfer-gbytes-per-s") cost.transfer_bytes_per_s = v * 1e9;
    if (flag == "--transfer-setup") cost.transfer_setup_s = v;
    if (flag == "--kv-bytes-per-token") {
      if (v < 0 || v > 1e12 || v != std::floor(v)) {
        return absl::InvalidArgumentError("--kv-bytes-per-token: expected a whole number of bytes");
      }
      cost.kv_bytes_per_token = static_cast<uint64_t>(v);
    }
    if (flag == "--prefill-overhead") cost.prefill_overhead_s = v;
    if (flag == "--prefill-per-token") cost.prefill_per_token_s = v;
    if (flag == "--prefill-attention") cost.prefill_attention_s = v;
    if (flag == "--decode-step-base") cost.decode_step_base_s = v;
    if (flag == "--decode-step-per-request") cost.decode_step_per_request_s = v;
    if (flag == "--decode-step-per-token") cost.decode_step_per_context_token_s = v;
    if (flag == "--admit-rpc") cost.admit_rpc_s = v;
  }
  if (!o.cost_overrides.empty() &&
      (o.cost_overrides.count("--transfer-gbytes-per-s") || o.cost_overrides.count("--transfer-setup"))) {
    o.transfer = "custom";
  }
  o.sim.cost = cost;
  if (absl::Status s = o.sim.Validate(); !s.ok()) return s;
  o.env.prefill_workers = o.sim.prefill_workers;
  o.env.decode_workers = o.sim.decode_workers;
  o.env.colocated_instances = o.sim.colocated_instances;
  o.env.kv_capacity_tokens = o.sim.admission.capacity_tokens;
  for (const std::string& name : o.policies) {
    bool known = false;
    for (const auto& info : kvc_router::policy::ListPolicies()) known |= info.name == name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("--policies: unknown policy \"", name, "\" (see --help)"));
    }
  }
  return absl::OkStatus();
}

// gnuplot string literal (single quotes; a quote is doubled).
std::string GnuplotQuote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "''";
    else if (c == '\n') out += ' ';
    else out.push_back(c);
  }
  return out + "'";
}

std::string FindPlotScript(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::vector<std::string> candidates;
#ifdef KVC_REPLAY_PLOT_SCRIPT
  candidates.emplace_back(KVC_REPLAY_PLOT_SCRIPT);
#endif
  candidates.emplace_back("scripts/plot_replay.gnuplot");
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back((exe.parent_path() / "../share/kvc_router/plot_replay.gnuplot").string());
  }
  for (const std::string& c : candidates) {
    if (std::filesystem::exists(c, ec)) return c;
  }
  return candidates.front();
}

absl::Status DrawPlot(const kvc_router::sim::ReplayReport& report, const Options& o) {
  char dir_template[] = "/tmp/kvc-replay-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return absl::UnavailableError("cannot create a temporary directory for the plot data");
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  if (absl::Status s = kvc_router::sim::WritePlotData(report, dir); !s.ok()) return s;
  std::string names;
  for (const auto& r : report.results) absl::StrAppend(&names, names.empty() ? "" : " ", r.name);
  const std::string title = o.title.empty()
                                ? absl::StrCat("kvc-replay: ", report.workload)
                                : o.title;
  const std::string script = FindPlotScript(o.plot_script);
  const std::string vars = absl::StrCat("datadir=", GnuplotQuote(dir), "; outfile=",
                                        GnuplotQuote(o.plot_path), "; policies=",
                                        GnuplotQuote(names), "; plottitle=", GnuplotQuote(title));
  std::vector<std::string> argv_strings = {"gnuplot", "-e", vars, script};
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv.data(), environ) != 0) {
    return absl::UnavailableError(
        "cannot run gnuplot (install it: apt-get install gnuplot-nox)");
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("gnuplot failed drawing ", o.plot_path,
                                            " with script ", script));
  }
  return absl::OkStatus();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  Options o;
  bool help = false;
  if (absl::Status s = ParseArgs(argc, argv, o, help); !s.ok()) {
    std::cerr << "kvc-replay: " << s.message() << "\n";
    return kExitUsage;
  }
  if (help) {
    PrintHelp();
    return 0;
  }

  absl::StatusOr<Trace> trace;
  if (o.synthetic) {
    trace = kvc_router::sim::GenerateSynthetic(o.synth);
  } else {
    kvc_router::sim::TraceOptions topts;
    topts.block_tokens = o.block_tokens.value_or(512);
    topts.hub_fanout = o.hub_fanout;
    trace = kvc_router::sim::LoadTraceFile(
        o.trace_path, o.format == "multiturn" ? TraceFormat::kMultiturn : TraceFormat::kMooncake, topts);
  }
  if (!trace.ok()) {
    std::cerr << "kvc-replay: " << trace.status().message() << "\n"
              << "kvc-replay: refusing to replay a trace it cannot read\n";
    return kExitFailure;
  }
  o.env.block_tokens = trace->block_tokens;

  kvc_router::sim::ReplayReport report = kvc_router::sim::ReplayReport::ForTrace(*trace);
  report.prefill_workers = o.sim.prefill_workers;
  report.decode_workers = o.sim.decode_workers;
  report.colocated_instances = o.env.instances();
  report.admission = o.sim.admission;
  report.max_admit_attempts = o.env.max_admit_attempts;
  report.transfer = o.transfer;
  report.cost = o.sim.cost;
  report.loop = o.sim.loop;
  report.seed = o.synth.seed;

  const bool tty = isatty(STDERR_FILENO) != 0;
  std::vector<double> wall;
  for (const std::string& name : o.policies) {
    absl::StatusOr<std::unique_ptr<kvc_router::policy::RoutingPolicy>> policy =
        kvc_router::policy::MakePolicy(name, o.env);
    if (!policy.ok()) {
      std::cerr << "kvc-replay: " << policy.status().message() << "\n";
      return kExitUsage;
    }
    const auto start = std::chrono::steady_clock::now();
    auto last_print = start;
    bool printed = false;
    SimConfig config = o.sim;
    if (!o.quiet) {
      config.progress_every = std::max<uint64_t>(1, trace->turns.size() / 200);
      config.progress = [&](uint64_t done, uint64_t total, double sim_time) {
        const auto now = std::chrono::steady_clock::now();
        const double since_start = std::chrono::duration<double>(now - start).count();
        const double since_print = std::chrono::duration<double>(now - last_print).count();
        if (since_start < 1.0 || since_print < (tty ? 0.25 : 5.0)) return;
        last_print = now;
        printed = true;
        std::cerr << absl::StrFormat("%s  %-8s %llu/%llu requests, simulated %.0f s%s",
                                     tty ? "\r" : "", name, static_cast<unsigned long long>(done),
                                     static_cast<unsigned long long>(total), sim_time,
                                     tty ? "   " : "\n");
        std::cerr.flush();
      };
    }
    absl::StatusOr<kvc_router::sim::PolicyResult> result =
        kvc_router::sim::Simulator::Run(*trace, **policy, config);
    if (printed && tty) std::cerr << "\r" << std::string(72, ' ') << "\r";
    if (!result.ok()) {
      std::cerr << "kvc-replay: " << result.status().message() << "\n";
      return kExitFailure;
    }
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    report.results.push_back(std::move(*result));
  }

  std::cout << kvc_router::sim::FormatTable(report, wall);
  std::cout.flush();
  int rc = 0;
  if (!o.json_path.empty()) {
    if (absl::Status s = WriteFile(o.json_path, kvc_router::sim::FormatJson(report)); !s.ok()) {
      std::cerr << "kvc-replay: " << s.message() << "\n";
      rc = kExitFailure;
    }
  }
  if (!o.csv_path.empty()) {
    if (absl::Status s = WriteFile(o.csv_path, kvc_router::sim::FormatCsv(report)); !s.ok()) {
      std::cerr << "kvc-replay: " << s.message() << "\n";
      rc = kExitFailure;
    }
  }
  if (!o.plot_path.empty()) {
    if (absl::Status s = DrawPlot(report, o); !s.ok()) {
      std::cerr << "kvc-replay: " << s.message() << "\n";
      rc = kExitFailure;
    } else {
      std::cerr << "kvc-replay: wrote " << o.plot_path << "\n";
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
