// kvc_router/policy/policy.hpp
//
// One interface for routing policies a gateway can run and a simulator can
// compare: the KVC-Router (kvc_policy.hpp) and the EAR family
// (affinity_policies.hpp). The
// trace-replay simulator (sim/, target kvc_router::sim) drives policies only
// through this interface and adds its own baselines (vanilla P/D, SGLang-style
// P/D and cache-aware data parallelism) beside them; nothing here depends on
// the simulator.
//
// `ClusterShape` is the one description of the pools a policy and a
// simulated cluster share: |P| and |D| on the disaggregated topology, the
// number of instances on the colocated one.
//
// A policy sees the cluster through `ClusterView`: the topology, each
// instance's observable load (running requests, pending prefill tokens, KV
// use: what a real gateway can scrape from its workers), the clock, and the
// decode workers' admission RPC (Algorithm 2), whose successful answer books
// the session on that worker exactly as a real worker would. For each
// request the policy returns a `Placement`: which prefill worker (if any) and
// which decode worker or colocated instance serve it, how the instance keeps
// the request's KV (`Booking`), the admission attempts and rejections it
// made, and, for policies that move sessions, the instance to migrate the
// session's KV from. `OnFinished` is called exactly once per placed request;
// `OnEvicted` reports sessions an instance dropped from its KV pool, after
// the call that caused the eviction returned (never re-entrantly).
// `HoldNewSession` is load control: before placing a session's first turn
// the gateway may be told to keep it queued while the cluster's memory is
// committed to the sessions already running.
//
// The interface is runtime-polymorphic so a command line can pick policies by
// name (kvc-replay's registry, sim/include/kvc_sim/policies/registry.hpp); the
// policies themselves are I/O-free.
//
//   std::unique_ptr<kvc_router::policy::RoutingPolicy> p = ...;
//   absl::StatusOr<kvc_router::policy::Placement> where = p->Place(request, cluster);
//   ... run it ...
//   p->OnFinished(request, *where, cluster);
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/config.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::policy {

enum class Topology : uint8_t {
  // |P| prefill workers and |D| decode workers; KV moves P -> D.
  kDisaggregated,
  // Symmetric instances that prefill and decode (EAR's setting); no P pool.
  kColocated,
};

inline std::string_view TopologyName(Topology topology) {
  return topology == Topology::kDisaggregated ? "disaggregated" : "colocated";
}

// False for a value outside the enum (a cast from unchecked input).
inline bool IsKnownTopology(Topology topology) {
  return topology == Topology::kDisaggregated || topology == Topology::kColocated;
}

// The pools of one cluster. Eight GPUs by default, as 4 prefill + 4 decode
// workers or as 8 colocated instances (the EAR testbed's 8 x TP1).
struct ClusterShape {
  uint32_t prefill_workers = 4;
  uint32_t decode_workers = 4;
  // Colocated instances; 0 = prefill_workers + decode_workers (the same GPUs).
  uint32_t colocated_instances = 0;

  // Decode workers (disaggregated) or instances (colocated).
  uint32_t instances(Topology topology) const {
    if (topology == Topology::kDisaggregated) return decode_workers;
    return colocated_instances != 0 ? colocated_instances : prefill_workers + decode_workers;
  }
  uint32_t prefill_pool(Topology topology) const {
    return topology == Topology::kDisaggregated ? prefill_workers : 0;
  }

  absl::Status Validate() const {
    if (decode_workers == 0 || decode_workers > kMaxWorkers || prefill_workers > kMaxWorkers ||
        colocated_instances > kMaxWorkers || instances(Topology::kColocated) > kMaxWorkers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ClusterShape: need 1..", kMaxWorkers, " decode workers and at most ", kMaxWorkers,
          " prefill workers or instances (got ", prefill_workers, "P+", decode_workers, "D, ",
          colocated_instances, " colocated)"));
    }
    return absl::OkStatus();
  }

  // The router's pools for `topology`: |D| = instances, |P| = 0 when colocated.
  RouterConfig ApplyTo(RouterConfig router, Topology topology) const {
    router.num_decode_workers = instances(topology);
    router.num_prefill_workers = prefill_pool(topology);
    return router;
  }
};

// What a gateway can observe about one decode worker or colocated instance.
struct InstanceLoad {
  // Requests placed on it and not finished (including those waiting for KV memory).
  uint32_t running_requests = 0;
  // Of those, requests waiting for KV memory before they can start.
  uint32_t waiting_requests = 0;
  // Prefill tokens queued or running on it.
  uint64_t pending_prefill_tokens = 0;
  // KV pool use and size, tokens.
  uint64_t used_kv_tokens = 0;
  uint64_t capacity_kv_tokens = 0;
};

