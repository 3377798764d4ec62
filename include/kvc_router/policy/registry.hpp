// kvc_router/policy/registry.hpp
//
// Policies by name, for command lines and configuration files. A
// `PolicyEnvironment` describes the cluster once (pool sizes for both
// topologies, block size, K_d, the router's knobs); `MakePolicy` builds the
// named policy for the topology that policy runs on. `ListPolicies` gives the
// names and one-line descriptions (kvc-replay --help prints them).
//
//   kvc_router::policy::PolicyEnvironment env;   // 2P+6D, 8 colocated instances
//   auto kvc = kvc_router::policy::MakePolicy("kvc", env);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/config.hpp"
#include "kvc_router/policy/cache_aware_dp_policy.hpp"
#include "kvc_router/policy/kvc_policy.hpp"
#include "kvc_router/policy/pd_round_robin_policy.hpp"
#include "kvc_router/policy/policy.hpp"

namespace kvc_router::policy {

struct PolicyEnvironment {
  // Disaggregated topology: |P| and |D|.
  uint32_t prefill_workers = 2;
  uint32_t decode_workers = 6;
  // Colocated topology: instances (0 = |P| + |D|, the same GPUs).
  uint32_t colocated_instances = 0;
  uint32_t block_tokens = 512;
  // K_d of every decode worker or instance.
  uint64_t kv_capacity_tokens = 92104;
  // KVC knobs: alpha, tau_reject, epsilon (0 = |D|).
  uint32_t sticky_bonus = 1;
  uint32_t reject_threshold = 3;
  uint32_t max_admit_attempts = 2;
  bool kv_events = false;
  CacheAwareOptions cache_aware;

  uint32_t instances() const {
    return colocated_instances != 0 ? colocated_instances : prefill_workers + decode_workers;
  }
};

struct PolicyInfo {
  std::string_view name;
  std::string_view description;
};

inline const std::vector<PolicyInfo>& ListPolicies() {
  static const std::vector<PolicyInfo> kPolicies = {
      {"kvc", "KVC-Router v2 (reset-on-success) on P/D: Route + worker admission + Fallback"},
      {"kvc-v1", "KVC-Router v1 (no reset-on-success): rejection counters only grow"},
      {"pd", "vanilla P/D disaggregation: round-robin P and D, no session awareness"},
      {"dp", "SGLang-style cache-aware data parallelism on colocated instances"},
      {"kvc-colo", "KVC-Router v2 on colocated instances (instances prefill themselves)"},
  };
  return kPolicies;
}

inline absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakePolicy(std::string_view name,
                                                                  const PolicyEnvironment& env) {
  if (name == "kvc" || name == "kvc-v1" || name == "kvc-colo") {
    KvcPolicyOptions options;
    const bool colocated = name == "kvc-colo";
    options.router.num_decode_workers = colocated ? env.instances() : env.decode_workers;
    options.router.num_prefill_workers = colocated ? 0 : env.prefill_workers;
    options.router.block_tokens = env.block_tokens;
    options.router.sticky_bonus = env.sticky_bonus;
    options.router.reject_threshold = env.reject_threshold;
    options.router.max_admit_attempts = env.max_admit_attempts;
    options.router.reset_on_success = name != "kvc-v1";
    options.index_capacity_tokens = env.kv_capacity_tokens;
    options.kv_events = env.kv_events;
    if (!colocated && env.prefill_workers == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "policy ", std::string(name), " needs at least one prefill worker (use kvc-colo)"));
    }
    absl::StatusOr<std::unique_ptr<KvcPolicy>> policy = KvcPolicy::Create(std::string(name), options);
    if (!policy.ok()) return policy.status();
    return std::unique_ptr<RoutingPolicy>(std::move(*policy));
  }
  if (name == "pd") {
    if (env.prefill_workers == 0 || env.decode_workers == 0) {
      return absl::InvalidArgumentError("policy pd needs at least one prefill and one decode worker");
    }
    return std::unique_ptr<RoutingPolicy>(
        new PdRoundRobinPolicy(env.prefill_workers, env.decode_workers));
  }
  if (name == "dp") {
    if (env.instances() == 0) return absl::InvalidArgumentError("policy dp needs instances");
    return std::unique_ptr<RoutingPolicy>(new CacheAwareDpPolicy(
        env.instances(), env.block_tokens, env.kv_capacity_tokens, env.cache_aware));
  }
  std::string known;
  for (const PolicyInfo& info : ListPolicies()) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", std::string(info.name));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy \"", std::string(name), "\" (known: ", known, ")"));
}

}  // namespace kvc_router::policy
