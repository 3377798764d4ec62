// kvc-replay: replay an LLM serving trace (or a generated agentic workload)
// through a simulated cluster under several routing policies and compare them
// side by side: Direct/Seed/Reseed/Fallback shares, prefix-cache hit rate,
// TTFT and E2E percentiles, per-worker TTFT, rejections, migrations,
// amplification and client load.
//
//   kvc-replay --synthetic --json out.json --plot out.png
//   kvc-replay --preset claude-code --concurrency 64 --profile h100-8b-hicache
//   kvc-replay --trace data/traces/mooncake/conversation_trace.jsonl --format mooncake
//
// The simulator, the policies and the reports live in the kvc_router::sim
// target (sim/include/kvc_sim/); this file only turns flags into their config
// structs, runs the replays and writes the outputs. Flags are CLI11 options
// bound straight to the struct fields, so `--help` shows the structs' own
// values. `--profile`, `--preset`, `--dp-defaults` and `--transfer` choose
// whole sets of values: they are read in a first pass over argv and applied
// before the other flags are bound, so --help shows the chosen profile's and
// preset's values and single flags override them. See docs/simulator.md.
//
// Exit status: 0 success, 1 a replay or an output failed, 2 bad usage.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvc_router/version.hpp"
#include "kvc_sim/cost_model.hpp"
#include "kvc_sim/policies/registry.hpp"
#include "kvc_sim/profiles.hpp"
#include "kvc_sim/report.hpp"
#include "kvc_sim/simulator.hpp"
#include "kvc_sim/synthetic.hpp"
#include "kvc_sim/trace.hpp"
#include "kvc_sim/ttft_floor.hpp"

extern char** environ;

namespace {

namespace sim = kvc_router::sim;
using kvc_router::CapacityAccounting;
using sim::CacheAwareOptions;
using sim::CostModel;
using sim::LoopMode;
using sim::Trace;
using sim::TraceFormat;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// The flags that choose whole sets of values (first pass).
struct BaseChoices {
  std::string profile = sim::profile_detail::H100With8B().name;  // SimConfig's default
  std::string preset = sim::SyntheticConfig{}.name;
  std::string dp_defaults = "launcher";  // PolicySetup's default
  std::string transfer;                  // tcp | rdma; empty: the profile's link
};

struct Options {
  // Input.
  std::string trace_path;
  TraceFormat format = TraceFormat::kMooncake;
  sim::TraceOptions trace_options;
  bool synthetic = false;
  sim::SyntheticConfig synth;
  // What runs.
  std::vector<std::string> policies = {"kvc", "kvc-v1", "pd", "pd-sglang", "dp", "kvc-colo"};
  sim::SimConfig sim;
  sim::PolicySetup setup;
  std::string link;
  // The generator's flags, refused with --trace.
  std::vector<const CLI::Option*> generator_flags;
  // Output.
  std::string json_path, csv_path, requests_csv_path, plot_path, plot_script, title;
  bool quiet = false;
};

// --- first pass ----------------------------------------------------------

// The value of the last `--name V` or `--name=V` before a "--", if any. A
// flag without a value is left for CLI11 to report.
std::optional<std::string> ScanFlag(int argc, char** argv, std::string_view name) {
  std::optional<std::string> value;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == name) {
      if (i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0) value = argv[++i];
    } else if (arg.size() > name.size() && arg.rfind(name, 0) == 0 && arg[name.size()] == '=') {
      value = std::string(arg.substr(name.size() + 1));
    }
  }
  return value;
}

BaseChoices ScanBaseChoices(int argc, char** argv) {
  BaseChoices base;
  if (auto v = ScanFlag(argc, argv, "--profile")) base.profile = *v;
  if (auto v = ScanFlag(argc, argv, "--preset")) base.preset = *v;
  if (auto v = ScanFlag(argc, argv, "--dp-defaults")) base.dp_defaults = *v;
  if (auto v = ScanFlag(argc, argv, "--transfer")) base.transfer = *v;
  return base;
}

