// kvc_router/policy/affinity_policies.hpp
//
// The load- and affinity-based policies the EAR report compares (its §3):
//
//   load-only  the instance with the fewest running requests;
//   lmetric    argmin over instances of (pending prefill tokens + the
//              request's input tokens not cached there) x running requests,
//              the report's LMetric; ties go to the smaller first factor;
//   sticky     rendezvous (highest-random-weight) hashing of the session over
//              the instances: a session always lands on the same instance,
//              whatever its load, and adding or removing one of N instances
//              moves only ~1/N of the sessions;
//   unified    affinity by default: a session's first placement is chosen by
//              LMetric (or, when some instance already caches more than
//              `high_cache_fraction` of the request, by that cache), and its
//              later turns follow the binding.
//
// Each runs on either topology. On the colocated one it picks the instance;
// on the disaggregated one it picks the decode worker the same way and the
// prefill worker with the least pending prefill work. The instance keeps the
// request's KV as its engine does (Booking::kSession).
//
// What a policy knows of caches is its own estimate, learned from its
// placements (the prompt when placed, the context when finished) and bounded
// per instance by K_d with whole sessions evicted least recently used first
// (EstimateIndex), the way a gateway without KV events would know it. Loads
// are what ClusterView reports (a gateway scrapes them from its workers).
//
// Every decision is deterministic: ties go to the lowest id, and sticky's
// weights come from a fixed-seed hash.
//
//   kvc_router::policy::AffinityPolicyOptions options;
//   options.rule = kvc_router::policy::AffinityRule::kUnified;
//   kvc_router::policy::AffinityPolicy unified(options);
//   absl::StatusOr<kvc_router::policy::Placement> p = unified.Place(request, cluster);
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/detail/splitmix.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::policy {

// LMetric's product of two 64-bit factors, without overflow.
__extension__ typedef unsigned __int128 LMetricScore;

enum class AffinityRule : uint8_t { kLoadOnly, kLMetric, kSticky, kUnified };

inline std::string_view AffinityRuleName(AffinityRule rule) {
  switch (rule) {
    case AffinityRule::kLoadOnly:
      return "load-only";
    case AffinityRule::kLMetric:
      return "lmetric";
    case AffinityRule::kSticky:
      return "sticky";
    case AffinityRule::kUnified:
      return "unified";
  }
  return "unknown";
}

struct AffinityPolicyOptions {
  AffinityRule rule = AffinityRule::kUnified;
  Topology topology = Topology::kColocated;
  // Instances (colocated) or decode workers, and prefill workers (P/D only).
  uint32_t instances = 8;
  uint32_t prefill_workers = 0;
  uint32_t block_tokens = 24;
  // Bound of the cache estimate per instance (the workers' K_d); 0 = none.
  uint64_t kv_capacity_tokens = 0;
  // unified: a session without a binding goes where more than this fraction
  // of its input is cached, when such an instance exists.
  double high_cache_fraction = 0.5;
  // Bound on remembered session bindings (oldest placement forgotten first).
  uint64_t max_bindings = uint64_t{1} << 20;

  absl::Status Validate() const {
    if (instances == 0 || instances > kMaxWorkers) {
      return absl::InvalidArgumentError(
          absl::StrCat("AffinityPolicyOptions.instances must be in 1..", kMaxWorkers));
    }
    if (topology == Topology::kDisaggregated && (prefill_workers == 0 || prefill_workers > kMaxWorkers)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions.prefill_workers must be in 1..", kMaxWorkers,
          " on the disaggregated topology"));
    }
    if (block_tokens == 0) {
      return absl::InvalidArgumentError("AffinityPolicyOptions.block_tokens must be >= 1");
    }
    if (!(high_cache_fraction >= 0 && high_cache_fraction <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("AffinityPolicyOptions.high_cache_fraction must be in [0, 1], got ",
                       high_cache_fraction));
    }
    if (max_bindings == 0) {
      return absl::InvalidArgumentError("AffinityPolicyOptions.max_bindings must be >= 1");
    }
    return absl::OkStatus();
  }
};