class ClusterView {
 public:
  virtual ~ClusterView() = default;
  virtual Topology topology() const = 0;
  // 0 on the colocated topology.
  virtual uint32_t num_prefill_workers() const = 0;
  // Decode workers (disaggregated) or instances (colocated), ids 0..n-1.
  virtual uint32_t num_instances() const = 0;
  virtual InstanceLoad instance_load(WorkerId instance) const = 0;
  virtual InstanceLoad prefill_load(WorkerId prefill) const = 0;
  // Current time, seconds since the start of the replay.
  virtual double now_s() const = 0;
  // Algorithm 2 on `instance`, as the admission RPC. An admitted answer
  // books the session there. A non-OK status means the RPC got no answer.
  virtual absl::StatusOr<AdmitResult> Admit(WorkerId instance, const AdmitQuery& query) = 0;
  // Whether requests may go to `instance` (or prefill worker `prefill`) now:
  // false while a gateway's circuit breaker holds it open after it stopped
  // answering (LoadLedger keeps one per worker). The EAR family places
  // nothing there, and a session bound there is placed anew; KVC keeps its
  // own breakers in RoutingState. A view without health says yes.
  virtual bool routable(WorkerId instance) const {
    (void)instance;
    return true;
  }
  virtual bool prefill_routable(WorkerId prefill) const {
    (void)prefill;
    return true;
  }
  // Not routable because an operator drains it, while it still answers:
  // `ear` moves the sessions bound there off it (their KV with them)
  // instead of re-prefilling them elsewhere. A view without drains says no.
  virtual bool draining(WorkerId instance) const {
    (void)instance;
    return false;
  }
};

// A request as a policy sees it.
struct PolicyRequest {
  // Unique within a replay.
  uint64_t id = 0;
  // Session, turn, prefix and appended blocks, append tokens.
  Request request;
  uint64_t input_tokens = 0;
  // The full blocks of the whole input (prefix followed by appended blocks).
  std::span<const BlockHash> input_hashes;
  // The input blocks followed by the blocks the output completes: what the
  // serving worker holds for the session once the turn finished.
  std::span<const BlockHash> context_hashes;
};

// How the serving instance keeps the request's KV.
enum class Booking : uint8_t {
  // The instance admitted the session through ClusterView::Admit (KVC): the
  // session stays resident after the request, until evicted.
  kAdmitted,
  // No admission gate: the instance takes the request (waiting for memory if
  // it must) and keeps its KV in its prefix cache afterwards, as SGLang's
  // radix cache does.
  kSession,
  // Plain P/D: the KV lives only while the request runs; nothing is reused.
  kTransient,
};

struct Placement {
  // Direct, Seed or Reseed from admission; Fallback for KVC's last resort.
  // A simulator or gateway may re-classify Direct/Seed/Reseed from what the
  // serving instance actually held, so the modes mean the same for every
  // policy (kvc_sim does).
  DecisionMode mode = DecisionMode::kFallback;
  // The prefill worker, or kNoWorker when the instance prefills itself.
  WorkerId prefill = kNoWorker;
  // The decode worker or colocated instance.
  WorkerId instance = kNoWorker;
  Booking booking = Booking::kTransient;
  // Admission RPCs made (each costs a round trip) and their rejections.
  uint32_t admit_attempts = 0;
  std::array<uint32_t, kNumRejectReasons> rejections{};
  // Session migration (ear): the gateway moves the session's KV from this
  // instance to `instance` with its own KV mover, then serves the request
  // there. kNoWorker: no migration. Only for Booking::kSession.
  WorkerId migrate_from = kNoWorker;
  // The policy's estimate, when it placed the request, of the input tokens
  // already held where the prompt is prefilled (the prefill worker, else the
  // instance; after a migration, what the move brings). input_tokens minus
  // this is the prefill work to book (LoadLedger::Start). 0: no estimate.
  uint64_t estimated_hit_tokens = 0;
};

// A placement on an instance that keeps the request's KV in its own cache
// (Booking::kSession). Its mode is provisional, Seed for a first turn and
// Reseed after: what the instance really held decides Direct (see
// Placement::mode).
inline Placement CachePlacement(const PolicyRequest& request, WorkerId instance,
                                WorkerId prefill = kNoWorker) {
  Placement placement;
  placement.instance = instance;
  placement.prefill = prefill;
  placement.mode = request.request.turn == 0 ? DecisionMode::kSeed : DecisionMode::kReseed;
  placement.booking = Booking::kSession;
  return placement;
}

