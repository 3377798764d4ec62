// kvc_sim/synthetic.hpp
//
// A built-in generator of agentic (coding-agent) workloads. Two presets:
//  * "swe-bench" (`SyntheticConfig::SweBench()`, also the default-constructed
//    config): shaped by the seeds' SWE-bench replay: 52 sessions and ~4,450
//    requests, contexts of 10^4-10^5 tokens growing turn by turn, appends
//    (tool results) of 10^2-10^3 tokens, outputs of 10^2-10^3 tokens, tool
//    delays of seconds between a turn's end and the next turn, and heavy skew
//    in how long sessions run.
//  * "claude-code" (`SyntheticConfig::ClaudeCode()`): shaped like a public
//    Claude Code session profile: first prompts of ~57k tokens (median ~47k),
//    ~6k new tokens per later turn, ~1k output, a 200k-token window with
//    compaction, heavy-tailed tool/think delays, about a dozen turns per
//    session over 1,000 sessions.
// Every parameter is a field of `SyntheticConfig` (and most are kvc-replay
// flags); docs/simulator.md explains each default.
//
// The generator is deterministic: its own SplitMix64 stream and its own
// distributions (no <random> distributions, whose output differs between
// standard libraries), so one seed gives the same trace everywhere.
//
// Each session shares a system prompt with every other session, then has
// its own task. When a context would grow past `max_context_tokens` the agent
// compacts it: the next prompt is the system prompt plus a summary, a new
// context generation with nothing reusable from before. `Validate()` makes
// sure every turn's prompt plus output fits in `max_context_tokens`.
//
//   kvc_router::sim::SyntheticConfig config;   // the seed-shaped (swe-bench) defaults
//   absl::StatusOr<kvc_router::sim::Trace> trace = kvc_router::sim::GenerateSynthetic(config);
//   absl::StatusOr<kvc_router::sim::SyntheticConfig> cc =
//       kvc_router::sim::SyntheticPreset("claude-code");
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/detail/splitmix.hpp"
#include "kvc_sim/trace.hpp"

namespace kvc_router::sim {

// Deterministic random numbers: SplitMix64 plus portable distributions.
class SimRng {
 public:
  explicit SimRng(uint64_t seed) : bits_(seed) {}

  uint64_t Next() { return bits_.Next(); }
  // Uniform in (0, 1): never 0, so logarithms are finite.
  double Uniform01() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }
  double Normal() {
    // Box-Muller; one value per call keeps the stream position simple.
    const double u1 = Uniform01();
    const double u2 = Uniform01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  double LogNormal(double median, double sigma) { return median * std::exp(sigma * Normal()); }
  double Exponential(double mean) { return -mean * std::log(Uniform01()); }

 private:
  kvc_router::detail::SplitMix64 bits_;
};

// The field initialisers are the "swe-bench" preset; `ClaudeCode()` is the
// other one. `name` only labels the generated trace's description.
struct SyntheticConfig {
  std::string name = "swe-bench";
  uint32_t sessions = 52;
  // Total requests (turns) over all sessions.
  uint64_t requests = 4450;
  // Spread (log-normal sigma) of turns per session: the session skew.
  double turns_sigma = 1.0;
  uint32_t min_turns = 2;
  // Mean gap between session starts (exponential), seconds.
  double session_interarrival_s = 120.0;
  // Prompt shared by all sessions (its full blocks hash alike everywhere).
  uint64_t system_prompt_tokens = 2048;
  // The task prompt of a session's first turn, after the system prompt.
  double task_tokens_median = 7000;
  double task_tokens_sigma = 0.5;
  // The task is at most this fraction of `max_context_tokens`.
  double max_task_fraction = 0.5;
  // New tokens per later turn (tool results, user messages).
  double append_tokens_median = 300;
  double append_tokens_sigma = 0.9;
  // Output tokens per turn.
  double output_tokens_median = 200;
  double output_tokens_sigma = 0.7;
  // Tool/think delay between a turn's end and the next turn, seconds.
  double tool_delay_median_s = 2.0;
  double tool_delay_sigma = 1.0;
  // Compaction: a prompt that would pass this restarts from the system
  // prompt plus a summary of about `compacted_tokens_median` tokens.
  uint64_t max_context_tokens = 40000;
  double compacted_tokens_median = 9000;
  // Clamps that keep single draws within sane bounds.
  uint64_t max_append_tokens = 16384;
  uint64_t max_output_tokens = 8192;
  uint32_t block_tokens = 256;
  uint64_t seed = 1;
  // Sessions active at once when the workload is replayed (SimConfig's
  // concurrency, unless the caller sets one): the seeds evaluated at 32.
  // The generator itself ignores it.
  uint32_t client_concurrency = 32;

