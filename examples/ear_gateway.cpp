// ear_gateway: how a gateway runs the recommended policy, `ear`
// (policy/affinity_policies.hpp), with nothing but what it sends.
//
// Four colocated instances serve 12 agentic sessions in rounds. The gateway
// hashes each turn with a SessionHasher, asks `ear` where it goes, books it
// in a LoadLedger (policy/load_ledger.hpp: pending prefill until the first
// token, a running slot until the end), moves the session's KV first when
// the placement says so (`migrate_from`; here a stand-in for the gateway's
// KV connector), and reports the turn finished. Halfway through, a batch of
// other tenants' long prompts lands on instance 0 and stays queued there for
// a few rounds: the sessions bound to it move to idle instances with their
// KV instead of waiting, and stay there afterwards. At the end the agents
// finish and the gateway closes their sessions (OnSessionClosed; a real
// gateway also sends SGLang's /close_session to the instances that served
// them).
//
// Then load control, on a smaller cluster (two instances of 10,000 KV
// tokens): agents keep arriving, and the gateway asks HoldNewSession before
// placing each one's first turn. While the live contexts would fill more
// than 80% of the KV, new sessions wait in the gateway's queue, oldest
// first, and go in as earlier sessions close.
//
// Exit status 0 when it ends as described (sessions moved off the busy
// instance, none moved twice, later turns booked only their new tokens as
// prefill, every ticket gave its load back, nothing left counted against an
// instance once every session closed; later, sessions waited while memory
// was full, entered in arrival order, and the live contexts never passed the
// limit); ctest runs it (label "example").
//
//   ear_gateway [--quiet]
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvc_router/block_hash.hpp"
#include "kvc_router/policy/affinity_policies.hpp"
#include "kvc_router/policy/load_ledger.hpp"