// Sets the structs from the profile, the preset, the cache-aware defaults
// and the transfer shortcut.
absl::Status ApplyBaseChoices(const BaseChoices& base, Options& o) {
  absl::StatusOr<sim::HardwareProfile> profile = sim::FindProfile(base.profile);
  if (!profile.ok()) return profile.status();
  o.sim.admission.capacity_tokens = profile->kv_capacity_tokens;
  o.sim.cost = profile->cost;
  o.sim.host_tier = profile->host_tier;
  o.link = profile->link;
  if (!base.transfer.empty()) {
    if (base.transfer != "tcp" && base.transfer != "rdma") {
      return absl::InvalidArgumentError(
          absl::StrCat("--transfer: expected tcp or rdma, got \"", base.transfer, "\""));
    }
    const CostModel link = base.transfer == "tcp" ? CostModel::LoopbackTcp() : CostModel::Rdma();
    o.sim.cost.transfer_setup_s = link.transfer_setup_s;
    o.sim.cost.transfer_bytes_per_s = link.transfer_bytes_per_s;
    o.link = base.transfer == "tcp" ? "tcp-loopback" : "rdma-200g";  // as profiles.hpp names them
  }
  absl::StatusOr<sim::SyntheticConfig> preset = sim::SyntheticPreset(base.preset);
  if (!preset.ok()) return preset.status();
  o.synth = *std::move(preset);
  if (base.dp_defaults == "launcher") {
    o.setup.cache_aware = CacheAwareOptions::Launcher();
  } else if (base.dp_defaults == "rust") {
    o.setup.cache_aware = CacheAwareOptions::Rust();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dp-defaults: expected launcher or rust, got \"", base.dp_defaults, "\""));
  }
  return absl::OkStatus();
}

// --- flags -----------------------------------------------------------------

// Whole numbers: decimal digits only (CLI11 alone would wrap "-1" into a
// huge unsigned value and read "010" as octal).
CLI::Validator WholeNumber() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
          return absl::StrCat("expected a whole number >= 0, got \"", s, "\"");
        }
        s.erase(0, std::min(s.find_first_not_of('0'), s.size() - 1));
        return {};
      },
      "", "whole");
}

// Finite numbers >= 0.
CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v) || !std::isfinite(v) || v < 0) {
          return absl::StrCat("expected a finite number >= 0, got \"", s, "\"");
        }
        return {};
      },
      "", "non-negative");
}

CLI::Validator NotZero() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (CLI::detail::lexical_cast(s, v) && v == 0) {
          return absl::StrCat("expected a number > 0, got \"", s, "\"");
        }
        return {};
      },
      "", "not-zero");
}

enum class Sign { kNonNegative, kPositive };

// An option bound to `field`, showing the field's current value as default.
template <class T>
CLI::Option* AddNumber(CLI::App& app, const std::string& name, T& field, const std::string& help,
                       Sign sign = Sign::kNonNegative) {
  CLI::Option* opt = app.add_option(name, field, help)->capture_default_str();
  if constexpr (std::is_integral_v<T>) {
    opt->transform(WholeNumber());
  } else {
    opt->check(NonNegative());
  }
  if (sign == Sign::kPositive) opt->check(NotZero());
  return opt;
}

// A bandwidth field in bytes/s set in GB/s.
CLI::Option* AddGbytesPerS(CLI::App& app, const std::string& name, double& bytes_per_s,
                           const std::string& help) {
  return app
      .add_option_function<double>(
          name, [&bytes_per_s](const double& g) { bytes_per_s = g * 1e9; }, help)
      ->check(NonNegative())
      ->check(NotZero())
      ->default_str(absl::StrCat(bytes_per_s / 1e9));
}

// One of a few named values, bound to `field`.
template <class T>
CLI::Option* AddChoice(CLI::App& app, const std::string& name, T& field,
                       std::vector<std::pair<std::string, T>> choices, const std::string& help) {
  std::vector<std::string> names;
  std::string current;
  for (const auto& [choice, value] : choices) {
    names.push_back(choice);
    if (value == field) current = choice;
  }
  return app
      .add_option_function<std::string>(
          name,
          [&field, choices](const std::string& v) {
            for (const auto& [choice, value] : choices) {
              if (choice == v) field = value;
            }
          },
          help)
      ->check(CLI::IsMember(names).description(""))
      ->type_name(CLI::detail::join(names, "|"))
      ->default_str(current);
}

std::string HelpFooter(const BaseChoices& base) {
  std::string out = "policies (--policies, comma-separated; \"all\" runs every one):\n";
  for (const sim::PolicyInfo& info : sim::ListPolicies()) {
    absl::StrAppend(
        &out,
        absl::StrFormat("  %-10s %-5s %s\n", std::string(info.name),
                        info.topology == kvc_router::policy::Topology::kColocated ? "colo" : "P/D",
                        std::string(info.description)));
  }
  out += "\nhardware profiles (--profile; applied first, single flags override it):\n";
  for (const sim::HardwareProfile& p : sim::HardwareProfiles()) {
    absl::StrAppend(&out, absl::StrFormat("  %s %-16s K_d %d, link %s\n      %s\n",
                                          p.name == base.profile ? "*" : " ", p.name,
                                          p.kv_capacity_tokens, p.link, p.description));
  }
  out += "\nsynthetic presets (--preset; implies --synthetic):\n";
  for (std::string_view name : sim::kSyntheticPresetNames) {
    absl::StrAppend(&out, "  ", name == base.preset ? "* " : "  ", std::string(name), "\n");
  }
  out +=
      "\nDefaults shown are those of the chosen profile and preset (marked *). The replay is\n"
      "deterministic: the same inputs and --seed give byte-identical JSON and CSV.\n"
      "Exit status: 0 ok, 1 a replay or an output failed, 2 bad usage.";
  return out;
}

