// kvc_router/policy/affinity_policies.hpp
//
// The load- and affinity-based policies the EAR report compares (its §3):
//
//   load-only  the instance with the fewest running requests;
//   lmetric    argmin over instances of (pending prefill tokens + the
//              request's input tokens not cached there) x running requests,
//              the report's LMetric; ties go to the smaller first factor;
//   sticky     rendezvous (highest-random-weight) hashing of the session over
//              the instances: a session always lands on the same instance,
//              whatever its load, and adding or removing one of N instances
//              moves only ~1/N of the sessions;
//   unified    affinity by default: a session's first placement is chosen by
//              LMetric (or, when some instance already caches more than
//              `high_cache_fraction` of the request, by that cache), and its
//              later turns follow the binding;
//   ear        unified's binding plus session migration (the EAR report's
//              Pillar 2): when a later turn's instance is hot, the session's
//              KV moves to a lighter instance that can hold it (see
//              PlanMigration). A session's first placement is the instance
//              with the least prefill work for it (pending prefill + its
//              uncached input) among those with room for its context
//              (give it kv_capacity_tokens, the workers' K_d, for that).
//              Its load control (HoldNewSession) keeps a new session's
//              first turn waiting at the gateway while the live sessions'
//              contexts fill the cluster's KV, so admitted sessions keep
//              their caches instead of evicting one another's.
//
// Each runs on either topology. On the colocated one it picks the instance;
// on the disaggregated one it picks the decode worker the same way and the
// prefill worker with the least pending prefill work (ear: the least prefill
// work for the request, what the policy estimates that worker caches
// counted, so a session's prompts tend to meet their prefix there). The instance keeps the
// request's KV as its engine does (Booking::kSession).
//
// What a policy knows of caches is its own estimate, learned from its
// placements (the prompt when placed, the context when finished) and bounded
// per instance by K_d with whole sessions evicted least recently used first
// (EstimateIndex), the way a gateway without KV events would know it. Block
// hashes must be chained from the root block (SessionHasher's, a trace's),
// which lets the estimate find how much of a prompt an instance holds by
// bisection. A session the client closed (OnSessionClosed) is forgotten at
// once. Loads are what ClusterView reports (a gateway scrapes them from its
// workers).
//
// Health: a worker the view says is not routable (ClusterView::routable: a
// gateway's open circuit breaker, LoadLedger's, or a drain) gets nothing; a
// session bound to such an instance is placed as if new (its KV cannot be
// moved off an instance that does not answer), except that ear moves the
// sessions of a draining instance, which still answers, with their KV;
// with no routable worker Place returns Unavailable and changes nothing.
//
// Membership: instances join at runtime (AddInstance, with the view's
// LoadLedger::AddInstance) and leave by a drain (ClusterView::routable).
//
// Every decision is deterministic: ties go to the lowest id, and sticky's
// weights come from a fixed-seed hash.
//
//   kvc_router::policy::AffinityPolicyOptions options;
//   options.rule = kvc_router::policy::AffinityRule::kUnified;
//   kvc_router::policy::AffinityPolicy unified(options);
//   absl::StatusOr<kvc_router::policy::Placement> p = unified.Place(request, cluster);
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/policy/policy.hpp"
#include "kvc_router/policy/rendezvous.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::policy {

// LMetric's product of two 64-bit factors, without overflow.
__extension__ typedef unsigned __int128 LMetricScore;

enum class AffinityRule : uint8_t { kLoadOnly, kLMetric, kSticky, kUnified, kEar };

inline std::string_view AffinityRuleName(AffinityRule rule) {
  switch (rule) {
    case AffinityRule::kLoadOnly:
      return "load-only";
    case AffinityRule::kLMetric:
      return "lmetric";
    case AffinityRule::kSticky:
      return "sticky";
    case AffinityRule::kUnified:
      return "unified";
    case AffinityRule::kEar:
      return "ear";
  }
  return "unknown";
}

struct AffinityPolicyOptions {
  AffinityRule rule = AffinityRule::kUnified;
  Topology topology = Topology::kColocated;
  // Instances (colocated) or decode workers, and prefill workers (P/D only).
  uint32_t instances = 8;
  uint32_t prefill_workers = 0;
  uint32_t block_tokens = 24;
  // Bound of the cache estimate per instance (the workers' K_d); 0 = none.
  uint64_t kv_capacity_tokens = 0;
  // unified: a session without a binding goes where more than this fraction
  // of its input is cached, when such an instance exists.
  double high_cache_fraction = 0.5;
  // Bound on remembered session bindings (oldest placement forgotten first).
  uint64_t max_bindings = uint64_t{1} << 20;

  // ear: a bound session's instance is hot when its pending prefill tokens
  // exceed this (T_hot). 8,192 tokens are one chunked-prefill step (~0.33 s
  // on an H100 with an 8B model): a turn queued behind more than that waits
  // for other sessions' prompts.
  uint64_t hot_prefill_tokens = 8192;
  // ear: how a move off a hot instance is judged. Enabled: the target must
  // serve the turn sooner by at least T_hot tokens of prefill after paying
  // for the move, i.e. pending(home) - pending(target) - append - (KV move
  // time / prefill time per token) >= T_hot, with the move priced from
  // `transfer_per_token_s` and `transfer_setup_s` and prefill from
  // `prefill_per_token_s` (the defaults: an H100 with an 8B model, 147 KB
  // of KV per token over 22 GB/s, so moving a 100k-token context costs about
  // what prefilling 17k tokens does). Disabled: the fixed rule, a target
  // must stay under T_hot / 2 pending tokens after taking the turn.
  DirectCostModel migration_cost = EnabledCost();
  // ear, memory trigger: a session moved for memory goes only where the
  // pending prefill, with its append, stays at most this many tokens.
  uint64_t memory_move_max_pending_tokens = 32768;
  // ear: also hot when the contexts of the live sessions bound to the
  // instance exceed its KV capacity (kv_capacity_tokens): LRU would evict
  // some of them and their next turns would re-prefill everything.
  bool memory_trigger = true;
  // ear, memory trigger: a session may also move to an instance that cannot
  // hold all of it beside its live contexts, when the move lowers the live
  // context tokens beyond K_d, summed over home and target, by at least
  // T_hot. An engine's LRU re-prefills about its overflow every round of
  // turns, so overflow moved to where there is room is re-prefill saved;
  // when every pool overflows nothing qualifies and the binding stays.
  // Engines with a host-memory tier (SGLang's HiCache) spill overflow
  // instead of recomputing it; there the moves cost more than they save
  // (docs/policies.md) and this is better off.
  bool memory_move_lowers_overflow = true;
  // ear: a session migrates at most once per this many seconds.
  double migration_cooldown_s = 60;
  // ear: a session idle this long no longer counts against its instance's
  // memory (it has most likely ended; its KV is the first LRU evicts).
  // 0 = learned: the idle_gap_quantile of the gaps observed between a turn's
  // end and its session's next turn (before any gap is seen: 60 s). How long
  // agents think or run tools differs by workload (seconds for a coding
  // agent, minutes for a chat), so the policy measures it.
  double session_idle_s = 0;
  double idle_gap_quantile = 0.95;