  // The seeds' SWE-bench replay (the default-constructed config).
  static SyntheticConfig SweBench() { return SyntheticConfig{}; }

  // A public Claude Code session profile:
  //  * first prompt = a 12,000-token shared system prompt + a log-normal task
  //    of median 35,000 and sigma 0.709: median 12,000 + 35,000 = 47,000 and
  //    mean 12,000 + 35,000 * exp(0.709^2 / 2) = 12,000 + 45,000 = 57,000;
  //  * new tokens per later turn: median 4,000, sigma sqrt(2 ln 1.5) = 0.900,
  //    so mean 4,000 * 1.5 = 6,000;
  //  * output: median 800, sigma sqrt(2 ln 1.25) = 0.668: mean 1,000, p99
  //    800 * exp(2.326 * 0.668) = ~3,780;
  //  * tool/think delay: median 2 s, sigma ln(15) / 1.645 = 1.646: p95 30 s;
  //  * a 200,000-token window; past it the agent compacts to the system
  //    prompt + a ~20,000-token summary;
  //  * 1,000 sessions of 12 turns on average (12,000 requests, sigma 0.8).
  // Session starts are 5 s apart on average: the preset is meant for
  // concurrency-limited (closed-loop) replay, where start times are ignored.
  // Blocks of 512 tokens keep the hash arena small at these context sizes.
  static SyntheticConfig ClaudeCode() {
    SyntheticConfig c;
    c.name = "claude-code";
    c.sessions = 1000;
    c.requests = 12000;
    c.turns_sigma = 0.8;
    c.min_turns = 2;
    c.session_interarrival_s = 5.0;
    c.system_prompt_tokens = 12000;
    c.task_tokens_median = 35000;
    c.task_tokens_sigma = 0.709;
    c.max_task_fraction = 0.8;  // system prompt + task + output stay within the window
    c.append_tokens_median = 4000;
    c.append_tokens_sigma = 0.900;
    c.output_tokens_median = 800;
    c.output_tokens_sigma = 0.668;
    c.tool_delay_median_s = 2.0;
    c.tool_delay_sigma = 1.646;
    c.max_context_tokens = 200000;
    c.compacted_tokens_median = 20000;
    c.max_append_tokens = 65536;
    c.max_output_tokens = 16384;
    c.block_tokens = 512;
    return c;
  }

  // Largest first-turn task, in tokens.
  uint64_t max_task_tokens() const {
    return static_cast<uint64_t>(max_task_fraction * static_cast<double>(max_context_tokens));
  }
  // Largest compaction summary, in tokens.
  uint64_t max_summary_tokens() const { return max_context_tokens / 4; }

  friend bool operator==(const SyntheticConfig&, const SyntheticConfig&) = default;

