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

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace kvc_router {

// Upper bound on workers of each pool: keeps ids dense and per-session
// counters small. Raise it if a deployment ever needs more.
inline constexpr uint32_t kMaxWorkers = 4096;

struct RouterConfig {
  // |D|: decode workers, ids 0..num_decode_workers-1. Must be >= 1.
  uint32_t num_decode_workers = 1;
  // |P|: prefill workers. 0 means the decode instances prefill themselves
  // (Seed, Reseed and Fallback then carry prefill = kNoWorker).
  uint32_t num_prefill_workers = 1;
  // Tokens per KV block; input_len = |prefix_hashes| * block_tokens + append.
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
    if (block_tokens == 0) {
      return absl::InvalidArgumentError(
          "RouterConfig.block_tokens must be >= 1");
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

struct AdmissionConfig {
  // K_d: the worker's KV pool in tokens (SGLang's max_total_num_tokens).
  // The seed's evaluation reported 92,104.
  uint64_t capacity_tokens = 92104;
  // rho: admissions keep resident tokens at or below rho * K_d.
  double high_water = 0.95;
  // tau_append: largest append served Direct.
  uint64_t max_direct_append_tokens = 8192;
  CapacityAccounting accounting = CapacityAccounting::kConservative;

  // floor(rho * K_d): the most tokens the pool may hold after an admission.
  uint64_t budget_tokens() const {
    return static_cast<uint64_t>(
        std::floor(high_water * static_cast<double>(capacity_tokens)));
  }

  absl::Status Validate() const {
    if (capacity_tokens == 0) {
      return absl::InvalidArgumentError(
          "AdmissionConfig.capacity_tokens (K_d) must be >= 1");
    }
    if (!(high_water > 0.0 && high_water <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AdmissionConfig.high_water (rho) must be in (0, 1], got ",
          high_water));
    }
    return absl::OkStatus();
  }
};

}  // namespace kvc_router