// Binds every flag to its field in `o` (and the first-pass flags to `base`,
// whose values are already applied).
void BindFlags(CLI::App& app, Options& o, BaseChoices& base) {
  std::vector<std::string> profiles;
  for (const sim::HardwareProfile& p : sim::HardwareProfiles()) profiles.push_back(p.name);
  std::vector<std::string> presets(sim::kSyntheticPresetNames.begin(),
                                   sim::kSyntheticPresetNames.end());
  std::vector<std::string> policy_names;
  for (const sim::PolicyInfo& info : sim::ListPolicies()) policy_names.emplace_back(info.name);
  policy_names.emplace_back("all");

  // Input.
  const std::string input = "input";
  app.add_option("--trace", o.trace_path, "JSONL trace to replay")->type_name("PATH")->group(input);
  AddChoice(app, "--format", o.format,
            {{"mooncake", TraceFormat::kMooncake}, {"multiturn", TraceFormat::kMultiturn}},
            "trace format")
      ->group(input);
  AddNumber(
      app, "--block-tokens", o.trace_options.block_tokens,
      absl::StrCat("tokens per trace block (synthetic: the preset's, ", o.synth.block_tokens, ")"),
      Sign::kPositive)
      ->group(input);
  AddNumber(app, "--hub-fanout", o.trace_options.hub_fanout,
            "mooncake: a prefix branching into N+ next blocks is a shared prompt, not a "
            "conversation",
            Sign::kPositive)
      ->group(input);
  app.add_flag("--synthetic", o.synthetic, "generate an agentic workload (the --preset)")
      ->group(input);
  app.add_option("--preset", base.preset, "synthetic workload preset (implies --synthetic)")
      ->capture_default_str()
      ->check(CLI::IsMember(presets).description(""))
      ->type_name(CLI::detail::join(presets, "|"))
      ->group(input);

  // The generator (defaults: the preset's).
  sim::SyntheticConfig& s = o.synth;
  const std::string gen = absl::StrCat("synthetic generator (preset ", base.preset, ")");
  CLI::Option* const generator[] = {
      AddNumber(app, "--seed", s.seed, "generator seed"),
      AddNumber(app, "--sessions", s.sessions, "sessions", Sign::kPositive),
      AddNumber(app, "--requests", s.requests, "total requests (turns)", Sign::kPositive),
      AddNumber(app, "--turns-sigma", s.turns_sigma, "log-normal spread of turns per session"),
      AddNumber(app, "--min-turns", s.min_turns, "turns of the shortest session", Sign::kPositive),
      AddNumber(app, "--session-interarrival", s.session_interarrival_s,
                "mean seconds between session starts"),
      AddNumber(app, "--system-prompt-tokens", s.system_prompt_tokens,
                "prompt shared by all sessions"),
      AddNumber(app, "--task-tokens", s.task_tokens_median, "median first-turn task prompt"),
      AddNumber(app, "--task-sigma", s.task_tokens_sigma, "log-normal sigma of the task"),
      AddNumber(app, "--max-task-fraction", s.max_task_fraction,
                "largest task as a fraction of --max-context"),
      AddNumber(app, "--append-tokens", s.append_tokens_median, "median new tokens per later turn"),
      AddNumber(app, "--append-sigma", s.append_tokens_sigma, "log-normal sigma of appends"),
      AddNumber(app, "--max-append-tokens", s.max_append_tokens, "largest append", Sign::kPositive),
      AddNumber(app, "--output-tokens", s.output_tokens_median, "median output tokens"),
      AddNumber(app, "--output-sigma", s.output_tokens_sigma, "log-normal sigma of outputs"),
      AddNumber(app, "--max-output-tokens", s.max_output_tokens, "largest output", Sign::kPositive),
      AddNumber(app, "--tool-delay", s.tool_delay_median_s,
                "median tool/think delay between turns, seconds"),
      AddNumber(app, "--tool-delay-sigma", s.tool_delay_sigma, "log-normal sigma of delays"),
      AddNumber(app, "--max-context", s.max_context_tokens, "compaction threshold, tokens",
                Sign::kPositive),
      AddNumber(app, "--compacted-tokens", s.compacted_tokens_median,
                "median summary size after compaction"),
  };
  for (CLI::Option* opt : generator) {
    opt->group(gen);
    o.generator_flags.push_back(opt);
  }

  // Policies.
  const std::string pol = "policies";
  app.add_option("--policies", o.policies, "comma-separated policies to run")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember(policy_names).description(""))
      ->type_name("LIST")
      ->group(pol);
  kvc_router::RouterConfig& router = o.setup.router;
  AddNumber(app, "--admit-attempts", router.max_admit_attempts,
            "KVC epsilon: admission attempts before Fallback, 0 = |D|")
      ->group(pol);
  AddNumber(app, "--reject-threshold", router.reject_threshold, "KVC tau_reject", Sign::kPositive)
      ->group(pol);
  AddNumber(app, "--sticky-bonus", router.sticky_bonus, "KVC alpha, blocks")->group(pol);
  app.add_flag("--kv-events", o.setup.kv_events, "KVC forgets sessions the workers evict")
      ->group(pol);
  app.add_option("--dp-defaults", base.dp_defaults,
                 "dp/pd-sglang option set: the SGLang router launcher's or the Rust router's")
      ->capture_default_str()
      ->check(CLI::IsMember({"launcher", "rust"}).description(""))
      ->type_name("launcher|rust")
      ->group(pol);
  CacheAwareOptions& ca = o.setup.cache_aware;
  AddNumber(app, "--cache-threshold", ca.cache_threshold,
            "dp/pd-sglang: prefix match rate to follow the cache")
      ->group(pol);
  AddNumber(app, "--balance-abs", ca.balance_abs_threshold,
            "dp/pd-sglang: absolute load imbalance threshold")
      ->group(pol);
  AddNumber(app, "--balance-rel", ca.balance_rel_threshold,
            "dp/pd-sglang: relative load imbalance threshold")
      ->group(pol);
  AddNumber(app, "--eviction-interval", ca.eviction_interval_s,
            "dp/pd-sglang: seconds between tree evictions")
      ->group(pol);
  AddNumber(app, "--max-tree-chars", ca.max_tree_chars,
            "dp/pd-sglang: characters the radix tree keeps")
      ->group(pol);

  kvc_router::policy::AffinityPolicyOptions& af = o.setup.affinity;
  AddNumber(app, "--high-cache-fraction", af.high_cache_fraction,
            "unified: a new session goes where more than this fraction of its input is cached")
      ->group(pol);
  AddNumber(app, "--hot-prefill-tokens", af.hot_prefill_tokens,
            "ear: T_hot, pending prefill tokens that make an instance hot", Sign::kPositive)
      ->group(pol);
  app.add_option("--close-sessions", o.sim.close_sessions,
                 "the client closes each session after its last request; policies forget it "
                 "and workers let its KV go first (SGLang's session-aware radix cache)")
      ->capture_default_str()
      ->group(pol);
  app.add_option("--migration-cost", af.migration_cost.enabled,
                 "ear: a move must save T_hot tokens of prefill after paying for the KV move "
                 "(false: the target must stay under T_hot/2)")
      ->capture_default_str()
      ->group(pol);
  app.add_option("--memory-trigger", af.memory_trigger,
                 "ear: also migrate off instances whose live session contexts exceed K_d")
      ->capture_default_str()
      ->group(pol);
  app.add_option("--memory-move-lowers-overflow", af.memory_move_lowers_overflow,
                 "ear: a memory move may go where the session does not wholly fit if it lowers "
                 "the live-context tokens beyond K_d, summed over home and target, by T_hot")
      ->capture_default_str()
      ->group(pol);
  AddNumber(app, "--migration-cooldown", af.migration_cooldown_s,
            "ear: seconds before a session may move again")
      ->group(pol);
  app.add_option("--hold-new-sessions", af.hold_new_sessions,
                 "ear: load control, a new session's first turn waits at the gateway while "
                 "live session contexts would exceed --hold-memory-fraction of the cluster's KV")
      ->capture_default_str()
      ->group(pol);
  AddNumber(app, "--hold-memory-fraction", af.hold_memory_fraction,
            "ear: share of the cluster's reusable KV (pools and host tiers) that live session "
            "contexts may fill before new sessions wait, in (0, 1]",
            Sign::kPositive)
      ->group(pol);
  AddNumber(app, "--hold-min-return-rate", af.hold_min_return_rate,
            "ear: hold only while at least this share of the turns placed lately continued a "
            "session")
      ->group(pol);
  AddNumber(app, "--max-hold", af.max_hold_s,
            "ear: seconds a first turn may wait at the gateway before it is placed anyway")
      ->group(pol);
  AddNumber(app, "--arrival-window-fraction", af.arrival_window_fraction,
            "ear: a new session's first turn waits up to this share of its own prefill time "
            "for shorter first turns arriving with it, which go first (0 = off; in [0, 1])")
      ->group(pol);
  AddNumber(app, "--max-arrival-window", af.max_arrival_window_s,
            "ear: longest such wait, seconds")
      ->group(pol);
  AddNumber(app, "--session-idle", af.session_idle_s,
            "ear: seconds after which an idle session stops counting against its instance's memory",
            Sign::kPositive)
      ->group(pol);

  // Cluster and load.
  const std::string clu = "cluster and load";
  app.add_option("--profile", base.profile, "hardware profile: K_d, cost model, host tier")
      ->capture_default_str()
      ->check(CLI::IsMember(profiles).description(""))
      ->type_name("NAME")
      ->group(clu);
  AddNumber(app, "--prefill-workers", o.sim.cluster.prefill_workers, "|P|")->group(clu);
  AddNumber(app, "--decode-workers", o.sim.cluster.decode_workers, "|D|", Sign::kPositive)
      ->group(clu);
  AddNumber(app, "--instances", o.sim.cluster.colocated_instances,
            "colocated instances, 0 = |P|+|D|")
      ->group(clu);
  AddNumber(app, "--kv-capacity", o.sim.admission.capacity_tokens,
            "K_d, KV tokens per worker (the profile's)", Sign::kPositive)
      ->group(clu);
  AddNumber(app, "--high-water", o.sim.admission.high_water, "rho, in (0, 1]", Sign::kPositive)
      ->group(clu);
  AddNumber(app, "--max-direct-append", o.sim.admission.max_direct_append_tokens,
            "tau_append, tokens")
      ->group(clu);
  AddChoice(app, "--accounting", o.sim.admission.accounting,
            {{"conservative", CapacityAccounting::kConservative},
             {"incremental", CapacityAccounting::kIncremental}},
            "admission charges the whole input (seed) or only the growth")
      ->group(clu);
  AddNumber(app, "--host-tier-tokens", o.sim.host_tier.capacity_tokens,
            "host-memory KV tier per worker, tokens, 0 = none")
      ->group(clu);
  AddGbytesPerS(app, "--host-reload-gbytes-per-s", o.sim.host_tier.reload_bytes_per_s,
                "host tier -> GPU reload bandwidth, GB/s")
      ->group(clu);
  AddChoice(app, "--loop", o.sim.loop, {{"closed", LoopMode::kClosed}, {"open", LoopMode::kOpen}},
            "closed: next turn after the previous one finished plus its delay; open: every "
            "turn at its trace time")
      ->group(clu);
  AddNumber(app, "--concurrency", o.sim.concurrency,
            absl::StrCat("closed loop: at most N sessions active at once, 0 = unlimited "
                         "(synthetic workloads: the preset's, ",
                         o.synth.client_concurrency, ")"))
      ->group(clu);
  app.add_flag_callback(
         "--no-prefix-cache", [&o] { o.sim.prefix_cache = false; },
         "no worker ever reuses KV (for checks)")
      ->group(clu);

  // Cost model.
  const std::string cost = "cost model (the profile's; docs/simulator.md lists sources)";
  CostModel& c = o.sim.cost;
  app.add_option("--transfer", base.transfer,
                 absl::StrCat("KV link shortcut: tcp (",
                              CostModel::LoopbackTcp().transfer_bytes_per_s / 1e9,
                              " GB/s loopback) or rdma (",
                              CostModel::Rdma().transfer_bytes_per_s / 1e9, " GB/s); now ", o.link))
      ->check(CLI::IsMember({"tcp", "rdma"}).description(""))
      ->type_name("tcp|rdma")
      ->group(cost);
  AddGbytesPerS(app, "--transfer-gbytes-per-s", c.transfer_bytes_per_s, "KV link bandwidth, GB/s")
      ->group(cost);
  AddNumber(app, "--transfer-setup", c.transfer_setup_s, "KV transfer setup, s")->group(cost);
  AddNumber(app, "--kv-bytes-per-token", c.kv_bytes_per_token, "KV bytes per token")->group(cost);
  AddNumber(app, "--prefill-overhead", c.prefill_overhead_s, "per prefill, s")->group(cost);
  AddNumber(app, "--prefill-per-token", c.prefill_per_token_s, "per new token, s")->group(cost);
  AddNumber(app, "--prefill-attention", c.prefill_attention_s, "per new x attended token, s")
      ->group(cost);
  AddNumber(app, "--chunked-prefill", c.chunked_prefill_tokens, "prefill chunk, tokens",
            Sign::kPositive)
      ->group(cost);
  AddNumber(app, "--decode-step-base", c.decode_step_base_s, "per decode step, s")->group(cost);
  AddNumber(app, "--decode-step-per-request", c.decode_step_per_request_s,
            "per sequence in the batch, s")
      ->group(cost);
  AddNumber(app, "--decode-step-per-token", c.decode_step_per_context_token_s,
            "per context token in the batch, s")
      ->group(cost);
  AddNumber(app, "--admit-rpc", c.admit_rpc_s, "admission RPC round trip, s")->group(cost);

  // Output.
  // Fault injection (kvc_sim/faults.hpp; docs/reliability.md).
  const std::string faults = "fault injection (off by default)";
  sim::FaultConfig& fault = o.sim.faults;
  AddNumber(app, "--fault-seed", fault.seed, "seed of every injected fault")->group(faults);
  AddNumber(app, "--fault-crash-interval", fault.crash_interval_s,
            "mean seconds between instance crashes (idle KV lost, then down), 0 = none")
      ->group(faults);
  AddNumber(app, "--fault-crash-downtime", fault.crash_downtime_s,
            "seconds a crashed instance is down: it answers no admission RPC, starts no "
            "request, and the affinity rules route around it")
      ->group(faults);
  AddNumber(app, "--fault-rpc-timeout", fault.rpc_timeout_rate,
            "probability that an admission RPC times out")
      ->group(faults);
  AddNumber(app, "--fault-event-drop", fault.event_drop_rate,
            "probability that an eviction event is lost")
      ->group(faults);
  AddNumber(app, "--fault-event-duplicate", fault.event_duplicate_rate,
            "probability that an eviction event is delivered twice")
      ->group(faults);
  AddNumber(app, "--fault-event-reorder", fault.event_reorder_rate,
            "probability that an eviction event arrives after later ones")
      ->group(faults);

  const std::string out = "output";
  app.add_option("--json", o.json_path, "results as JSON (top-level \"policies\" array)")
      ->type_name("PATH")
      ->group(out);
  app.add_option("--csv", o.csv_path, "one row per policy")->type_name("PATH")->group(out);
  app.add_option("--requests-csv", o.requests_csv_path,
                 "one row per request and policy (times, mode, instance, tokens)")
      ->type_name("PATH")
      ->group(out);
  app.add_option("--hit-bound", o.sim.hit_bound,
                 "also report each run's hit-rate bound: the offline optimum of its request "
                 "order with every pool as one cache")
      ->capture_default_str()
      ->group(out);
  app.add_option("--plot", o.plot_path, "TTFT CDF and mode shares, drawn by gnuplot")
      ->type_name("PATH.png")
      ->group(out);
  app.add_option("--plot-script", o.plot_script,
                 "the gnuplot script (default scripts/plot_replay.gnuplot)")
      ->type_name("PATH")
      ->group(out);
  app.add_option("--title", o.title, "plot title")->type_name("TEXT")->group(out);
  app.add_flag("--quiet", o.quiet, "no progress line")->group(out);
  app.set_version_flag("--version", kvc_router::kVersionString);
  app.footer(HelpFooter(base));
}

