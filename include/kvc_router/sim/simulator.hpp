// kvc_router/sim/simulator.hpp
//
// The deterministic discrete-event simulator: replays a Trace through a
// simulated cluster under one RoutingPolicy and measures what happened
// (PolicyResult). Single-threaded; the agenda is a binary heap ordered by
// (time, sequence), so the same trace, configuration and policy always give
// the same result, bit for bit.
//
// A request's life:
//   arrival -> Place (the policy; admission RPCs cost admit_rpc_s each)
//     -> KV booking on its instance (admission already booked it for KVC;
//        other policies may wait here for memory, FIFO)
//     -> prefill: on a P worker (full input, no cache) then KV transfer to
//        the decode worker over its inbound link, or on the instance itself
//        (only the tokens its pool does not hold)
//     -> first token (TTFT) -> decode (output - 1 steps at the step time of
//        the batch it joined) -> finish: the booking is released or the
//        session stays resident with its output, the policy is told, and in
//        closed-loop replay the session's next turn is scheduled after its
//        tool/think delay.
// Open-loop replay issues every turn at its nominal arrival time instead.
//
//   kvc_router::sim::SimConfig config;               // 2P+6D, K_d = 92,104, TCP
//   auto policy = kvc_router::policy::MakePolicy("kvc", env);
//   absl::StatusOr<kvc_router::sim::PolicyResult> result =
//       kvc_router::sim::Simulator::Run(trace, **policy, config);
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/admit.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_router/sim/cost_model.hpp"
#include "kvc_router/sim/event_queue.hpp"
#include "kvc_router/sim/instance.hpp"
#include "kvc_router/sim/metrics.hpp"
#include "kvc_router/sim/trace.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::sim {

enum class LoopMode : uint8_t {
  // A session's next turn starts after its previous turn finished plus its delay.
  kClosed,
  // Every turn starts at its nominal arrival time.
  kOpen,
};

struct SimConfig {
  // Disaggregated topology: |P| and |D|. The default 2P+6D is eight GPUs, as
  // in the EAR testbed (8 x TP1); the colocated topology uses the same eight.
  uint32_t prefill_workers = 2;
  uint32_t decode_workers = 6;
  // Colocated topology: instances (0 = |P| + |D|).
  uint32_t colocated_instances = 0;
  // Every decode worker's / instance's KV pool and admission (K_d, rho,
  // tau_append, accounting). Policies without admission get tau_append = inf.
  AdmissionConfig admission;
  CostModel cost;
  LoopMode loop = LoopMode::kClosed;
  // false: instances never reuse KV (every hit is 0), for checks.
  bool prefix_cache = true;
  // Called every `progress_every` finished requests (0 = never).
  std::function<void(uint64_t finished, uint64_t total, double sim_time_s)> progress;
  uint64_t progress_every = 0;

  uint32_t instances(policy::Topology topology) const {
    if (topology == policy::Topology::kDisaggregated) return decode_workers;
    return colocated_instances != 0 ? colocated_instances : prefill_workers + decode_workers;
  }

  absl::Status Validate() const {
    if (absl::Status s = admission.Validate(); !s.ok()) return s;
    if (absl::Status s = cost.Validate(); !s.ok()) return s;
    if (decode_workers == 0 || decode_workers > kMaxWorkers || prefill_workers > kMaxWorkers ||
        colocated_instances > kMaxWorkers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SimConfig: need 1..", kMaxWorkers, " decode workers and at most ", kMaxWorkers,
          " prefill workers or instances"));
    }
    return absl::OkStatus();
  }
};

class Simulator final : public policy::ClusterView {
 public:
  // Replays `trace` under `policy`. The policy must be fresh (built for this
  // replay) and sized for config.instances(policy.topology()).
  static absl::StatusOr<PolicyResult> Run(const Trace& trace, policy::RoutingPolicy& policy,
                                          const SimConfig& config) {
    if (absl::Status s = config.Validate(); !s.ok()) return s;
    if (absl::Status s = trace.Validate(); !s.ok()) return s;
    Simulator sim(trace, policy, config);
    return sim.Replay();
  }

