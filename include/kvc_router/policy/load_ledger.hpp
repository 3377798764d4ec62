// kvc_router/policy/load_ledger.hpp
//
// The load a gateway can know without asking its workers: what it sent them
// and has not seen come back. `LoadLedger` is a `ClusterView` built from
// that alone, so a gateway can run the load- and affinity-based policies
// (affinity_policies.hpp, `ear` among them) without scraping engine metrics:
//
//   pending prefill tokens  the prefill work of requests sent to an instance
//                           (or prefill worker) whose first token has not
//                           come back yet;
//   running requests        requests sent and not finished.
//
// Each placed request gets a `LoadLedger::Ticket` that gives its load back
// exactly once: its prefill share at `FirstToken()` (or when it finishes or
// is dropped without one) and its running slot at `Finish()` or in its
// destructor, so a transport that throws or an early return loses nothing.
// `Rebook()` corrects the prefill share before the first token when the
// placement's estimate proves wrong (a KV move it counted on failed).
// These policies make no admission RPC; `Admit` says so.
//
// Health: the ledger keeps a circuit breaker per instance and per prefill
// worker (health.hpp's, same thresholds and states), fed by the caller with
// `ReportAnswered` / `ReportUnavailable` for each request it sent. A worker
// whose requests got no answer `failure_threshold` times within the window
// is not `routable()` for a cooldown, then takes one probe request (the next
// ticket started there); an answer closes its breaker. The EAR family
// places nothing on a worker that is not routable and places a session
// bound there anew, so a dead instance neither keeps its sessions failing
// nor, looking idle once its tickets are released, draws new ones. An
// operator can also drain an instance (`SetDrained`): it is not routable
// until resumed, while what runs there finishes. Instances can join at
// runtime (`AddInstance`, the next id, idle and routable; tell the policy
// too, AffinityPolicy::AddInstance); one leaves by being drained for good.
//
// The ledger is thread-safe: many gateway threads may start and finish
// requests and read loads at once. A ticket has one owner (hand it to the
// thread that sees the first token and the end, or guard it). The policies
// themselves are not thread-safe: serialise Place and OnFinished. The
// ledger must outlive its tickets.
//
//   auto ledger = kvc_router::policy::LoadLedger::Create(Topology::kColocated, 8, 0);
//   absl::StatusOr<Placement> where = ear->Place(request, **ledger);
//   auto ticket = (*ledger)->Start(*where, request.input_tokens - where->estimated_hit_tokens);
//   ... send; on the first streamed token: ticket->FirstToken(); at the end: ticket->Finish();
//   (*ledger)->ReportAnswered(where->instance);   // or ReportUnavailable when it never answered
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvc_router/config.hpp"
#include "kvc_router/health.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::policy {

class LoadLedger final : public ClusterView {
 public:
  // Seconds on a monotonic clock; tests pass their own.
  using Clock = std::function<double()>;