// A decision to copy a session's KV from the decode worker that holds it to
// a prefill worker's memory (the D -> P incremental backup, the KVC seed's
// open question 4). The gateway streams the context's blocks the backup does
// not hold yet (its KV mover, in the opposite direction of a seed's
// transfer); when the session later leaves the decode worker (evicted, or
// its append is refused), its Reseed prefills on `prefill` and reuses
// whatever blocks the backup still holds, so it re-enters by transfer
// instead of recomputing its context.
struct BackupPlan {
  SessionId session = 0;
  WorkerId decode = kNoWorker;
  WorkerId prefill = kNoWorker;
  // The session's context now on `decode`, tokens.
  uint64_t context_tokens = 0;
};

// How often a gateway asks again about a held first turn when nothing
// finishes or closes meanwhile (RoutingPolicy::HoldNewSession).
inline constexpr double kHoldRecheckSeconds = 1.0;

// How a gateway orders new sessions that reach it together (a harness
// starting a batch of agents at once), from RoutingPolicy::ArrivalWindow.
struct ArrivalOrder {
  // How long the first turn may wait after it arrived for shorter first
  // turns arriving with it; 0 = it goes on at once.
  double window_s = 0;
  // Among first turns waiting together, the smaller key goes first.
  double key = 0;
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  // The name it is selected by (kvc, kvc-v1, pd, dp, ...).
  virtual std::string_view name() const = 0;
  virtual Topology topology() const = 0;
  // True when the policy relies on decode-worker admission (Algorithm 2):
  // the workers then enforce tau_append; otherwise they take any append.
  virtual bool uses_admission() const { return false; }
  virtual absl::StatusOr<Placement> Place(const PolicyRequest& request, ClusterView& cluster) = 0;
  virtual void OnFinished(const PolicyRequest& request, const Placement& placement,
                          ClusterView& cluster) {
    (void)request;
    (void)placement;
    (void)cluster;
  }
  // Called after OnFinished: whether to back the session's KV up to a
  // prefill worker now. Policies without a backup return nothing.
  virtual std::optional<BackupPlan> PlanBackup(const PolicyRequest& request,
                                               const Placement& placement) const {
    (void)request;
    (void)placement;
    return std::nullopt;
  }
  virtual void OnEvicted(WorkerId instance, SessionId session) {
    (void)instance;
    (void)session;
  }
  // The client ended `session` (its agent finished): no request of it runs
  // and none will follow. The policy forgets what it kept for the session.
  // The gateway, which knows the workers that served it, tells them too
  // (SGLang's /close_session with --enable-session-radix-cache), so their
  // caches give up that KV before any KV still in use.
  virtual void OnSessionClosed(SessionId session) { (void)session; }
  // Load control, asked before a session's first turn is placed (after its
  // arrival window, ArrivalWindow): true keeps the turn waiting at the
  // gateway. The gateway keeps held turns in the order they left their
  // arrival windows (arrival order when there are none) and asks again
  // about the oldest whenever a request finishes or a session closes, and
  // at least every kHoldRecheckSeconds (memory also frees as sessions fall
  // idle); it places the turn once the answer is false. No first turn that
  // entered the queue after it, and no later turn of its own session, goes
  // before it; later turns of sessions already placed are never held and do
  // not queue. `arrived_s` is when the turn reached the
  // gateway, on cluster.now_s()'s clock. A policy must answer false
  // eventually (ear does after max_hold_s), so every turn is placed.
  virtual bool HoldNewSession(const PolicyRequest& request, ClusterView& cluster,
                              double arrived_s) {
    (void)request;
    (void)cluster;
    (void)arrived_s;
    return false;
  }
  // Shortest first among new sessions that arrive together, asked once when
  // a session's first turn reaches the gateway, before load control. The
  // gateway keeps the turn waiting up to window_s; when the window of a
  // waiting turn ends, that turn and every waiting turn with a key no larger
  // go on to load control (HoldNewSession), smallest key first; a turn with
  // no window goes behind the waiting turns whose keys are no larger than
  // its own (policy::ArrivalWindows keeps this rule). Every turn
  // goes on within its own window, so none waits behind shorter ones for
  // longer than that. Engines prefill in arrival order: a batch of first
  // prompts that reaches them longest first keeps every short one waiting
  // behind a long one, while shortest first lets each short prompt finish
  // before the long ones start (the shortest-processing-time rule, which
  // minimizes the mean wait of a batch on one server).
  virtual ArrivalOrder ArrivalWindow(const PolicyRequest& request, const ClusterView& cluster) {
    (void)request;
    (void)cluster;
    return {};
  }
};

}  // namespace kvc_router::policy