  // ClusterView.
  policy::Topology topology() const override { return topology_; }
  uint32_t num_prefill_workers() const override {
    return static_cast<uint32_t>(prefills_.size());
  }
  uint32_t num_instances() const override { return static_cast<uint32_t>(instances_.size()); }
  policy::InstanceLoad instance_load(WorkerId instance) const override {
    policy::InstanceLoad load;
    if (instance >= instances_.size()) return load;
    const SimInstance& inst = instances_[instance];
    load.running_requests = inst.running_requests;
    load.waiting_requests = static_cast<uint32_t>(inst.waiting.size());
    load.pending_prefill_tokens = inst.pending_prefill_tokens;
    load.used_kv_tokens = inst.admission().used_tokens();
    load.capacity_kv_tokens = inst.admission().config().capacity_tokens;
    return load;
  }
  policy::InstanceLoad prefill_load(WorkerId prefill) const override {
    policy::InstanceLoad load;
    if (prefill >= prefills_.size()) return load;
    load.running_requests = prefills_[prefill].running_requests;
    load.pending_prefill_tokens = prefills_[prefill].pending_prefill_tokens;
    return load;
  }
  double now_s() const override { return now_; }

  absl::StatusOr<AdmitResult> Admit(WorkerId instance, const AdmitQuery& query) override {
    if (instance >= instances_.size()) {
      return absl::NotFoundError(absl::StrCat("instance ", instance, " does not exist"));
    }
    if (placing_ == kNoSlot) {
      return absl::FailedPreconditionError("Admit outside of Place");
    }
    Flight& f = flights_[placing_];
    const TraceTurn& t = trace_.turns[f.turn];
    if (query.session != f.request.request.session || query.turn != t.turn ||
        query.input_tokens != t.input_tokens) {
      // The replay cannot go on: the policy describes another request than
      // the one it places (most likely its block size is not the trace's).
      failure_ = absl::InvalidArgumentError(absl::StrCat(
          "policy ", result_.name, " asked instance ", instance, " to admit session ",
          query.session, " turn ", query.turn, " with ", query.input_tokens,
          " input tokens while placing session ", t.session, " turn ", t.turn, " with ",
          t.input_tokens, " (is its block size the trace's ", trace_.block_tokens, "?)"));
      return failure_;
    }
    SimInstance& inst = instances_[instance];
    const uint64_t cached = inst.CachedTokens(query.session, t.segment, t.reusable_tokens,
                                              f.request.input_hashes, t.input_tokens);
    const AdmitResult result = inst.AdmitEvicting(query, EvictionSink(instance));
    if (result.admitted) {
      inst.HoldChain(query.session, t.segment, f.request.input_hashes);
      f.cached = cached;
      f.admitted_on = instance;
      NotePeak(inst);
    }
    return result;
  }

 private:
  static constexpr uint32_t kNoSlot = std::numeric_limits<uint32_t>::max();

  enum class EventType : uint8_t { kArrival, kPrefillDone, kTransferDone, kFinish };
  struct EventPayload {
    EventType type = EventType::kArrival;
    uint32_t index = 0;  // turn index for arrivals, flight slot otherwise
  };

  // A request in flight.
  struct Flight {
    uint32_t turn = 0;
    policy::PolicyRequest request;
    policy::Placement placement;
    double issue_s = 0;
    double ready_s = 0;
    uint64_t cached = 0;
    uint64_t decode_context = 0;
    WorkerId admitted_on = kNoWorker;
    SessionId booked_id = 0;
    bool booked = false;
    bool transient = false;
  };