  absl::Status Validate() const {
    if (sessions == 0) return absl::InvalidArgumentError("synthetic: sessions must be >= 1");
    if (min_turns == 0) return absl::InvalidArgumentError("synthetic: min_turns must be >= 1");
    if (requests < uint64_t{sessions} * min_turns) {
      return absl::InvalidArgumentError(absl::StrCat(
          "synthetic: ", requests, " requests cannot give ", sessions, " sessions ", min_turns,
          " turns each"));
    }
    if (requests > (uint64_t{1} << 31)) {
      return absl::InvalidArgumentError("synthetic: at most 2^31 requests");
    }
    if (block_tokens == 0) return absl::InvalidArgumentError("synthetic: block_tokens must be >= 1");
    const double positives[] = {task_tokens_median, append_tokens_median, output_tokens_median,
                                compacted_tokens_median};
    for (double v : positives) {
      if (!(v >= 1.0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError("synthetic: token medians must be >= 1");
      }
    }
    const double spreads[] = {turns_sigma, task_tokens_sigma, append_tokens_sigma,
                              output_tokens_sigma, tool_delay_sigma};
    for (double v : spreads) {
      if (!(v >= 0.0 && v <= 5.0)) {
        return absl::InvalidArgumentError("synthetic: sigmas must be in [0, 5]");
      }
    }
    if (!(tool_delay_median_s >= 0.0) || !std::isfinite(tool_delay_median_s) ||
        !(session_interarrival_s >= 0.0) || !std::isfinite(session_interarrival_s)) {
      return absl::InvalidArgumentError("synthetic: delays must be finite and >= 0");
    }
    if (max_append_tokens == 0 || max_output_tokens == 0) {
      return absl::InvalidArgumentError(
          "synthetic: max_append_tokens and max_output_tokens must be >= 1");
    }
    if (max_append_tokens > kMaxTurnTokens || max_output_tokens > kMaxTurnTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "synthetic: max_append_tokens and max_output_tokens must be <= ", kMaxTurnTokens));
    }
    if (max_context_tokens > kMaxSessionContextTokens ||
        system_prompt_tokens > kMaxSessionContextTokens) {
      return absl::InvalidArgumentError(
          "synthetic: max_context_tokens or system_prompt_tokens is too large");
    }
    if (!(max_task_fraction > 0.0 && max_task_fraction <= 1.0) || max_task_tokens() == 0) {
      return absl::InvalidArgumentError(
          "synthetic: max_task_fraction must be in (0, 1] and allow a task of >= 1 token");
    }
    // Every turn's prompt plus output fits in the window: a first turn
    // (system prompt + the largest task), and a compacted turn (system
    // prompt + the largest summary + the largest append); a continued turn
    // compacts whenever it would not fit.
    const uint64_t fresh =
        system_prompt_tokens + std::max(max_task_tokens(), max_summary_tokens() + max_append_tokens);
    if (max_context_tokens < fresh + max_output_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "synthetic: max_context_tokens (", max_context_tokens,
          ") must hold the system prompt plus the largest task (max_task_fraction of it) or "
          "the largest summary (a quarter of it) plus max_append_tokens, plus "
          "max_output_tokens: ",
          fresh + max_output_tokens, " tokens"));
    }
    return absl::OkStatus();
  }
};

// Names `SyntheticPreset` knows.
inline constexpr std::array<std::string_view, 2> kSyntheticPresetNames = {"swe-bench",
                                                                         "claude-code"};

// The preset called `name`; InvalidArgument listing the known names otherwise.
inline absl::StatusOr<SyntheticConfig> SyntheticPreset(std::string_view name) {
  if (name == "swe-bench") return SyntheticConfig::SweBench();
  if (name == "claude-code") return SyntheticConfig::ClaudeCode();
  // (std::string copies: this abseil's string_view need not be std's.)
  std::string known;
  for (std::string_view known_name : kSyntheticPresetNames) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", std::string(known_name));
  }
  return absl::InvalidArgumentError(absl::StrCat("synthetic: unknown preset \"",
                                                 std::string(name), "\" (known: ", known, ")"));
}

namespace detail {

inline uint64_t DrawTokens(SimRng& rng, double median, double sigma, uint64_t lo, uint64_t hi) {
  const double v = std::round(rng.LogNormal(median, sigma));
  return std::clamp<uint64_t>(static_cast<uint64_t>(std::max(0.0, std::min(v, 1e12))), lo, hi);
}

// Turns per session: log-normal weights scaled to exactly `total`.
inline std::vector<uint64_t> DrawTurnCounts(SimRng& rng, const SyntheticConfig& c) {
  std::vector<double> weight(c.sessions);
  for (double& w : weight) w = rng.LogNormal(1.0, c.turns_sigma);
  const double sum = std::accumulate(weight.begin(), weight.end(), 0.0);
  const uint64_t spare = c.requests - uint64_t{c.sessions} * c.min_turns;
  std::vector<uint64_t> turns(c.sessions);
  uint64_t given = 0;
  for (uint32_t s = 0; s < c.sessions; ++s) {
    turns[s] = c.min_turns + static_cast<uint64_t>(std::floor(spare * weight[s] / sum));
    given += turns[s];
  }
  // Hand out the rounding remainder to the heaviest sessions, ties by index.
  std::vector<uint32_t> order(c.sessions);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return weight[a] > weight[b]; });
  for (uint64_t i = 0; given < c.requests; ++i, ++given) ++turns[order[i % c.sessions]];
  return turns;
}

}  // namespace detail

