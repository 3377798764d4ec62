// kvc_router/config.hpp
//
// Configuration of the router (Algorithms 1 and 3) and of decode-worker
// admission (Algorithm 2), with the seed's defaults. Every value is checked by
// `Validate()`, which names the offending field; nothing is silently clamped.
//
//   kvc_router::RouterConfig config;
//   config.num_decode_workers = 8;
//   config.num_prefill_workers = 2;
//   if (absl::Status s = config.Validate(); !s.ok()) { /* report s.message() */ }
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvc_router/health.hpp"

namespace kvc_router {

// Upper bound on workers of each pool: keeps ids dense and per-session
// counters small, and it is what the fast indexes' inline worker ids can
// encode (12 bits, index/detail/block_table.hpp). Raising it means widening
// that encoding first.
inline constexpr uint32_t kMaxWorkers = 4096;

// Upper bound on RouterConfig::block_tokens (and SessionHasher's block
// size). Real engines use 1..1024-token blocks; the bound keeps the per-block
// buffers small and |prefix| * block_tokens far from overflow.
inline constexpr uint32_t kMaxBlockTokens = uint32_t{1} << 16;

// Upper bound on AdmissionConfig::capacity_tokens (K_d), 2^48 tokens: a
// million times the largest KV pools in use, while every token count (and a
// sum of a few of them) stays exact in uint64 arithmetic and in a double
// (reports, JSON).
inline constexpr uint64_t kMaxCapacityTokens = uint64_t{1} << 48;

namespace detail {

// floor(rho * tokens), exactly. rho is read as the decimal it was written as,
// i.e. the shortest decimal that converts back to the same double (0.7 means
// 7/10, not the double's binary value 0.6999999999999999555...), so
// floor(0.7 * 90) is 63 as it is on paper. The product is formed in 128-bit
// integers, so no rounding happens anywhere and the result never exceeds
// `tokens` for rho <= 1. Returns 0 unless 0 < rho <= 1.
inline uint64_t ExactFloorOfFraction(double rho, uint64_t tokens) {
  if (!(rho > 0.0 && rho <= 1.0)) return 0;
  // Scientific form, shortest round-trip digits: "7e-01", "9.5e-01", "1e+00".
  char text[64];
  const std::to_chars_result printed =
      std::to_chars(text, text + sizeof(text), rho, std::chars_format::scientific);
  if (printed.ec != std::errc()) return 0;  // cannot happen: 64 chars always suffice
  uint64_t digits = 0;  // at most 17 significant digits
  int fraction_digits = 0;
  bool after_point = false;
  const char* p = text;
  for (; p != printed.ptr && *p != 'e'; ++p) {
    if (*p == '.') {
      after_point = true;
      continue;
    }
    digits = digits * 10 + static_cast<uint64_t>(*p - '0');
    fraction_digits += after_point ? 1 : 0;
  }
  int exponent = 0;
  bool negative = false;
  if (p != printed.ptr) ++p;  // 'e'
  if (p != printed.ptr && (*p == '-' || *p == '+')) negative = *p++ == '-';
  for (; p != printed.ptr; ++p) exponent = exponent * 10 + (*p - '0');
  // rho = digits / 10^scale with scale >= 0, because rho <= 1.
  const int scale = fraction_digits + (negative ? exponent : -exponent);
  // digits * tokens < 10^17 * 2^64 < 10^37: below 10^scale the floor is 0.
  if (scale < 0 || scale > 37) return 0;
  absl::uint128 divisor = 1;
  for (int i = 0; i < scale; ++i) divisor *= 10;
  return absl::Uint128Low64(absl::uint128(digits) * tokens / divisor);
}

}  // namespace detail

struct RouterConfig {
  // |D|: decode workers, ids 0..num_decode_workers-1. Must be >= 1.
  uint32_t num_decode_workers = 1;
  // |P|: prefill workers. 0 means the decode instances prefill themselves
  // (Seed, Reseed and Fallback then carry prefill = kNoWorker).
  uint32_t num_prefill_workers = 1;
  // Tokens per KV block, 1..kMaxBlockTokens;
  // input_len = |prefix_hashes| * block_tokens + append.
  uint32_t block_tokens = 24;
  // alpha: sticky bonus, in blocks, added to the pinned worker's overlap.
  uint32_t sticky_bonus = 1;
  // tau_reject: a worker is blacklisted for a session once the session's
  // rejection counter there reaches this value. Must be >= 1.
  uint32_t reject_threshold = 3;
  // epsilon: admission attempts per Dispatch before Fallback. 0 means |D|.
  uint32_t max_admit_attempts = 0;
  // v2 (true) resets rejects[s,d] on every successful admission of s on d.
  // false reproduces v1, whose counters only grow (seed §3.4).
  bool reset_on_success = true;
  // Requests with more prefix blocks than this are refused (bad input).
  uint64_t max_prefix_blocks = uint64_t{1} << 22;
  // Sessions with no request for this long and nothing in flight are forgotten.
  absl::Duration session_idle_ttl = absl::Hours(1);
  // Hard bound on remembered sessions; the least recently seen idle ones go first.
  uint64_t max_sessions = uint64_t{1} << 20;
  // Beyond the seed (off by default): a session with no residency, no pin
  // and no overlap on any candidate worker (new, forgotten, or evicted where
  // KV events cleared its pin), is ranked by
  //   (room >= its input, -inflight, -assigned, room)
  // instead of Route's 4-tuple, where room is what the workers' admission
  // answers last reported (AdmitResult::room_tokens; a capacity rejection
  // without it bounds the room below the rejected input). Sessions with
  // residency keep Route's order. See docs/policies.md (kvc-adaptive).
  bool place_by_room = false;
  // Beyond the seed (on by default): a decode worker's capacity rejections
  // since its last admission (within health.failure_window) count as
  // inflight load in Route for sessions with no pin and no overlap, so new
  // sessions stop asking a full worker first (docs/reliability.md, "reject
  // pressure"). Off, with health.enabled = false, Route is the seed's.
  bool reject_pressure = true;
  // Worker health (health.hpp): a decode worker whose admission RPC fails
  // (worker-unavailable) failure_threshold times within failure_window is
  // not asked again until open_cooldown has passed, then probed. On by
  // default (3 failures in 10 s, 5 s cooldown).
  HealthConfig health;