// Rendezvous weight of `worker` for `session`: a fixed-seed 64-bit mix.
inline uint64_t RendezvousWeight(SessionId session, WorkerId worker) {
  kvc_router::detail::SplitMix64 mix(session * 0x9e3779b97f4a7c15ULL ^ (uint64_t{worker} << 32) ^
                                     worker);
  (void)mix.Next();
  return mix.Next();
}

// The instance rendezvous hashing gives `session` among `instances`.
inline WorkerId RendezvousInstance(SessionId session, uint32_t instances) {
  WorkerId best = 0;
  uint64_t best_weight = 0;
  for (WorkerId d = 0; d < instances; ++d) {
    const uint64_t w = RendezvousWeight(session, d);
    if (d == 0 || w > best_weight) {
      best = d;
      best_weight = w;
    }
  }
  return best;
}

class AffinityPolicy final : public RoutingPolicy {
 public:
  static absl::StatusOr<std::unique_ptr<AffinityPolicy>> Create(const AffinityPolicyOptions& options) {
    if (absl::Status s = options.Validate(); !s.ok()) return s;
    return std::unique_ptr<AffinityPolicy>(new AffinityPolicy(options));
  }

  std::string_view name() const override { return name_; }
  Topology topology() const override { return options_.topology; }

  absl::StatusOr<Placement> Place(const PolicyRequest& request, ClusterView& cluster) override {
    if (cluster.num_instances() != options_.instances ||
        (options_.topology == Topology::kDisaggregated &&
         cluster.num_prefill_workers() != options_.prefill_workers)) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, ": built for ", options_.instances, " instances and ", options_.prefill_workers,
          " prefill workers, the cluster has ", cluster.num_instances(), " and ",
          cluster.num_prefill_workers()));
    }
    const WorkerId chosen = Choose(request, cluster);
    estimate_.Learn(chosen, request.request.session, request.input_hashes);
    Bind(request.request.session, chosen);
    return CachePlacement(request, chosen,
                          options_.topology == Topology::kDisaggregated ? ChoosePrefill(cluster)
                                                                        : kNoWorker);
  }

  void OnFinished(const PolicyRequest& request, const Placement& placement,
                  ClusterView& cluster) override {
    (void)cluster;
    if (placement.instance < options_.instances &&
        request.context_hashes.size() >= request.input_hashes.size()) {
      estimate_.Learn(placement.instance, request.request.session, request.context_hashes);
    }
  }

  // The instance a session is bound to (unified and sticky), or kNoWorker.
  WorkerId binding(SessionId session) const {
    auto it = bindings_.find(session);
    return it == bindings_.end() ? kNoWorker : it->second.instance;
  }
  // Tokens of `hashes` the policy believes `instance` caches.
  uint64_t EstimatedHitTokens(WorkerId instance, std::span<const BlockHash> hashes) {
    estimate_.Overlap(hashes, overlap_);
    return uint64_t{overlap_[instance]} * options_.block_tokens;
  }

 private:
  explicit AffinityPolicy(const AffinityPolicyOptions& options)
      : options_(options),
        name_(std::string(AffinityRuleName(options.rule)) +
              (options.topology == Topology::kDisaggregated ? "-pd" : "")),
        estimate_(options.instances, options.kv_capacity_tokens, options.block_tokens),
        overlap_(options.instances, 0) {}

  WorkerId Choose(const PolicyRequest& request, ClusterView& cluster) {
    const uint32_t n = options_.instances;
    switch (options_.rule) {
      case AffinityRule::kLoadOnly: {
        WorkerId best = 0;
        for (WorkerId d = 1; d < n; ++d) {
          if (cluster.instance_load(d).running_requests <
              cluster.instance_load(best).running_requests) {
            best = d;
          }
        }
        return best;
      }
      case AffinityRule::kSticky:
        return RendezvousInstance(request.request.session, n);
      case AffinityRule::kLMetric:
        return LMetric(request, cluster);
      case AffinityRule::kUnified: {
        const WorkerId bound = binding(request.request.session);
        if (bound != kNoWorker) return bound;
        estimate_.Overlap(request.input_hashes, overlap_);
        WorkerId best_cache = 0;
        for (WorkerId d = 1; d < n; ++d) {
          if (overlap_[d] > overlap_[best_cache]) best_cache = d;
        }
        const double cached = static_cast<double>(uint64_t{overlap_[best_cache]} * options_.block_tokens);
        if (request.input_tokens > 0 &&
            cached > options_.high_cache_fraction * static_cast<double>(request.input_tokens)) {
          return best_cache;
        }
        return LMetric(request, cluster);
      }
    }
    return 0;
  }

  // argmin (pending prefill + uncached input) x running requests; ties: the
  // smaller prefill term, then the lowest id.
  WorkerId LMetric(const PolicyRequest& request, ClusterView& cluster) {
    estimate_.Overlap(request.input_hashes, overlap_);
    WorkerId best = 0;
    LMetricScore best_score = 0;
    uint64_t best_prefill = 0;
    for (WorkerId d = 0; d < options_.instances; ++d) {
      const InstanceLoad load = cluster.instance_load(d);
      const uint64_t hit = std::min<uint64_t>(request.input_tokens,
                                              uint64_t{overlap_[d]} * options_.block_tokens);
      const uint64_t prefill = load.pending_prefill_tokens + (request.input_tokens - hit);
      const LMetricScore score = static_cast<LMetricScore>(prefill) * load.running_requests;
      if (d == 0 || score < best_score || (score == best_score && prefill < best_prefill)) {
        best = d;
        best_score = score;
        best_prefill = prefill;
      }
    }
    return best;
  }

  WorkerId ChoosePrefill(ClusterView& cluster) const {
    WorkerId best = 0;
    InstanceLoad best_load = cluster.prefill_load(0);
    for (WorkerId p = 1; p < options_.prefill_workers; ++p) {
      const InstanceLoad load = cluster.prefill_load(p);
      if (load.pending_prefill_tokens < best_load.pending_prefill_tokens ||
          (load.pending_prefill_tokens == best_load.pending_prefill_tokens &&
           load.running_requests < best_load.running_requests)) {
        best = p;
        best_load = load;
      }
    }
    return best;
  }

  void Bind(SessionId session, WorkerId instance) {
    if (options_.rule != AffinityRule::kUnified && options_.rule != AffinityRule::kSticky) return;
    auto [it, inserted] = bindings_.try_emplace(session, Binding{instance, ++clock_});
    if (!inserted) {
      it->second = Binding{instance, ++clock_};
      return;
    }
    order_.push_back({session, it->second.stamp});
    // Forget the oldest bindings beyond the bound (lazy queue of stamps).
    while (bindings_.size() > options_.max_bindings && head_ < order_.size()) {
      const auto [old, stamp] = order_[head_++];
      auto jt = bindings_.find(old);
      if (jt != bindings_.end() && jt->second.stamp == stamp) {
        bindings_.erase(jt);
      } else if (jt != bindings_.end()) {
        order_.push_back({old, jt->second.stamp});
      }
    }
    if (head_ > 4096 && head_ * 2 > order_.size()) {
      order_.erase(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(head_));
      head_ = 0;
    }
  }

  struct Binding {
    WorkerId instance = kNoWorker;
    uint64_t stamp = 0;
  };

  AffinityPolicyOptions options_;
  std::string name_;
  EstimateIndex estimate_;
  std::vector<uint32_t> overlap_;
  absl::flat_hash_map<SessionId, Binding> bindings_;
  std::vector<std::pair<SessionId, uint64_t>> order_;
  size_t head_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace kvc_router::policy
