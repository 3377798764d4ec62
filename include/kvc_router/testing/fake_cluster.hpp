// kvc_router/testing/fake_cluster.hpp
//
// Test doubles for the policy interface (policy/policy.hpp), for the
// library's tests and for users who check a policy of their own:
//
//  * `FakeCluster` is a ClusterView whose loads a test sets by hand, whose
//    clock it moves, and whose decode workers are real AdmissionControllers
//    answering the admission RPC; it records which workers were asked.
//    `down` and `prefill_down` mark workers not routable (as a gateway's
//    open circuit breaker would), `drain` instances an operator drains.
//  * `GrowingSession` builds the PolicyRequests of one session turn by turn:
//    each turn appends new blocks to the session's chain.
//
//   kvc_router::testing::FakeCluster cluster(kvc_router::policy::Topology::kColocated,
//                                            /*prefill=*/0, /*instances=*/4,
//                                            /*capacity_tokens=*/100000);
//   cluster.load(2).running_requests = 5;
//   kvc_router::testing::GrowingSession s{/*id=*/7};
//   auto placement = policy.Place(s.Next(/*request_id=*/0, /*new_blocks=*/20), cluster);
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvc_router/admit.hpp"
#include "kvc_router/block_hash.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::testing {

class FakeCluster final : public policy::ClusterView {
 public:
  FakeCluster(policy::Topology topology, uint32_t prefill, uint32_t instances,
              uint64_t capacity_tokens)
      : topology_(topology), loads_(instances), prefill_loads_(prefill) {
    for (uint32_t d = 0; d < instances; ++d) {
      AdmissionConfig config;
      config.capacity_tokens = capacity_tokens;
      workers_.push_back(*AdmissionController::Create(config));
    }
  }
  policy::Topology topology() const override { return topology_; }
  uint32_t num_prefill_workers() const override {
    return static_cast<uint32_t>(prefill_loads_.size());
  }
  uint32_t num_instances() const override { return static_cast<uint32_t>(workers_.size()); }
  policy::InstanceLoad instance_load(WorkerId d) const override {
    return d < loads_.size() ? loads_[d] : policy::InstanceLoad{};
  }
  policy::InstanceLoad prefill_load(WorkerId p) const override {
    return p < prefill_loads_.size() ? prefill_loads_[p] : policy::InstanceLoad{};
  }
  double now_s() const override { return now; }
  bool routable(WorkerId d) const override { return d >= down.size() || !down[d]; }
  bool prefill_routable(WorkerId p) const override {
    return p >= prefill_down.size() || !prefill_down[p];
  }
  bool draining(WorkerId d) const override { return d < drain.size() && drain[d]; }
  absl::StatusOr<AdmitResult> Admit(WorkerId d, const AdmitQuery& query) override {
    asked.push_back(d);
    if (d >= workers_.size()) return absl::NotFoundError("no such worker");
    return workers_[d].Admit(query);
  }

  policy::InstanceLoad& load(WorkerId d) { return loads_[d]; }
  policy::InstanceLoad& prefill(WorkerId p) { return prefill_loads_[p]; }
  AdmissionController& worker(WorkerId d) { return workers_[d]; }

  double now = 0;
  // Instances (prefill workers) set true here are not routable.
  std::vector<bool> down;
  std::vector<bool> prefill_down;
  // Instances set true here are draining (set them in `down` too: a
  // draining instance is not routable, but still answers).
  std::vector<bool> drain;
  // Workers asked by Admit, in order.
  std::vector<WorkerId> asked;

 private:
  policy::Topology topology_;
  std::vector<policy::InstanceLoad> loads_;
  std::vector<policy::InstanceLoad> prefill_loads_;
  std::vector<AdmissionController> workers_;
};

// One session's requests with `block_tokens`-token blocks; its chain grows
// by the new blocks of each turn. Token values depend on the session id, so
// two sessions share no block unless a test copies a chain into `chain`.
struct GrowingSession {
  SessionId id = 0;
  std::vector<BlockHash> chain;
  uint32_t turn = 0;
  uint32_t block_tokens = 16;

  policy::PolicyRequest Next(uint64_t request_id, size_t new_blocks) {
    const size_t prefix = chain.size();
    for (size_t i = 0; i < new_blocks; ++i) {
      const TokenId token = static_cast<TokenId>(id * 1000 + chain.size());
      chain.push_back(HashBlock(chain.empty() ? kChainRootHash : chain.back(),
                                std::span<const TokenId>(&token, 1)));
    }
    policy::PolicyRequest r;
    r.id = request_id;
    r.request.session = id;
    r.request.turn = turn++;
    r.request.prefix_hashes = std::span<const BlockHash>(chain).first(prefix);
    r.request.appended_hashes = std::span<const BlockHash>(chain).subspan(prefix);
    r.request.append_tokens = new_blocks * block_tokens;
    r.input_tokens = chain.size() * block_tokens;
    r.input_hashes = chain;
    r.context_hashes = chain;
    return r;
  }
};

}  // namespace kvc_router::testing
