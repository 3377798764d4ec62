// kvc_sim/policies/registry.hpp
//
// Policies by name, for kvc-replay and tests. Every policy is built from the
// same `PolicySetup`: one cluster shape, the router's own `RouterConfig`
// (alpha, tau_reject, epsilon, block size; its pool sizes come from the
// shape and the policy's topology) and the workers' `AdmissionConfig` (K_d
// bounds KVC's residency estimate), plus the cache-aware baselines' options.
// There is no second set of router knobs.
//
// `MakePolicy` returns the policy and the engine model its workers run
// (whether prefill workers cache prefixes and whether P -> D transfers skip
// what the decode worker holds): vanilla `pd` has neither, every other
// policy both, as SGLang engines do.
//
//   kvc_router::sim::PolicySetup setup;            // 4P+4D, 8 colocated
//   setup.router.block_tokens = trace.block_tokens;
//   absl::StatusOr<kvc_router::sim::MadePolicy> kvc = kvc_router::sim::MakePolicy("kvc", setup);
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
#include "kvc_router/policy/affinity_policies.hpp"
#include "kvc_router/policy/kvc_policy.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_sim/policies/cache_aware_dp.hpp"
#include "kvc_sim/policies/pd_round_robin.hpp"
#include "kvc_sim/policies/pd_sglang.hpp"
#include "kvc_sim/simulator.hpp"