  Simulator(const Trace& trace, policy::RoutingPolicy& policy, const SimConfig& config)
      : trace_(trace), policy_(policy), config_(config), topology_(policy.topology()) {
    const uint32_t n = config.instances(topology_);
    AdmissionConfig admission = config.admission;
    if (!policy.uses_admission()) {
      // A worker without KVC admission takes any append and counts only the
      // KV a request adds to what its session already holds.
      admission.max_direct_append_tokens = UINT64_MAX;
      admission.accounting = CapacityAccounting::kIncremental;
    }
    instances_.reserve(n);
    for (uint32_t d = 0; d < n; ++d) {
      // Validated in Run, so Create cannot fail.
      instances_.emplace_back(*AdmissionController::Create(admission), config.prefix_cache,
                              trace.block_tokens);
    }
    if (topology_ == policy::Topology::kDisaggregated) prefills_.resize(config.prefill_workers);
    const size_t turns = trace.turns.size();
    ttft_.assign(turns, 0);
    e2e_.assign(turns, 0);
    mode_.assign(turns, DecisionMode::kFallback);
    served_by_.assign(turns, kNoWorker);
    finished_.assign(turns, 0);
    last_instance_.assign(trace.sessions.size(), kNoWorker);
    result_.name = std::string(policy.name());
    result_.topology = topology_;
    result_.prefill_workers = static_cast<uint32_t>(prefills_.size());
    result_.instances = n;
    result_.budget_tokens = config.admission.budget_tokens();
    result_.trace_span_s = trace.span_s();
  }

  absl::StatusOr<PolicyResult> Replay() {
    if (instances_.empty()) return absl::InvalidArgumentError("the cluster has no instances");
    // Initial arrivals, in (arrival, line) order.
    std::vector<uint32_t> first;
    for (const TraceSession& s : trace_.sessions) {
      if (config_.loop == LoopMode::kClosed) {
        first.push_back(s.first_turn);
      } else {
        for (uint32_t k = 0; k < s.num_turns; ++k) first.push_back(s.first_turn + k);
      }
    }
    std::stable_sort(first.begin(), first.end(), [&](uint32_t a, uint32_t b) {
      const TraceTurn& x = trace_.turns[a];
      const TraceTurn& y = trace_.turns[b];
      if (x.arrival_s != y.arrival_s) return x.arrival_s < y.arrival_s;
      return x.line < y.line;
    });
    result_.first_arrival_s = first.empty() ? 0 : trace_.turns[first.front()].arrival_s;
    for (uint32_t turn : first) {
      queue_.Push(trace_.turns[turn].arrival_s, EventPayload{EventType::kArrival, turn});
    }

    double last_finish = result_.first_arrival_s;
    while (!queue_.empty()) {
      const auto event = queue_.Pop();
      now_ = event.time;
      switch (event.payload.type) {
        case EventType::kArrival:
          OnArrival(event.payload.index);
          break;
        case EventType::kPrefillDone:
          OnPrefillDone(event.payload.index);
          break;
        case EventType::kTransferDone:
          StartDecode(event.payload.index);
          break;
        case EventType::kFinish:
          OnFinish(event.payload.index);
          last_finish = now_;
          break;
      }
      if (!failure_.ok()) return failure_;
    }
    result_.events = queue_.pushed();
    for (size_t i = 0; i < finished_.size(); ++i) {
      if (finished_[i] != 1) {
        return absl::InternalError(absl::StrCat(
            "replay under ", result_.name, " ended with request ", i, " finished ",
            static_cast<int>(finished_[i]), " times (a request waited for memory forever?)"));
      }
    }
    result_.makespan_s = last_finish - result_.first_arrival_s;
    result_.amplification = result_.trace_span_s > 0
                                ? result_.makespan_s / result_.trace_span_s
                                : std::numeric_limits<double>::quiet_NaN();
    Summarize();
    return std::move(result_);
  }

  // ---------------------------------------------------------------- events --