  // ear, load control (HoldNewSession; Denning's working-set rule, with
  // sessions for processes): a new session's first turn waits at the
  // gateway while the contexts of the live sessions plus its input exceed
  // hold_memory_fraction of the cluster's reusable KV (routable instances
  // x reusable_capacity_tokens). Admitting it would make the engines' LRU
  // evict contexts whose next turns come within seconds, and every lost
  // context is prefilled again while other prompts queue behind it; held,
  // the new session waits once, for memory that sessions ending free. The
  // remaining fraction is room for the admitted contexts to grow. It holds
  // only while
  //  - at least hold_min_return_rate of the turns placed lately continued
  //    a session (return_rate(), prior 1/2): for traffic of
  //    mostly one-turn sessions, kept contexts save little and the wait
  //    would fall on most requests;
  //  - an instance's share of that memory fits two average live contexts:
  //    with fewer, no admitted set fits either, and holding would leave
  //    instances idle while their sessions think;
  //  - the input alone fits within the limit (a larger one would wait for
  //    an empty cluster, and every session behind it with it);
  //  - kv_capacity_tokens is set (without a K_d nothing is held);
  //  - the turn has waited less than max_hold_s (600 s, also the default
  //    request timeout of OpenAI's Python client: a turn held that long
  //    still needs its prefill, so set it below the clients' timeout by
  //    their TTFT budget).
  bool hold_new_sessions = true;
  double hold_memory_fraction = 0.8;
  double hold_min_return_rate = 0.5;
  double max_hold_s = 600;
  // ear: shortest first among new sessions that arrive together
  // (RoutingPolicy::ArrivalWindow). A first turn may wait at the gateway up
  // to arrival_window_fraction of its own estimated prefill time (the
  // migration_cost figures, for the input no instance is estimated to
  // cache), at most max_arrival_window_s, for shorter first turns arriving
  // with it. The wait costs a new session at most that fraction of its TTFT
  // when nothing else arrives; when a batch of agents starts together, each
  // short first prompt is placed, and prefilled, before the long ones
  // instead of behind whichever of them arrived a moment earlier. 0 = off.
  double arrival_window_fraction = 0.02;
  double max_arrival_window_s = 0.25;
  // KV tokens per instance that keep a context reusable without recompute:
  // the GPU pool plus any host-memory tier (SGLang's HiCache, LMCache).
  // 0 = kv_capacity_tokens.
  uint64_t reusable_capacity_tokens = 0;

  absl::Status Validate() const {
    if (AffinityRuleName(rule) == "unknown") {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions.rule ", static_cast<int>(rule), " is not an AffinityRule"));
    }
    if (!IsKnownTopology(topology)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions.topology ", static_cast<int>(topology), " is not a Topology"));
    }
    if (instances == 0 || instances > kMaxWorkers) {
      return absl::InvalidArgumentError(
          absl::StrCat("AffinityPolicyOptions.instances must be in 1..", kMaxWorkers));
    }
    if (topology == Topology::kDisaggregated && (prefill_workers == 0 || prefill_workers > kMaxWorkers)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions.prefill_workers must be in 1..", kMaxWorkers,
          " on the disaggregated topology"));
    }
    if (block_tokens == 0) {
      return absl::InvalidArgumentError("AffinityPolicyOptions.block_tokens must be >= 1");
    }
    if (!(high_cache_fraction >= 0 && high_cache_fraction <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("AffinityPolicyOptions.high_cache_fraction must be in [0, 1], got ",
                       high_cache_fraction));
    }
    if (max_bindings == 0) {
      return absl::InvalidArgumentError("AffinityPolicyOptions.max_bindings must be >= 1");
    }
    if (hot_prefill_tokens == 0) {
      return absl::InvalidArgumentError("AffinityPolicyOptions.hot_prefill_tokens must be >= 1");
    }
    if (absl::Status s = migration_cost.Validate(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("AffinityPolicyOptions.migration_cost: ", s.message()));
    }
    if (migration_cost.enabled && !(migration_cost.prefill_per_token_s > 0)) {
      return absl::InvalidArgumentError(
          "AffinityPolicyOptions.migration_cost.prefill_per_token_s must be > 0 when the cost "
          "rule is enabled");
    }
    if (!(migration_cooldown_s >= 0) || !std::isfinite(migration_cooldown_s) ||
        !(session_idle_s >= 0) || !std::isfinite(session_idle_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions: migration_cooldown_s and session_idle_s must be finite and "
          ">= 0 (got ",
          migration_cooldown_s, " and ", session_idle_s, ")"));
    }
    if (!(idle_gap_quantile > 0 && idle_gap_quantile < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions.idle_gap_quantile must be in (0, 1), got ", idle_gap_quantile));
    }
    if (!(hold_memory_fraction > 0 && hold_memory_fraction <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions.hold_memory_fraction must be in (0, 1], got ",
          hold_memory_fraction));
    }
    if (!(hold_min_return_rate >= 0 && hold_min_return_rate <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions.hold_min_return_rate must be in [0, 1], got ",
          hold_min_return_rate));
    }
    if (!(max_hold_s >= 0) || !std::isfinite(max_hold_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions.max_hold_s must be finite and >= 0, got ", max_hold_s));
    }
    if (!(arrival_window_fraction >= 0 && arrival_window_fraction <= 1) ||
        !(max_arrival_window_s >= 0) || !std::isfinite(max_arrival_window_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions: arrival_window_fraction must be in [0, 1] and "
          "max_arrival_window_s finite and >= 0 (got ",
          arrival_window_fraction, " and ", max_arrival_window_s, ")"));
    }
    if (reusable_capacity_tokens != 0 && reusable_capacity_tokens < kv_capacity_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AffinityPolicyOptions.reusable_capacity_tokens (", reusable_capacity_tokens,
          ") must be 0 or at least kv_capacity_tokens (", kv_capacity_tokens,
          "): it counts the GPU pool too"));
    }
    return absl::OkStatus();
  }

  static DirectCostModel EnabledCost() {
    DirectCostModel cost;
    cost.enabled = true;
    return cost;
  }
};

