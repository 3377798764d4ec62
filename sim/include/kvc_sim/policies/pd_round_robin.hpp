// kvc_sim/policies/pd_round_robin.hpp
//
// Vanilla P/D disaggregation ("pd"), the KVC seed's baseline and its
// Fallback: every request is prefilled in full on the next prefill worker
// (round-robin, no prefix cache there), its whole KV shipped to the next
// decode worker (round-robin), decoded there and dropped. No session
// awareness and no cross-turn reuse, so a later turn recomputes its whole
// context. Modes are Seed (turn 0) and Reseed (later turns). This is not how
// SGLang's P/D runs today; pd_sglang.hpp models that.
//
//   kvc_router::sim::PdRoundRobinPolicy pd(/*prefill_workers=*/1, /*decode_workers=*/3);
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvc_router/policy/policy.hpp"

namespace kvc_router::sim {

class PdRoundRobinPolicy final : public policy::RoutingPolicy {
 public:
  PdRoundRobinPolicy(uint32_t prefill_workers, uint32_t decode_workers)
      : prefill_workers_(prefill_workers), decode_workers_(decode_workers) {}

  std::string_view name() const override { return "pd"; }
  policy::Topology topology() const override { return policy::Topology::kDisaggregated; }

  absl::StatusOr<policy::Placement> Place(const policy::PolicyRequest& request,
                                          policy::ClusterView& cluster) override {
    (void)cluster;
    if (prefill_workers_ == 0 || decode_workers_ == 0) {
      return absl::FailedPreconditionError("pd: needs at least one prefill and one decode worker");
    }
    policy::Placement placement;
    placement.mode = request.request.turn == 0 ? DecisionMode::kSeed : DecisionMode::kReseed;
    placement.prefill = static_cast<WorkerId>(next_prefill_++ % prefill_workers_);
    placement.instance = static_cast<WorkerId>(next_decode_++ % decode_workers_);
    placement.booking = policy::Booking::kTransient;
    return placement;
  }

 private:
  uint32_t prefill_workers_;
  uint32_t decode_workers_;
  uint64_t next_prefill_ = 0;
  uint64_t next_decode_ = 0;
};

}  // namespace kvc_router::sim