  void OnArrival(uint32_t turn_index) {
    const TraceTurn& t = trace_.turns[turn_index];
    const uint32_t slot = AllocFlight();
    Flight& f = flights_[slot];
    f = Flight{};
    f.turn = turn_index;
    f.issue_s = now_;
    f.request.id = turn_index;
    f.request.request = trace_.MakeRequest(t);
    f.request.input_tokens = t.input_tokens;
    f.request.input_hashes = trace_.InputChain(t);
    f.request.context_hashes = trace_.ContextChain(t);

    placing_ = slot;
    absl::StatusOr<policy::Placement> placement = policy_.Place(f.request, *this);
    placing_ = kNoSlot;
    DeliverEvictions();
    if (!failure_.ok()) return;
    if (!placement.ok()) {
      failure_ = absl::Status(placement.status().code(),
                              absl::StrCat("policy ", result_.name, " failed on turn ", t.turn,
                                           " of session ", t.session, " (line ", t.line,
                                           "): ", placement.status().message()));
      return;
    }
    if (absl::Status s = CheckPlacement(f, *placement); !s.ok()) {
      failure_ = s;
      return;
    }
    f.placement = *placement;
    f.ready_s = now_ + config_.cost.admit_rpc_s * placement->admit_attempts;
    result_.admit_attempts += placement->admit_attempts;
    for (int r = 0; r < kNumRejectReasons; ++r) result_.rejections[r] += placement->rejections[r];

    SimInstance& inst = instances_[placement->instance];
    ++inst.running_requests;
    const SessionId session = f.request.request.session;
    if (placement->booking != policy::Booking::kTransient) {
      WorkerId& last = last_instance_[t.session];
      if (last != kNoWorker && last != placement->instance) ++result_.migrations;
      last = placement->instance;
    }
    switch (placement->booking) {
      case policy::Booking::kAdmitted:
        f.booked = true;
        f.booked_id = session;
        StartPrefill(slot, f.ready_s);
        return;
      case policy::Booking::kSession: {
        f.cached = inst.CachedTokens(session, t.segment, t.reusable_tokens,
                                     f.request.input_hashes, t.input_tokens);
        f.placement.mode = inst.HoldsContext(session, t.segment)
                               ? DecisionMode::kDirect
                           : t.turn == 0 ? DecisionMode::kSeed
                                         : DecisionMode::kReseed;
        break;
      }
      case policy::Booking::kTransient:
        f.transient = true;
        f.cached = 0;
        break;
    }
    if (TryBook(f, placement->instance)) {
      StartPrefill(slot, f.ready_s);
    } else {
      inst.waiting.push_back(slot);
      ++result_.memory_waits;
    }
  }

  void StartPrefill(uint32_t slot, double at) {
    Flight& f = flights_[slot];
    const TraceTurn& t = trace_.turns[f.turn];
    if (f.placement.prefill != kNoWorker) {
      SimPrefillWorker& p = prefills_[f.placement.prefill];
      f.cached = 0;  // prefill workers keep no cache
      const double start = std::max(at, p.free_at);
      p.free_at = start + config_.cost.PrefillSeconds(t.input_tokens, 0);
      p.pending_prefill_tokens += t.input_tokens;
      ++p.running_requests;
      result_.prefill_tokens_remote += t.input_tokens;
      queue_.Push(p.free_at, EventPayload{EventType::kPrefillDone, slot});
    } else {
      SimInstance& inst = instances_[f.placement.instance];
      const uint64_t compute = t.input_tokens - f.cached;
      const double start = std::max(at, inst.prefill_free_at);
      inst.prefill_free_at = start + config_.cost.PrefillSeconds(compute, f.cached);
      inst.pending_prefill_tokens += compute;
      result_.prefill_tokens_local += compute;
      queue_.Push(inst.prefill_free_at, EventPayload{EventType::kPrefillDone, slot});
    }
    result_.cached_tokens += f.cached;
  }

  void OnPrefillDone(uint32_t slot) {
    Flight& f = flights_[slot];
    const TraceTurn& t = trace_.turns[f.turn];
    SimInstance& inst = instances_[f.placement.instance];
    if (f.placement.prefill != kNoWorker) {
      SimPrefillWorker& p = prefills_[f.placement.prefill];
      p.pending_prefill_tokens -= t.input_tokens;
      --p.running_requests;
      const double start = std::max(now_, inst.link_free_at);
      inst.link_free_at = start + config_.cost.TransferSeconds(t.input_tokens);
      result_.kv_transfer_tokens += t.input_tokens;
      result_.kv_transfer_bytes += t.input_tokens * config_.cost.kv_bytes_per_token;
      queue_.Push(inst.link_free_at, EventPayload{EventType::kTransferDone, slot});
      return;
    }
    inst.pending_prefill_tokens -= t.input_tokens - f.cached;
    StartDecode(slot);
  }

