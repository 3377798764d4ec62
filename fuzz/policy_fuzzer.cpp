// Fuzz target: the policies a gateway runs without admission RPCs (the
// affinity family, `ear` first among them) over a LoadLedger, as
// kvc-gateway --policy ear drives them: options from the input (invalid ones
// must be refused by Create), then any sequence of session turns with
// consistent or inconsistent token counts, load control, migration plans,
// first tokens, rebooked prefills, finishes in any order, evictions, session
// closes and a clock that jumps (backwards too). Invariants after every call:
//  - a placement names a real instance (and, on P/D, a real prefill worker),
//    estimates no more hit than input, and a move leaves another instance;
//  - a binding rule binds the session it just placed there;
//  - a migration plan starts at the session's binding and goes elsewhere;
//  - a turn held longer than max_hold_s is let in;
//  - ear's live-context total equals the sum of its per-instance counts;
//  - the ledger's loads equal the sums over the open tickets;
// and once every request ended and every session closed, nothing is counted.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include "fuzz_input.hpp"
#include "kvc_router/policy/affinity_policies.hpp"
#include "kvc_router/policy/load_ledger.hpp"

namespace {

using kvc_router::BlockHash;
using kvc_router::kNoWorker;
using kvc_router::SessionId;
using kvc_router::WorkerId;
using kvc_router::policy::AffinityPolicy;
using kvc_router::policy::AffinityPolicyOptions;
using kvc_router::policy::AffinityRule;
using kvc_router::policy::InstanceLoad;
using kvc_router::policy::LoadLedger;
using kvc_router::policy::Placement;
using kvc_router::policy::PolicyRequest;
using kvc_router::policy::Topology;

constexpr uint32_t kSessions = 8;

struct Session {
  std::vector<BlockHash> chain;  // the context after the last finished turn
  uint32_t turn = 0;
};

// One placed request; owns the hashes its PolicyRequest points into.
struct Running {
  std::vector<BlockHash> input, context;
  PolicyRequest request;
  Placement placement;
  std::unique_ptr<LoadLedger::Ticket> ticket;  // null when the ledger refused it
  uint64_t booked = 0;
  bool first_token = false;
};

double Seconds(kvc_fuzz::FuzzInput& in) {
  switch (in.U8() % 8) {
    case 0:
      return std::numeric_limits<double>::quiet_NaN();
    case 1:
      return -1.0 * (in.U8() % 4);
    case 2:
      return std::numeric_limits<double>::infinity();
    default:
      return static_cast<double>(in.U16() % 200) / 4.0;
  }
}

void CheckLedger(const LoadLedger& ledger, const std::vector<std::unique_ptr<Running>>& running,
                 const AffinityPolicyOptions& o) {
  std::vector<InstanceLoad> want(o.instances), want_prefill(o.prefill_workers);
  for (const auto& r : running) {
    if (r->ticket == nullptr) continue;
    ++want[r->placement.instance].running_requests;
    if (r->first_token) continue;
    if (r->placement.prefill == kNoWorker) {
      want[r->placement.instance].pending_prefill_tokens += r->booked;
    } else {
      want_prefill[r->placement.prefill].pending_prefill_tokens += r->booked;
      ++want_prefill[r->placement.prefill].running_requests;
    }
  }
  for (WorkerId d = 0; d < o.instances; ++d) {
    FUZZ_CHECK(ledger.instance_load(d).running_requests == want[d].running_requests);
    FUZZ_CHECK(ledger.instance_load(d).pending_prefill_tokens == want[d].pending_prefill_tokens);
  }
  for (WorkerId p = 0; p < o.prefill_workers; ++p) {
    FUZZ_CHECK(ledger.prefill_load(p).running_requests == want_prefill[p].running_requests);
    FUZZ_CHECK(ledger.prefill_load(p).pending_prefill_tokens ==
               want_prefill[p].pending_prefill_tokens);
  }
}

void CheckPolicy(const AffinityPolicy& policy, const AffinityPolicyOptions& o) {
  uint64_t committed = 0;
  for (WorkerId d = 0; d < o.instances; ++d) committed += policy.committed_tokens(d);
  FUZZ_CHECK(policy.live_context_tokens() == committed);
  FUZZ_CHECK((policy.live_sessions() == 0) == (committed == 0));
  for (SessionId s = 0; s < kSessions; ++s) {
    const WorkerId b = policy.binding(s);
    FUZZ_CHECK(b == kNoWorker || b < o.instances);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvc_fuzz::FuzzInput in(data, size);
  AffinityPolicyOptions o;
  const uint8_t rule = in.U8();
  o.rule = static_cast<AffinityRule>(rule % 16 < 15 ? rule % 5 : rule);
  o.topology = in.U8() % 2 == 0 ? Topology::kColocated : Topology::kDisaggregated;
  o.instances = in.U8() % 32 == 0 ? 0 : 1 + in.U8() % 6;
  o.prefill_workers = o.topology == Topology::kDisaggregated ? in.U8() % 4 : 0;
  o.block_tokens = in.U8() % 32;
  o.kv_capacity_tokens = in.U8() % 4 == 0 ? 0 : in.Tokens();
  o.high_cache_fraction = (in.U8() % 12) / 10.0;
  o.max_bindings = in.U8() % 10;
  o.hot_prefill_tokens = in.Tokens();
  o.memory_move_max_pending_tokens = in.Tokens();
  o.memory_trigger = in.U8() % 2 == 0;
  o.memory_move_lowers_overflow = in.U8() % 2 == 0;
  if (in.U8() % 3 == 0) o.migration_cost.enabled = false;
  o.migration_cooldown_s = Seconds(in);
  o.session_idle_s = Seconds(in);
  o.idle_gap_quantile = (in.U8() % 12) / 10.0;
  o.hold_new_sessions = in.U8() % 4 != 0;
  o.hold_memory_fraction = (in.U8() % 12) / 10.0;
  o.hold_min_return_rate = (in.U8() % 12) / 10.0;
  o.max_hold_s = Seconds(in);
  o.reusable_capacity_tokens = in.U8() % 3 == 0 ? in.Tokens() : 0;

  auto created = AffinityPolicy::Create(o);
  if (!created.ok()) {
    FUZZ_CHECK(!created.status().message().empty());
    return 0;
  }
  AffinityPolicy& policy = **created;
  auto now = std::make_shared<double>(0.0);
  auto made = LoadLedger::Create(o.topology, o.instances, o.prefill_workers, [now] { return *now; });
  if (!made.ok()) {  // the policy's options accepted a shape the ledger cannot serve
    FUZZ_CHECK(o.topology == Topology::kDisaggregated && o.prefill_workers == 0);
    return 0;
  }
  LoadLedger& ledger = **made;
  const bool binds = o.rule == AffinityRule::kUnified || o.rule == AffinityRule::kSticky ||
                     o.rule == AffinityRule::kEar;

  std::vector<Session> sessions(kSessions);
  std::vector<std::unique_ptr<Running>> running;
  uint64_t next_id = 0;
  BlockHash next_hash = 1;
  while (!in.empty()) {
    const uint8_t action = in.U8() % 12;
    if (action < 4) {  // a turn of a session
      const SessionId sid = in.U8() % kSessions;
      Session& s = sessions[sid];
      auto r = std::make_unique<Running>();
      r->input = s.chain;
      const uint32_t appended = in.U8() % 6;
      // Shared blocks across sessions now and then (a common system prompt).
      for (uint32_t i = 0; i < appended; ++i) {
        r->input.push_back(in.U8() % 4 == 0 ? 1000000 + i : next_hash++);
      }
      r->context = r->input;
      for (uint32_t i = in.U8() % 4; i > 0; --i) r->context.push_back(next_hash++);
      PolicyRequest& q = r->request;
      q.id = next_id++;
      q.request.session = sid;
      q.request.turn = in.U8() % 8 == 0 ? in.U8() : s.turn;  // sometimes out of order
      q.request.prefix_hashes = std::span<const BlockHash>(r->input).first(s.chain.size());
      q.request.appended_hashes = std::span<const BlockHash>(r->input).subspan(s.chain.size());
      q.request.append_tokens = uint64_t{appended} * o.block_tokens;
      q.input_tokens = in.U8() % 8 == 0 ? in.Tokens()
                                        : uint64_t{r->input.size()} * o.block_tokens +
                                              in.U8() % (o.block_tokens == 0 ? 1 : o.block_tokens);
      q.input_hashes = r->input;
      q.context_hashes = r->context;
      if (q.request.turn == 0 || policy.binding(sid) == kNoWorker) {
        const double arrived = *now - Seconds(in);
        const bool hold = policy.HoldNewSession(q, ledger, arrived);
        if (std::isfinite(o.max_hold_s) && *now - arrived >= o.max_hold_s) FUZZ_CHECK(!hold);
        if (hold && in.U8() % 2 == 0) continue;  // it waits at the gateway (and gives up)
      }
      absl::StatusOr<Placement> placed = policy.Place(q, ledger);
      if (!placed.ok()) {  // the cluster has the shape the policy was built for
        FUZZ_CHECK(q.input_tokens > kvc_router::kMaxCapacityTokens);
        FUZZ_CHECK(placed.status().message().find("input_tokens") != std::string_view::npos);
        continue;
      }
      const Placement& p = *placed;
      FUZZ_CHECK(p.instance < o.instances);
      if (o.topology == Topology::kDisaggregated) {
        FUZZ_CHECK(p.prefill < o.prefill_workers);
      } else {
        FUZZ_CHECK(p.prefill == kNoWorker);
      }
      FUZZ_CHECK(p.estimated_hit_tokens <= q.input_tokens);
      if (p.migrate_from != kNoWorker) {
        FUZZ_CHECK(o.rule == AffinityRule::kEar);
        FUZZ_CHECK(p.migrate_from < o.instances && p.migrate_from != p.instance);
      }
      if (binds) FUZZ_CHECK(policy.binding(sid) == p.instance);
      r->placement = p;
      r->booked = q.input_tokens - p.estimated_hit_tokens;
      absl::StatusOr<LoadLedger::Ticket> ticket = ledger.Start(p, r->booked);
      if (ticket.ok()) {
        r->ticket = std::make_unique<LoadLedger::Ticket>(std::move(*ticket));
      } else {
        FUZZ_CHECK(r->booked > kvc_router::kMaxCapacityTokens);
      }
      s.chain = r->context;
      ++s.turn;
      running.push_back(std::move(r));
    } else if (action < 6) {  // a request ends (answered or failed)
      if (running.empty()) continue;
      const uint32_t k = in.Below(static_cast<uint32_t>(running.size()));
      Running& r = *running[k];
      if (r.ticket != nullptr) {
        r.ticket->Finish();
        FUZZ_CHECK(r.ticket->finished());
        r.ticket->Finish();  // a second finish gives nothing back
      }
      policy.OnFinished(r.request, r.placement, ledger);
      running.erase(running.begin() + k);
    } else if (action == 6) {  // first token, or a rebook before it
      if (running.empty()) continue;
      Running& r = *running[in.Below(static_cast<uint32_t>(running.size()))];
      if (r.ticket == nullptr) continue;
      if (in.U8() % 2 == 0) {
        r.ticket->FirstToken();
        r.first_token = true;
      } else {
        const uint64_t tokens = in.Tokens();
        const absl::Status s = r.ticket->Rebook(tokens);
        FUZZ_CHECK(s.ok() == (!r.first_token && tokens <= kvc_router::kMaxCapacityTokens));
        if (s.ok()) r.booked = tokens;
      }
    } else if (action == 7) {  // the client closes a session
      const SessionId sid = in.U8() % kSessions;
      policy.OnSessionClosed(sid);
      if (binds) FUZZ_CHECK(policy.binding(sid) == kNoWorker);
      sessions[sid] = Session{};
    } else if (action == 8) {  // an instance evicted a session (KV event)
      policy.OnEvicted(in.U8() % (o.instances + 1), in.U8() % kSessions);
    } else if (action == 9) {  // what the migration step would do now
      const SessionId sid = in.U8() % kSessions;
      PolicyRequest q;
      q.request.session = sid;
      q.input_tokens = in.Tokens();
      const std::vector<BlockHash>& chain = sessions[sid].chain;
      q.input_hashes = chain;
      if (auto plan = policy.PlanMigration(q, ledger)) {
        FUZZ_CHECK(plan->from == policy.binding(sid));
        FUZZ_CHECK(plan->to < o.instances && plan->to != plan->from);
      }
    } else {  // the clock moves, now and then backwards
      *now += in.U8() % 16 == 0 ? -1.0 : Seconds(in) * (in.U8() % 2 == 0 ? 1 : 100);
      if (!std::isfinite(*now)) *now = 0;
    }
    CheckLedger(ledger, running, o);
    CheckPolicy(policy, o);
  }
  // Everything ends; every session closes.
  for (auto& r : running) {
    if (r->ticket != nullptr) r->ticket->Finish();
    policy.OnFinished(r->request, r->placement, ledger);
  }
  running.clear();
  CheckLedger(ledger, running, o);
  for (SessionId s = 0; s < kSessions; ++s) policy.OnSessionClosed(s);
  CheckPolicy(policy, o);
  FUZZ_CHECK(policy.live_context_tokens() == 0 && policy.live_sessions() == 0);
  return 0;
}
