// kvc_sim/policies/cache_aware_dp.hpp
//
// SGLang's cache-aware routing (sgl-router, `cache_aware` policy), as a
// baseline: `CacheAwareSelector` picks one worker of a pool, and two
// policies use it:
//  * `CacheAwareDpPolicy` ("dp"): data parallelism on colocated instances;
//  * the P/D policy in pd_sglang.hpp, one selector per pool.
//
// For each request the selector:
//  1. reads its own count of requests in flight per worker (the router's
//     load); the pool is imbalanced when (max - min) > balance_abs_threshold
//     AND max > balance_rel_threshold * min, and then the least loaded worker
//     wins (ties: lowest id), whatever the cache says;
//  2. otherwise matches the request against its approximate tree of what it
//     sent to each worker (here: the library's EstimateIndex over block
//     hashes; SGLang's tree holds characters, so the match rate, matched /
//     input, is the same ratio at a constant characters-per-token); the best
//     match wins when its rate exceeds cache_threshold (ties: lower load,
//     then lowest id), else the worker with the smallest tree;
//  3. inserts the request into the chosen worker's tree. Every
//     eviction_interval_s the tree is trimmed to max_tree_chars per worker,
//     least recently used sessions first (SGLang trims leaves by LRU; a
//     session's unshared suffix is its leaf).
// Defaults are those of the router's launcher (sglang_router.launch_router,
// sglang-router 0.2.x): 0.3 / 64 / 1.5, trimmed every 120 s to 2^26
// characters. `Rust()` gives CacheAwareConfig::default() of the Rust crate
// (0.5 / 32 / 1.1, 30 s, 10,000 characters), which only programs that build
// the policy themselves get.
//
//   kvc_router::sim::CacheAwareDpPolicy dp(/*instances=*/8, /*block_tokens=*/512,
//                                          kvc_router::sim::CacheAwareOptions::Launcher());
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/policy/policy.hpp"

namespace kvc_router::sim {

struct CacheAwareOptions {
  double cache_threshold = 0.3;
  uint32_t balance_abs_threshold = 64;
  double balance_rel_threshold = 1.5;
  double eviction_interval_s = 120;
  uint64_t max_tree_chars = uint64_t{1} << 26;
  // Characters per token, to turn the tree's character bound into tokens.
  double chars_per_token = 4.0;

  static CacheAwareOptions Launcher() { return CacheAwareOptions{}; }
  static CacheAwareOptions Rust() {
    CacheAwareOptions o;
    o.cache_threshold = 0.5;
    o.balance_abs_threshold = 32;
    o.balance_rel_threshold = 1.1;
    o.eviction_interval_s = 30;
    o.max_tree_chars = 10000;
    return o;
  }

