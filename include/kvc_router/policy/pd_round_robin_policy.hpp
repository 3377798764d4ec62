// kvc_router/policy/pd_round_robin_policy.hpp
//
// Vanilla P/D disaggregation, the seed's baseline: every request is
// prefilled in full on the next prefill worker (round-robin), its KV shipped
// to the next decode worker (round-robin), decoded there and dropped. No
// session awareness and no cross-turn reuse, so a later turn recomputes its
// whole context. Modes are reported as Seed (turn 0) and Reseed (later
// turns): every turn pays a full prefill and a full KV transfer.
//
//   kvc_router::policy::PdRoundRobinPolicy pd(/*prefill_workers=*/1, /*decode_workers=*/3);
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvc_router/policy/policy.hpp"

namespace kvc_router::policy {

class PdRoundRobinPolicy final : public RoutingPolicy {
 public:
  PdRoundRobinPolicy(uint32_t prefill_workers, uint32_t decode_workers)
      : prefill_workers_(prefill_workers), decode_workers_(decode_workers) {}

  std::string_view name() const override { return "pd"; }
  Topology topology() const override { return Topology::kDisaggregated; }

  absl::StatusOr<Placement> Place(const PolicyRequest& request, ClusterView& cluster) override {
    (void)cluster;
    if (prefill_workers_ == 0 || decode_workers_ == 0) {
      return absl::FailedPreconditionError("pd: needs at least one prefill and one decode worker");
    }
    Placement placement;
    placement.mode = request.request.turn == 0 ? DecisionMode::kSeed : DecisionMode::kReseed;
    placement.prefill = static_cast<WorkerId>(next_prefill_++ % prefill_workers_);
    placement.instance = static_cast<WorkerId>(next_decode_++ % decode_workers_);
    placement.booking = Booking::kTransient;
    return placement;
  }

 private:
  uint32_t prefill_workers_;
  uint32_t decode_workers_;
  uint64_t next_prefill_ = 0;
  uint64_t next_decode_ = 0;
};

}  // namespace kvc_router::policy