namespace {

using namespace kvc_router;
using namespace kvc_router::policy;

constexpr uint32_t kInstances = 4;
constexpr uint32_t kBlockTokens = 16;

struct Session {
  SessionId id = 0;
  std::optional<SessionHasher> hasher;
  uint32_t turns = 0;
  std::vector<WorkerId> homes;  // where each turn ran
};

// Tokens a turn appends: a task first, then tool results.
std::vector<TokenId> NewTokens(const Session& s) {
  const size_t n = s.turns == 0 ? 2000 : 300;
  std::vector<TokenId> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<TokenId>(s.id * 100000 + s.turns * 1000 + i);
  return tokens;
}

// Load control: three agents arrive per second for eight seconds on two
// instances of 10,000 tokens; each runs three turns (one per second) and
// closes. Returns the number of broken expectations.
int LoadControl(bool quiet) {
  double now = 0;
  auto ledger = LoadLedger::Create(Topology::kColocated, 2, 0, [&now] { return now; });
  AffinityPolicyOptions options;
  options.rule = AffinityRule::kEar;
  options.instances = 2;
  options.block_tokens = kBlockTokens;
  options.kv_capacity_tokens = 10000;
  auto ear = AffinityPolicy::Create(options);
  if (!ledger.ok() || !ear.ok()) return 1;
  LoadLedger& cluster = **ledger;
  AffinityPolicy& policy = **ear;
  const double limit = options.hold_memory_fraction * 2 * 10000;

  struct Agent {
    Session session;
    double arrived_s = 0;
    double placed_s = -1;
  };
  std::deque<Agent> agents;
  std::deque<Agent*> queue;  // first turns waiting at the gateway
  std::vector<Agent*> running;
  std::vector<SessionId> admitted;
  int failures = 0;
  uint32_t checked = 0;  // admissions made under load control
  uint64_t request_id = 0;
  // One turn of `a`: placed, run, finished (the sketch above, condensed).
  auto run_turn = [&](Agent& a) {
    Session& s = a.session;
    const std::vector<TokenId> fresh(s.turns == 0 ? 2400 : 300, static_cast<TokenId>(s.id));
    PolicyRequest request;
    request.id = request_id++;
    request.request = s.hasher->BeginTurn(fresh);
    request.input_tokens = s.hasher->total_tokens();
    request.input_hashes = s.hasher->hashes();
    absl::StatusOr<Placement> where = policy.Place(request, cluster);
    if (!where.ok()) return false;
    absl::StatusOr<LoadLedger::Ticket> ticket =
        cluster.Start(*where, request.input_tokens - where->estimated_hit_tokens);
    if (!ticket.ok()) return false;
    ticket->FirstToken();
    s.hasher->AppendContext(std::vector<TokenId>(100, static_cast<TokenId>(7)));
    request.context_hashes = s.hasher->hashes();
    ticket->Finish();
    policy.OnFinished(request, *where, cluster);
    ++s.turns;
    return true;
  };
  for (int second = 0; second < 40; ++second) {
    now = second;
    for (int k = 0; k < 3 && second < 8; ++k) {
      Agent& a = agents.emplace_back();
      a.session.id = 100 + agents.size();
      a.session.hasher = *SessionHasher::Create(a.session.id, kBlockTokens);
      a.arrived_s = now;
      queue.push_back(&a);
    }
    // Running agents take their next turn; after the third they close.
    for (auto it = running.begin(); it != running.end();) {
      if ((*it)->session.turns == 3) {
        policy.OnSessionClosed((*it)->session.id);
        it = running.erase(it);
        continue;
      }
      if (!run_turn(**it)) return failures + 1;
      ++it;
    }
    // The gateway's queue: the oldest first turn goes in unless the policy
    // holds it, and nothing passes a held turn.
    while (!queue.empty()) {
      Agent& a = *queue.front();
      PolicyRequest first;
      const std::vector<TokenId> task(2400, static_cast<TokenId>(a.session.id));
      SessionHasher probe = *SessionHasher::Create(a.session.id, kBlockTokens);
      first.request = probe.BeginTurn(task);
      first.input_tokens = probe.total_tokens();
      first.input_hashes = probe.hashes();
      if (policy.HoldNewSession(first, cluster, a.arrived_s)) break;
      // Until most placed turns continue a session, ear does not hold (the
      // first agents' first turns); after that an admitted task fit.
      const bool controlled = policy.return_rate() >= options.hold_min_return_rate;
      queue.pop_front();
      a.placed_s = now;
      if (!run_turn(a)) return failures + 1;
      running.push_back(&a);
      admitted.push_back(a.session.id);
      // Its 2,400-token task fit; its first answer adds 100.
      checked += controlled;
      if (controlled && static_cast<double>(policy.live_context_tokens()) > limit + 100) {
        ++failures;
      }
    }
  }
  uint32_t waited = 0;
  for (const Agent& a : agents) {
    if (a.placed_s < 0) ++failures;  // every agent got in
    if (a.placed_s > a.arrived_s) ++waited;
    if (!quiet && a.placed_s > a.arrived_s) {
      std::printf("load control: session %llu arrived at %.0f s, waited until %.0f s\n",
                  static_cast<unsigned long long>(a.session.id), a.arrived_s, a.placed_s);
    }
  }
  for (size_t i = 1; i < admitted.size(); ++i) failures += admitted[i] < admitted[i - 1];
  if (waited == 0 || checked == 0) ++failures;
  std::printf("ear_gateway: load control held %u of %zu sessions at the gateway until memory "
              "freed\n",
              waited, agents.size());
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quiet = argc > 1 && std::strcmp(argv[1], "--quiet") == 0;
  double now = 0;
  auto ledger = LoadLedger::Create(Topology::kColocated, kInstances, 0, [&now] { return now; });
  AffinityPolicyOptions options;
  options.rule = AffinityRule::kEar;
  options.instances = kInstances;
  options.block_tokens = kBlockTokens;
  options.kv_capacity_tokens = 362272;  // each instance's KV pool, tokens
  // A short cooldown, so a session could move again within the run: the
  // hysteresis, not the clock, has to keep it where it went.
  options.migration_cooldown_s = 15;
  auto ear = AffinityPolicy::Create(options);
  if (!ledger.ok() || !ear.ok()) {
    std::fprintf(stderr, "ear_gateway: %s\n",
                 std::string((ledger.ok() ? ear.status() : ledger.status()).message()).c_str());
    return 1;
  }
  LoadLedger& cluster = **ledger;
  AffinityPolicy& policy = **ear;

  std::vector<Session> sessions(12);
  for (size_t i = 0; i < sessions.size(); ++i) {
    sessions[i].id = i + 1;
    sessions[i].hasher = *SessionHasher::Create(sessions[i].id, kBlockTokens);
  }
  std::vector<LoadLedger::Ticket> other_tenants;
  uint64_t request_id = 0, moves = 0, moved_off_busy = 0, misbooked = 0;
  for (int round = 0; round < 8; ++round) {
    now = 10.0 * round;
    if (round == 3) {
      // Long prompts from elsewhere queue on instance 0 for three rounds.
      Placement busy;
      busy.instance = 0;
      for (int i = 0; i < 4; ++i) other_tenants.push_back(*cluster.Start(busy, 50000));
    }
    if (round == 6) other_tenants.clear();  // their prefills finished
    for (Session& s : sessions) {
      const std::vector<TokenId> fresh = NewTokens(s);
      const Request turn = s.hasher->BeginTurn(fresh);
      PolicyRequest request;
      request.id = request_id++;
      request.request = turn;
      request.input_tokens = s.hasher->total_tokens();
      request.input_hashes = s.hasher->hashes();
      absl::StatusOr<Placement> where = policy.Place(request, cluster);
      if (!where.ok()) {
        std::fprintf(stderr, "ear_gateway: %s\n", std::string(where.status().message()).c_str());
        return 1;
      }
      if (where->migrate_from != kNoWorker) {
        // The gateway's KV mover copies the session's blocks here.
        ++moves;
        if (where->migrate_from == 0 && round >= 3 && round < 6) ++moved_off_busy;
        if (!quiet) {
          std::printf("round %d: session %llu moves %u -> %u with its KV\n", round,
                      static_cast<unsigned long long>(s.id), where->migrate_from,
                      where->instance);
        }
      }
      // Book the prefill this turn really does: what the serving instance
      // (or the move) does not already hold. Later turns only append.
      const uint64_t prefill = request.input_tokens - where->estimated_hit_tokens;
      if (s.turns > 0 && (prefill + kBlockTokens < fresh.size() ||
                          prefill > fresh.size() + kBlockTokens)) {
        ++misbooked;
      }
      absl::StatusOr<LoadLedger::Ticket> ticket = cluster.Start(*where, prefill);
      if (!ticket.ok()) return 1;
      // ... the request is sent; its first token and its end come back ...
      ticket->FirstToken();
      const std::vector<TokenId> output(200, static_cast<TokenId>(7));
      s.hasher->AppendContext(output);
      request.context_hashes = s.hasher->hashes();
      ticket->Finish();
      policy.OnFinished(request, *where, cluster);
      s.homes.push_back(where->instance);
      ++s.turns;
    }
  }

  // The agents are done: the gateway closes their sessions.
  for (const Session& s : sessions) policy.OnSessionClosed(s.id);

  int failures = 0;
  uint32_t moved_twice = 0;
  for (const Session& s : sessions) {
    uint32_t changes = 0;
    for (size_t t = 1; t < s.homes.size(); ++t) changes += s.homes[t] != s.homes[t - 1];
    moved_twice += changes > 1;
  }
  for (WorkerId d = 0; d < kInstances; ++d) {
    const InstanceLoad load = cluster.instance_load(d);
    if (load.running_requests != 0 || load.pending_prefill_tokens != 0) ++failures;
    if (policy.committed_tokens(d) != 0) ++failures;  // closed sessions hold nothing
  }
  std::printf("ear_gateway: %llu turns, %llu KV moves (%llu off the busy instance), %u sessions "
              "moved twice, %llu later turns booked other than their new tokens as prefill, loads %s\n",
              static_cast<unsigned long long>(request_id), static_cast<unsigned long long>(moves),
              static_cast<unsigned long long>(moved_off_busy), moved_twice,
              static_cast<unsigned long long>(misbooked),
              failures == 0 ? "and live contexts back to zero" : "LEFT OVER");
  if (moved_off_busy == 0 || moved_twice != 0 || misbooked != 0) ++failures;
  failures += LoadControl(quiet);
  return failures == 0 ? 0 : 1;
}