  absl::Status Validate() const {
    if (!(cache_threshold >= 0 && cache_threshold <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cache-aware: cache_threshold must be in [0, 1], got ", cache_threshold));
    }
    if (!(balance_rel_threshold >= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cache-aware: balance_rel_threshold must be >= 1, got ", balance_rel_threshold));
    }
    if (!(eviction_interval_s >= 0) || !(chars_per_token > 0)) {
      return absl::InvalidArgumentError(
          "cache-aware: eviction_interval_s must be >= 0 and chars_per_token > 0");
    }
    return absl::OkStatus();
  }
};

class CacheAwareSelector {
 public:
  CacheAwareSelector(uint32_t workers, uint32_t block_tokens, const CacheAwareOptions& options)
      : options_(options),
        block_tokens_(block_tokens),
        tree_(workers, /*capacity_tokens=*/0, block_tokens),
        last_used_(workers),
        load_(workers, 0),
        overlap_(workers, 0) {}

  // Chooses a worker for `request` (its full input blocks) at time `now_s`,
  // learns it and counts it in flight there.
  WorkerId Select(const policy::PolicyRequest& request, double now_s) {
    MaybeEvict(now_s);
    const auto n = static_cast<WorkerId>(load_.size());
    WorkerId least = 0, most = 0;
    for (WorkerId d = 1; d < n; ++d) {
      if (load_[d] < load_[least]) least = d;
      if (load_[d] > load_[most]) most = d;
    }
    const uint64_t max_load = load_[most], min_load = load_[least];
    const bool imbalanced = max_load - min_load > options_.balance_abs_threshold &&
                            static_cast<double>(max_load) >
                                options_.balance_rel_threshold * static_cast<double>(min_load);
    WorkerId chosen = least;
    if (!imbalanced) {
      tree_.Overlap(request.input_hashes, overlap_);
      WorkerId best = 0;
      for (WorkerId d = 1; d < n; ++d) {
        if (overlap_[d] > overlap_[best] ||
            (overlap_[d] == overlap_[best] && load_[d] < load_[best])) {
          best = d;
        }
      }
      const double rate =
          request.input_tokens == 0
              ? 0.0
              : static_cast<double>(uint64_t{overlap_[best]} * block_tokens_) /
                    static_cast<double>(request.input_tokens);
      if (rate > options_.cache_threshold) {
        chosen = best;
      } else {
        chosen = 0;
        for (WorkerId d = 1; d < n; ++d) {
          if (tree_.resident_blocks(d) < tree_.resident_blocks(chosen)) chosen = d;
        }
      }
    }
    tree_.Learn(chosen, request.request.session, request.input_hashes);
    last_used_[chosen][request.request.session] = now_s;
    ++load_[chosen];
    return chosen;
  }

  // The request placed on `worker` finished.
  void Done(WorkerId worker) {
    if (worker < load_.size() && load_[worker] > 0) --load_[worker];
  }

  uint64_t load(WorkerId worker) const { return load_[worker]; }
  uint64_t tree_blocks(WorkerId worker) const { return tree_.resident_blocks(worker); }
  const CacheAwareOptions& options() const { return options_; }

 private:
  void MaybeEvict(double now_s) {
    if (options_.eviction_interval_s <= 0 || now_s < next_eviction_s_) return;
    next_eviction_s_ = now_s + options_.eviction_interval_s;
    const double max_tokens =
        static_cast<double>(options_.max_tree_chars) / options_.chars_per_token;
    for (WorkerId d = 0; d < load_.size(); ++d) {
      if (static_cast<double>(tree_.resident_blocks(d) * block_tokens_) <= max_tokens) continue;
      std::vector<std::pair<double, SessionId>> by_age;
      by_age.reserve(last_used_[d].size());
      for (const auto& [session, when] : last_used_[d]) by_age.emplace_back(when, session);
      std::sort(by_age.begin(), by_age.end());
      for (const auto& [when, session] : by_age) {
        if (static_cast<double>(tree_.resident_blocks(d) * block_tokens_) <= max_tokens) break;
        tree_.ForgetSession(d, session);
        last_used_[d].erase(session);
      }
    }
  }

  CacheAwareOptions options_;
  uint32_t block_tokens_;
  EstimateIndex tree_;
  std::vector<absl::flat_hash_map<SessionId, double>> last_used_;
  std::vector<uint64_t> load_;
  std::vector<uint32_t> overlap_;
  double next_eviction_s_ = 0;
};

// Cache-aware data parallelism on colocated instances ("dp").
class CacheAwareDpPolicy final : public policy::RoutingPolicy {
 public:
  CacheAwareDpPolicy(uint32_t instances, uint32_t block_tokens, const CacheAwareOptions& options)
      : selector_(instances, block_tokens, options), instances_(instances) {}

  std::string_view name() const override { return "dp"; }
  policy::Topology topology() const override { return policy::Topology::kColocated; }

  absl::StatusOr<policy::Placement> Place(const policy::PolicyRequest& request,
                                          policy::ClusterView& cluster) override {
    if (instances_ == 0) return absl::FailedPreconditionError("dp: no instances");
    return policy::CachePlacement(request, selector_.Select(request, cluster.now_s()));
  }

  void OnFinished(const policy::PolicyRequest& request, const policy::Placement& placement,
                  policy::ClusterView& cluster) override {
    (void)request;
    (void)cluster;
    selector_.Done(placement.instance);
  }

  const CacheAwareSelector& selector() const { return selector_; }

 private:
  CacheAwareSelector selector_;
  uint32_t instances_;
};

}  // namespace kvc_router::sim
