// kvc_sim/simulator.hpp
//
// The deterministic discrete-event simulator: replays a Trace through a
// simulated cluster under one RoutingPolicy and measures what happened
// (PolicyResult). Single-threaded; the agenda is a binary heap ordered by
// (time, sequence), so the same trace, configuration and policy always give
// the same result, bit for bit.
//
// Load: in closed-loop replay a session's next turn is issued when its
// previous turn finished plus the tool/think delay. With `concurrency` N > 0,
// at most N sessions are active at once, as a benchmark client (aiperf,
// genai-perf) replays a multi-turn dataset: N sessions start together and
// the next session in trace order starts when one ends; session start times
// in the trace are then ignored. Open-loop replay issues every turn at its
// nominal arrival time instead.
//
// A request's life:
//   arrival -> a new session's first turn may wait its arrival window for
//        shorter first turns arriving with it (RoutingPolicy::ArrivalWindow:
//        shortest first among sessions that start together)
//     -> the gateway's FIFO queue, which the policy's load control
//        (RoutingPolicy::HoldNewSession) may hold at a session's first turn
//        (empty at once for policies that never hold)
//     -> Place (the policy; admission RPCs cost admit_rpc_s each)
//     -> KV booking on its instance: the whole footprint is booked before the
//        request runs (admission already booked it for KVC; other policies
//        wait here for memory, FIFO); a request larger than the pool is
//        refused and counted, never run unbooked; a migrating session's KV
//        then moves from its old instance over the new one's inbound link
//        (Placement::migrate_from), and the request waits for it
//     -> prefill: on a P worker (what its prefix cache lacks) then a KV
//        transfer to the decode worker over its inbound link (what the decode
//        worker lacks, or everything for vanilla P/D), or on the instance's
//        GPU timeline, chunk by chunk, sharing iterations with its decodes
//     -> first token (TTFT) -> decode on the GPU timeline -> finish: the KV
//        is released or kept as cache, the policy is told, and the session's
//        next turn (or, at the session's end, the next session) is scheduled.
//
// Modes mean the same for every policy: Direct when the turn reused its
// session's KV on the instance that served it (all of the session's previous
// full blocks were cached there, on the GPU or in its host tier), Seed for a
// first turn, Reseed for a later turn that found nothing, Fallback for KVC's
// last resort.
//
//   kvc_router::sim::SimConfig config;               // 4P+4D, h100-8b constants
//   auto made = kvc_router::sim::MakePolicy("kvc", setup);
//   absl::StatusOr<kvc_router::sim::PolicyResult> result =
//       kvc_router::sim::Simulator::Run(trace, *made->policy, config, made->engine);
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/admit.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/policy/arrival_windows.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_router/types.hpp"
#include "kvc_sim/cost_model.hpp"
#include "kvc_sim/event_queue.hpp"
#include "kvc_sim/faults.hpp"
#include "kvc_sim/hit_bound.hpp"
#include "kvc_sim/instance.hpp"
#include "kvc_sim/metrics.hpp"
#include "kvc_sim/page_cache.hpp"
#include "kvc_sim/profiles.hpp"
#include "kvc_sim/trace.hpp"

namespace kvc_router::sim {

enum class LoopMode : uint8_t {
  // A session's next turn starts after its previous turn finished plus its delay.
  kClosed,
  // Every turn starts at its nominal arrival time.
  kOpen,
};

// What the engines behind a policy do besides routing.
struct EngineModel {
  // Prefill workers keep a page-LRU prefix cache (SGLang's radix cache).
  bool prefill_cache = true;
  // A P -> D transfer moves only the KV the decode worker does not hold.
  bool delta_transfer = true;
  // The workers' admission when the policy's engines differ from
  // SimConfig::admission (kvc-adaptive: incremental accounting, the cost
  // rule); the pool size K_d is always SimConfig's.
  std::optional<AdmissionConfig> admission;
  // The policy's D -> P backups (RoutingPolicy::PlanBackup) are carried
  // out: after a turn, the context's blocks the prefill worker's cache lacks
  // stream over that worker's inbound backup link and join its cache when
  // the copy completes.
  bool kv_backup = false;
};

// One request's outcome, for observers (tests, custom reports). Times are
// seconds since the trace's first arrival.
struct RequestRecord {
  uint32_t turn = 0;     // index into Trace::turns
  uint32_t session = 0;  // index into Trace::sessions
  double issue_s = 0;
  // When its arrival window ended (RoutingPolicy::ArrivalWindow; issue_s
  // when it had none), and when the gateway placed it: after queued_s only
  // if load control held it or a turn ahead of it
  // (RoutingPolicy::HoldNewSession).
  double queued_s = 0;
  double placed_s = 0;
  double first_token_s = 0;  // NaN when refused
  double finish_s = 0;       // when it finished or was refused
  WorkerId instance = kNoWorker;
  DecisionMode mode = DecisionMode::kFallback;
  bool refused = false;
  // Input tokens served from cache (GPU, host tier or moved KV); 0 when refused.
  uint64_t cached_tokens = 0;
};

struct SimConfig {
  // The pools; each policy runs on the topology it is defined for.
  policy::ClusterShape cluster;
  // Every worker's KV pool and KVC's admission (K_d, rho, tau_append,
  // accounting). K_d defaults to the h100-8b profile's pool. Policies without
  // admission get page caches of K_d tokens and no tau_append.
  AdmissionConfig admission = DefaultAdmission();
  CostModel cost;
  HostTierConfig host_tier;
  LoopMode loop = LoopMode::kClosed;
  // Closed loop: at most this many sessions active at once; 0 = unlimited.
  uint32_t concurrency = 0;
  // false: no worker ever reuses KV (every hit is 0), for checks.
  bool prefix_cache = true;
  // Called every `progress_every` finished requests (0 = never).
  std::function<void(uint64_t finished, uint64_t total, double sim_time_s)> progress;
  uint64_t progress_every = 0;
  // Called once per request when it finished or was refused.
  std::function<void(const RequestRecord&)> on_request;
  // Injected faults (faults.hpp); none by default.
  FaultConfig faults;
  // Called once per injected crash: the instance and the seconds (since the
  // trace's first arrival) it is down from and until.
  std::function<void(WorkerId instance, double down_from_s, double down_until_s)> on_crash;
  // The client closes each session after its last request, and the gateway
  // passes that on: the policy hears RoutingPolicy::OnSessionClosed and every
  // worker lets the session's KV go first (SimInstance::CloseSession), as
  // SGLang's session-aware radix cache does on /close_session.
  bool close_sessions = false;
  // Also compute PolicyResult::hit_bound_tokens (hit_bound.hpp): the most any
  // caches as large as all of this run's pools together could have served,
  // in the order this run's prefills began, and one_pool_lru_tokens. Costs
  // about as much time again as the replay, and ~24 bytes per block of every
  // request while it runs.
  bool hit_bound = false;

  static AdmissionConfig DefaultAdmission() {
    AdmissionConfig admission;
    admission.capacity_tokens = profile_detail::H100With8B().kv_capacity_tokens;
    return admission;
  }