// Everything that needs more than one flag.
absl::Status FinishOptions(const CLI::App& app, Options& o) {
  o.synthetic = o.synthetic || app.count("--preset") > 0;
  if (o.synthetic == !o.trace_path.empty()) {
    return absl::InvalidArgumentError(
        "give exactly one of --trace PATH and --synthetic (or --preset NAME)");
  }
  if (o.synthetic && app.count("--concurrency") == 0 && o.sim.loop == LoopMode::kClosed) {
    o.sim.concurrency = o.synth.client_concurrency;  // presets are meant to run under load
  }
  if (o.synthetic) {
    for (const char* flag : {"--format", "--hub-fanout"}) {
      if (app.count(flag) > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, " applies to --trace, not to a synthetic workload"));
      }
    }
    if (app.count("--block-tokens") > 0) o.synth.block_tokens = o.trace_options.block_tokens;
    if (absl::Status s = o.synth.Validate(); !s.ok()) return s;
  } else {
    for (const CLI::Option* opt : o.generator_flags) {
      if (opt->count() > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            opt->get_name(), " shapes the synthetic workload: it needs --synthetic, not --trace"));
      }
    }
  }
  if (app.count("--transfer-gbytes-per-s") > 0 || app.count("--transfer-setup") > 0) {
    o.link = "custom";
  }
  // One source for the pools: the policies see what the simulator runs.
  o.setup.cluster = o.sim.cluster;
  o.setup.admission = o.sim.admission;
  o.setup.cost = o.sim.cost;
  o.setup.host_tier_tokens = o.sim.host_tier.capacity_tokens;
  if (absl::Status s = o.sim.Validate(); !s.ok()) return s;
  if (absl::Status s = o.setup.cache_aware.Validate(); !s.ok()) return s;
  if (absl::Status s = o.setup.affinity.Validate(); !s.ok()) return s;
  std::vector<std::string> names;
  for (std::string& name : sim::ExpandPolicyNames(o.policies)) {
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(std::move(name));
    }
  }
  if (names.empty()) return absl::InvalidArgumentError("--policies: empty list");
  o.policies = std::move(names);
  return absl::OkStatus();
}