  void StartDecode(uint32_t slot) {
    Flight& f = flights_[slot];
    const TraceTurn& t = trace_.turns[f.turn];
    SimInstance& inst = instances_[f.placement.instance];
    ttft_[f.turn] = now_ - f.issue_s;
    f.decode_context = t.input_tokens + t.output_tokens / 2;
    ++inst.decode_batch;
    inst.decode_context_tokens += f.decode_context;
    const double step = config_.cost.DecodeStepSeconds(inst.decode_batch, inst.decode_context_tokens);
    const uint64_t steps = t.output_tokens > 0 ? t.output_tokens - 1 : 0;
    queue_.Push(now_ + step * static_cast<double>(steps), EventPayload{EventType::kFinish, slot});
  }

  void OnFinish(uint32_t slot) {
    Flight& f = flights_[slot];
    const TraceTurn& t = trace_.turns[f.turn];
    const WorkerId d = f.placement.instance;
    SimInstance& inst = instances_[d];
    --inst.decode_batch;
    inst.decode_context_tokens -= f.decode_context;
    --inst.running_requests;
    if (f.booked) {
      if (f.transient) {
        inst.ReleaseTransient(f.booked_id);
      } else {
        inst.FinishSessionRequest(f.booked_id, t.segment, t.output_tokens,
                                  f.request.context_hashes, EvictionSink(d));
        NotePeak(inst);
      }
    }
    e2e_[f.turn] = now_ - f.issue_s;
    mode_[f.turn] = f.placement.mode;
    served_by_[f.turn] = d;
    ++finished_[f.turn];
    ++finished_count_;
    policy_.OnFinished(f.request, f.placement, *this);
    DeliverEvictions();
    if (config_.loop == LoopMode::kClosed && t.turn + 1 < trace_.sessions[t.session].num_turns) {
      const uint32_t next = f.turn + 1;
      queue_.Push(now_ + trace_.turns[next].delay_s, EventPayload{EventType::kArrival, next});
    }
    free_slots_.push_back(slot);
    DrainWaiting(d);
    if (config_.progress && config_.progress_every != 0 &&
        finished_count_ % config_.progress_every == 0) {
      config_.progress(finished_count_, trace_.turns.size(), now_);
    }
  }

  // --------------------------------------------------------------- helpers --

  absl::Status CheckPlacement(const Flight& f, const policy::Placement& p) const {
    auto bad = [&](std::string_view what) {
      return absl::InternalError(absl::StrCat("policy ", result_.name, " placed request ",
                                              f.turn, " badly: ", std::string(what)));
    };
    if (p.instance >= instances_.size()) return bad("no such instance");
    if (p.prefill != kNoWorker && p.prefill >= prefills_.size()) return bad("no such prefill worker");
    if (p.migrate_from != kNoWorker) return bad("session migration is not simulated yet");
    if (p.booking == policy::Booking::kAdmitted) {
      if (f.admitted_on != p.instance) return bad("admitted placement the instance never admitted");
      if (p.mode == DecisionMode::kFallback) return bad("admitted placement in mode fallback");
    } else if (f.admitted_on != kNoWorker) {
      return bad("an instance admitted the session but the placement does not use it");
    }
    return absl::OkStatus();
  }

  // Books KV for a non-admitted placement; false when it must wait for memory.
  bool TryBook(Flight& f, WorkerId d) {
    SimInstance& inst = instances_[d];
    const TraceTurn& t = trace_.turns[f.turn];
    AdmitQuery query;
    if (f.transient) {
      query.session = kTransientSessionBit | f.turn;
      query.turn = 0;
      query.input_tokens = t.input_tokens + t.output_tokens;
      query.append_tokens = query.input_tokens;
    } else {
      query = MakeAdmitQuery(f.request.request, trace_.block_tokens);
    }
    if (query.input_tokens > inst.admission().budget_tokens()) {
      ++result_.oversize_requests;
      return true;  // larger than the whole pool: runs without a booking
    }
    const AdmitResult result = inst.AdmitEvicting(query, EvictionSink(d));
    DeliverEvictions();
    if (!result.admitted) return false;
    f.booked = true;
    f.booked_id = query.session;
    if (!f.transient) inst.HoldChain(query.session, t.segment, f.request.input_hashes);
    NotePeak(inst);
    return true;
  }

