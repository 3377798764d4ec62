// kvc_router/policy/cache_aware_dp_policy.hpp
//
// Cache-aware data parallelism in the style of SGLang's router, on the
// colocated topology: every instance prefills and decodes, and keeps a
// prefix cache of what it served.
//
// For each request:
//  1. Load is the number of requests the router has in flight per instance.
//     The system is imbalanced when (max - min) > balance_abs_threshold AND
//     max > balance_rel_threshold * min; then the least loaded instance
//     wins (ties: lowest id), whatever the cache says.
//  2. Otherwise the router's approximate prefix tree (here: the library's
//     EstimateIndex, learned from the router's own placements and bounded by
//     the instances' KV size) gives each instance's matched prefix; the match
//     rate is matched tokens / input tokens. The best match wins when its
//     rate exceeds cache_threshold (ties: lower load, then lowest id); else
//     the instance whose tree is smallest (most free cache) wins.
//  3. The chosen instance's tree learns the request's blocks.
// Defaults follow SGLang's router (cache_threshold 0.5, balance_abs_threshold
// 32, balance_rel_threshold 1.1); docs/simulator.md cites them.
//
//   kvc_router::policy::CacheAwareDpPolicy dp(/*instances=*/4, /*block_tokens=*/512,
//                                              /*tree_capacity_tokens=*/92104, {});
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/policy/policy.hpp"

namespace kvc_router::policy {

struct CacheAwareOptions {
  double cache_threshold = 0.5;
  uint32_t balance_abs_threshold = 32;
  double balance_rel_threshold = 1.1;
};

class CacheAwareDpPolicy final : public RoutingPolicy {
 public:
  CacheAwareDpPolicy(uint32_t instances, uint32_t block_tokens, uint64_t tree_capacity_tokens,
                     const CacheAwareOptions& options)
      : options_(options),
        block_tokens_(block_tokens),
        tree_(instances, tree_capacity_tokens, block_tokens),
        load_(instances, 0),
        overlap_(instances, 0) {}

  std::string_view name() const override { return "dp"; }
  Topology topology() const override { return Topology::kColocated; }

  absl::StatusOr<Placement> Place(const PolicyRequest& request, ClusterView& cluster) override {
    (void)cluster;
    const auto n = static_cast<WorkerId>(load_.size());
    if (n == 0) return absl::FailedPreconditionError("dp: no instances");
    WorkerId least = 0, most = 0;
    for (WorkerId d = 1; d < n; ++d) {
      if (load_[d] < load_[least]) least = d;
      if (load_[d] > load_[most]) most = d;
    }
    const uint64_t max_load = load_[most], min_load = load_[least];
    const bool imbalanced =
        max_load - min_load > options_.balance_abs_threshold &&
        static_cast<double>(max_load) > options_.balance_rel_threshold * static_cast<double>(min_load);
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
    ++load_[chosen];
    Placement placement;
    placement.mode = request.request.turn == 0 ? DecisionMode::kSeed : DecisionMode::kReseed;
    placement.instance = chosen;
    placement.booking = Booking::kSession;
    return placement;
  }

  void OnFinished(const PolicyRequest& request, const Placement& placement,
                  ClusterView& cluster) override {
    (void)request;
    (void)cluster;
    if (placement.instance < load_.size() && load_[placement.instance] > 0) {
      --load_[placement.instance];
    }
  }

 private:
  CacheAwareOptions options_;
  uint32_t block_tokens_;
  EstimateIndex tree_;
  std::vector<uint64_t> load_;
  std::vector<uint32_t> overlap_;
};

}  // namespace kvc_router::policy