  absl::Status Validate() const {
    if (absl::Status s = admission.Validate(); !s.ok()) return s;
    if (absl::Status s = cost.Validate(); !s.ok()) return s;
    if (absl::Status s = cluster.Validate(); !s.ok()) return s;
    if (absl::Status s = faults.Validate(); !s.ok()) return s;
    if (concurrency != 0 && loop == LoopMode::kOpen) {
      return absl::InvalidArgumentError(
          "SimConfig: concurrency limits need the closed loop (open-loop replay issues every "
          "turn at its trace time)");
    }
    if (!(host_tier.reload_bytes_per_s > 0) || !std::isfinite(host_tier.reload_bytes_per_s)) {
      return absl::InvalidArgumentError("SimConfig.host_tier.reload_bytes_per_s must be positive");
    }
    return absl::OkStatus();
  }
};

class Simulator final : public policy::ClusterView {
 public:
  // Replays `trace` under `policy`. The policy must be fresh (built for this
  // replay) and sized for config.cluster.instances(policy.topology()).
  static absl::StatusOr<PolicyResult> Run(const Trace& trace, policy::RoutingPolicy& policy,
                                          const SimConfig& config, const EngineModel& engine = {}) {
    if (absl::Status s = config.Validate(); !s.ok()) return s;
    if (absl::Status s = trace.Validate(); !s.ok()) return s;
    if (engine.admission) {
      if (absl::Status s = engine.admission->Validate(); !s.ok()) return s;
      if (engine.admission->capacity_tokens != config.admission.capacity_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            "EngineModel.admission has K_d ", engine.admission->capacity_tokens,
            " but the cluster's pools hold ", config.admission.capacity_tokens));
      }
    }
    Simulator sim(trace, policy, config, engine);
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
    load.pending_prefill_tokens = inst.gpu.pending_prefill_tokens();
    load.used_kv_tokens = inst.used_tokens();
    load.capacity_kv_tokens = inst.capacity_tokens();
    return load;
  }
  policy::InstanceLoad prefill_load(WorkerId prefill) const override {
    policy::InstanceLoad load;
    if (prefill >= prefills_.size()) return load;
    load.running_requests = prefills_[prefill].running_requests;
    load.pending_prefill_tokens = prefills_[prefill].pending_prefill_tokens;
    load.used_kv_tokens = prefills_[prefill].pages.used_tokens();
    load.capacity_kv_tokens = prefills_[prefill].pages.capacity_tokens();
    return load;
  }
  double now_s() const override { return now_; }
  // A crashed instance is out of rotation exactly while it is down: an
  // ideal circuit breaker (a gateway's opens after some calls go
  // unanswered). Only the policies that read it (the affinity rules) avoid it.
  bool routable(WorkerId instance) const override {
    if (instance >= instances_.size()) return false;
    // Before the replay starts nothing is down.
    return instance >= down_until_.size() || now_ >= down_until_[instance];
  }

  absl::StatusOr<AdmitResult> Admit(WorkerId instance, const AdmitQuery& query) override {
    if (instance >= instances_.size()) {
      return absl::NotFoundError(absl::StrCat("instance ", instance, " does not exist"));
    }
    if (placing_ == kNoSlot) {
      return absl::FailedPreconditionError("Admit outside of Place");
    }
    SimInstance& inst = instances_[instance];
    if (!inst.admission_pool()) {
      return absl::FailedPreconditionError(
          absl::StrCat("instance ", instance, " has no admission controller (policy ", result_.name,
                       " does not declare uses_admission())"));
    }
    // Injected faults: a crashed instance answers nothing; any RPC may time out.
    if (now_ < down_until_[instance] || dice_.Chance(config_.faults.rpc_timeout_rate)) {
      ++result_.faults.rpc_timeouts;
      return absl::DeadlineExceededError(
          absl::StrCat("admission RPC to instance ", instance, " timed out (injected)"));
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
    // The worker's scheduler knows its queued prefill (the cost rule reads it).
    inst.SetQueuedPrefill(inst.gpu.pending_prefill_tokens());
    const AdmitResult result = inst.AdmitEvicting(query, EvictionSink(instance));
    if (result.admitted) {
      // What is cached once admission made its room (it may have evicted).
      f.instance_hit = inst.CachedTokens(query.session, t.segment, t.reusable_tokens,
                                         f.request.input_hashes, t.input_tokens);
      inst.HoldChain(query.session, t.segment, f.request.input_hashes, t.input_tokens);
      f.admitted_on = instance;
      NotePeak(inst);
    }
    return result;
  }

 private:
  static constexpr uint32_t kNoSlot = std::numeric_limits<uint32_t>::max();
  // Longer than any policy should hold a turn (a simulated day): past it the
  // replay fails instead of asking forever.
  static constexpr double kMaxHoldSeconds = 86400;

  enum class EventType : uint8_t {
    kSessionStart,  // index: session
    kArrival,       // index: turn
    kReady,         // index: flight slot; booked, admission RPCs paid
    kPrefillDone,   // index: flight slot; on a prefill worker
    kTransferDone,  // index: flight slot
    kGpuWake,       // index: instance; `version` must match
    kFinish,        // index: flight slot; a request with no decode steps
    kBackupDone,    // index: backup job
    kCrash,         // injected fault; index unused
    kHoldCheck,     // the oldest held turn is asked about again; index unused
    kArrivalWindow,  // an arrival window may have ended; index unused
    kRetryPlacement,  // a crashed instance is back; index unused
  };
  struct EventPayload {
    EventType type = EventType::kArrival;
    uint32_t index = 0;
    uint64_t version = 0;
  };

  // A request in flight.
  struct Flight {
    uint32_t turn = 0;
    policy::PolicyRequest request;
    policy::Placement placement;
    double issue_s = 0;
    double queued_s = 0;
    double placed_s = 0;
    double ready_s = 0;
    // Tokens the serving instance held for this request when it was booked.
    uint64_t instance_hit = 0;
    // Of those, tokens reloaded from the instance's host tier.
    uint64_t instance_host_hit = 0;
    uint64_t prefill_compute = 0;  // tokens computed on the prefill worker
    uint64_t cached = 0;           // input tokens served from cache
    uint64_t decode_context = 0;
    WorkerId admitted_on = kNoWorker;
    SessionId booked_id = 0;
    bool booked = false;
    bool transient = false;
    PageCache::Lease lease;         // on the instance (page-cache policies)
    PageCache::Lease prefill_lease;  // on the prefill worker
  };

  Simulator(const Trace& trace, policy::RoutingPolicy& policy, const SimConfig& config,
            const EngineModel& engine)
      : trace_(trace),
        policy_(policy),
        config_(config),
        engine_(engine),
        topology_(policy.topology()) {
    const uint32_t n = config.cluster.instances(topology_);
    const AdmissionConfig admission = engine.admission ? *engine.admission : config.admission;
    const bool admission_pool = policy.uses_admission();
    instances_.reserve(n);
    for (uint32_t d = 0; d < n; ++d) {
      // Validated in Run, so Create cannot fail.
      instances_.emplace_back(
          *AdmissionController::Create(admission),
          PageCache(admission.capacity_tokens, trace.block_tokens, config.prefix_cache,
                    config.host_tier),
          config_.cost, admission_pool, config.prefix_cache, trace.block_tokens);
    }
    const uint32_t p = config.cluster.prefill_pool(topology_);
    prefills_.reserve(p);
    for (uint32_t i = 0; i < p; ++i) {
      prefills_.emplace_back(PageCache(admission.capacity_tokens, trace.block_tokens,
                                       config.prefix_cache && engine.prefill_cache,
                                       config.host_tier));
    }
    const size_t turns = trace.turns.size();
    ttft_.assign(turns, std::numeric_limits<double>::quiet_NaN());
    e2e_.assign(turns, std::numeric_limits<double>::quiet_NaN());
    mode_.assign(turns, DecisionMode::kFallback);
    served_by_.assign(turns, kNoWorker);
    finished_.assign(turns, 0);
    last_instance_.assign(trace.sessions.size(), kNoWorker);
    result_.name = std::string(policy.name());
    result_.topology = topology_;
    result_.prefill_workers = static_cast<uint32_t>(prefills_.size());
    result_.instances = n;
    result_.budget_tokens = admission_pool ? admission.budget_tokens()
                                           : config.admission.capacity_tokens;
    result_.trace_span_s = trace.span_s();
    result_.concurrency = config.concurrency;
  }

  absl::StatusOr<PolicyResult> Replay() {
    if (instances_.empty()) return absl::InvalidArgumentError("the cluster has no instances");
    // Sessions in trace order: (first arrival, line).
    std::vector<uint32_t> order(trace_.sessions.size());
    for (uint32_t s = 0; s < order.size(); ++s) order[s] = s;
    auto first_turn = [&](uint32_t s) -> const TraceTurn& {
      return trace_.turns[trace_.sessions[s].first_turn];
    };
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const TraceTurn& x = first_turn(a);
      const TraceTurn& y = first_turn(b);
      if (x.arrival_s != y.arrival_s) return x.arrival_s < y.arrival_s;
      return x.line < y.line;
    });
    // Simulated time runs from the first arrival: traces with epoch
    // timestamps keep the full precision of a double for the replay itself.
    result_.first_arrival_s = order.empty() ? 0 : first_turn(order.front()).arrival_s;
    const double origin = result_.first_arrival_s;
    last_change_s_ = 0;
    if (config_.loop == LoopMode::kOpen) {
      // A session is active from its first arrival to its last finish; its
      // start is handled before any arrival at the same instant.
      for (uint32_t s : order) {
        queue_.Push(first_turn(s).arrival_s - origin, EventPayload{EventType::kSessionStart, s, 1});
      }
      std::vector<uint32_t> all(trace_.turns.size());
      for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
      std::stable_sort(all.begin(), all.end(), [&](uint32_t a, uint32_t b) {
        const TraceTurn& x = trace_.turns[a];
        const TraceTurn& y = trace_.turns[b];
        if (x.arrival_s != y.arrival_s) return x.arrival_s < y.arrival_s;
        return x.line < y.line;
      });
      for (uint32_t turn : all) {
        queue_.Push(trace_.turns[turn].arrival_s - origin, EventPayload{EventType::kArrival, turn, 0});
      }
    } else if (config_.concurrency == 0) {
      for (uint32_t s : order) {
        queue_.Push(first_turn(s).arrival_s - origin, EventPayload{EventType::kSessionStart, s, 0});
      }
    } else {
      waiting_sessions_ = std::move(order);
      const size_t start = std::min<size_t>(config_.concurrency, waiting_sessions_.size());
      for (; next_session_ < start; ++next_session_) {
        queue_.Push(0, EventPayload{EventType::kSessionStart, waiting_sessions_[next_session_], 0});
      }
    }

    down_until_.assign(instances_.size(), -std::numeric_limits<double>::infinity());
    if (config_.faults.crash_interval_s > 0) {
      queue_.Push(dice_.Exponential(config_.faults.crash_interval_s),
                  EventPayload{EventType::kCrash, 0, 0});
    }
    while (!queue_.empty()) {
      const auto event = queue_.Pop();
      now_ = event.time;
      const EventPayload& e = event.payload;
      switch (e.type) {
        case EventType::kSessionStart:
          StartSession(e.index, /*issue_first_turn=*/e.version == 0);
          break;
        case EventType::kArrival:
          OnArrival(e.index);
          break;
        case EventType::kReady:
          StartPrefill(e.index);
          break;
        case EventType::kPrefillDone:
          OnPrefillDone(e.index);
          break;
        case EventType::kTransferDone:
          StartDecode(e.index);
          break;
        case EventType::kGpuWake:
          if (e.version == instances_[e.index].gpu_version) OnGpuWake(e.index);
          break;
        case EventType::kFinish:
          OnFinish(e.index);
          break;
        case EventType::kBackupDone:
          OnBackupDone(e.index);
          break;
        case EventType::kCrash:
          OnCrash();
          break;
        case EventType::kHoldCheck:
          hold_check_pending_ = false;
          PlaceQueued();
          break;
        case EventType::kRetryPlacement:
          RetryPlacements();
          break;
        case EventType::kArrivalWindow:
          arrival_check_s_ = std::numeric_limits<double>::infinity();
          EnqueueArrivals(windows_.Release(now_));
          // The turn this event was for may have gone early (released by a
          // later turn of its session): the others still need a wake-up.
          ScheduleArrivalWindow();
          break;
      }
      if (!failure_.ok()) return failure_;
      RescheduleGpus();
    }
    result_.events = queue_.pushed();
    for (size_t i = 0; i < finished_.size(); ++i) {
      if (finished_[i] != 1) {
        return absl::InternalError(absl::StrCat(
            "replay under ", result_.name, " ended with request ", i, " finished ",
            static_cast<int>(finished_[i]), " times (a request waited for memory forever?)"));
      }
    }
    const double last_finish = last_end_s_;
    result_.makespan_s = last_finish;
    AccumulateAreas(last_finish);
    if (result_.makespan_s > 0) {
      result_.in_flight_mean = in_flight_area_ / result_.makespan_s;
      result_.sessions_active_mean = sessions_area_ / result_.makespan_s;
    }
    result_.amplification = result_.trace_span_s > 0
                                ? result_.makespan_s / result_.trace_span_s
                                : std::numeric_limits<double>::quiet_NaN();
    Summarize();
    if (config_.hit_bound) {
      const uint64_t per_worker =
          config_.admission.capacity_tokens + config_.host_tier.capacity_tokens;
      const absl::StatusOr<HitBound> bound = OfflineHitBound(
          trace_, prefill_order_, per_worker * (instances_.size() + prefills_.size()),
          config_.close_sessions);
      if (!bound.ok()) return bound.status();
      result_.hit_bound_tokens = bound->hit_tokens;
      result_.one_pool_lru_tokens = bound->lru_hit_tokens;
    }
    return std::move(result_);
  }

  // ---------------------------------------------------------------- events --

  void StartSession(uint32_t session, bool issue_first_turn) {
    AccumulateAreas(now_);
    ++sessions_active_;
    result_.sessions_active_max = std::max<uint64_t>(result_.sessions_active_max, sessions_active_);
    if (issue_first_turn) OnArrival(trace_.sessions[session].first_turn);
  }

  // The client ended `session` (SimConfig::close_sessions): the policy and
  // every worker hear it; workers that never held it ignore it.
  void CloseSession(uint32_t session) {
    if (!config_.close_sessions) return;
    const TraceSession& s = trace_.sessions[session];
    const TraceTurn& last = trace_.turns[s.first_turn + s.num_turns - 1];
    const std::span<const BlockHash> chain = trace_.ContextChain(last);
    closed_[session] = 1;
    policy_.OnSessionClosed(session);
    // A released session is not an eviction (not counted), but a policy that
    // tracks residency learns it the same way.
    std::vector<SessionId> released;
    for (WorkerId d = 0; d < instances_.size(); ++d) {
      instances_[d].CloseSession(session, chain, Owner(last), released);
      for (SessionId id : released) policy_.OnEvicted(d, id);
      released.clear();
    }
    for (SimPrefillWorker& p : prefills_) p.pages.Close(chain, Owner(last));
  }

  void EndSession() {
    AccumulateAreas(now_);
    --sessions_active_;
    if (config_.concurrency != 0 && next_session_ < waiting_sessions_.size()) {
      queue_.Push(now_, EventPayload{EventType::kSessionStart,
                                     waiting_sessions_[next_session_++], 0});
    }
  }

  // A turn reaches the gateway. A new session's first turn may first wait
  // its arrival window (RoutingPolicy::ArrivalWindow). First turns, and any
  // turn of a session with a turn still queued, join the gateway's FIFO
  // queue, which the policy's load control (RoutingPolicy::HoldNewSession)
  // may hold at a first turn; the queue is empty unless it does. Later turns
  // of placed sessions go straight to Place.
  void OnArrival(uint32_t turn_index) {
    const TraceTurn& t = trace_.turns[turn_index];
    AccumulateAreas(now_);
    ++in_flight_;
    if (t.turn == 0 && queued_of_session_[t.session] == 0) {
      const policy::ArrivalOrder order =
          policy_.ArrivalWindow(MakePolicyRequest(turn_index), *this);
      if (order.window_s > 0) {
        windows_.Add(turn_index, order, now_);
        window_arrived_s_[turn_index] = now_;
        ++queued_of_session_[t.session];
        ScheduleArrivalWindow();
        return;
      }
      // A turn that does not wait goes behind the shorter ones still waiting.
      EnqueueArrivals(windows_.Release(now_, order.key));
    } else if (queued_of_session_[t.session] > 0) {
      // A later turn of a session whose first turn still waits its window
      // (an open-loop trace): the first turn goes now, with those shorter.
      EnqueueArrivals(windows_.ReleaseWith(trace_.sessions[t.session].first_turn, now_));
    }
    if (!failure_.ok()) return;
    if (t.turn == 0 || queued_of_session_[t.session] > 0) {
      gateway_queue_.push_back(QueuedTurn{turn_index, now_, now_});
      ++queued_of_session_[t.session];
      PlaceQueued();
      return;
    }
    Place(turn_index, now_, now_);
  }

  // Moves first turns that left their arrival windows (ArrivalWindows, in
  // the order it gives) to the gateway queue and places what it can.
  void EnqueueArrivals(const std::vector<uint64_t>& turns) {
    if (turns.empty()) return;
    for (uint64_t turn : turns) {
      // Counted in queued_of_session_ since it arrived.
      const double arrived_s = window_arrived_s_[turn];
      gateway_queue_.push_back(QueuedTurn{static_cast<uint32_t>(turn), arrived_s, now_});
      if (now_ > arrived_s) {
        ++result_.arrival_window_turns;
        arrival_waits_.push_back(now_ - arrived_s);
      }
    }
    ScheduleArrivalWindow();
    PlaceQueued();
  }

  void ScheduleArrivalWindow() {
    const double next = windows_.next_deadline_s();
    if (next < arrival_check_s_) {
      arrival_check_s_ = next;
      queue_.Push(next, EventPayload{EventType::kArrivalWindow, 0, 0});
    }
  }

  // Places queued turns, oldest first, until the policy holds one.
  void PlaceQueued() {
    if (placing_queued_) return;  // Place -> EndRequest -> here: the outer loop goes on
    placing_queued_ = true;
    while (!gateway_queue_.empty() && failure_.ok()) {
      const QueuedTurn& q = gateway_queue_.front();
      const TraceTurn& t = trace_.turns[q.turn];
      // Only first turns are asked about; a later turn queued behind its
      // session's first goes in once it is at the head.
      if (t.turn == 0 && policy_.HoldNewSession(MakePolicyRequest(q.turn), *this, q.arrived_s)) {
        if (now_ - q.arrived_s > kMaxHoldSeconds) {
          failure_ = absl::InternalError(absl::StrCat(
              "policy ", result_.name, " held turn ", t.turn, " of session ", t.session,
              " (line ", t.line, ") at the gateway for more than ", kMaxHoldSeconds,
              " s; a held turn must be placed eventually"));
          break;
        }
        if (!hold_check_pending_) {
          hold_check_pending_ = true;
          queue_.Push(now_ + policy::kHoldRecheckSeconds,
                      EventPayload{EventType::kHoldCheck, 0, 0});
        }
        break;
      }
      const QueuedTurn placed = q;
      gateway_queue_.pop_front();
      --queued_of_session_[t.session];
      if (now_ > placed.queued_s) {
        ++result_.held_turns;
        hold_waits_.push_back(now_ - placed.queued_s);
      }
      Place(placed.turn, placed.arrived_s, placed.queued_s);
    }
    placing_queued_ = false;
  }

  policy::PolicyRequest MakePolicyRequest(uint32_t turn_index) const {
    const TraceTurn& t = trace_.turns[turn_index];
    policy::PolicyRequest request;
    request.id = turn_index;
    request.request = trace_.MakeRequest(t);
    request.input_tokens = t.input_tokens;
    request.input_hashes = trace_.InputChain(t);
    request.context_hashes = trace_.ContextChain(t);
    return request;
  }

  // Hands a turn that arrived at `issue_s` to the policy now.
  void Place(uint32_t turn_index, double issue_s, double queued_s) {
    const TraceTurn& t = trace_.turns[turn_index];
    const uint32_t slot = AllocFlight();
    Flight& f = flights_[slot];
    f = Flight{};
    f.turn = turn_index;
    f.issue_s = issue_s;
    f.queued_s = queued_s;
    f.placed_s = now_;
    f.request = MakePolicyRequest(turn_index);

    placing_ = slot;
    absl::StatusOr<policy::Placement> placement = policy_.Place(f.request, *this);
    placing_ = kNoSlot;
    DeliverEvictions();
    if (!failure_.ok()) return;
    if (absl::IsUnavailable(placement.status()) && AnyDown()) {
      // Nothing the policy may use is up (injected crashes): the turn waits
      // at the gateway until an instance is back, as a client told 503
      // retries.
      free_slots_.push_back(slot);
      ++result_.faults.turns_waited_for_instance;
      unplaced_.push_back(QueuedTurn{turn_index, issue_s, queued_s});
      if (!retry_pending_) {
        retry_pending_ = true;
        double back_s = std::numeric_limits<double>::infinity();
        for (double until : down_until_) {
          if (until > now_) back_s = std::min(back_s, until);
        }
        queue_.Push(back_s, EventPayload{EventType::kRetryPlacement, 0, 0});
      }
      return;
    }
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
    f.transient = placement->booking == policy::Booking::kTransient;
    if (placement->booking != policy::Booking::kAdmitted && Oversize(f)) {
      Refuse(slot);
      return;
    }
    if (placement->booking != policy::Booking::kTransient) {
      WorkerId& last = last_instance_[t.session];
      if (last != kNoWorker && last != placement->instance) ++result_.migrations;
      last = placement->instance;
    }
    if (placement->booking == policy::Booking::kAdmitted) {
      f.booked = true;
      f.booked_id = f.request.request.session;
      f.placement.mode = Classify(t, f.instance_hit);
      BeginWhenReady(slot);
      return;
    }
    // First come, first booked: nobody passes a request waiting for memory.
    if (inst.waiting.empty() && TryBook(f, placement->instance)) {
      BeginWhenReady(slot);
    } else {
      inst.waiting.push_back(slot);
      ++result_.memory_waits;
    }
  }

  void BeginWhenReady(uint32_t slot) {
    const Flight& f = flights_[slot];
    if (f.ready_s > now_) {
      queue_.Push(f.ready_s, EventPayload{EventType::kReady, slot, 0});
    } else {
      StartPrefill(slot);
    }
  }

  void StartPrefill(uint32_t slot) {
    Flight& f = flights_[slot];
    const TraceTurn& t = trace_.turns[f.turn];
    // A crashed instance starts nothing while it is down: a turn placed
    // there anyway (by a policy that does not read routability, or before
    // the crash) starts when it is back, as a gateway with no breaker
    // retries it until it answers. Its booking waits with it.
    if (const double back_s = down_until_[f.placement.instance]; now_ < back_s) {
      queue_.Push(back_s, EventPayload{EventType::kReady, slot, 0});
      return;
    }
    if (config_.hit_bound && !prefill_began_[f.turn]) {
      prefill_began_[f.turn] = 1;
      prefill_order_.push_back(f.turn);
    }
    if (f.placement.prefill != kNoWorker) {
      SimPrefillWorker& p = prefills_[f.placement.prefill];
      const PageCache::Match match =
          p.pages.Lookup(f.request.input_hashes, t.reusable_tokens, Owner(t));
      const uint64_t hit = std::min<uint64_t>(
          t.input_tokens, uint64_t{match.gpu_blocks} * trace_.block_tokens + match.tail_tokens);
      const uint64_t host = std::min<uint64_t>(t.input_tokens - hit,
                                               uint64_t{match.host_blocks} * trace_.block_tokens);
      // A prefill worker holds a request's KV only until it is sent; if even
      // that does not fit beside what other requests pin, nothing is cached.
      if (!p.pages.Reserve(f.prefill_lease, f.request.input_hashes, match, t.input_tokens)) {
        f.prefill_lease = PageCache::Lease{};
      }
      const uint64_t compute = t.input_tokens - hit - host;
      const double start = std::max(now_, p.free_at);
      p.free_at = start + config_.cost.PrefillSeconds(compute, hit + host) + ReloadSeconds(host);
      p.pending_prefill_tokens += compute;
      ++p.running_requests;
      f.prefill_compute = compute;
      result_.prefill_tokens_remote += compute;
      result_.cached_tokens += hit + host;
      f.cached = hit + host;
      result_.host_reload_tokens += host;
      queue_.Push(p.free_at, EventPayload{EventType::kPrefillDone, slot, 0});
      return;
    }
    SimInstance& inst = instances_[f.placement.instance];
    const uint64_t cached = std::min(f.instance_hit, t.input_tokens);
    const uint64_t compute = t.input_tokens - cached;
    result_.prefill_tokens_local += compute;
    result_.cached_tokens += cached;
    f.cached = cached;
    result_.host_reload_tokens += f.instance_host_hit;
    inst.gpu.AdvanceTo(now_);
    const double seconds = config_.cost.PrefillSeconds(compute, cached) +
                           ReloadSeconds(f.instance_host_hit);
    inst.gpu.EnqueuePrefill(slot, seconds, config_.cost.PrefillChunks(compute), compute);
    MarkGpu(f.placement.instance);
  }

  void OnPrefillDone(uint32_t slot) {
    Flight& f = flights_[slot];
    const TraceTurn& t = trace_.turns[f.turn];
    SimPrefillWorker& p = prefills_[f.placement.prefill];
    p.pending_prefill_tokens -= f.prefill_compute;
    --p.running_requests;
    p.pages.Release(f.prefill_lease, f.request.input_hashes, t.input_tokens, Owner(t));
    SimInstance& inst = instances_[f.placement.instance];
    const uint64_t held = engine_.delta_transfer ? std::min(f.instance_hit, t.input_tokens) : 0;
    const uint64_t tokens = t.input_tokens - held;
    if (tokens == 0) {
      StartDecode(slot);
      return;
    }
    const double start = std::max(now_, inst.link_free_at);
    inst.link_free_at = start + config_.cost.TransferSeconds(tokens);
    result_.kv_transfer_tokens += tokens;
    result_.kv_transfer_bytes += tokens * config_.cost.kv_bytes_per_token;
    queue_.Push(inst.link_free_at, EventPayload{EventType::kTransferDone, slot, 0});
  }

  void StartDecode(uint32_t slot) {
    Flight& f = flights_[slot];
    const TraceTurn& t = trace_.turns[f.turn];
    ttft_[f.turn] = now_ - f.issue_s;
    const uint64_t steps = t.output_tokens > 0 ? t.output_tokens - 1 : 0;
    if (steps == 0) {
      queue_.Push(now_, EventPayload{EventType::kFinish, slot, 0});
      return;
    }
    SimInstance& inst = instances_[f.placement.instance];
    // The prompt's KV is now on the instance: later requests may share it.
    if (!inst.admission_pool() && !f.transient) {
      inst.pages.Publish(f.lease, f.request.input_hashes, t.input_tokens, Owner(t));
    }
    f.decode_context = t.input_tokens + t.output_tokens / 2;
    inst.gpu.AdvanceTo(now_);
    inst.gpu.AddDecode(slot, steps, f.decode_context);
    MarkGpu(f.placement.instance);
  }

  void OnGpuWake(WorkerId d) {
    SimInstance& inst = instances_[d];
    inst.gpu.AdvanceTo(now_);
    prefills_done_.clear();
    decodes_done_.clear();
    inst.gpu.TakeDue(prefills_done_, decodes_done_);
    MarkGpu(d);
    // Copies: the handlers below may wake this instance again.
    const std::vector<uint32_t> prefills = prefills_done_;
    const std::vector<uint32_t> decodes = decodes_done_;
    for (uint32_t slot : prefills) StartDecode(slot);
    for (uint32_t slot : decodes) OnFinish(slot);
  }

  void OnFinish(uint32_t slot) {
    Flight& f = flights_[slot];
    const TraceTurn& t = trace_.turns[f.turn];
    const WorkerId d = f.placement.instance;
    SimInstance& inst = instances_[d];
    --inst.running_requests;
    if (inst.admission_pool()) {
      if (f.booked) {
        if (f.transient) {
          inst.ReleaseTransient(f.booked_id);
        } else {
          inst.FinishSessionRequest(f.booked_id, t.segment, t.output_tokens,
                                    f.request.context_hashes, EvictionSink(d));
        }
      }
    } else {
      if (f.transient) {
        inst.pages.Release(f.lease, {});
      } else {
        inst.pages.Release(f.lease, f.request.context_hashes, t.input_tokens + t.output_tokens,
                           Owner(t));
      }
    }
    NotePeak(inst);
    e2e_[f.turn] = now_ - f.issue_s;
    mode_[f.turn] = f.placement.mode;
    served_by_[f.turn] = d;
    ++finished_count_;
    EndRequest(slot);
    DrainWaiting(d);
  }

  // A request that can never fit its instance's pool: counted, not run.
  void Refuse(uint32_t slot) {
    Flight& f = flights_[slot];
    --instances_[f.placement.instance].running_requests;
    ++result_.refused_oversize;
    mode_[f.turn] = f.placement.mode;
    served_by_[f.turn] = f.placement.instance;
    EndRequest(slot);
  }

  // Common end of a finished or refused request.
  void EndRequest(uint32_t slot) {
    Flight& f = flights_[slot];
    const TraceTurn& t = trace_.turns[f.turn];
    ++finished_[f.turn];
    AccumulateAreas(now_);
    --in_flight_;
    last_end_s_ = now_;
    if (config_.on_request) {
      RequestRecord record;
      record.turn = f.turn;
      record.session = t.session;
      record.issue_s = f.issue_s;
      record.queued_s = f.queued_s;
      record.placed_s = f.placed_s;
      record.first_token_s = f.issue_s + ttft_[f.turn];
      record.finish_s = now_;
      record.instance = f.placement.instance;
      record.mode = f.placement.mode;
      record.refused = std::isnan(ttft_[f.turn]);
      record.cached_tokens = record.refused ? 0 : f.cached;
      config_.on_request(record);
    }
    policy_.OnFinished(f.request, f.placement, *this);
    DeliverEvictions();
    if (engine_.kv_backup) {
      if (std::optional<policy::BackupPlan> plan = policy_.PlanBackup(f.request, f.placement)) {
        StartBackup(*plan, f);
        if (!failure_.ok()) return;
      }
    }
    if (config_.loop == LoopMode::kClosed) {
      if (t.turn + 1 < trace_.sessions[t.session].num_turns) {
        const uint32_t next = f.turn + 1;
        queue_.Push(now_ + trace_.turns[next].delay_s, EventPayload{EventType::kArrival, next, 0});
      } else {
        CloseSession(t.session);
        EndSession();
      }
    } else if (++open_turns_done_[t.session] == trace_.sessions[t.session].num_turns) {
      CloseSession(t.session);
      EndSession();
    }
    free_slots_.push_back(slot);
    PlaceQueued();
    if (config_.progress && config_.progress_every != 0 &&
        (finished_count_ + result_.refused_oversize) % config_.progress_every == 0) {
      config_.progress(finished_count_ + result_.refused_oversize, trace_.turns.size(), now_);
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
    if (p.migrate_from != kNoWorker) {
      if (p.migrate_from >= instances_.size()) return bad("migration from no such instance");
      if (p.migrate_from == p.instance) return bad("migration onto the same instance");
      if (p.booking != policy::Booking::kSession) {
        return bad("migration of a session the instance does not keep in its cache");
      }
    }
    if (p.booking == policy::Booking::kAdmitted) {
      if (f.admitted_on != p.instance) return bad("admitted placement the instance never admitted");
      if (p.mode == DecisionMode::kFallback) return bad("admitted placement in mode fallback");
    } else if (f.admitted_on != kNoWorker) {
      return bad("an instance admitted the session but the placement does not use it");
    }
    if (p.booking == policy::Booking::kSession && instances_[p.instance].admission_pool()) {
      return bad("session booking on an admission-controlled instance");
    }
    return absl::OkStatus();
  }

  // Whole KV footprint of a request: its input and its output.
  uint64_t Footprint(const Flight& f) const {
    const TraceTurn& t = trace_.turns[f.turn];
    return t.input_tokens + t.output_tokens;
  }

  bool Oversize(const Flight& f) const {
    const SimInstance& inst = instances_[f.placement.instance];
    const uint64_t limit = inst.admission_pool() ? inst.admission().budget_tokens()
                                                 : inst.pages.capacity_tokens();
    if (Footprint(f) > limit) return true;
    return f.placement.prefill != kNoWorker &&
           trace_.turns[f.turn].input_tokens > prefills_[f.placement.prefill].pages.capacity_tokens();
  }

  // Books KV for a placement without admission; false when it must wait.
  bool TryBook(Flight& f, WorkerId d) {
    SimInstance& inst = instances_[d];
    const TraceTurn& t = trace_.turns[f.turn];
    if (inst.admission_pool()) {
      // KVC's Fallback: a transient entry of input + output tokens.
      AdmitQuery query;
      query.session = kTransientSessionBit | f.turn;
      query.turn = 0;
      query.input_tokens = Footprint(f);
      query.append_tokens = query.input_tokens;
      const AdmitResult result = inst.AdmitEvicting(query, EvictionSink(d));
      DeliverEvictions();
      if (!result.admitted) return false;
      f.booked = true;
      f.booked_id = query.session;
      f.instance_hit = 0;
      NotePeak(inst);
      return true;
    }
    const PageCache::Match match =
        inst.pages.Lookup(f.request.input_hashes, t.reusable_tokens, Owner(t));
    if (!inst.pages.Reserve(f.lease, f.request.input_hashes, match, Footprint(f))) return false;
    const uint64_t gpu_hit = std::min<uint64_t>(
        t.input_tokens, uint64_t{match.gpu_blocks} * trace_.block_tokens + match.tail_tokens);
    const uint64_t host_hit = std::min<uint64_t>(
        t.input_tokens - gpu_hit, uint64_t{match.host_blocks} * trace_.block_tokens);
    f.booked = true;
    // With a prefill worker the instance only receives KV: its own cache
    // decides what need not be sent.
    f.instance_hit = f.placement.prefill != kNoWorker ? gpu_hit : gpu_hit + host_hit;
    f.instance_host_hit = f.placement.prefill != kNoWorker ? 0 : host_hit;
    if (f.placement.migrate_from != kNoWorker) MigrateSession(f, d, gpu_hit);
    if (!f.transient) f.placement.mode = Classify(t, f.instance_hit);
    NotePeak(inst);
    return true;
  }

  // A D -> P backup of the context `f` left on its decode worker: what the
  // prefill worker's cache lacks of it is copied over the prefill worker's
  // inbound backup link, and cached there when the copy completes.
  void StartBackup(const policy::BackupPlan& plan, const Flight& f) {
    const TraceTurn& t = trace_.turns[f.turn];
    if (plan.prefill >= prefills_.size() || plan.decode != f.placement.instance ||
        plan.session != f.request.request.session) {
      failure_ = absl::InternalError(absl::StrCat(
          "policy ", result_.name, " planned a backup of session ", plan.session, " from ",
          plan.decode, " to prefill worker ", plan.prefill, " that does not match request ",
          f.turn, " (served by ", f.placement.instance, ")"));
      return;
    }
    SimPrefillWorker& p = prefills_[plan.prefill];
    const std::span<const BlockHash> chain = f.request.context_hashes;
    const uint64_t tokens = t.input_tokens + t.output_tokens;
    const PageCache::Match have = p.pages.Lookup(chain, tokens, Owner(t));
    const uint64_t held = std::min<uint64_t>(
        tokens, uint64_t{have.gpu_blocks} * trace_.block_tokens + have.tail_tokens);
    if (held >= tokens) return;
    const uint64_t sent = tokens - held;
    const double start = std::max(now_, p.backup_link_free_at);
    p.backup_link_free_at = start + config_.cost.TransferSeconds(sent);
    result_.kv_backup_tokens += sent;
    result_.kv_transfer_bytes += sent * config_.cost.kv_bytes_per_token;
    backups_.push_back(Backup{plan.prefill, f.turn});
    queue_.Push(p.backup_link_free_at, EventPayload{EventType::kBackupDone,
                                                    static_cast<uint32_t>(backups_.size() - 1), 0});
  }

  void OnBackupDone(uint32_t job) {
    const Backup& b = backups_[job];
    const TraceTurn& t = trace_.turns[b.turn];
    prefills_[b.prefill].pages.Insert(trace_.ContextChain(t), t.input_tokens + t.output_tokens,
                                      Owner(t));
    // A backup that lands after its session closed is closed as well.
    if (closed_[t.session]) prefills_[b.prefill].pages.Close(trace_.ContextChain(t), Owner(t));
  }

  // Session migration, once `f` is booked on `d`: what the source instance
  // holds of the request's prefix (GPU pages and the session's tail) moves
  // over `d`'s inbound link, which the request waits for; the moved KV then
  // counts as held on `d` (its pages are inside the request's reservation
  // and published with its prompt). The source's copy becomes the first
  // thing its LRU evicts.
  void MigrateSession(Flight& f, WorkerId d, uint64_t held_on_target) {
    const TraceTurn& t = trace_.turns[f.turn];
    SimInstance& source = instances_[f.placement.migrate_from];
    const PageCache::Match there =
        source.pages.Lookup(f.request.input_hashes, t.reusable_tokens, Owner(t));
    const uint64_t moved = std::min<uint64_t>(
        t.input_tokens, uint64_t{there.gpu_blocks} * trace_.block_tokens + there.tail_tokens);
    source.pages.Demote(f.request.input_hashes);
    ++result_.kv_migrations;
    if (moved <= held_on_target) return;
    const uint64_t tokens = moved - held_on_target;
    f.instance_hit = std::max(f.instance_hit, moved);
    SimInstance& target = instances_[d];
    const double start = std::max(now_, target.link_free_at);
    target.link_free_at = start + config_.cost.TransferSeconds(tokens);
    f.ready_s = std::max(f.ready_s, target.link_free_at);
    result_.kv_migrated_tokens += tokens;
    result_.kv_transfer_bytes += tokens * config_.cost.kv_bytes_per_token;
  }

  // Who left a context in a page cache: tails are only reused by their session.
  static uint64_t Owner(const TraceTurn& t) { return uint64_t{t.session} + 1; }

  // The one meaning of the modes: Direct when the serving instance held all
  // of the session's previous context (`held` tokens of this request's
  // prefix were there), else Seed for a first turn and Reseed for a later one.
  DecisionMode Classify(const TraceTurn& t, uint64_t held) const {
    if (t.turn == 0) return DecisionMode::kSeed;
    const uint64_t previous_blocks = uint64_t{t.prefix_blocks} * trace_.block_tokens;
    return t.prefix_blocks > 0 && held >= previous_blocks ? DecisionMode::kDirect
                                                          : DecisionMode::kReseed;
  }

  void DrainWaiting(WorkerId d) {
    SimInstance& inst = instances_[d];
    while (!inst.waiting.empty()) {
      const uint32_t slot = inst.waiting.front();
      if (!TryBook(flights_[slot], d)) break;
      inst.waiting.pop_front();
      BeginWhenReady(slot);
    }
  }

  double ReloadSeconds(uint64_t tokens) const {
    if (tokens == 0) return 0;
    return static_cast<double>(tokens) * static_cast<double>(config_.cost.kv_bytes_per_token) /
           config_.host_tier.reload_bytes_per_s;
  }

  void MarkGpu(WorkerId d) {
    SimInstance& inst = instances_[d];
    if (!inst.gpu_dirty) {
      inst.gpu_dirty = true;
      dirty_gpus_.push_back(d);
    }
  }

  // One wake-up per changed GPU timeline, at its next completion.
  void RescheduleGpus() {
    for (WorkerId d : dirty_gpus_) {
      SimInstance& inst = instances_[d];
      inst.gpu_dirty = false;
      ++inst.gpu_version;
      const double next = inst.gpu.NextCompletion();
      if (std::isfinite(next)) {
        queue_.Push(std::max(next, now_), EventPayload{EventType::kGpuWake, d, inst.gpu_version});
      }
    }
    dirty_gpus_.clear();
  }

  void AccumulateAreas(double t) {
    if (t > last_change_s_) {
      in_flight_area_ += static_cast<double>(in_flight_) * (t - last_change_s_);
      sessions_area_ += static_cast<double>(sessions_active_) * (t - last_change_s_);
      last_change_s_ = t;
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
  // returned, never while it is placing a request. Injected faults drop,
  // duplicate or hold back (reorder) each notification.
  void DeliverEvictions() {
    FlushEvictions();
    if (placing_ != kNoSlot) return;
    if (!config_.faults.any()) {
      for (const auto& [d, s] : pending_evictions_) policy_.OnEvicted(d, s);
      pending_evictions_.clear();
      return;
    }
    std::vector<std::pair<WorkerId, SessionId>> held;
    for (const auto& [d, s] : pending_evictions_) {
      if (dice_.Chance(config_.faults.event_drop_rate)) {
        ++result_.faults.events_dropped;
        continue;
      }
      if (dice_.Chance(config_.faults.event_reorder_rate)) {
        ++result_.faults.events_reordered;
        held.emplace_back(d, s);
        continue;
      }
      policy_.OnEvicted(d, s);
      if (dice_.Chance(config_.faults.event_duplicate_rate)) {
        ++result_.faults.events_duplicated;
        policy_.OnEvicted(d, s);
      }
    }
    // Held back from the previous delivery: after this one's events.
    for (const auto& [d, s] : delayed_evictions_) policy_.OnEvicted(d, s);
    delayed_evictions_ = std::move(held);
    pending_evictions_.clear();
  }

  // Injected crash: a random instance loses its idle sessions' KV and is
  // down for crash_downtime_s; the next crash is drawn while work remains.
  void OnCrash() {
    const uint32_t d = dice_.Below(static_cast<uint32_t>(instances_.size()));
    ++result_.faults.crashes;
    down_until_[d] = now_ + config_.faults.crash_downtime_s;
    if (config_.on_crash) config_.on_crash(d, now_, down_until_[d]);
    std::vector<SessionId>& sink = EvictionSink(d);
    const size_t before = sink.size();
    result_.faults.cached_tokens_lost += instances_[d].Crash(sink);
    result_.faults.sessions_lost += sink.size() - before;
    DeliverEvictions();
    if (!queue_.empty()) {
      queue_.Push(now_ + dice_.Exponential(config_.faults.crash_interval_s),
                  EventPayload{EventType::kCrash, 0, 0});
    }
  }

  bool AnyDown() const {
    return std::any_of(down_until_.begin(), down_until_.end(),
                       [this](double until) { return until > now_; });
  }

  // Turns the policy could not place while every instance it may use was
  // down go again, in the order they came.
  void RetryPlacements() {
    retry_pending_ = false;
    std::vector<QueuedTurn> again;
    again.swap(unplaced_);
    for (const QueuedTurn& q : again) {
      if (!failure_.ok()) return;
      Place(q.turn, q.arrived_s, q.queued_s);
    }
  }

  void NotePeak(SimInstance& inst) {
    inst.peak_used_tokens = std::max(inst.peak_used_tokens, inst.used_tokens());
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
    for (const SimInstance& inst : instances_) result_.evicted_pages += inst.pages.evicted_pages();
    for (const SimPrefillWorker& p : prefills_) result_.evicted_pages += p.pages.evicted_pages();
    std::vector<double> ttft, e2e;
    ttft.reserve(ttft_.size());
    e2e.reserve(e2e_.size());
    std::array<std::vector<double>, kNumDecisionModes> by_mode;
    std::vector<std::vector<double>> by_instance(instances_.size());
    for (size_t i = 0; i < trace_.turns.size(); ++i) {
      const TraceTurn& t = trace_.turns[i];
      if (std::isnan(ttft_[i])) continue;  // refused: nothing computed or cached
      result_.input_tokens += t.input_tokens;
      result_.output_tokens += t.output_tokens;
      ++result_.mode_counts[static_cast<int>(mode_[i])];
      ttft.push_back(ttft_[i]);
      e2e.push_back(e2e_[i]);
      by_mode[static_cast<int>(mode_[i])].push_back(ttft_[i]);
      by_instance[served_by_[i]].push_back(ttft_[i]);
    }
    result_.ttft_s = Summary::Of(ttft);
    result_.hold_wait_s = Summary::Of(hold_waits_);
    result_.arrival_window_wait_s = Summary::Of(arrival_waits_);
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
  const EngineModel engine_;
  const policy::Topology topology_;
  std::vector<SimInstance> instances_;
  std::vector<SimPrefillWorker> prefills_;
  EventQueue<EventPayload> queue_;
  double now_ = 0;

  std::vector<Flight> flights_;
  std::vector<uint32_t> free_slots_;
  uint32_t placing_ = kNoSlot;
  std::vector<WorkerId> dirty_gpus_;
  std::vector<uint32_t> prefills_done_, decodes_done_;

  std::vector<SessionId> eviction_scratch_;
  WorkerId eviction_instance_ = 0;
  std::vector<std::pair<WorkerId, SessionId>> pending_evictions_;
  // Fault injection (SimConfig::faults).
  FaultDice dice_{config_.faults.seed};
  std::vector<double> down_until_;
  std::vector<std::pair<WorkerId, SessionId>> delayed_evictions_;

  // Client load.
  std::vector<uint32_t> waiting_sessions_;  // trace order, with a concurrency limit
  size_t next_session_ = 0;
  std::vector<uint32_t> open_turns_done_ = std::vector<uint32_t>(trace_.sessions.size(), 0);
  uint64_t in_flight_ = 0;
  // The gateway's queue of turns not placed yet (OnArrival).
  struct QueuedTurn {
    uint32_t turn = 0;
    double arrived_s = 0;
    double queued_s = 0;  // after any arrival window
  };
  std::deque<QueuedTurn> gateway_queue_;
  // New sessions' first turns waiting their arrival windows (ids: turn
  // indexes), and when each arrived.
  policy::ArrivalWindows windows_;
  std::vector<double> window_arrived_s_ = std::vector<double>(trace_.turns.size(), 0);
  // When the next kArrivalWindow event is due (infinity: none pending).
  double arrival_check_s_ = std::numeric_limits<double>::infinity();
  std::vector<uint32_t> queued_of_session_ = std::vector<uint32_t>(trace_.sessions.size(), 0);
  bool placing_queued_ = false;
  bool hold_check_pending_ = false;
  // Turns refused Unavailable while instances were down (RetryPlacements).
  std::vector<QueuedTurn> unplaced_;
  bool retry_pending_ = false;
  std::vector<double> hold_waits_;
  std::vector<double> arrival_waits_;
  uint64_t sessions_active_ = 0;
  double last_change_s_ = 0;
  double in_flight_area_ = 0;
  double sessions_area_ = 0;
  double last_end_s_ = 0;

  // Per turn.
  std::vector<double> ttft_;
  // Requests in the order their prefills began (only with config_.hit_bound).
  std::vector<uint32_t> prefill_order_;
  // Defensive: a request's prefill begins once today, but the order must
  // never list a request twice.
  // Sessions the client closed (config_.close_sessions).
  std::vector<uint8_t> closed_ = std::vector<uint8_t>(trace_.sessions.size(), 0);
  std::vector<uint8_t> prefill_began_ =
      std::vector<uint8_t>(config_.hit_bound ? trace_.turns.size() : 0, 0);
  std::vector<double> e2e_;
  std::vector<DecisionMode> mode_;
  std::vector<WorkerId> served_by_;
  std::vector<uint8_t> finished_;
  uint64_t finished_count_ = 0;
  // Per session: the instance of its last session-aware placement.
  std::vector<WorkerId> last_instance_;

  PolicyResult result_;
  absl::Status failure_;
  // D -> P backups in flight or done: (prefill worker, turn whose context).
  struct Backup {
    WorkerId prefill = kNoWorker;
    uint32_t turn = 0;
  };
  std::vector<Backup> backups_;
};

}  // namespace kvc_router::sim
