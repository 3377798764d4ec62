// kvc_router/health.hpp
//
// Worker health: one circuit breaker per decode worker, fed by the answers of
// the admission RPC. A worker whose RPC got no answer (`worker-unavailable`:
// timeout, connection refused) `failure_threshold` times within
// `failure_window` is *open*: Route and Dispatch do not ask it. After
// `open_cooldown` it is *half-open*: one request probes it; an answer closes
// the breaker, another failure opens it for a new cooldown. Any answer at all
// (an admission or a capacity rejection) proves the worker alive and closes
// it. Time is always the caller's (RoutingState's clock), so tests use a
// fake clock.
//
// RoutingState owns a `WorkerHealth` (RouterConfig::health, on by default)
// and feeds it from DispatchOp::OnAdmitResult; this header is the state
// machine alone, with no locking (RoutingState's mutex guards it).
//
//   kvc_router::WorkerHealth health(config.health, /*num_workers=*/8);
//   health.OnFailure(3, now);           // the admission RPC to worker 3 timed out
//   if (!health.Routable(3, now)) { ... }
//
// The thresholds, and why (see docs/reliability.md):
//   failure_threshold 3   one or two lost RPCs are normal under load
//   failure_window    10 s  failures older than this are forgotten
//   open_cooldown     5 s   how long an open worker is left alone before a probe
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace kvc_router {

struct HealthConfig {
  // Off: every worker is always routable (the seed's behaviour).
  bool enabled = true;
  // Failures (worker-unavailable answers) within `failure_window` that open
  // the breaker. 1..1000000.
  uint32_t failure_threshold = 3;
  // Positive.
  absl::Duration failure_window = absl::Seconds(10);
  // How long an open breaker stays open before a half-open probe. Positive.
  absl::Duration open_cooldown = absl::Seconds(5);

  absl::Status Validate() const {
    if (failure_threshold == 0 || failure_threshold > 1000000) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HealthConfig.failure_threshold must be in 1..1000000, got ", failure_threshold));
    }
    if (failure_window <= absl::ZeroDuration() || failure_window == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HealthConfig.failure_window must be positive and finite, got ",
          absl::FormatDuration(failure_window)));
    }
    if (open_cooldown <= absl::ZeroDuration() || open_cooldown == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HealthConfig.open_cooldown must be positive and finite, got ",
          absl::FormatDuration(open_cooldown)));
    }
    return absl::OkStatus();
  }
};

enum class BreakerState : uint8_t { kClosed, kOpen, kHalfOpen };

constexpr std::string_view BreakerStateName(BreakerState state) {
  switch (state) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kOpen:
      return "open";
    case BreakerState::kHalfOpen:
      return "half-open";
  }
  return "unknown";
}

// One worker's breaker. Not thread-safe.
class CircuitBreaker {
 public:
  // The state at `now` (an open breaker whose cooldown passed is half-open).
  BreakerState state(const HealthConfig& config, absl::Time now) const {
    if (!open_) return BreakerState::kClosed;
    return now - opened_at_ >= config.open_cooldown ? BreakerState::kHalfOpen
                                                    : BreakerState::kOpen;
  }

  // May a request be sent to this worker at `now`? Closed: yes. Open: no.
  // Half-open: yes unless a probe is already out (a probe that got no answer
  // within one cooldown is given up, so an abandoned op cannot wedge it).
  bool Routable(const HealthConfig& config, absl::Time now) const {
    switch (state(config, now)) {
      case BreakerState::kClosed:
        return true;
      case BreakerState::kOpen:
        return false;
      case BreakerState::kHalfOpen:
        return !probing_ || now - probe_sent_ >= config.open_cooldown;
    }
    return true;
  }

  // A request is being sent at `now`: in half-open it is the probe.
  void OnSend(const HealthConfig& config, absl::Time now) {
    if (state(config, now) == BreakerState::kHalfOpen) {
      probing_ = true;
      probe_sent_ = now;
    }
  }

  // The worker answered (admitted or rejected for a reason of its own).
  void OnAnswer() {
    open_ = false;
    probing_ = false;
    failures_ = 0;
  }

  // The RPC got no answer.
  void OnFailure(const HealthConfig& config, absl::Time now) {
    if (open_) {
      // A failed probe (or a late failure of a request sent before opening)
      // restarts the cooldown.
      opened_at_ = now;
      probing_ = false;
      ++times_opened_;
      return;
    }
    if (failures_ == 0 || now - window_start_ > config.failure_window) {
      window_start_ = now;
      failures_ = 0;
    }
    if (++failures_ >= config.failure_threshold) {
      open_ = true;
      opened_at_ = now;
      probing_ = false;
      failures_ = 0;
      ++times_opened_;
    }
  }

  // How many times the breaker opened (including re-opens after a failed probe).
  uint64_t times_opened() const { return times_opened_; }
  // Open or half-open (not closed).
  bool is_open() const { return open_; }

 private:
  bool open_ = false;
  bool probing_ = false;
  uint32_t failures_ = 0;
  absl::Time window_start_;
  absl::Time opened_at_;
  absl::Time probe_sent_;
  uint64_t times_opened_ = 0;
};

// The breakers of a pool of workers, indexed by worker id; grows with the
// pool (elastic membership) and forgets a removed worker's history.
class WorkerHealth {
 public:
  WorkerHealth() = default;
  WorkerHealth(const HealthConfig& config, uint32_t num_workers)
      : config_(config), breakers_(num_workers) {}

  const HealthConfig& config() const { return config_; }
  size_t num_workers() const { return breakers_.size(); }

  // Routable at `now`; always true when health is disabled or `worker` is unknown.
  bool Routable(uint32_t worker, absl::Time now) const {
    if (!config_.enabled || worker >= breakers_.size()) return true;
    return breakers_[worker].Routable(config_, now);
  }
  BreakerState state(uint32_t worker, absl::Time now) const {
    if (!config_.enabled || worker >= breakers_.size()) return BreakerState::kClosed;
    return breakers_[worker].state(config_, now);
  }
  uint64_t times_opened(uint32_t worker) const {
    return worker < breakers_.size() ? breakers_[worker].times_opened() : 0;
  }
  void OnSend(uint32_t worker, absl::Time now) {
    if (config_.enabled && worker < breakers_.size()) breakers_[worker].OnSend(config_, now);
  }
  void OnAnswer(uint32_t worker) {
    if (worker >= breakers_.size()) return;
    num_open_ -= breakers_[worker].is_open() ? 1 : 0;
    breakers_[worker].OnAnswer();
  }
  void OnFailure(uint32_t worker, absl::Time now) {
    if (!config_.enabled || worker >= breakers_.size()) return;
    const bool was_open = breakers_[worker].is_open();
    breakers_[worker].OnFailure(config_, now);
    num_open_ += !was_open && breakers_[worker].is_open() ? 1 : 0;
  }
  // False when every breaker is closed (Route then skips the health pass).
  bool any_open() const { return num_open_ > 0; }
  // Slots 0..num_workers-1; new slots start closed.
  void Resize(uint32_t num_workers) { breakers_.resize(num_workers); }
  // A worker left or joined in slot `worker`: a fresh, closed breaker.
  void Reset(uint32_t worker) {
    if (worker >= breakers_.size()) return;
    num_open_ -= breakers_[worker].is_open() ? 1 : 0;
    breakers_[worker] = CircuitBreaker();
  }

 private:
  HealthConfig config_;
  std::vector<CircuitBreaker> breakers_;
  uint32_t num_open_ = 0;  // breakers not closed
};

}  // namespace kvc_router