// --- plot ------------------------------------------------------------------

// gnuplot string literal (single quotes; a quote is doubled).
std::string GnuplotQuote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "''";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out.push_back(c);
    }
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

absl::Status DrawPlot(const sim::ReplayReport& report, const Options& o) {
  char dir_template[] = "/tmp/kvc-replay-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) {
    return absl::UnavailableError("cannot create a temporary directory for the plot data");
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  if (absl::Status s = sim::WritePlotData(report, dir); !s.ok()) return s;
  std::string names;
  for (const auto& r : report.results) absl::StrAppend(&names, names.empty() ? "" : " ", r.name);
  const std::string title =
      !o.title.empty()
          ? o.title
          : absl::StrCat("kvc-replay: ", report.workload, " (", report.profile, ", ",
                         report.cluster.prefill_workers, "P+", report.cluster.decode_workers, "D",
                         report.concurrency == 0
                             ? std::string()
                             : absl::StrCat(", concurrency ", report.concurrency),
                         ")");
  const std::string script = FindPlotScript(o.plot_script);
  const std::string vars =
      absl::StrCat("datadir=", GnuplotQuote(dir), "; outfile=", GnuplotQuote(o.plot_path),
                   "; policies=", GnuplotQuote(names), "; plottitle=", GnuplotQuote(title));
  std::vector<std::string> argv_strings = {"gnuplot", "-e", vars, script};
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv.data(), environ) != 0) {
    return absl::UnavailableError("cannot run gnuplot (install it: apt-get install gnuplot-nox)");
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        absl::StrCat("gnuplot failed drawing ", o.plot_path, " with script ", script));
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

