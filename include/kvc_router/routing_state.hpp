// kvc_router/routing_state.hpp
//
// `RoutingState` is the router's state Σ from the seed: the cache index
// (resident[d]), each session's pin and per-worker rejection counters
// (pin[s], rejects[s,d]), and per-worker load (inflight[d], assigned[d]),
// plus the round-robin cursors used by Seed/Reseed and Fallback.
//
// Thread safety: every public member function may be called from many
// gateway threads at once. One absl::Mutex guards the whole state; Route takes
// it shared, dispatch steps take it exclusively for a few hundred nanoseconds,
// and no lock is ever held across I/O (the dispatch state machine releases it
// before the caller sends an RPC).
//
// Elastic membership (with an ElasticCacheIndex): AddDecodeWorker,
// DrainDecodeWorker, RemoveDecodeWorker and their prefill twins change the
// pools at runtime, with requests in flight. A draining worker gets no new
// requests (its sessions move on their next turn) while what runs there
// finishes; a removed worker's pins, rejection counters, load and residency
// are forgotten, and its slot is reused by a later Add once its last request
// completed. Worker ids are slots: 0..num_decode_workers()-1, some of which
// may be removed.
//
// Bounded memory: a session that has nothing in flight and no request for
// `RouterConfig::session_idle_ttl` is forgotten, and at most
// `RouterConfig::max_sessions` sessions are kept (least recently seen idle
// sessions go first). Rejection counters are only allocated for sessions
// that were ever rejected.
//
//   auto state = kvc_router::RoutingState<kvc_router::EstimateIndex>::Create(
//       config, kvc_router::EstimateIndex(config.num_decode_workers, ...));
//   if (!state.ok()) return state.status();
//   // then StartDispatch(**state, request) or Dispatch(**state, request, transport)
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvc_router/concepts.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/health.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {

namespace detail {
struct StateAccess;
}  // namespace detail

// Source of "now" for idle-session expiry; tests pass a fake clock.
using Clock = std::function<absl::Time()>;

inline Clock SystemClock() {
  return [] { return absl::Now(); };
}

// A worker slot's membership (elastic membership).
enum class WorkerStatus : uint8_t {
  kActive,    // routed to
  kDraining,  // no new requests; requests placed there finish
  kRemoved,   // gone: never routed to; the slot is free for a later Add
};

template <CacheIndex Index>
class RoutingState {
 public:
  // Validates `config` and checks that `index` covers exactly |D| workers.
  static absl::StatusOr<std::unique_ptr<RoutingState>> Create(
      const RouterConfig& config, Index index, Clock clock = SystemClock()) {
    if (absl::Status status = config.Validate(); !status.ok()) return status;
    if (index.num_workers() != config.num_decode_workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RoutingState: the cache index covers ", index.num_workers(),
          " workers but RouterConfig.num_decode_workers is ",
          config.num_decode_workers));
    }
    if (!clock) {
      return absl::InvalidArgumentError("RoutingState: the clock is empty");
    }
    return std::unique_ptr<RoutingState>(
        new RoutingState(config, std::move(index), std::move(clock)));
  }

  RoutingState(const RoutingState&) = delete;
  RoutingState& operator=(const RoutingState&) = delete;

  // The configuration; num_decode_workers / num_prefill_workers are the
  // current slot counts (they grow with Add*Worker; read them through the
  // accessors below when workers may be added concurrently).
  const RouterConfig& config() const { return config_; }
  uint32_t num_decode_workers() const {
    absl::ReaderMutexLock lock(&mu_);
    return config_.num_decode_workers;
  }
  uint32_t num_prefill_workers() const {
    absl::ReaderMutexLock lock(&mu_);
    return config_.num_prefill_workers;
  }

  // --- elastic membership ------------------------------------------------
  WorkerStatus decode_status(WorkerId worker) const {
    absl::ReaderMutexLock lock(&mu_);
    return worker < decode_status_.size() ? decode_status_[worker] : WorkerStatus::kRemoved;
  }
  WorkerStatus prefill_status(WorkerId worker) const {
    absl::ReaderMutexLock lock(&mu_);
    return worker < prefill_status_.size() ? prefill_status_[worker] : WorkerStatus::kRemoved;
  }
  uint32_t num_active_decode_workers() const {
    absl::ReaderMutexLock lock(&mu_);
    return CountActive(decode_status_);
  }

  // A new decode worker joins; returns its id: the lowest removed slot with
  // nothing left in flight, else a new slot (the index grows). Errors past
  // kMaxWorkers slots.
  absl::StatusOr<WorkerId> AddDecodeWorker()
    requires ElasticCacheIndex<Index>
  {
    absl::MutexLock lock(&mu_);
    WorkerId slot = kNoWorker;
    for (WorkerId d = 0; d < decode_status_.size(); ++d) {
      if (decode_status_[d] == WorkerStatus::kRemoved && inflight_[d] == 0) {
        slot = d;
        break;
      }
    }
    if (slot == kNoWorker) {
      if (decode_status_.size() >= kMaxWorkers) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "AddDecodeWorker: all ", kMaxWorkers,
            " decode slots (kMaxWorkers) are taken or still finishing requests"));
      }
      slot = static_cast<WorkerId>(decode_status_.size());
      const uint32_t n = slot + 1;
      index_.ResizeWorkers(n);
      inflight_.resize(n, 0);
      assigned_.resize(n, 0);
      learned_room_.resize(n, kUnknownRoomTokens);
      pressure_.resize(n, 0);
      pressure_at_.resize(n);
      health_.Resize(n);
      decode_status_.resize(n, WorkerStatus::kRemoved);
      config_.num_decode_workers = n;
    }
    ResetDecodeSlotLocked(slot);
    decode_status_[slot] = WorkerStatus::kActive;
    return slot;
  }

  // `worker` takes no new requests; those placed there finish, and its
  // sessions move on their next turn. Refused for the last active worker.
  absl::Status DrainDecodeWorker(WorkerId worker) {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckLeavingLocked(decode_status_, worker, "DrainDecodeWorker", "decode");
        !s.ok()) {
      return s;
    }
    decode_status_[worker] = WorkerStatus::kDraining;
    return absl::OkStatus();
  }

  // `worker` is gone: its pins, rejection counters, load figures, health
  // and residency are forgotten, and its sessions reseed elsewhere. Requests
  // still running there release their inflight when they complete; the slot
  // is reused once none is left. Refused for the last active worker.
  absl::Status RemoveDecodeWorker(WorkerId worker)
    requires ElasticCacheIndex<Index>
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckLeavingLocked(decode_status_, worker, "RemoveDecodeWorker", "decode");
        !s.ok()) {
      return s;
    }
    decode_status_[worker] = WorkerStatus::kRemoved;
    for (auto& [id, session] : sessions_) {
      if (session.pin == worker) session.pin = kNoWorker;
      if (worker < session.rejects.size()) session.rejects[worker] = 0;
    }
    ResetDecodeSlotLocked(worker);
    return absl::OkStatus();
  }

  // The prefill twins: Seed/Reseed and Fallback round-robin over active
  // prefill workers. A removed prefill slot is reused by the next Add (the
  // router keeps no per-prefill counters).
  absl::StatusOr<WorkerId> AddPrefillWorker() {
    absl::MutexLock lock(&mu_);
    for (WorkerId p = 0; p < prefill_status_.size(); ++p) {
      if (prefill_status_[p] == WorkerStatus::kRemoved) {
        prefill_status_[p] = WorkerStatus::kActive;
        return p;
      }
    }
    if (prefill_status_.size() >= kMaxWorkers) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "AddPrefillWorker: all ", kMaxWorkers, " prefill slots (kMaxWorkers) are taken"));
    }
    prefill_status_.push_back(WorkerStatus::kActive);
    config_.num_prefill_workers = static_cast<uint32_t>(prefill_status_.size());
    return static_cast<WorkerId>(prefill_status_.size() - 1);
  }
  absl::Status DrainPrefillWorker(WorkerId worker) {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckLeavingLocked(prefill_status_, worker, "DrainPrefillWorker", "prefill");
        !s.ok()) {
      return s;
    }
    prefill_status_[worker] = WorkerStatus::kDraining;
    return absl::OkStatus();
  }
  absl::Status RemovePrefillWorker(WorkerId worker) {
    absl::MutexLock lock(&mu_);
    if (absl::Status s =
            CheckLeavingLocked(prefill_status_, worker, "RemovePrefillWorker", "prefill");
        !s.ok()) {
      return s;
    }
    prefill_status_[worker] = WorkerStatus::kRemoved;
    return absl::OkStatus();
  }

  // pin[s]: the decode worker that last admitted s, or kNoWorker.
  WorkerId pin(SessionId session) const {
    absl::ReaderMutexLock lock(&mu_);
    auto it = sessions_.find(session);
    return it == sessions_.end() ? kNoWorker : it->second.pin;
  }

  // rejects[s,d]; 0 for unknown sessions and out-of-range workers.
  uint32_t rejects(SessionId session, WorkerId worker) const {
    absl::ReaderMutexLock lock(&mu_);
    auto it = sessions_.find(session);
    return it == sessions_.end() ? 0 : it->second.RejectsOn(worker);
  }

  uint64_t inflight(WorkerId worker) const {
    absl::ReaderMutexLock lock(&mu_);
    return worker < inflight_.size() ? inflight_[worker] : 0;
  }
  uint64_t assigned(WorkerId worker) const {
    absl::ReaderMutexLock lock(&mu_);
    return worker < assigned_.size() ? assigned_[worker] : 0;
  }
  // The room `worker`'s admission answers last reported (place_by_room), or
  // kUnknownRoomTokens.
  uint64_t learned_room(WorkerId worker) const {
    absl::ReaderMutexLock lock(&mu_);
    return worker < learned_room_.size() ? learned_room_[worker] : kUnknownRoomTokens;
  }
  // Worker health (RouterConfig::health): the state of `worker`'s circuit
  // breaker now, and how often it opened.
  BreakerState worker_health(WorkerId worker) const {
    absl::ReaderMutexLock lock(&mu_);
    return health_.state(worker, clock_());
  }
  uint64_t breaker_opens(WorkerId worker) const {
    absl::ReaderMutexLock lock(&mu_);
    return health_.times_opened(worker);
  }
  // Rejections (capacity or worker-unavailable) `worker` answered since it
  // last admitted a request, forgotten once none came for
  // RouterConfig::health.failure_window. Route counts them as load when it
  // places a session with no pin and no overlap anywhere, so a worker that
  // refuses stops attracting new sessions; sessions with residency ignore it.
  uint64_t reject_pressure(WorkerId worker) const {
    absl::ReaderMutexLock lock(&mu_);
    return PressureLocked(worker, clock_());
  }
  uint64_t total_inflight() const {
    absl::ReaderMutexLock lock(&mu_);
    uint64_t total = 0;
    for (uint64_t n : inflight_) total += n;
    return total;
  }
  // Requests of `session` placed and not completed yet.
  uint32_t session_inflight(SessionId session) const {
    absl::ReaderMutexLock lock(&mu_);
    auto it = sessions_.find(session);
    return it == sessions_.end() ? 0 : it->second.inflight;
  }
  size_t num_sessions() const {
    absl::ReaderMutexLock lock(&mu_);
    return sessions_.size();
  }

  // Decode worker `worker` dropped `session` from its cache: the index forgets it.
  absl::Status OnSessionEvicted(WorkerId worker, SessionId session) {
    absl::MutexLock lock(&mu_);
    if (worker >= config_.num_decode_workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "OnSessionEvicted: decode worker ", worker, " does not exist (|D|=",
          config_.num_decode_workers, ")"));
    }
    index_.ForgetSession(worker, session);
    // place_by_room: a session evicted from its pinned worker has no
    // residency left there, so its next turn is placed by room.
    if (config_.place_by_room) {
      if (auto it = sessions_.find(session); it != sessions_.end() && it->second.pin == worker) {
        it->second.pin = kNoWorker;
      }
    }
    return absl::OkStatus();
  }

  // Tells the index that `worker` now holds `chain` for `session`, e.g. after
  // the worker decoded a turn's output and the gateway hashed it.
  absl::Status LearnResidency(WorkerId worker, SessionId session,
                              std::span<const BlockHash> chain) {
    if (worker >= num_decode_workers()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LearnResidency: decode worker ", worker, " does not exist (|D|=",
          config_.num_decode_workers, ")"));
    }
    if (chain.size() > config_.max_prefix_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LearnResidency: ", chain.size(), " blocks exceed RouterConfig.max_prefix_blocks ",
          config_.max_prefix_blocks));
    }
    absl::MutexLock lock(&mu_);
    if (decode_status_[worker] == WorkerStatus::kRemoved) {
      return absl::FailedPreconditionError(
          absl::StrCat("LearnResidency: decode worker ", worker, " was removed"));
    }
    index_.Learn(worker, session, chain);
    return absl::OkStatus();
  }

  // The session ended: drop its pin and counters. Refused while it has
  // requests in flight, so their completion still finds it.
  absl::Status ForgetSession(SessionId session) {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat("ForgetSession: unknown session ", session));
    }
    if (it->second.inflight > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ForgetSession: session ", session, " has ", it->second.inflight,
          " requests in flight"));
    }
    sessions_.erase(it);
    return absl::OkStatus();
  }

  // Forgets idle sessions past the TTL and enforces max_sessions now; returns
  // how many were forgotten. Dispatch also does this on its own, amortized.
  size_t ExpireIdleSessions() {
    absl::MutexLock lock(&mu_);
    return SweepLocked(clock_(), nullptr);
  }

  // Runs `fn(Index&)` with exclusive access, e.g. to apply worker events.
  template <class Fn>
  decltype(auto) WithIndex(Fn&& fn) {
    absl::MutexLock lock(&mu_);
    return std::forward<Fn>(fn)(index_);
  }
  // Runs `fn(const Index&)` with shared access.
  template <class Fn>
  decltype(auto) ReadIndex(Fn&& fn) const {
    absl::ReaderMutexLock lock(&mu_);
    return std::forward<Fn>(fn)(static_cast<const Index&>(index_));
  }

 private:
  friend struct detail::StateAccess;

  struct SessionEntry {
    WorkerId pin = kNoWorker;
    uint32_t inflight = 0;
    absl::Time last_seen;
    // Empty until the first rejection; then one counter per decode worker.
    std::vector<uint32_t> rejects;

    uint32_t RejectsOn(WorkerId worker) const {
      return worker < rejects.size() ? rejects[worker] : 0;
    }
  };

  RoutingState(const RouterConfig& config, Index index, Clock clock)
      : config_(config),
        clock_(std::move(clock)),
        index_(std::move(index)),
        inflight_(config.num_decode_workers, 0),
        assigned_(config.num_decode_workers, 0),
        learned_room_(config.num_decode_workers, kUnknownRoomTokens),
        pressure_(config.num_decode_workers, 0),
        pressure_at_(config.num_decode_workers),
        health_(config.health, config.num_decode_workers),
        decode_status_(config.num_decode_workers, WorkerStatus::kActive),
        prefill_status_(config.num_prefill_workers, WorkerStatus::kActive) {
    last_sweep_ = clock_();
  }

  static uint32_t CountActive(const std::vector<WorkerStatus>& status) {
    return static_cast<uint32_t>(std::count(status.begin(), status.end(), WorkerStatus::kActive));
  }

  // Drain/Remove preconditions: the worker exists, is not removed, and is
  // not the pool's last active worker.
  static absl::Status CheckLeavingLocked(const std::vector<WorkerStatus>& status,
                                         WorkerId worker, const char* what, const char* pool) {
    if (worker >= status.size() || status[worker] == WorkerStatus::kRemoved) {
      return absl::NotFoundError(
          absl::StrCat(what, ": ", pool, " worker ", worker, " does not exist"));
    }
    if (status[worker] == WorkerStatus::kActive && CountActive(status) == 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": ", pool, " worker ", worker, " is the last active one of its pool"));
    }
    return absl::OkStatus();
  }

  // A decode slot forgets its worker (removal) or starts fresh (add).
  // Callers hold mu_ exclusively.
  void ResetDecodeSlotLocked(WorkerId worker)
    requires ElasticCacheIndex<Index>
  {
    index_.ForgetWorker(worker);
    assigned_[worker] = 0;
    learned_room_[worker] = kUnknownRoomTokens;
    num_pressured_ -= pressure_[worker] != 0 ? 1 : 0;
    pressure_[worker] = 0;
    health_.Reset(worker);
  }

  uint64_t PressureLocked(WorkerId worker, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    if (worker >= pressure_.size() || pressure_[worker] == 0) return 0;
    return now - pressure_at_[worker] > config_.health.failure_window ? 0 : pressure_[worker];
  }

  SessionEntry& TouchSessionLocked(SessionId session, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto [it, inserted] = sessions_.try_emplace(session);
    it->second.last_seen = now;
    if (inserted && (sessions_.size() > config_.max_sessions ||
                     now - last_sweep_ > config_.session_idle_ttl / 4)) {
      SweepLocked(now, &session);
      it = sessions_.find(session);
    }
    return it->second;
  }

  // Drops idle sessions past the TTL; if still above max_sessions, drops the
  // least recently seen idle ones down to 7/8 of the bound so that the O(n)
  // sweep is amortized over many insertions.
  // `keep`, when given, is the session being inserted right now.
  size_t SweepLocked(absl::Time now, const SessionId* keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_sweep_ = now;
    const size_t before = sessions_.size();
    auto is_kept = [keep](SessionId id) { return keep != nullptr && id == *keep; };
    absl::erase_if(sessions_, [&](const auto& entry) {
      const SessionEntry& s = entry.second;
      return s.inflight == 0 && now - s.last_seen > config_.session_idle_ttl &&
             !is_kept(entry.first);
    });
    if (sessions_.size() > config_.max_sessions) {
      const size_t target = config_.max_sessions - config_.max_sessions / 8;
      std::vector<std::pair<absl::Time, SessionId>> idle;
      for (const auto& [id, s] : sessions_) {
        if (s.inflight == 0 && !is_kept(id)) idle.emplace_back(s.last_seen, id);
      }
      const size_t excess = sessions_.size() - std::min(target, sessions_.size());
      const size_t drop = std::min(excess, idle.size());
      // Ties on last_seen are broken by session id, never by map order.
      std::nth_element(idle.begin(), idle.begin() + drop, idle.end());
      for (size_t i = 0; i < drop; ++i) sessions_.erase(idle[i].second);
    }
    return before - sessions_.size();
  }

  RouterConfig config_;  // worker counts change under mu_ (elastic membership)
  const Clock clock_;
  mutable absl::Mutex mu_;
  Index index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionId, SessionEntry> sessions_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> inflight_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> assigned_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> learned_room_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> pressure_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> pressure_at_ ABSL_GUARDED_BY(mu_);  // last rejection
  int64_t num_pressured_ ABSL_GUARDED_BY(mu_) = 0;           // workers with pressure != 0
  WorkerHealth health_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkerStatus> decode_status_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkerStatus> prefill_status_ ABSL_GUARDED_BY(mu_);
  uint64_t prefill_cursor_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t decode_cursor_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_);
};