  uint32_t effective_max_admit_attempts() const {
    return max_admit_attempts == 0 ? num_decode_workers : max_admit_attempts;
  }

  absl::Status Validate() const {
    if (num_decode_workers == 0) {
      return absl::InvalidArgumentError(
          "RouterConfig.num_decode_workers must be >= 1 (the decode pool D is empty)");
    }
    if (num_decode_workers > kMaxWorkers || num_prefill_workers > kMaxWorkers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RouterConfig: at most ", kMaxWorkers, " workers per pool, got |D|=",
          num_decode_workers, " |P|=", num_prefill_workers));
    }
    if (block_tokens == 0 || block_tokens > kMaxBlockTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RouterConfig.block_tokens must be in 1..", kMaxBlockTokens,
          " (kMaxBlockTokens), got ", block_tokens));
    }
    if (reject_threshold == 0) {
      return absl::InvalidArgumentError(
          "RouterConfig.reject_threshold (tau_reject) must be >= 1; 0 would "
          "blacklist every worker before its first attempt");
    }
    if (max_prefix_blocks == 0) {
      return absl::InvalidArgumentError(
          "RouterConfig.max_prefix_blocks must be >= 1");
    }
    if (session_idle_ttl <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RouterConfig.session_idle_ttl must be positive, got ",
          absl::FormatDuration(session_idle_ttl)));
    }
    if (max_sessions == 0) {
      return absl::InvalidArgumentError("RouterConfig.max_sessions must be >= 1");
    }
    if (absl::Status status = health.Validate(); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("RouterConfig.health: ", status.message()));
    }
    return absl::OkStatus();
  }
};

// How admission charges a request against the pool (see docs/algorithm.md).
enum class CapacityAccounting : uint8_t {
  // The seed's rule: used + input_len <= rho*K_d even when the session is
  // already resident, so its resident tokens count twice. Never overloads.
  kConservative,
  // Only the growth counts: used - resident(s) + input_len <= rho*K_d.
  kIncremental,
};