// A streaming quantile of gaps in seconds: a histogram with buckets 2^(1/4)
// apart from 1 ms to about a day, so a quantile is within 19% of the truth
// in constant memory.
class GapHistogram {
 public:
  void Add(double seconds) {
    if (!(seconds >= 0) || !std::isfinite(seconds)) return;
    ++buckets_[Bucket(seconds)];
    ++count_;
  }
  uint64_t count() const { return count_; }
  // The upper edge of the bucket holding the q-quantile.
  double Quantile(double q) const {
    const auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
    uint64_t seen = 0;
    for (size_t i = 0; i < kBuckets; ++i) {
      seen += buckets_[i];
      if (seen >= rank && seen > 0) return Edge(i);
    }
    return Edge(kBuckets - 1);
  }

 private:
  static constexpr size_t kBuckets = 112;  // 1 ms * 2^(112/4) ~ 74 hours
  static size_t Bucket(double seconds) {
    if (seconds <= 1e-3) return 0;
    const double b = std::ceil(4.0 * std::log2(seconds / 1e-3));
    return static_cast<size_t>(std::min<double>(b, kBuckets - 1));
  }
  static double Edge(size_t bucket) { return 1e-3 * std::exp2(static_cast<double>(bucket) / 4.0); }

  std::array<uint64_t, kBuckets> buckets_{};
  uint64_t count_ = 0;
};

// ear's return rate (AffinityPolicy::return_rate) weighs about this many of
// the latest placements.
inline constexpr double kReturnRateWindow = 4096;

// Why PlanMigration moves a session.
enum class MigrationTrigger : uint8_t {
  // The bound instance's pending prefill tokens exceed hot_prefill_tokens.
  kHotPrefill,
  // The live contexts bound to the instance exceed its KV capacity.
  kMemory,
  // An operator drains the bound instance (ClusterView::draining).
  kDrain,
};

// A decision to move one session's KV between instances before its next
// turn runs. The gateway moves the KV with its own mover (a KV connector,
// Mooncake's transfer engine) and then serves the turn on `to`.
struct MigrationPlan {
  SessionId session = 0;
  WorkerId from = kNoWorker;
  WorkerId to = kNoWorker;
  // The session's context as the policy knows it: the KV to move, tokens.
  uint64_t context_tokens = 0;
  MigrationTrigger trigger = MigrationTrigger::kHotPrefill;
};

class AffinityPolicy final : public RoutingPolicy {
 public:
  static absl::StatusOr<std::unique_ptr<AffinityPolicy>> Create(const AffinityPolicyOptions& options) {
    if (absl::Status s = options.Validate(); !s.ok()) return s;
    return std::unique_ptr<AffinityPolicy>(new AffinityPolicy(options));
  }

  std::string_view name() const override { return name_; }
  Topology topology() const override { return options_.topology; }