namespace detail {

// The library's own access to RoutingState internals (Route and the dispatch
// state machine). Callers hold `Mutex(state)` as each member documents.
struct StateAccess {
  template <class State>
  static absl::Mutex& Mutex(State& state) ABSL_LOCK_RETURNED(state.mu_) {
    return state.mu_;
  }
  template <class State>
  static auto& Index(State& state) { return state.index_; }
  template <class State>
  static auto& Sessions(State& state) { return state.sessions_; }
  template <class State>
  static auto& Inflight(State& state) { return state.inflight_; }
  template <class State>
  static auto& Assigned(State& state) { return state.assigned_; }
  template <class State>
  static auto& LearnedRoom(State& state) { return state.learned_room_; }
  // Reject pressure of `worker` at `now` (0 once it is older than the window).
  template <class State>
  static uint64_t PressureOf(State& state, WorkerId worker, absl::Time now) {
    return state.PressureLocked(worker, now);
  }
  // Records an answer of `worker` for its reject pressure.
  template <class State>
  static void NotePressure(State& state, WorkerId worker, bool admitted, absl::Time now) {
    if (!state.config_.reject_pressure) return;
    uint64_t& pressure = state.pressure_[worker];
    const bool had = pressure != 0;
    if (admitted) {
      pressure = 0;
    } else {
      if (state.PressureLocked(worker, now) == 0) pressure = 0;
      ++pressure;
      state.pressure_at_[worker] = now;
    }
    state.num_pressured_ += (pressure != 0) - static_cast<int>(had);
  }
  // False when no worker has any reject pressure (Route skips that pass).
  template <class State>
  static bool AnyPressure(State& state) { return state.num_pressured_ > 0; }
  template <class State>
  static auto& Health(State& state) { return state.health_; }
  template <class State>
  static absl::Time Now(State& state) { return state.clock_(); }
  template <class State>
  static const std::vector<WorkerStatus>& DecodeStatus(State& state) {
    return state.decode_status_;
  }
  template <class State>
  static auto& TouchSession(State& state, SessionId session, absl::Time now) {
    return state.TouchSessionLocked(session, now);
  }
  // Round-robin cursors; kNoWorker when the pool is empty.
  // Round-robin over active workers (elastic membership). A pool whose
  // workers are all draining still serves (never happens through the API:
  // the last active worker cannot leave).
  template <class State>
  static WorkerId NextPrefill(State& state) {
    const uint32_t n = state.config_.num_prefill_workers;
    if (n == 0) return kNoWorker;
    for (uint32_t i = 0; i < n; ++i) {
      const auto p = static_cast<WorkerId>((state.prefill_cursor_ + i) % n);
      if (state.prefill_status_[p] == WorkerStatus::kActive) {
        state.prefill_cursor_ += i + 1;
        return p;
      }
    }
    return static_cast<WorkerId>(state.prefill_cursor_++ % n);
  }
  // The fallback's round-robin decode worker: the next one whose breaker
  // lets requests through, or plain round-robin when none does.
  template <class State>
  static WorkerId NextDecode(State& state) {
    const uint32_t n = state.config_.num_decode_workers;
    const absl::Time now = state.clock_();
    // Active and healthy first, then any active worker.
    for (int pass = 0; pass < 2; ++pass) {
      for (uint32_t i = 0; i < n; ++i) {
        const auto d = static_cast<WorkerId>((state.decode_cursor_ + i) % n);
        if (state.decode_status_[d] != WorkerStatus::kActive) continue;
        if (pass == 0 && !state.health_.Routable(d, now)) continue;
        state.decode_cursor_ += i + 1;
        return d;
      }
    }
    return static_cast<WorkerId>(state.decode_cursor_++ % n);
  }
};

}  // namespace detail
}  // namespace kvc_router