  void DrainWaiting(WorkerId d) {
    SimInstance& inst = instances_[d];
    while (!inst.waiting.empty()) {
      const uint32_t slot = inst.waiting.front();
      if (!TryBook(flights_[slot], d)) break;
      inst.waiting.pop_front();
      StartPrefill(slot, std::max(now_, flights_[slot].ready_s));
    }
  }

  // Where an instance call appends the sessions it evicts.
  std::vector<SessionId>& EvictionSink(WorkerId d) {
    FlushEvictions();
    eviction_instance_ = d;
    return eviction_scratch_;
  }

  void FlushEvictions() {
    for (SessionId s : eviction_scratch_) {
      ++result_.evictions;
      pending_evictions_.emplace_back(eviction_instance_, s);
    }
    eviction_scratch_.clear();
  }

  // Evictions are reported to the policy after the call that caused them
  // returned, never while it is placing a request.
  void DeliverEvictions() {
    FlushEvictions();
    if (placing_ != kNoSlot) return;
    for (const auto& [d, s] : pending_evictions_) policy_.OnEvicted(d, s);
    pending_evictions_.clear();
  }

  void NotePeak(SimInstance& inst) {
    inst.peak_used_tokens = std::max(inst.peak_used_tokens, inst.admission().used_tokens());
    result_.peak_used_tokens = std::max(result_.peak_used_tokens, inst.peak_used_tokens);
  }

  uint32_t AllocFlight() {
    if (!free_slots_.empty()) {
      const uint32_t slot = free_slots_.back();
      free_slots_.pop_back();
      return slot;
    }
    flights_.emplace_back();
    return static_cast<uint32_t>(flights_.size() - 1);
  }

  void Summarize() {
    result_.requests = trace_.turns.size();
    std::vector<double> ttft = ttft_;
    std::vector<double> e2e = e2e_;
    std::array<std::vector<double>, kNumDecisionModes> by_mode;
    std::vector<std::vector<double>> by_instance(instances_.size());
    for (size_t i = 0; i < trace_.turns.size(); ++i) {
      const TraceTurn& t = trace_.turns[i];
      result_.input_tokens += t.input_tokens;
      result_.output_tokens += t.output_tokens;
      ++result_.mode_counts[static_cast<int>(mode_[i])];
      by_mode[static_cast<int>(mode_[i])].push_back(ttft_[i]);
      by_instance[served_by_[i]].push_back(ttft_[i]);
    }
    result_.ttft_s = Summary::Of(ttft);
    result_.e2e_s = Summary::Of(e2e);
    result_.ttft_sorted_s = std::move(ttft);
    for (int m = 0; m < kNumDecisionModes; ++m) result_.ttft_by_mode_s[m] = Summary::Of(by_mode[m]);
    std::vector<double> worker_p90;
    for (std::vector<double>& v : by_instance) {
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      worker_p90.push_back(SortedPercentile(v, 0.90));
    }
    std::sort(worker_p90.begin(), worker_p90.end());
    result_.worker_ttft_p90_median_s = SortedPercentile(worker_p90, 0.5);
    result_.worker_ttft_p90_max_s = worker_p90.empty() ? 0.0 : worker_p90.back();
  }

  const Trace& trace_;
  policy::RoutingPolicy& policy_;
  const SimConfig& config_;
  const policy::Topology topology_;
  std::vector<SimInstance> instances_;
  std::vector<SimPrefillWorker> prefills_;
  EventQueue<EventPayload> queue_;
  double now_ = 0;

  std::vector<Flight> flights_;
  std::vector<uint32_t> free_slots_;
  uint32_t placing_ = kNoSlot;

  std::vector<SessionId> eviction_scratch_;
  WorkerId eviction_instance_ = 0;
  std::vector<std::pair<WorkerId, SessionId>> pending_evictions_;

  // Per turn.
  std::vector<double> ttft_;
  std::vector<double> e2e_;
  std::vector<DecisionMode> mode_;
  std::vector<WorkerId> served_by_;
  std::vector<uint8_t> finished_;
  uint64_t finished_count_ = 0;
  // Per session: the instance of its last session-aware placement.
  std::vector<WorkerId> last_instance_;

  PolicyResult result_;
  absl::Status failure_;
};

}  // namespace kvc_router::sim