inline absl::StatusOr<Trace> GenerateSynthetic(const SyntheticConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  SimRng rng(config.seed);
  const uint64_t block = config.block_tokens;
  const std::vector<uint64_t> turn_counts = detail::DrawTurnCounts(rng, config);

  Trace trace;
  trace.description =
      absl::StrCat("synthetic ", config.name.empty() ? std::string("agentic") : config.name,
                   " workload (seed ", config.seed, ")");
  trace.format = TraceFormat::kSynthetic;
  trace.block_tokens = config.block_tokens;
  trace.turns.reserve(config.requests);
  trace.sessions.reserve(config.sessions);

  // Blocks of the shared system prompt: the same ids in every session.
  constexpr uint64_t kSystemSegment = 0xFFFFFFFFULL;
  const uint64_t system_blocks = config.system_prompt_tokens / block;
  uint32_t segment = 0;
  uint32_t order = 0;
  double session_start = 0;
  std::vector<TraceTurn> pending;  // turns of the current context generation

  auto flush_segment = [&](std::vector<TraceTurn>& turns) {
    if (turns.empty()) return;
    const TraceTurn& last = turns.back();
    const uint64_t blocks = (last.input_tokens + last.output_tokens) / block;
    const uint64_t begin = trace.hashes.size();
    BlockHash parent = kChainRootHash;
    for (uint64_t j = 0; j < blocks; ++j) {
      const uint64_t id = j < system_blocks ? SyntheticBlockId(kSystemSegment, j)
                                            : SyntheticBlockId(turns.front().segment, j);
      parent = ChainTraceId(parent, id);
      trace.hashes.push_back(parent);
    }
    for (TraceTurn& t : turns) {
      t.hash_begin = begin;
      trace.turns.push_back(t);
    }
    turns.clear();
  };

  for (uint32_t s = 0; s < config.sessions; ++s) {
    if (s > 0) session_start += rng.Exponential(config.session_interarrival_s);
    TraceSession session;
    session.name = absl::StrCat("s", s);
    session.first_turn = static_cast<uint32_t>(trace.turns.size());
    session.num_turns = static_cast<uint32_t>(turn_counts[s]);
    trace.sessions.push_back(session);

    uint64_t context = 0;  // prompt + output of the previous turn
    double arrival = session_start;
    for (uint32_t k = 0; k < turn_counts[s]; ++k) {
      TraceTurn t;
      t.session = s;
      t.turn = k;
      t.line = ++order;
      t.output_tokens = detail::DrawTokens(rng, config.output_tokens_median,
                                           config.output_tokens_sigma, 1, config.max_output_tokens);
      if (k == 0) {
        t.segment = segment++;
        const uint64_t task_cap = config.max_task_tokens();
        const uint64_t task = detail::DrawTokens(rng, config.task_tokens_median,
                                                 config.task_tokens_sigma,
                                                 std::min<uint64_t>(64, task_cap), task_cap);
        t.input_tokens = config.system_prompt_tokens + task;
        t.reusable_tokens = 0;
        t.arrival_s = arrival;
      } else {
        t.delay_s = rng.LogNormal(config.tool_delay_median_s, config.tool_delay_sigma);
        arrival += t.delay_s;
        t.arrival_s = arrival;
        const uint64_t append = detail::DrawTokens(rng, config.append_tokens_median,
                                                   config.append_tokens_sigma, 1,
                                                   config.max_append_tokens);
        if (context + append + t.output_tokens > config.max_context_tokens) {
          // Compaction: a new context generation.
          flush_segment(pending);
          t.segment = segment++;
          const uint64_t summary_cap = config.max_summary_tokens();
          const uint64_t summary =
              detail::DrawTokens(rng, config.compacted_tokens_median, 0.3,
                                 std::min<uint64_t>(256, summary_cap), summary_cap);
          t.input_tokens = config.system_prompt_tokens + summary + append;
          t.reusable_tokens = 0;
        } else {
          t.segment = pending.back().segment;
          t.input_tokens = context + append;
          t.reusable_tokens = context;
        }
      }
      t.prefix_blocks = static_cast<uint32_t>(t.reusable_tokens / block);
      t.input_blocks = static_cast<uint32_t>(t.input_tokens / block);
      t.output_blocks =
          static_cast<uint32_t>((t.input_tokens + t.output_tokens) / block) - t.input_blocks;
      context = t.input_tokens + t.output_tokens;
      pending.push_back(t);
    }
    flush_segment(pending);
  }
  if (absl::Status s = trace.Validate(); !s.ok()) return s;
  return trace;
}

}  // namespace kvc_router::sim
