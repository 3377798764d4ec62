// kvc_router/testing/scripted_transport.hpp
//
// Test doubles for the WorkerTransport concept, for the library's tests and
// for users who check their own index or gateway glue with the property kit.
//
//  * `ScriptedTransport` answers admission with a function the test supplies
//    and records every call; any execution step can be told to fail with an
//    error or to throw, to check that nothing leaks.
//  * `AdmissionCluster` is a set of real AdmissionControllers, one per decode
//    worker, answering admission the way the workers would.
//
//   kvc_router::testing::AdmissionCluster cluster(4, {.capacity_tokens = 50000});
//   kvc_router::testing::ScriptedTransport transport(cluster.AdmitFunction());
//   auto decision = kvc_router::Dispatch(*state, request, transport);
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/admit.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::testing {

// The exception ScriptedTransport throws when told to.
struct TransportFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ScriptedTransport {
 public:
  using AdmitFunction =
      std::function<absl::StatusOr<AdmitResult>(WorkerId, const AdmitQuery&)>;

  enum class Step { kAdmit, kRunDirect, kPrefill, kTransferKv, kDecode, kRunFallback };
  enum class Failure { kNone, kError, kThrow };

  struct Call {
    Step step;
    WorkerId prefill;
    WorkerId decode;
    SessionId session;
  };

  explicit ScriptedTransport(AdmitFunction admit) : admit_(std::move(admit)) {}

  // The next call of `step` fails as told (once).
  void FailNext(Step step, Failure failure) {
    fail_step_ = step;
    failure_ = failure;
  }

  absl::StatusOr<AdmitResult> Admit(WorkerId decode, const AdmitQuery& query) {
    calls_.push_back({Step::kAdmit, kNoWorker, decode, query.session});
    if (absl::Status s = MaybeFail(Step::kAdmit); !s.ok()) return s;
    return admit_(decode, query);
  }
  absl::Status RunDirect(WorkerId decode, const Request& request) {
    return Record(Step::kRunDirect, kNoWorker, decode, request);
  }
  absl::Status Prefill(WorkerId prefill, const Request& request) {
    return Record(Step::kPrefill, prefill, kNoWorker, request);
  }
  absl::Status TransferKv(WorkerId prefill, WorkerId decode, const Request& request) {
    return Record(Step::kTransferKv, prefill, decode, request);
  }
  absl::Status Decode(WorkerId decode, const Request& request) {
    return Record(Step::kDecode, kNoWorker, decode, request);
  }
  absl::Status RunFallback(WorkerId prefill, WorkerId decode, const Request& request) {
    return Record(Step::kRunFallback, prefill, decode, request);
  }

  const std::vector<Call>& calls() const { return calls_; }
  void ClearCalls() { calls_.clear(); }

 private:
  absl::Status Record(Step step, WorkerId prefill, WorkerId decode, const Request& request) {
    calls_.push_back({step, prefill, decode, request.session});
    return MaybeFail(step);
  }

  absl::Status MaybeFail(Step step) {
    if (failure_ == Failure::kNone || step != fail_step_) return absl::OkStatus();
    const Failure failure = std::exchange(failure_, Failure::kNone);
    if (failure == Failure::kThrow) {
      throw TransportFailure(absl::StrCat("scripted transport threw at step ",
                                          static_cast<int>(step)));
    }
    return absl::UnavailableError(
        absl::StrCat("scripted transport failed at step ", static_cast<int>(step)));
  }

  AdmitFunction admit_;
  std::vector<Call> calls_;
  Step fail_step_ = Step::kAdmit;
  Failure failure_ = Failure::kNone;
};

// One AdmissionController per decode worker. Not thread-safe.
class AdmissionCluster {
 public:
  // `config` must be valid (AdmissionConfig::Validate); invalid configs make
  // every worker use the defaults instead, so tests should validate first.
  AdmissionCluster(uint32_t num_workers, const AdmissionConfig& config) {
    workers_.reserve(num_workers);
    for (uint32_t d = 0; d < num_workers; ++d) {
      absl::StatusOr<AdmissionController> worker = AdmissionController::Create(config);
      workers_.push_back(worker.ok() ? std::move(*worker)
                                     : *AdmissionController::Create(AdmissionConfig{}));
    }
  }

  absl::StatusOr<AdmitResult> Admit(WorkerId decode, const AdmitQuery& query) {
    if (decode >= workers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("no decode worker ", decode));
    }
    return workers_[decode].Admit(query);
  }

  ScriptedTransport::AdmitFunction AdmitFunction() {
    return [this](WorkerId decode, const AdmitQuery& query) { return Admit(decode, query); };
  }

  AdmissionController& worker(WorkerId decode) { return workers_[decode]; }
  uint32_t num_workers() const { return static_cast<uint32_t>(workers_.size()); }

 private:
  std::vector<AdmissionController> workers_;
};

}  // namespace kvc_router::testing