  // `instances`: colocated instances or decode workers; `prefill_workers`:
  // 0 on the colocated topology, at least 1 on the disaggregated one.
  // `health`: the circuit breakers' thresholds (enabled = false: every
  // worker is always routable).
  static absl::StatusOr<std::unique_ptr<LoadLedger>> Create(Topology topology, uint32_t instances,
                                                            uint32_t prefill_workers,
                                                            Clock clock = nullptr,
                                                            const HealthConfig& health = {}) {
    if (!IsKnownTopology(topology)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadLedger: topology ", static_cast<int>(topology), " is not a Topology"));
    }
    if (instances == 0 || instances > kMaxWorkers) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadLedger: instances must be in 1..", kMaxWorkers, ", got ", instances));
    }
    if (topology == Topology::kDisaggregated && (prefill_workers == 0 || prefill_workers > kMaxWorkers)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadLedger: the disaggregated topology needs 1..", kMaxWorkers,
          " prefill workers, got ", prefill_workers));
    }
    if (topology == Topology::kColocated && prefill_workers != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadLedger: the colocated topology has no prefill workers, got ", prefill_workers));
    }
    if (absl::Status valid = health.Validate(); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("LoadLedger: ", valid.message()));
    }
    if (clock == nullptr) {
      const auto start = std::chrono::steady_clock::now();
      clock = [start] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      };
    }
    return std::unique_ptr<LoadLedger>(
        new LoadLedger(topology, instances, prefill_workers, std::move(clock), health));
  }

  // One placed request's share of the load; move-only, gives it back once.
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept {
      if (this != &other) {
        Finish();
        ledger_ = std::exchange(other.ledger_, nullptr);
        prefill_on_ = other.prefill_on_;
        prefill_is_worker_ = other.prefill_is_worker_;
        instance_ = other.instance_;
        prefill_tokens_ = other.prefill_tokens_;
        prefill_open_ = std::exchange(other.prefill_open_, false);
      }
      return *this;
    }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { Finish(); }

    // The first token came back: the request's prefill is done.
    void FirstToken() {
      if (ledger_ == nullptr || !prefill_open_) return;
      prefill_open_ = false;
      ledger_->ReleasePrefill(prefill_on_, prefill_is_worker_, prefill_tokens_);
    }
    // The request ended (answered, failed or abandoned).
    void Finish() {
      if (ledger_ == nullptr) return;
      FirstToken();
      std::exchange(ledger_, nullptr)->ReleaseRunning(instance_);
    }
    // The prefill turned out to be `prefill_tokens` instead of what was
    // booked, before its first token: a KV move the placement counted on
    // failed or brought less, so the instance prefills more. The ledger then
    // carries the new figure until FirstToken. Refused, changing nothing,
    // once the prefill is given back or past kMaxCapacityTokens.
    absl::Status Rebook(uint64_t prefill_tokens) {
      if (ledger_ == nullptr || !prefill_open_) {
        return absl::FailedPreconditionError(
            "LoadLedger::Ticket::Rebook: the prefill was already given back (first token or "
            "end seen); nothing is pending to correct");
      }
      if (prefill_tokens > kMaxCapacityTokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "LoadLedger::Ticket::Rebook: prefill_tokens ", prefill_tokens, " is above ",
            kMaxCapacityTokens));
      }
      ledger_->ReplacePrefill(prefill_on_, prefill_is_worker_, prefill_tokens_, prefill_tokens);
      prefill_tokens_ = prefill_tokens;
      return absl::OkStatus();
    }
    uint64_t prefill_tokens() const { return prefill_tokens_; }
    bool finished() const { return ledger_ == nullptr; }

   private:
    friend class LoadLedger;
    Ticket() = default;
    LoadLedger* ledger_ = nullptr;
    WorkerId prefill_on_ = kNoWorker;
    bool prefill_is_worker_ = false;
    WorkerId instance_ = kNoWorker;
    uint64_t prefill_tokens_ = 0;
    bool prefill_open_ = false;
  };

  // Books a request placed by a policy: `prefill_tokens` of prefill work (its
  // input less what the serving side is expected to hold, e.g.
  // input_tokens - placement.estimated_hit_tokens) on the prefill worker, or
  // on the instance when it prefills itself (colocated, or a decode worker
  // serving an append in place), and one running request on the instance.
  // A placement naming no instance or an unknown worker is refused and books
  // nothing.
  absl::StatusOr<Ticket> Start(const Placement& placement, uint64_t prefill_tokens) {
    if (placement.instance >= num_instances_.load()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadLedger::Start: placement instance ", placement.instance, " is not one of the ",
          num_instances_.load(), " instances"));
    }
    if (prefill_tokens > kMaxCapacityTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadLedger::Start: prefill_tokens ", prefill_tokens, " is above ", kMaxCapacityTokens,
          " (more than any KV pool; an input minus a larger hit wrapped around?)"));
    }
    const bool on_worker = placement.prefill != kNoWorker;
    if (on_worker && placement.prefill >= num_prefill_workers_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadLedger::Start: placement prefill worker ", placement.prefill, " is not one of the ",
          num_prefill_workers_, " prefill workers"));
    }
    const absl::Time now = AsTime(clock_());
    Ticket ticket;
    ticket.ledger_ = this;
    ticket.instance_ = placement.instance;
    ticket.prefill_on_ = on_worker ? placement.prefill : placement.instance;
    ticket.prefill_is_worker_ = on_worker;
    ticket.prefill_tokens_ = prefill_tokens;
    ticket.prefill_open_ = true;
    absl::MutexLock lock(&mu_);
    // A half-open breaker's probe is the request started there.
    instance_health_.OnSend(placement.instance, now);
    if (on_worker) prefill_health_.OnSend(placement.prefill, now);
    InstanceLoad& instance = instances_[placement.instance];
    ++instance.running_requests;
    InstanceLoad& prefiller = on_worker ? prefill_[placement.prefill] : instance;
    prefiller.pending_prefill_tokens += prefill_tokens;
    if (on_worker) ++prefiller.running_requests;
    return ticket;
  }

  // ClusterView.
  Topology topology() const override { return topology_; }
  uint32_t num_prefill_workers() const override { return num_prefill_workers_; }
  uint32_t num_instances() const override { return num_instances_.load(); }
  InstanceLoad instance_load(WorkerId instance) const override {
    if (instance >= num_instances_.load()) return InstanceLoad{};
    absl::MutexLock lock(&mu_);
    return instances_[instance];
  }
  InstanceLoad prefill_load(WorkerId prefill) const override {
    if (prefill >= num_prefill_workers_) return InstanceLoad{};
    absl::MutexLock lock(&mu_);
    return prefill_[prefill];
  }
  double now_s() const override { return clock_(); }
  bool routable(WorkerId instance) const override {
    const absl::Time now = AsTime(clock_());
    absl::MutexLock lock(&mu_);
    if (instance < drained_.size() && drained_[instance]) return false;
    return instance_health_.Routable(instance, now);
  }

  // A new instance joins: the next id, with no load, a closed breaker and
  // not drained. ResourceExhausted once kMaxWorkers instances exist.
  absl::StatusOr<WorkerId> AddInstance() {
    absl::MutexLock lock(&mu_);
    const uint32_t id = num_instances_.load();
    if (id >= kMaxWorkers) {
      return absl::ResourceExhaustedError(
          absl::StrCat("LoadLedger::AddInstance: all ", kMaxWorkers, " instances exist"));
    }
    instances_.emplace_back();
    drained_.push_back(false);
    instance_health_.Resize(id + 1);
    num_instances_.store(id + 1);
    return id;
  }

  // Drains `instance` (true: nothing new goes there; requests running there
  // finish and give their load back as usual) or resumes it (false).
  // Refused, changing nothing, for an unknown instance.
  absl::Status SetDrained(WorkerId instance, bool drained) {
    if (instance >= num_instances_.load()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoadLedger::SetDrained: instance ", instance, " is not one of the ", num_instances_.load(),
          " instances"));
    }
    absl::MutexLock lock(&mu_);
    drained_[instance] = drained;
    return absl::OkStatus();
  }
  bool drained(WorkerId instance) const {
    absl::MutexLock lock(&mu_);
    return instance < drained_.size() && drained_[instance];
  }
  // Drained and still answering (its breaker closed): its KV can be moved.
  bool draining(WorkerId instance) const override {
    const absl::Time now = AsTime(clock_());
    absl::MutexLock lock(&mu_);
    return instance < drained_.size() && drained_[instance] &&
           instance_health_.state(instance, now) == BreakerState::kClosed;
  }
  bool prefill_routable(WorkerId prefill) const override {
    const absl::Time now = AsTime(clock_());
    absl::MutexLock lock(&mu_);
    return prefill_health_.Routable(prefill, now);
  }

  // What became of a request sent to `instance`: it answered (whatever the
  // answer said), or it never did (connection refused, timeout).
  void ReportAnswered(WorkerId instance) {
    absl::MutexLock lock(&mu_);
    instance_health_.OnAnswer(instance);
  }
  void ReportUnavailable(WorkerId instance) {
    const absl::Time now = AsTime(clock_());
    absl::MutexLock lock(&mu_);
    instance_health_.OnFailure(instance, now);
  }
  // The same for prefill worker `prefill` (disaggregated topology).
  void ReportPrefillAnswered(WorkerId prefill) {
    absl::MutexLock lock(&mu_);
    prefill_health_.OnAnswer(prefill);
  }
  void ReportPrefillUnavailable(WorkerId prefill) {
    const absl::Time now = AsTime(clock_());
    absl::MutexLock lock(&mu_);
    prefill_health_.OnFailure(prefill, now);
  }
  // The breaker of `instance` now, and how often it opened (for metrics).
  BreakerState instance_breaker(WorkerId instance) const {
    const absl::Time now = AsTime(clock_());
    absl::MutexLock lock(&mu_);
    return instance_health_.state(instance, now);
  }
  uint64_t instance_breaker_openings(WorkerId instance) const {
    absl::MutexLock lock(&mu_);
    return instance_health_.times_opened(instance);
  }
  absl::StatusOr<AdmitResult> Admit(WorkerId instance, const AdmitQuery& query) override {
    (void)query;
    return absl::FailedPreconditionError(absl::StrCat(
        "LoadLedger: no admission RPC to instance ", instance,
        " (a policy that admits, such as kvc, needs the workers' transport)"));
  }

 private:
  LoadLedger(Topology topology, uint32_t instances, uint32_t prefill_workers, Clock clock,
             const HealthConfig& health)
      : topology_(topology),
        num_instances_(instances),
        num_prefill_workers_(prefill_workers),
        clock_(std::move(clock)),
        instances_(instances),
        prefill_(prefill_workers),
        instance_health_(health, instances),
        prefill_health_(health, prefill_workers),
        drained_(instances, false) {}

  // The breakers count in absl::Time; the ledger's clock in seconds.
  static absl::Time AsTime(double seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }

  void ReleasePrefill(WorkerId on, bool is_worker, uint64_t tokens) {
    absl::MutexLock lock(&mu_);
    InstanceLoad& load = is_worker ? prefill_[on] : instances_[on];
    load.pending_prefill_tokens -= tokens;
    if (is_worker) --load.running_requests;
  }
  void ReplacePrefill(WorkerId on, bool is_worker, uint64_t booked, uint64_t now_needed) {
    absl::MutexLock lock(&mu_);
    InstanceLoad& load = is_worker ? prefill_[on] : instances_[on];
    load.pending_prefill_tokens = load.pending_prefill_tokens - booked + now_needed;
  }
  void ReleaseRunning(WorkerId instance) {
    absl::MutexLock lock(&mu_);
    --instances_[instance].running_requests;
  }

  const Topology topology_;
  // Grows under mu_ (AddInstance); read without it, since an id below a
  // count once read stays valid.
  std::atomic<uint32_t> num_instances_;
  const uint32_t num_prefill_workers_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  std::vector<InstanceLoad> instances_ ABSL_GUARDED_BY(mu_);
  std::vector<InstanceLoad> prefill_ ABSL_GUARDED_BY(mu_);
  WorkerHealth instance_health_ ABSL_GUARDED_BY(mu_);
  WorkerHealth prefill_health_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> drained_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc_router::policy