  absl::StatusOr<Placement> Place(const PolicyRequest& request, ClusterView& cluster) override {
    if (cluster.num_instances() != options_.instances ||
        (options_.topology == Topology::kDisaggregated &&
         cluster.num_prefill_workers() != options_.prefill_workers)) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, ": built for ", options_.instances, " instances and ", options_.prefill_workers,
          " prefill workers, the cluster has ", cluster.num_instances(), " and ",
          cluster.num_prefill_workers()));
    }
    // Beyond any pool: a wrapped-around count, which summed into the
    // per-instance memory would wrap those too.
    if (request.input_tokens > kMaxCapacityTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": input_tokens ", request.input_tokens, " of session ", request.request.session,
          " is above ", kMaxCapacityTokens, " (more than any KV pool)"));
    }
    // Which workers may take requests now (a gateway's circuit breakers);
    // with none, nothing is decided and nothing changes.
    if (absl::Status up = ReadRoutable(cluster); !up.ok()) return up;
    const SessionId session = request.request.session;
    const double now = cluster.now_s();
    if (options_.rule == AffinityRule::kEar) {
      auto it = bindings_.find(session);
      if (it != bindings_.end() && it->second.in_flight == 0) {
        gaps_.Add(now - it->second.last_active_s);
      }
      // Counts that fade over the last ~kReturnRateWindow placements, so
      // a long-running gateway follows its traffic when it changes.
      constexpr double kKeep = 1.0 - 1.0 / kReturnRateWindow;
      first_turns_ *= kKeep;
      later_turns_ *= kKeep;
      (it != bindings_.end() ? later_turns_ : first_turns_) += 1;
    }
    ExpireIdle(now);
    // What each instance is estimated to hold of the input, before this
    // request is learned: read by every rule below and by the hit estimate.
    estimate_.OverlapOfChain(request.input_hashes, overlap_);
    WorkerId chosen = kNoWorker;
    WorkerId migrate_from = kNoWorker;
    if (options_.rule == AffinityRule::kEar) {
      if (std::optional<MigrationPlan> plan = PlanMigrationAmong(
              request, cluster, [this](WorkerId d) { return up_[d] != 0; })) {
        chosen = plan->to;
        migrate_from = plan->from;
        ++migrations_;
      } else {
        const WorkerId bound = binding(session);
        chosen = bound != kNoWorker && up_[bound] ? bound : PlaceNewSession(request, cluster);
      }
    } else {
      chosen = Choose(request, cluster);
    }
    // What the serving instance holds before this request: its own cache,
    // or after a move what the move brings.
    const uint64_t instance_hit = std::min<uint64_t>(
        request.input_tokens,
        uint64_t{overlap_[migrate_from != kNoWorker ? migrate_from : chosen]} *
            options_.block_tokens);
    if (migrate_from != kNoWorker) estimate_.ForgetSession(migrate_from, session);
    if (const WorkerId bound = binding(session);
        bound != kNoWorker && bound != chosen && !up_[bound] && bound != migrate_from) {
      // Placed anew because its instance is not routable: whatever that
      // instance held of it is not counted on when it comes back, and turns
      // still running there no longer count as this binding's (their
      // OnFinished names the old instance and is ignored).
      estimate_.ForgetSession(bound, session);
      if (auto it = bindings_.find(session); it != bindings_.end()) it->second.in_flight = 0;
    }
    estimate_.Learn(chosen, session, request.input_hashes);
    Bind(session, chosen);
    if (options_.rule == AffinityRule::kEar) {
      Binding& b = bindings_.find(session)->second;
      if (migrate_from != kNoWorker) b.migrated_at_s = now;
      ++b.in_flight;
      Track(session, b, std::max(b.context_tokens, request.input_tokens), now);
    }
    WorkerId prefill = kNoWorker;
    uint64_t hit = instance_hit;
    if (options_.topology == Topology::kDisaggregated) {
      hit = 0;  // the load-only prefill choice keeps no estimate
      prefill = options_.rule == AffinityRule::kEar ? ChoosePrefillByWork(request, cluster, hit)
                                                    : ChoosePrefill(cluster);
    }
    Placement placement = CachePlacement(request, chosen, prefill);
    placement.migrate_from = migrate_from;
    placement.estimated_hit_tokens = hit;
    return placement;
  }

  void OnFinished(const PolicyRequest& request, const Placement& placement,
                  ClusterView& cluster) override {
    if (placement.instance >= options_.instances) return;
    if (request.context_hashes.size() >= request.input_hashes.size()) {
      estimate_.Learn(placement.instance, request.request.session, request.context_hashes);
    }
    if (options_.rule != AffinityRule::kEar) return;
    auto it = bindings_.find(request.request.session);
    if (it == bindings_.end() || it->second.instance != placement.instance) return;
    Binding& b = it->second;
    if (b.in_flight > 0) --b.in_flight;
    const uint64_t context = std::max<uint64_t>(
        request.input_tokens, uint64_t{request.context_hashes.size()} * options_.block_tokens);
    Track(request.request.session, b, context, cluster.now_s());
  }

  // The session ended: its binding, the memory counted for it and what the
  // cache estimates hold of it go (the workers let its KV go first).
  void OnSessionClosed(SessionId session) override {
    for (WorkerId d = 0; d < options_.instances; ++d) estimate_.ForgetSession(d, session);
    for (WorkerId p = 0; p < options_.prefill_workers; ++p) {
      prefill_estimate_.ForgetSession(p, session);
    }
    auto it = bindings_.find(session);
    if (it == bindings_.end()) return;
    Uncount(it->second);
    bindings_.erase(it);
    // Closed sessions leave their entries in the forgetting order; drop them
    // once they outnumber the live bindings, so the state stays bounded.
    if (order_.size() - head_ > 2 * bindings_.size() + 4096) {
      std::vector<std::pair<SessionId, uint64_t>> live;
      live.reserve(bindings_.size());
      for (size_t i = head_; i < order_.size(); ++i) {
        if (bindings_.contains(order_[i].first)) live.push_back(order_[i]);
      }
      order_ = std::move(live);
      head_ = 0;
    }
  }

  // ear's load control (see AffinityPolicyOptions::hold_new_sessions): true
  // while `request`, the first turn of a session the policy has not placed,
  // should wait at the gateway. Forgets sessions idle past IdleSeconds()
  // first, as Place would.
  bool HoldNewSession(const PolicyRequest& request, ClusterView& cluster,
                      double arrived_s) override {
    if (options_.rule != AffinityRule::kEar || !options_.hold_new_sessions ||
        options_.kv_capacity_tokens == 0 || request.request.turn != 0 ||
        bindings_.contains(request.request.session)) {
      return false;
    }
    const double now = cluster.now_s();
    if (now - arrived_s >= options_.max_hold_s) return false;
    ExpireIdle(now);
    // With nothing live the memory test below is false for any input.
    if (return_rate() < options_.hold_min_return_rate) return false;
    const double reusable =
        options_.hold_memory_fraction *
        static_cast<double>(options_.reusable_capacity_tokens != 0
                                ? options_.reusable_capacity_tokens
                                : options_.kv_capacity_tokens);
    const double live = static_cast<double>(live_tokens_);
    if (2 * live > reusable * static_cast<double>(live_sessions_)) return false;
    // Only routable instances lend their memory: a drained (or removed)
    // one takes no new session, and one whose breaker is open may come
    // back empty. With none routable nothing is held: Place answers.
    uint32_t routable = 0;
    const uint32_t instances = std::min<uint32_t>(options_.instances, cluster.num_instances());
    for (WorkerId d = 0; d < instances; ++d) routable += cluster.routable(d) ? 1 : 0;
    const double limit = reusable * static_cast<double>(routable);
    const double input = static_cast<double>(request.input_tokens);
    // An input beyond the limit on its own would wait for an empty cluster.
    return input <= limit && live + input > limit;
  }

  // ear: shortest first among new sessions arriving together (see
  // AffinityPolicyOptions::arrival_window_fraction). The key is the input
  // no routable instance is estimated to cache, the prefill the turn needs
  // at best; sessions already placed, and the other rules, get no window.
  // Changes nothing Place reads.
  ArrivalOrder ArrivalWindow(const PolicyRequest& request, const ClusterView& cluster) override {
    if (options_.rule != AffinityRule::kEar || options_.arrival_window_fraction == 0 ||
        request.request.turn != 0 || bindings_.contains(request.request.session) ||
        request.input_tokens > kMaxCapacityTokens) {
      return {};
    }
    estimate_.OverlapOfChain(request.input_hashes, overlap_);
    uint32_t best_overlap = 0;
    const uint32_t instances = std::min<uint32_t>(options_.instances, cluster.num_instances());
    for (WorkerId d = 0; d < instances; ++d) {
      if (cluster.routable(d)) best_overlap = std::max(best_overlap, overlap_[d]);
    }
    const uint64_t cached = std::min<uint64_t>(request.input_tokens,
                                               uint64_t{best_overlap} * options_.block_tokens);
    const uint64_t uncached = request.input_tokens - cached;
    const double prefill_s = options_.migration_cost.PrefillSeconds(uncached, cached);
    return ArrivalOrder{
        std::min(options_.max_arrival_window_s, options_.arrival_window_fraction * prefill_s),
        static_cast<double>(uncached)};
  }

  // ear's migration step for the next turn of `request`'s session, without
  // changing anything (Place commits it). A session moves only when
  //  - it is bound and has no request running (never mid-request),
  //  - it has not moved within migration_cooldown_s,
  //  - its instance is hot: pending prefill above hot_prefill_tokens, or
  //    (memory_trigger) the live contexts bound there above K_d,
  //  - some other instance can hold its input beside the live contexts
  //    bound there (or, for a memory move with memory_move_lowers_overflow,
  //    taking it lowers the tokens beyond K_d on home and target together by
  //    T_hot) and takes the turn sooner: with migration_cost enabled,
  //    sooner by at least T_hot tokens of prefill after paying for the KV
  //    move; with it disabled, that instance stays under T_hot / 2 pending
  //    tokens after taking the turn. A memory move instead needs the
  //    target's pending prefill, with the append, at most
  //    memory_move_max_pending_tokens: it may go to an instance busier than
  //    home, since losing the context to eviction costs a full re-prefill.
  // The target is the lightest such instance by observable pending prefill
  // tokens (then running requests, then id). Otherwise the binding stays:
  // migration is opportunistic, never forced. Counting the append on the
  // target's side is the hysteresis that keeps two instances from trading a
  // session back and forth (after a move the way back looks worse by the
  // append, the move's price and T_hot); the cooldown bounds moves per
  // session whatever the load does.
  std::optional<MigrationPlan> PlanMigration(const PolicyRequest& request,
                                             const ClusterView& cluster) const {
    return PlanMigrationAmong(request, cluster,
                              [&cluster](WorkerId d) { return cluster.routable(d); });
  }

 private:
  // PlanMigration over the instances `routable` accepts (Place passes the
  // snapshot it decides on, so one placement sees one answer per instance).
  template <typename Routable>
  std::optional<MigrationPlan> PlanMigrationAmong(const PolicyRequest& request,
                                                  const ClusterView& cluster,
                                                  Routable routable) const {
    if (options_.rule != AffinityRule::kEar) return std::nullopt;
    auto it = bindings_.find(request.request.session);
    if (it == bindings_.end()) return std::nullopt;
    const Binding& b = it->second;
    if (b.in_flight > 0 || b.instance >= options_.instances) return std::nullopt;
    const uint64_t capacity = options_.kv_capacity_tokens;
    if (!routable(b.instance)) {
      // A drained instance still answers: its sessions leave with their KV
      // for the lightest routable instance with room (the cooldown does not
      // apply; nothing moves back to a drained instance). One that does not
      // answer cannot hand its KV over: Place places the session anew.
      if (!cluster.draining(b.instance)) return std::nullopt;
      const uint64_t need = std::max(request.input_tokens, b.context_tokens);
      WorkerId best = kNoWorker;
      InstanceLoad best_load;
      for (WorkerId d = 0; d < options_.instances; ++d) {
        if (d == b.instance || !routable(d)) continue;
        if (capacity > 0 && committed_[d] + need > capacity) continue;
        const InstanceLoad load = cluster.instance_load(d);
        if (best == kNoWorker || LighterTarget(load, best_load)) {
          best = d;
          best_load = load;
        }
      }
      if (best == kNoWorker) return std::nullopt;
      return MigrationPlan{request.request.session, b.instance, best, b.context_tokens,
                           MigrationTrigger::kDrain};
    }
    const double now = cluster.now_s();
    if (now - b.migrated_at_s < options_.migration_cooldown_s) return std::nullopt;
    const InstanceLoad home = cluster.instance_load(b.instance);
    const bool prefill_hot = home.pending_prefill_tokens > options_.hot_prefill_tokens;
    const bool memory_hot =
        options_.memory_trigger && capacity > 0 && committed_[b.instance] > capacity;
    if (!prefill_hot && !memory_hot) return std::nullopt;
    const uint64_t need = std::max(request.input_tokens, b.context_tokens);
    const DirectCostModel& cost = options_.migration_cost;
    // The KV move in tokens of prefill time, and the work left at home.
    const double move_tokens =
        cost.enabled ? (cost.transfer_setup_s +
                        static_cast<double>(b.context_tokens) * cost.transfer_per_token_s) /
                           cost.prefill_per_token_s
                     : 0;
    const double home_pending = static_cast<double>(home.pending_prefill_tokens);
    WorkerId best = kNoWorker;
    InstanceLoad best_load;
    for (WorkerId d = 0; d < options_.instances; ++d) {
      if (d == b.instance || !routable(d)) continue;
      if (capacity > 0 && committed_[d] + need > capacity &&
          !(memory_hot && LowersOverflow(b, d, need))) {
        continue;
      }
      const InstanceLoad load = cluster.instance_load(d);
      const uint64_t after = load.pending_prefill_tokens + request.request.append_tokens;
      if (memory_hot) {
        if (after > options_.memory_move_max_pending_tokens) continue;
      } else if (cost.enabled) {
        const double saved = home_pending - static_cast<double>(after) - move_tokens;
        if (saved < static_cast<double>(options_.hot_prefill_tokens)) continue;
      } else if (after > options_.hot_prefill_tokens / 2) {
        continue;
      }
      if (best == kNoWorker || LighterTarget(load, best_load)) {
        best = d;
        best_load = load;
      }
    }
    if (best == kNoWorker) return std::nullopt;
    return MigrationPlan{request.request.session, b.instance, best, b.context_tokens,
                         memory_hot ? MigrationTrigger::kMemory : MigrationTrigger::kHotPrefill};
  }

  // A move's target order: fewer pending prefill tokens, then fewer running
  // requests (then the lower id, by scanning in id order).
  static bool LighterTarget(const InstanceLoad& a, const InstanceLoad& b) {
    return a.pending_prefill_tokens < b.pending_prefill_tokens ||
           (a.pending_prefill_tokens == b.pending_prefill_tokens &&
            a.running_requests < b.running_requests);
  }

 public:
  // A new instance (colocated) or decode worker joins: the next id, with
  // nothing cached, bound or committed. Grow the cluster view the same way
  // first (LoadLedger::AddInstance): Place refuses a view of another size.
  // Under unified and ear bound sessions stay where their KV is and new
  // sessions see the newcomer; under sticky the ~1/N of all sessions whose
  // weight it wins move there, without their KV. ResourceExhausted once
  // kMaxWorkers instances exist (ids are not reused: an instance leaves by
  // a drain and keeps its id).
  absl::StatusOr<WorkerId> AddInstance() {
    if (options_.instances >= kMaxWorkers) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name_, ": all ", kMaxWorkers, " instances exist"));
    }
    const WorkerId id = options_.instances++;
    estimate_.ResizeWorkers(options_.instances);
    overlap_.push_back(0);
    committed_.push_back(0);
    up_.push_back(1);
    read_up_.push_back(1);
    return id;
  }

  // The instance a session is bound to (unified, ear and sticky), or kNoWorker.
  WorkerId binding(SessionId session) const {
    auto it = bindings_.find(session);
    return it == bindings_.end() ? kNoWorker : it->second.instance;
  }
  // ear: tokens of live session contexts bound to `instance`.
  uint64_t committed_tokens(WorkerId instance) const {
    return instance < committed_.size() ? committed_[instance] : 0;
  }
  // ear: tokens of live session contexts on all instances, and the
  // sessions they belong to (load control's view of memory).
  uint64_t live_context_tokens() const { return live_tokens_; }
  uint64_t live_sessions() const { return live_sessions_; }
  // ear: the share of the turns placed lately (about the last
  // kReturnRateWindow) that continued a session, (later turns + 1) / (all
  // turns + 2). For steady traffic it is the share of turns followed by
  // another turn of their session; unlike counting the sessions that ended,
  // it needs no wait to learn that a session will not come back.
  double return_rate() const {
    return (later_turns_ + 1) / (first_turns_ + later_turns_ + 2);
  }
  // ear: migrations planned and committed so far.
  uint64_t migrations() const { return migrations_; }
  // Tokens of `hashes` the policy believes `instance` caches.
  uint64_t EstimatedHitTokens(WorkerId instance, std::span<const BlockHash> hashes) {
    estimate_.OverlapOfChain(hashes, overlap_);
    return uint64_t{overlap_[instance]} * options_.block_tokens;
  }

 private:
  explicit AffinityPolicy(const AffinityPolicyOptions& options)
      : options_(options),
        name_(std::string(AffinityRuleName(options.rule)) +
              (options.topology == Topology::kDisaggregated ? "-pd" : "")),
        estimate_(options.instances, options.kv_capacity_tokens, options.block_tokens),
        overlap_(options.instances, 0),
        prefill_estimate_(std::max<uint32_t>(options.prefill_workers, 1),
                          options.kv_capacity_tokens, options.block_tokens),
        prefill_overlap_(std::max<uint32_t>(options.prefill_workers, 1), 0),
        committed_(options.instances, 0),
        up_(options.instances, 1),
        prefill_up_(options.prefill_workers, 1),
        read_up_(options.instances, 1),
        read_prefill_up_(options.prefill_workers, 1) {}

  struct Binding {
    WorkerId instance = kNoWorker;
    uint64_t stamp = 0;
    // ear: the session's context (its KV on `instance`), what of it counts
    // in committed_ (0 once idle), its last activity and last move.
    uint64_t context_tokens = 0;
    uint64_t counted_tokens = 0;
    double last_active_s = 0;
    double migrated_at_s = -std::numeric_limits<double>::infinity();
    uint32_t in_flight = 0;
  };

  // ear: whether moving `b`'s session (`need` tokens at the target) to `d`
  // lowers the live context tokens beyond K_d on the two instances by at
  // least T_hot (memory_move_lowers_overflow).
  bool LowersOverflow(const Binding& b, WorkerId d, uint64_t need) const {
    if (!options_.memory_move_lowers_overflow) return false;
    const uint64_t capacity = options_.kv_capacity_tokens;
    auto beyond = [capacity](uint64_t tokens) { return tokens > capacity ? tokens - capacity : 0; };
    const uint64_t home = committed_[b.instance];
    const uint64_t leaving = std::min(b.counted_tokens, home);
    const uint64_t before = beyond(home) + beyond(committed_[d]);
    const uint64_t after = beyond(home - leaving) + beyond(committed_[d] + need);
    return after + options_.hot_prefill_tokens <= before;
  }

  WorkerId Choose(const PolicyRequest& request, ClusterView& cluster) {
    const uint32_t n = options_.instances;
    switch (options_.rule) {
      case AffinityRule::kLoadOnly: {
        WorkerId best = kNoWorker;
        uint32_t best_running = 0;
        for (WorkerId d = 0; d < n; ++d) {
          if (!up_[d]) continue;
          const uint32_t running = cluster.instance_load(d).running_requests;
          if (best == kNoWorker || running < best_running) {
            best = d;
            best_running = running;
          }
        }
        return best;
      }
      case AffinityRule::kSticky:
        // The highest weight among the instances that answer: while one is
        // down only its own sessions move, and they return when it does.
        return RendezvousInstance(request.request.session, n,
                                  [this](WorkerId d) { return up_[d] != 0; });
      case AffinityRule::kLMetric:
        return LMetric(request, cluster, /*need_fit=*/false);
      case AffinityRule::kUnified:
      case AffinityRule::kEar: {
        const WorkerId bound = binding(request.request.session);
        if (bound != kNoWorker && up_[bound]) return bound;
        if (const WorkerId cached = HighCacheInstance(request, /*need_fit=*/false);
            cached != kNoWorker) {
          return cached;
        }
        return LMetric(request, cluster, /*need_fit=*/false);
      }
    }
    return 0;
  }

  // ear's first placement: the least prefill work (LeastWork) among the
  // instances that can hold the input beside the live contexts bound there
  // (all of them without a K_d or with memory_trigger off); when none can,
  // the instance with the most room left. The work sum is
  // what the first token waits for, so a cached prefix counts exactly as
  // much as the queue it would save; LMetric's product with running
  // requests instead ties every idle instance at 0 and lets a burst of new
  // sessions pile their long prompts on one of them.
  WorkerId PlaceNewSession(const PolicyRequest& request, ClusterView& cluster) {
    if (options_.kv_capacity_tokens == 0 || !options_.memory_trigger) {
      return LeastWork(request, cluster, /*need_fit=*/false);
    }
    const WorkerId fit = LeastWork(request, cluster, /*need_fit=*/true);
    if (fit != kNoWorker) return fit;
    WorkerId roomiest = kNoWorker;
    for (WorkerId d = 0; d < options_.instances; ++d) {
      if (up_[d] && (roomiest == kNoWorker || committed_[d] < committed_[roomiest])) roomiest = d;
    }
    return roomiest;
  }

  // Fills up_ and prefill_up_ from the view; Unavailable, naming the pool,
  // and changing nothing, when a pool the request needs has no worker that
  // answers.
  absl::Status ReadRoutable(const ClusterView& cluster) {
    uint32_t instances_up = 0;
    for (WorkerId d = 0; d < options_.instances; ++d) {
      read_up_[d] = cluster.routable(d) ? 1 : 0;
      instances_up += read_up_[d];
    }
    uint32_t prefill_up = 0;
    for (WorkerId p = 0; p < options_.prefill_workers; ++p) {
      read_prefill_up_[p] = cluster.prefill_routable(p) ? 1 : 0;
      prefill_up += read_prefill_up_[p];
    }
    if (instances_up == 0) {
      return absl::UnavailableError(absl::StrCat(
          name_, ": none of the ", options_.instances,
          " instances is routable (each one's circuit breaker is open or it is drained); retry "
          "after the breakers' cooldown"));
    }
    if (options_.topology == Topology::kDisaggregated && prefill_up == 0) {
      return absl::UnavailableError(absl::StrCat(
          name_, ": none of the ", options_.prefill_workers,
          " prefill workers is routable (each one's circuit breaker is open or it is drained); "
          "retry after the breakers' cooldown"));
    }
    for (WorkerId d = 0; d < options_.instances; ++d) {
      // An instance that stopped answering may come back with an empty
      // cache (a restart): what the estimate held of it is not counted on.
      if (up_[d] && !read_up_[d] && !cluster.draining(d)) estimate_.ForgetWorker(d);
    }
    for (WorkerId p = 0; p < options_.prefill_workers; ++p) {
      if (prefill_up_[p] && !read_prefill_up_[p]) prefill_estimate_.ForgetWorker(p);
    }
    up_.swap(read_up_);
    prefill_up_.swap(read_prefill_up_);
    return absl::OkStatus();
  }

  bool Fits(WorkerId d, uint64_t tokens) const {
    return options_.kv_capacity_tokens == 0 || committed_[d] + tokens <= options_.kv_capacity_tokens;
  }

  // The rule helpers below read overlap_, which Place fills for the request
  // before it decides.

  // The instance caching more than high_cache_fraction of the input, if any.
  WorkerId HighCacheInstance(const PolicyRequest& request, bool need_fit) {
    WorkerId best = kNoWorker;
    for (WorkerId d = 0; d < options_.instances; ++d) {
      if (!up_[d] || (need_fit && !Fits(d, request.input_tokens))) continue;
      if (best == kNoWorker || overlap_[d] > overlap_[best]) best = d;
    }
    if (best == kNoWorker || request.input_tokens == 0) return kNoWorker;
    const double cached = static_cast<double>(uint64_t{overlap_[best]} * options_.block_tokens);
    return cached > options_.high_cache_fraction * static_cast<double>(request.input_tokens)
               ? best
               : kNoWorker;
  }

  // Pending prefill on `d` plus the input tokens it does not cache, by the
  // overlap the caller has just put in overlap_.
  uint64_t PrefillWork(const PolicyRequest& request, WorkerId d, const InstanceLoad& load) const {
    const uint64_t hit =
        std::min<uint64_t>(request.input_tokens, uint64_t{overlap_[d]} * options_.block_tokens);
    return load.pending_prefill_tokens + (request.input_tokens - hit);
  }

  // argmin (pending prefill + uncached input) x running requests; ties: the
  // smaller prefill term, then the lowest id. With `need_fit`, only
  // instances that can hold the input (kNoWorker when none can).
  WorkerId LMetric(const PolicyRequest& request, ClusterView& cluster, bool need_fit) {
    WorkerId best = kNoWorker;
    LMetricScore best_score = 0;
    uint64_t best_prefill = 0;
    for (WorkerId d = 0; d < options_.instances; ++d) {
      if (!up_[d] || (need_fit && !Fits(d, request.input_tokens))) continue;
      const InstanceLoad load = cluster.instance_load(d);
      const uint64_t prefill = PrefillWork(request, d, load);
      const LMetricScore score = static_cast<LMetricScore>(prefill) * load.running_requests;
      if (best == kNoWorker || score < best_score ||
          (score == best_score && prefill < best_prefill)) {
        best = d;
        best_score = score;
        best_prefill = prefill;
      }
    }
    return best;
  }

  // argmin pending prefill + uncached input: the prefill work the request
  // waits for and does. Ties: fewer running requests, then fewer tokens of
  // live contexts bound there (idle instances share new sessions instead of
  // the lowest id taking them all), then the lowest id.
  WorkerId LeastWork(const PolicyRequest& request, ClusterView& cluster, bool need_fit) {
    WorkerId best = kNoWorker;
    std::tuple<uint64_t, uint32_t, uint64_t> best_key;
    for (WorkerId d = 0; d < options_.instances; ++d) {
      if (!up_[d] || (need_fit && !Fits(d, request.input_tokens))) continue;
      const InstanceLoad load = cluster.instance_load(d);
      const std::tuple<uint64_t, uint32_t, uint64_t> key{PrefillWork(request, d, load),
                                                         load.running_requests, committed_[d]};
      if (best == kNoWorker || key < best_key) {
        best = d;
        best_key = key;
      }
    }
    return best;
  }

  // ear on P/D: the prefill worker with the least prefill work for the
  // request (pending prefill + the input its cache lacks, by the policy's
  // estimate of what each prefill worker computed), so a session's next
  // prompt tends to find its previous one where it was computed. Ties: fewer
  // running requests, then the lowest id.
  // `hit` receives the tokens of the input the chosen worker was estimated
  // to hold before this request.
  WorkerId ChoosePrefillByWork(const PolicyRequest& request, ClusterView& cluster,
                               uint64_t& hit) {
    prefill_estimate_.OverlapOfChain(request.input_hashes, prefill_overlap_);
    WorkerId best = kNoWorker;
    uint64_t best_work = 0;
    uint32_t best_running = 0;
    for (WorkerId p = 0; p < options_.prefill_workers; ++p) {
      if (!prefill_up_[p]) continue;
      const InstanceLoad load = cluster.prefill_load(p);
      const uint64_t hit = std::min<uint64_t>(
          request.input_tokens, uint64_t{prefill_overlap_[p]} * options_.block_tokens);
      const uint64_t work = load.pending_prefill_tokens + (request.input_tokens - hit);
      if (best == kNoWorker || work < best_work ||
          (work == best_work && load.running_requests < best_running)) {
        best = p;
        best_work = work;
        best_running = load.running_requests;
      }
    }
    hit = std::min<uint64_t>(request.input_tokens,
                             uint64_t{prefill_overlap_[best]} * options_.block_tokens);
    prefill_estimate_.Learn(best, request.request.session, request.input_hashes);
    return best;
  }

  WorkerId ChoosePrefill(ClusterView& cluster) const {
    WorkerId best = kNoWorker;
    InstanceLoad best_load;
    for (WorkerId p = 0; p < options_.prefill_workers; ++p) {
      if (!prefill_up_[p]) continue;
      const InstanceLoad load = cluster.prefill_load(p);
      if (best == kNoWorker || load.pending_prefill_tokens < best_load.pending_prefill_tokens ||
          (load.pending_prefill_tokens == best_load.pending_prefill_tokens &&
           load.running_requests < best_load.running_requests)) {
        best = p;
        best_load = load;
      }
    }
    return best;
  }

  // ear: the session's context is now `context` tokens, bound to
  // b.instance, active at `now`.
  void Track(SessionId session, Binding& b, uint64_t context, double now) {
    Uncount(b);
    b.context_tokens = context;
    Count(b, context);
    b.last_active_s = now;
    idle_queue_.emplace_back(now, session);
  }

  // `b` counts `tokens` against its instance (it counted nothing before).
  void Count(Binding& b, uint64_t tokens) {
    b.counted_tokens = tokens;
    committed_[b.instance] += tokens;
    live_tokens_ += tokens;
    if (tokens > 0) ++live_sessions_;
  }

  void Uncount(Binding& b) {
    if (b.instance < committed_.size()) committed_[b.instance] -= b.counted_tokens;
    live_tokens_ -= b.counted_tokens;
    if (b.counted_tokens > 0) --live_sessions_;
    b.counted_tokens = 0;
  }

  // How long a session may be idle and still count (see session_idle_s).
  double IdleSeconds() const {
    if (options_.session_idle_s > 0) return options_.session_idle_s;
    return gaps_.count() == 0 ? 60.0 : std::max(1.0, gaps_.Quantile(options_.idle_gap_quantile));
  }

  // Sessions idle longer than IdleSeconds() stop counting against their instance.
  void ExpireIdle(double now) {
    const double idle = IdleSeconds();
    while (!idle_queue_.empty() && idle_queue_.front().first + idle <= now) {
      const auto [at, session] = idle_queue_.front();
      idle_queue_.pop_front();
      auto it = bindings_.find(session);
      if (it == bindings_.end()) continue;
      Binding& b = it->second;
      if (b.last_active_s == at && b.in_flight == 0) Uncount(b);
    }
  }

  void Bind(SessionId session, WorkerId instance) {
    if (options_.rule != AffinityRule::kUnified && options_.rule != AffinityRule::kSticky &&
        options_.rule != AffinityRule::kEar) {
      return;
    }
    auto [it, inserted] = bindings_.try_emplace(session, Binding{});
    if (!inserted) {
      // A move: the context's memory goes with it.
      if (it->second.instance != instance) {
        const uint64_t counted = it->second.counted_tokens;
        Uncount(it->second);
        it->second.instance = instance;
        Count(it->second, counted);
      }
      it->second.stamp = ++clock_;
      return;
    }
    it->second.instance = instance;
    it->second.stamp = ++clock_;
    // Forget the oldest other bindings beyond the bound (lazy queue of
    // stamps: an entry whose session was placed again since goes back in
    // line with its new stamp). The new binding joins the queue after them,
    // so it is never the one forgotten.
    while (bindings_.size() > options_.max_bindings && head_ < order_.size()) {
      const auto [old, stamp] = order_[head_++];
      if (old == session) continue;  // an entry from an earlier binding of it
      auto jt = bindings_.find(old);
      if (jt != bindings_.end() && jt->second.stamp == stamp) {
        Uncount(jt->second);
        bindings_.erase(jt);
      } else if (jt != bindings_.end()) {
        order_.push_back({old, jt->second.stamp});
      }
    }
    order_.push_back({session, it->second.stamp});
    if (head_ > 4096 && head_ * 2 > order_.size()) {
      order_.erase(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(head_));
      head_ = 0;
    }
  }

  AffinityPolicyOptions options_;
  std::string name_;
  EstimateIndex estimate_;
  std::vector<uint32_t> overlap_;
  // ear on P/D: what each prefill worker is estimated to cache.
  EstimateIndex prefill_estimate_;
  std::vector<uint32_t> prefill_overlap_;
  absl::flat_hash_map<SessionId, Binding> bindings_;
  std::vector<std::pair<SessionId, uint64_t>> order_;
  size_t head_ = 0;
  uint64_t clock_ = 0;
  // ear: live context tokens bound to each instance; activity in time order.
  std::vector<uint64_t> committed_;
  // Whether each instance and prefill worker was routable when Place began
  // (ClusterView::routable); read by the rule helpers.
  std::vector<uint8_t> up_;
  std::vector<uint8_t> prefill_up_;
  std::vector<uint8_t> read_up_;  // scratch for ReadRoutable
  std::vector<uint8_t> read_prefill_up_;
  // ear: their sum, the sessions counted in it, and the turns placed for
  // sessions without and with a binding (fading, see return_rate()).
  uint64_t live_tokens_ = 0;
  uint64_t live_sessions_ = 0;
  double first_turns_ = 0;
  double later_turns_ = 0;
  std::deque<std::pair<double, SessionId>> idle_queue_;
  GapHistogram gaps_;
  uint64_t migrations_ = 0;
};

}  // namespace kvc_router::policy
