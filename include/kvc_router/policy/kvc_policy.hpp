// kvc_router/policy/kvc_policy.hpp
//
// The KVC-Router as a RoutingPolicy: the library's own RoutingState with a
// placement-learned FastIndex (the production estimate), driven through the I/O-free
// StartDispatch/DispatchOp, with every admission question sent to the
// cluster's decode workers (ClusterView::Admit), which answer with their own
// AdmissionController. Nothing here re-implements Algorithms 1-3.
//
// v2 is the default; v1 is the same policy with
// RouterConfig::reset_on_success = false. On the colocated topology
// (RouterConfig::num_prefill_workers = 0) Seed and Reseed prefill on the
// instance itself.
//
// After a turn finishes the policy teaches the index the blocks the output
// completed (RoutingState::LearnResidency), as a gateway that hashes the
// model's answer would. With `kv_events` it also forgets sessions the
// workers evicted; by default the router keeps its own estimate, which is
// the seed's setting.
//
//   kvc_router::policy::KvcPolicyOptions options;
//   options.router.num_decode_workers = 3;
//   auto kvc = kvc_router::policy::KvcPolicy::Create("kvc", options);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/fast_index.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_router/policy/rendezvous.hpp"
#include "kvc_router/routing_state.hpp"

namespace kvc_router::policy {

struct KvcPolicyOptions {
  // |D| (or the instances), |P| (0 = colocated), block size, alpha, tau_reject,
  // epsilon, reset_on_success (false = v1).
  RouterConfig router;
  // Bound of the router's residency estimate per worker (the workers' K_d);
  // 0 = unbounded.
  uint64_t index_capacity_tokens = 92104;
  // Learn the blocks each finished turn's output completed.
  bool learn_outputs = true;
  // Forget sessions the workers report evicted (KV events).
  bool kv_events = false;
  // Beyond the seed (P/D only): back every admitted session's KV up to one
  // prefill worker, its backup home (rendezvous hashing of the session over
  // P), after each turn (PlanBackup), and prefill its Seed, Reseed and
  // Fallback turns there, where the backup lets them reuse the context.
  bool kv_backup = false;
};

class KvcPolicy final : public RoutingPolicy {
 public:
  static absl::StatusOr<std::unique_ptr<KvcPolicy>> Create(std::string name,
                                                           const KvcPolicyOptions& options) {
    // Validate before building the index, whose size follows |D|.
    if (absl::Status status = options.router.Validate(); !status.ok()) return status;
    absl::StatusOr<FastIndex> index =
        FastIndex::Create(options.router.num_decode_workers, options.index_capacity_tokens,
                          options.router.block_tokens);
    if (!index.ok()) return index.status();
    auto policy = std::unique_ptr<KvcPolicy>(new KvcPolicy(std::move(name), options));
    const double* now = &policy->now_s_;
    auto state = RoutingState<FastIndex>::Create(
        options.router, std::move(*index),
        [now] { return absl::UnixEpoch() + absl::Seconds(*now); });
    if (!state.ok()) return state.status();
    policy->state_ = std::move(*state);
    return policy;
  }

  std::string_view name() const override { return name_; }
  Topology topology() const override {
    return options_.router.num_prefill_workers == 0 ? Topology::kColocated
                                                    : Topology::kDisaggregated;
  }
  bool uses_admission() const override { return true; }

  absl::StatusOr<Placement> Place(const PolicyRequest& request, ClusterView& cluster) override {
    now_s_ = cluster.now_s();
    absl::StatusOr<DispatchOp<FastIndex>> op = StartDispatch(*state_, request.request);
    if (!op.ok()) return op.status();
    Placement placement;
    while (op->awaiting_admit()) {
      absl::StatusOr<AdmitResult> answer = cluster.Admit(op->admit_target(), op->admit_query());
      const AdmitResult result =
          answer.ok() ? *answer : AdmitResult::Rejected(RejectReason::kWorkerUnavailable);
      // The op validates the answer first (a reason outside RejectReason is
      // refused), so only well-formed rejections are counted.
      if (absl::Status fed = op->OnAdmitResult(result); !fed.ok()) return fed;
      const int reason = static_cast<int>(result.reason);
      if (!result.admitted && reason < kNumRejectReasons) ++placement.rejections[reason];
    }
    const Decision& decision = op->decision();
    placement.mode = decision.mode;
    placement.prefill = decision.prefill;
    placement.instance = decision.decode;
    placement.booking =
        decision.mode == DecisionMode::kFallback ? Booking::kTransient : Booking::kAdmitted;
    placement.admit_attempts = op->attempts();
    if (options_.kv_backup && placement.prefill != kNoWorker) {
      placement.prefill = BackupHome(request.request.session);
    }
    ops_.insert_or_assign(request.id, std::move(*op));
    return placement;
  }

  std::optional<BackupPlan> PlanBackup(const PolicyRequest& request,
                                       const Placement& placement) const override {
    if (!options_.kv_backup || options_.router.num_prefill_workers == 0 ||
        placement.booking != Booking::kAdmitted) {
      return std::nullopt;
    }
    return BackupPlan{request.request.session, placement.instance,
                      BackupHome(request.request.session),
                      uint64_t{request.context_hashes.size()} * options_.router.block_tokens};
  }

  // The prefill worker holding `session`'s backup (kv_backup).
  WorkerId BackupHome(SessionId session) const {
    return RendezvousInstance(session, options_.router.num_prefill_workers);
  }

  void OnFinished(const PolicyRequest& request, const Placement& placement,
                  ClusterView& cluster) override {
    now_s_ = cluster.now_s();
    auto it = ops_.find(request.id);
    if (it == ops_.end()) return;
    (void)it->second.Complete();
    ops_.erase(it);
    if (options_.learn_outputs && placement.booking == Booking::kAdmitted &&
        request.context_hashes.size() > request.input_hashes.size()) {
      (void)state_->LearnResidency(placement.instance, request.request.session,
                                   request.context_hashes);
    }
  }

  void OnEvicted(WorkerId instance, SessionId session) override {
    if (options_.kv_events) (void)state_->OnSessionEvicted(instance, session);
  }

  const RoutingState<FastIndex>& state() const { return *state_; }

 private:
  KvcPolicy(std::string name, const KvcPolicyOptions& options)
      : name_(std::move(name)), options_(options) {}

  std::string name_;
  KvcPolicyOptions options_;
  double now_s_ = 0;
  std::unique_ptr<RoutingState<FastIndex>> state_;
  // Placed requests, by request id, until they finish.
  absl::flat_hash_map<uint64_t, DispatchOp<FastIndex>> ops_;
};

}  // namespace kvc_router::policy