namespace kvc_router::sim {

struct PolicySetup {
  policy::ClusterShape cluster;
  // KVC's knobs; num_decode_workers / num_prefill_workers are overwritten
  // from `cluster` for the policy's topology.
  RouterConfig router;
  // The workers' pools; K_d bounds KVC's residency estimate.
  AdmissionConfig admission = SimConfig::DefaultAdmission();
  // Forget sessions the workers report evicted (KVC).
  bool kv_events = false;
  // The cache-aware baselines (dp, pd-sglang).
  CacheAwareOptions cache_aware = CacheAwareOptions::Launcher();
  // The cost figures kvc-adaptive's workers decide Direct by.
  CostModel cost;
  // The EAR family's knobs (high-cache fraction, ear's migration triggers,
  // cooldown, idle time); rule, topology, pools, block size and K_d are set
  // per policy.
  policy::AffinityPolicyOptions affinity;
  // Each worker's host-memory tier, tokens (0: none): with the K_d pool, what
  // keeps a context reusable (ear's load control counts both).
  uint64_t host_tier_tokens = 0;
};

struct MadePolicy {
  std::unique_ptr<policy::RoutingPolicy> policy;
  EngineModel engine;
};

// The policy a gateway should run by default, marked "recommended": true in
// kvc-replay's JSON: ear on colocated instances. docs/policies.md gives the
// measurements behind the choice and where it loses.
inline constexpr std::string_view kRecommendedPolicy = "ear";

struct PolicyInfo {
  std::string_view name;
  policy::Topology topology;
  std::string_view description;
};

inline const std::vector<PolicyInfo>& ListPolicies() {
  using policy::Topology;
  static const std::vector<PolicyInfo> kPolicies = {
      {"kvc", Topology::kDisaggregated,
       "KVC-Router v2 (reset-on-success): Route + decode-worker admission + Fallback"},
      {"kvc-v1", Topology::kDisaggregated,
       "KVC-Router v1 (no reset-on-success): rejection counters only grow"},
      {"kvc-colo", Topology::kColocated, "KVC-Router v2 on colocated instances"},
      {"kvc-adaptive", Topology::kDisaggregated,
       "KVC beyond the seed: cost-based Direct, incremental accounting, new sessions by room, "
       "D->P KV backup"},
      {"kvc-adaptive-colo", Topology::kColocated, "kvc-adaptive on colocated instances"},
      {"pd", Topology::kDisaggregated,
       "vanilla P/D (the KVC seed's baseline): round-robin, no cache, whole KV moved"},
      {"pd-sglang", Topology::kDisaggregated,
       "SGLang P/D today: cache-aware P and D, radix caches, only missing KV moved"},
      {"dp", Topology::kColocated,
       "SGLang cache-aware data parallelism (router launcher defaults)"},
      {"load-only", Topology::kColocated, "EAR: fewest running requests"},
      {"lmetric", Topology::kColocated,
       "EAR: argmin (pending prefill + uncached input) x running requests"},
      {"sticky", Topology::kColocated, "EAR: rendezvous hashing of the session"},
      {"unified", Topology::kColocated,
       "EAR: new sessions by LMetric or a high cache hit, later turns follow the binding"},
      {"ear", Topology::kColocated,
       "EAR: unified + session KV migration off hot instances (pending prefill or memory)"},
      {"load-only-pd", Topology::kDisaggregated, "load-only choosing the decode worker"},
      {"lmetric-pd", Topology::kDisaggregated, "lmetric choosing the decode worker"},
      {"sticky-pd", Topology::kDisaggregated, "sticky choosing the decode worker"},
      {"unified-pd", Topology::kDisaggregated, "unified choosing the decode worker"},
      {"ear-pd", Topology::kDisaggregated, "ear choosing and migrating between decode workers"},
  };
  return kPolicies;
}

// kvc-adaptive's workers: the cluster's pool with incremental accounting
// (it cannot overbook: an admission replaces the session's booking by its
// new input under rho*K_d), no tau_append, and the cost rule from the
// cluster's cost model (no transfer term on colocated instances, where a
// reseed prefills in place).
inline AdmissionConfig AdaptiveAdmission(const PolicySetup& setup, policy::Topology topology) {
  AdmissionConfig admission = setup.admission;
  admission.accounting = CapacityAccounting::kIncremental;
  admission.max_direct_append_tokens = ~uint64_t{0};
  DirectCostModel& cost = admission.direct_cost;
  cost.enabled = true;
  cost.prefill_per_token_s = setup.cost.prefill_per_token_s;
  cost.prefill_attention_s = setup.cost.prefill_attention_s;
  if (topology == policy::Topology::kDisaggregated) {
    cost.transfer_per_token_s = static_cast<double>(setup.cost.kv_bytes_per_token) /
                                setup.cost.transfer_bytes_per_s;
    cost.transfer_setup_s = setup.cost.transfer_setup_s;
  } else {
    cost.transfer_per_token_s = 0;
    cost.transfer_setup_s = 0;
  }
  return admission;
}

inline absl::StatusOr<MadePolicy> MakePolicy(std::string_view name, const PolicySetup& setup) {
  if (absl::Status s = setup.cluster.Validate(); !s.ok()) return s;
  if (absl::Status s = setup.cache_aware.Validate(); !s.ok()) return s;
  const policy::ClusterShape& shape = setup.cluster;
  const uint32_t block_tokens = setup.router.block_tokens;
  MadePolicy made;
  if (name == "kvc" || name == "kvc-v1" || name == "kvc-colo" || name == "kvc-adaptive" ||
      name == "kvc-adaptive-colo") {
    const bool colocated = name == "kvc-colo" || name == "kvc-adaptive-colo";
    const bool adaptive = name == "kvc-adaptive" || name == "kvc-adaptive-colo";
    const policy::Topology topology =
        colocated ? policy::Topology::kColocated : policy::Topology::kDisaggregated;
    if (topology == policy::Topology::kDisaggregated && shape.prefill_workers == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "policy ", std::string(name), " needs at least one prefill worker (use kvc-colo)"));
    }
    policy::KvcPolicyOptions options;
    options.router = shape.ApplyTo(setup.router, topology);
    options.router.reset_on_success = setup.router.reset_on_success && name != "kvc-v1";
    // The seed's Route: capacity rejections steer nothing beyond its
    // blacklists (kvc-adaptive keeps the library's reject pressure).
    options.router.reject_pressure = adaptive && setup.router.reject_pressure;
    options.index_capacity_tokens = setup.admission.capacity_tokens;
    options.kv_events = setup.kv_events;
    if (adaptive) {
      options.router.place_by_room = true;
      // Evictions clear the pin, so evicted sessions are placed by room too.
      options.kv_events = true;
      options.kv_backup = topology == policy::Topology::kDisaggregated;
      made.engine.admission = AdaptiveAdmission(setup, topology);
      made.engine.kv_backup = options.kv_backup;
    }
    absl::StatusOr<std::unique_ptr<policy::KvcPolicy>> kvc =
        policy::KvcPolicy::Create(std::string(name), options);
    if (!kvc.ok()) return kvc.status();
    made.policy = std::move(*kvc);
    return made;
  }
  if (name == "pd") {
    if (shape.prefill_workers == 0) {
      return absl::InvalidArgumentError("policy pd needs at least one prefill worker");
    }
    made.policy = std::make_unique<PdRoundRobinPolicy>(shape.prefill_workers, shape.decode_workers);
    made.engine.prefill_cache = false;
    made.engine.delta_transfer = false;
    return made;
  }
  if (name == "pd-sglang") {
    if (shape.prefill_workers == 0) {
      return absl::InvalidArgumentError("policy pd-sglang needs at least one prefill worker");
    }
    made.policy = std::make_unique<PdSglangPolicy>(shape.prefill_workers, shape.decode_workers,
                                                   block_tokens, setup.cache_aware);
    return made;
  }
  if (name == "dp") {
    made.policy = std::make_unique<CacheAwareDpPolicy>(
        shape.instances(policy::Topology::kColocated), block_tokens, setup.cache_aware);
    return made;
  }
  for (const policy::AffinityRule rule :
       {policy::AffinityRule::kLoadOnly, policy::AffinityRule::kLMetric,
        policy::AffinityRule::kSticky, policy::AffinityRule::kUnified,
        policy::AffinityRule::kEar}) {
    const std::string base(policy::AffinityRuleName(rule));
    if (name != base && name != base + "-pd") continue;
    policy::AffinityPolicyOptions options = setup.affinity;
    options.rule = rule;
    options.topology =
        name == base ? policy::Topology::kColocated : policy::Topology::kDisaggregated;
    options.instances = shape.instances(options.topology);
    options.prefill_workers = shape.prefill_pool(options.topology);
    options.block_tokens = block_tokens;
    options.kv_capacity_tokens = setup.admission.capacity_tokens;
    options.reusable_capacity_tokens = setup.admission.capacity_tokens + setup.host_tier_tokens;
    // ear prices a move with the cluster's own figures: its prefill speed
    // and the KV link between instances (or decode workers).
    options.migration_cost.prefill_per_token_s = setup.cost.prefill_per_token_s;
    options.migration_cost.prefill_attention_s = setup.cost.prefill_attention_s;
    options.migration_cost.transfer_per_token_s =
        static_cast<double>(setup.cost.kv_bytes_per_token) / setup.cost.transfer_bytes_per_s;
    options.migration_cost.transfer_setup_s = setup.cost.transfer_setup_s;
    absl::StatusOr<std::unique_ptr<policy::AffinityPolicy>> affinity =
        policy::AffinityPolicy::Create(options);
    if (!affinity.ok()) return affinity.status();
    made.policy = std::move(*affinity);
    return made;
  }
  std::string known;
  for (const PolicyInfo& info : ListPolicies()) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", std::string(info.name));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy \"", std::string(name), "\" (known: ", known, ", all)"));
}

// Expands "all" into every registered policy; other names pass through.
inline std::vector<std::string> ExpandPolicyNames(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (name == "all") {
      for (const PolicyInfo& info : ListPolicies()) out.emplace_back(info.name);
    } else {
      out.push_back(name);
    }
  }
  return out;
}

}  // namespace kvc_router::sim