// Beyond the seed: what a decode worker knows of its own costs, for
// deciding Direct by cost rather than by tau_append alone. A Direct append
// waits for the worker's queued prefill and then prefills `append` tokens
// over the session's `context`; the alternative, a reseed, prefills the
// whole input elsewhere (assumed idle: the worker cannot see other queues)
// and moves it here. Prefill(n new, c cached) = n * per_token + n * (c + n/2)
// * attention, the shape of kvc_sim's cost model.
struct DirectCostModel {
  bool enabled = false;
  double prefill_per_token_s = 40e-6;
  double prefill_attention_s = 1.5e-9;
  // KV transfer to this worker per token (0 on colocated instances, where a
  // reseed prefills in place), plus a fixed setup cost.
  double transfer_per_token_s = 147456.0 / 22e9;
  double transfer_setup_s = 0.005;

  double PrefillSeconds(uint64_t new_tokens, uint64_t cached_tokens) const {
    const double n = static_cast<double>(new_tokens);
    const double c = static_cast<double>(cached_tokens);
    return n * prefill_per_token_s + n * (c + n / 2) * prefill_attention_s;
  }
  // Seconds of a Direct append after `queued_prefill_tokens` of queued work.
  double DirectSeconds(uint64_t append, uint64_t input, uint64_t queued_prefill_tokens) const {
    // Queued work is many requests' prompts: its per-token part is what it
    // costs for sure (their attention depends on contexts the worker knows
    // but this figure leaves out, erring toward Direct).
    return static_cast<double>(queued_prefill_tokens) * prefill_per_token_s +
           PrefillSeconds(append, input - append);
  }
  double ReseedSeconds(uint64_t input) const {
    return PrefillSeconds(input, 0) + transfer_setup_s +
           static_cast<double>(input) * transfer_per_token_s;
  }
  absl::Status Validate() const {
    for (double v : {prefill_per_token_s, prefill_attention_s, transfer_per_token_s,
                     transfer_setup_s}) {
      if (!(v >= 0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            "DirectCostModel: every cost figure must be finite and >= 0");
      }
    }
    return absl::OkStatus();
  }
};

struct AdmissionConfig {
  // K_d: the worker's KV pool in tokens (SGLang's max_total_num_tokens),
  // 1..kMaxCapacityTokens. The seed's evaluation reported 92,104.
  uint64_t capacity_tokens = 92104;
  // rho: admissions keep resident tokens at or below rho * K_d; in (0, 1].
  double high_water = 0.95;
  // tau_append: largest append served Direct.
  uint64_t max_direct_append_tokens = 8192;
  CapacityAccounting accounting = CapacityAccounting::kConservative;
  // Beyond the seed (off by default): a resident session's append is served
  // Direct only when that is no slower than a reseed (DirectCostModel);
  // tau_append stays a hard cap on top.
  DirectCostModel direct_cost;

  // floor(rho * K_d): the most tokens the pool may hold after an admission.
  // Exact (see detail::ExactFloorOfFraction: rho is the decimal as written,
  // 0.7 * 90 gives 63) and never above K_d. Meaningful for a config that
  // passes Validate(); 0 when rho is outside (0, 1].
  uint64_t budget_tokens() const {
    return detail::ExactFloorOfFraction(high_water, capacity_tokens);
  }

  absl::Status Validate() const {
    if (capacity_tokens == 0) {
      return absl::InvalidArgumentError(
          "AdmissionConfig.capacity_tokens (K_d) must be >= 1");
    }
    if (capacity_tokens > kMaxCapacityTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AdmissionConfig.capacity_tokens (K_d) must be at most ", kMaxCapacityTokens,
          " (2^48, kMaxCapacityTokens), got ", capacity_tokens));
    }
    if (!(high_water > 0.0 && high_water <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AdmissionConfig.high_water (rho) must be in (0, 1], got ",
          high_water));
    }
    return direct_cost.Validate();
  }
};

}  // namespace kvc_router
