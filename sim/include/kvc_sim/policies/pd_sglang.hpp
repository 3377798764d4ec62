// kvc_sim/policies/pd_sglang.hpp
//
// P/D disaggregation as SGLang deploys it today ("pd-sglang"), the baseline
// KVC has to beat on the disaggregated topology:
//  * sgl-router in PD mode builds one policy per pool from the main policy
//    (`cache_aware` unless --prefill-policy / --decode-policy say otherwise),
//    so both the prefill and the decode worker are chosen cache-aware, each
//    pool with its own approximate tree and load counts (CacheAwareSelector,
//    launcher defaults);
//  * every prefill server keeps its radix cache, so a prefill computes only
//    what that worker's page-LRU cache lacks (EngineModel::prefill_cache);
//  * decode servers run with --disaggregation-decode-enable-radix-cache: the
//    decode worker keeps a page-LRU cache of what it served and the prefill
//    worker sends only the KV beyond the decode worker's cached prefix
//    (EngineModel::delta_transfer). Without that option (SGLang's default
//    before it existed) the decode side caches nothing and every turn moves
//    its whole KV, which is what the vanilla `pd` baseline models.
//
//   kvc_router::sim::PdSglangPolicy pd(/*prefill=*/4, /*decode=*/4, /*block_tokens=*/512,
//                                      kvc_router::sim::CacheAwareOptions::Launcher());
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvc_router/policy/policy.hpp"
#include "kvc_sim/policies/cache_aware_dp.hpp"

namespace kvc_router::sim {

class PdSglangPolicy final : public policy::RoutingPolicy {
 public:
  PdSglangPolicy(uint32_t prefill_workers, uint32_t decode_workers, uint32_t block_tokens,
                 const CacheAwareOptions& options)
      : prefill_(prefill_workers, block_tokens, options),
        decode_(decode_workers, block_tokens, options),
        prefill_workers_(prefill_workers),
        decode_workers_(decode_workers) {}

  std::string_view name() const override { return "pd-sglang"; }
  policy::Topology topology() const override { return policy::Topology::kDisaggregated; }

  absl::StatusOr<policy::Placement> Place(const policy::PolicyRequest& request,
                                          policy::ClusterView& cluster) override {
    if (prefill_workers_ == 0 || decode_workers_ == 0) {
      return absl::FailedPreconditionError(
          "pd-sglang: needs at least one prefill and one decode worker");
    }
    const WorkerId prefill = prefill_.Select(request, cluster.now_s());
    return policy::CachePlacement(request, decode_.Select(request, cluster.now_s()), prefill);
  }

  void OnFinished(const policy::PolicyRequest& request, const policy::Placement& placement,
                  policy::ClusterView& cluster) override {
    (void)request;
    (void)cluster;
    prefill_.Done(placement.prefill);
    decode_.Done(placement.instance);
  }

 private:
  CacheAwareSelector prefill_;
  CacheAwareSelector decode_;
  uint32_t prefill_workers_;
  uint32_t decode_workers_;
};

}  // namespace kvc_router::sim