// --- main --------------------------------------------------------------------

int Run(int argc, char** argv) {
  Options o;
  BaseChoices base = ScanBaseChoices(argc, argv);
  if (absl::Status s = ApplyBaseChoices(base, o); !s.ok()) {
    std::cerr << "kvc-replay: " << s.message() << "\n";
    return kExitUsage;
  }
  CLI::App app(
      "Replays a trace (or a generated agentic workload) through a simulated cluster under\n"
      "each routing policy and prints one comparison table.",
      "kvc-replay");
  app.get_formatter()->column_width(36);
  BindFlags(app, o, base);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::cerr << "kvc-replay: " << e.what() << " (see --help)\n";
    return kExitUsage;
  }
  if (absl::Status s = FinishOptions(app, o); !s.ok()) {
    std::cerr << "kvc-replay: " << s.message() << "\n";
    return kExitUsage;
  }

  absl::StatusOr<Trace> trace = o.synthetic
                                    ? sim::GenerateSynthetic(o.synth)
                                    : sim::LoadTraceFile(o.trace_path, o.format, o.trace_options);
  if (!trace.ok()) {
    std::cerr << "kvc-replay: " << trace.status().message() << "\n"
              << "kvc-replay: refusing to replay a trace it cannot read\n";
    return kExitFailure;
  }
  o.setup.router.block_tokens = trace->block_tokens;

  // Every policy is built (fresh, used once) before the first replay, so a
  // bad knob is reported before minutes of replay.
  std::vector<sim::MadePolicy> made;
  for (const std::string& name : o.policies) {
    absl::StatusOr<sim::MadePolicy> policy = sim::MakePolicy(name, o.setup);
    if (!policy.ok()) {
      std::cerr << "kvc-replay: " << policy.status().message() << "\n";
      return kExitUsage;
    }
    made.push_back(*std::move(policy));
  }

  sim::ReplayReport report = sim::ReplayReport::ForTrace(*trace);
  report.SetConfig(o.sim, o.setup);
  // Indexed like trace->turns; Summary::Of sorts its argument, so it gets a copy.
  const std::vector<double> ttft_floor = sim::TtftFloor(*trace, o.sim.cost);
  {
    std::vector<double> sorted_floor = ttft_floor;
    report.ttft_floor_s = sim::Summary::Of(sorted_floor);
  }
  report.profile = base.profile;
  report.link = o.link;
  report.recommended_policy = std::string(sim::kRecommendedPolicy);
  if (o.synthetic) {
    report.preset = o.synth.name;
    report.seed = o.synth.seed;
  }

  const bool tty = isatty(STDERR_FILENO) != 0;
  std::vector<double> wall;
  // Per-request rows, kept as text while replaying (a row is ~80 bytes).
  std::string request_rows;
  if (!o.requests_csv_path.empty()) {
    request_rows =
        "policy,session,turn,issue_s,first_token_s,ttft_s,finish_s,instance,mode,refused,"
        "input_tokens,reusable_tokens,output_tokens,cached_tokens,placed_s,gateway_wait_s,"
        "ttft_floor_s,window_wait_s\n";
  }
  for (size_t i = 0; i < made.size(); ++i) {
    const std::string& name = o.policies[i];
    const auto start = std::chrono::steady_clock::now();
    auto last_print = start;
    bool printed = false;
    sim::SimConfig config = o.sim;
    if (!o.quiet) {
      config.progress_every = std::max<uint64_t>(1, trace->turns.size() / 200);
      config.progress = [&](uint64_t done, uint64_t total, double sim_time) {
        const auto now = std::chrono::steady_clock::now();
        const double since_start = std::chrono::duration<double>(now - start).count();
        const double since_print = std::chrono::duration<double>(now - last_print).count();
        if (since_start < 1.0 || since_print < (tty ? 0.25 : 5.0)) return;
        last_print = now;
        printed = true;
        std::cerr << absl::StrFormat("%s  %-9s %d/%d requests, simulated %.0f s%s", tty ? "\r" : "",
                                     name, done, total, sim_time, tty ? "   " : "\n");
        std::cerr.flush();
      };
    }
    if (!o.requests_csv_path.empty()) {
      config.on_request = [&](const sim::RequestRecord& r) {
        const sim::TraceTurn& turn = trace->turns[r.turn];
        // A refused request has no first token: its time fields stay empty.
        const std::string first_token =
            r.refused ? "" : absl::StrFormat("%.6f", r.first_token_s);
        const std::string ttft =
            r.refused ? "" : absl::StrFormat("%.6f", r.first_token_s - r.issue_s);
        absl::StrAppendFormat(
            &request_rows, "%s,%d,%d,%.6f,%s,%s,%.6f,%d,%s,%d,%d,%d,%d,%d,%.6f,%.9f,%.6f,%.9f\n", name,
            r.session,
            turn.turn, r.issue_s, first_token, ttft, r.finish_s,
            r.instance == kvc_router::kNoWorker ? -1 : static_cast<int64_t>(r.instance),
            kvc_router::DecisionModeName(r.mode), r.refused ? 1 : 0, turn.input_tokens,
            turn.reusable_tokens, turn.output_tokens, r.cached_tokens, r.placed_s,
            r.placed_s - r.issue_s, ttft_floor[r.turn], r.queued_s - r.issue_s);
      };
    }
    absl::StatusOr<sim::PolicyResult> result =
        sim::Simulator::Run(*trace, *made[i].policy, config, made[i].engine);
    if (printed && tty) std::cerr << "\r" << std::string(72, ' ') << "\r";
    if (!result.ok()) {
      std::cerr << "kvc-replay: " << result.status().message() << "\n";
      return kExitFailure;
    }
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    report.results.push_back(*std::move(result));
  }

  std::cout << sim::FormatTable(report, wall);
  if (o.sim.faults.any()) {
    for (const sim::PolicyResult& r : report.results) {
      std::cout << absl::StrFormat(
          "faults %-18s crashes %d (sessions lost %d, cached tokens lost %d, turns that "
          "waited for an instance %d), RPC timeouts %d, events dropped %d, duplicated %d, "
          "reordered %d\n",
          r.name, r.faults.crashes, r.faults.sessions_lost, r.faults.cached_tokens_lost,
          r.faults.turns_waited_for_instance, r.faults.rpc_timeouts,
          r.faults.events_dropped, r.faults.events_duplicated, r.faults.events_reordered);
    }
  }
  std::cout.flush();
  int rc = 0;
  auto fail = [&rc](const absl::Status& s) {
    std::cerr << "kvc-replay: " << s.message() << "\n";
    rc = kExitFailure;
  };
  if (!o.json_path.empty()) {
    if (absl::Status s = WriteFile(o.json_path, sim::FormatJson(report)); !s.ok()) fail(s);
  }
  if (!o.csv_path.empty()) {
    if (absl::Status s = WriteFile(o.csv_path, sim::FormatCsv(report)); !s.ok()) fail(s);
  }
  if (!o.requests_csv_path.empty()) {
    if (absl::Status s = WriteFile(o.requests_csv_path, request_rows); !s.ok()) fail(s);
  }
  if (!o.plot_path.empty()) {
    if (absl::Status s = DrawPlot(report, o); !s.ok()) {
      fail(s);
    } else {
      std::cerr << "kvc-replay: wrote " << o.plot_path << "\n";
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
