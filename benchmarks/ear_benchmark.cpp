// BM_EarPlace / BM_EarHoldNewSession: the recommended policy's per-request
// decisions on eight colocated instances (K_d 362,272 tokens, 24-token
// blocks) holding `sessions` live sessions of `blocks`-block contexts. Place
// is a later turn of a bound session (the common case: the cache estimate's
// overlap for every instance, by bisection, the migration step, the
// bookkeeping) and its OnFinished; BM_Route (route_benchmark.cpp, same
// executable) is the in-run baseline, the KVC core's decision.
// HoldNewSession is the load-control question a gateway asks before a
// session's first turn, here with memory full (it answers true).
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "bench_support.hpp"
#include "kvc_router/policy/affinity_policies.hpp"
#include "kvc_router/testing/fake_cluster.hpp"

namespace kvc_router::bench {
namespace {

constexpr uint32_t kInstances = 8;
constexpr uint32_t kBlockTokens = 24;
constexpr uint64_t kPool = 362272;

struct EarSetup {
  std::unique_ptr<policy::AffinityPolicy> policy;
  testing::FakeCluster cluster{policy::Topology::kColocated, 0, kInstances, kPool};
  std::vector<std::vector<BlockHash>> chains;
  std::vector<policy::PolicyRequest> requests;
};

policy::PolicyRequest RequestFor(SessionId session, uint32_t turn,
                                 const std::vector<BlockHash>& chain) {
  policy::PolicyRequest r;
  r.id = session;
  r.request.session = session;
  r.request.turn = turn;
  r.request.prefix_hashes = std::span<const BlockHash>(chain).first(chain.size() - 1);
  r.request.appended_hashes = std::span<const BlockHash>(chain).last(1);
  r.request.append_tokens = kBlockTokens;
  r.input_tokens = chain.size() * kBlockTokens;
  r.input_hashes = chain;
  r.context_hashes = chain;
  return r;
}

// Places every session's first and second turns, so each is bound and its
// context counted.
EarSetup BuildEar(policy::AffinityRule rule, uint32_t sessions, size_t blocks) {
  EarSetup s;
  policy::AffinityPolicyOptions options;
  options.rule = rule;
  options.instances = kInstances;
  options.block_tokens = kBlockTokens;
  options.kv_capacity_tokens = kPool;
  s.policy = *policy::AffinityPolicy::Create(options);
  s.chains.reserve(sessions);
  for (uint32_t i = 0; i < sessions; ++i) s.chains.push_back(MakeChain(blocks, 1000 + i));
  for (uint32_t turn = 0; turn < 2; ++turn) {
    for (uint32_t i = 0; i < sessions; ++i) {
      const policy::PolicyRequest r = RequestFor(i + 1, turn, s.chains[i]);
      const absl::StatusOr<policy::Placement> p = s.policy->Place(r, s.cluster);
      if (p.ok()) s.policy->OnFinished(r, *p, s.cluster);
      s.cluster.now += 0.01;
    }
  }
  for (uint32_t i = 0; i < sessions; ++i) s.requests.push_back(RequestFor(i + 1, 2, s.chains[i]));
  return s;
}

// Contexts that fit the estimate's K_d per instance (15,094 blocks), and
// one population that does not (32 x 4,096 blocks, four per instance):
// there every placement evicts a whole session from the estimate and
// re-learns one, O(blocks) hash-map updates.
void PlaceArgs(benchmark::internal::Benchmark* b) {
  b->Args({32, 256})->Args({32, 1024})->Args({256, 256})->Args({8, 4096})->Args({32, 4096});
}

// Later turns, sessions in turn; each is finished before the next, as a
// gateway's serialised policy calls would be.
void BM_EarPlace(benchmark::State& state) {
  const auto sessions = static_cast<uint32_t>(state.range(0));
  EarSetup s = BuildEar(policy::AffinityRule::kEar, sessions, static_cast<size_t>(state.range(1)));
  size_t next = 0;
  bool ok = true;
  for (auto _ : state) {
    const policy::PolicyRequest& r = s.requests[next];
    absl::StatusOr<policy::Placement> p = s.policy->Place(r, s.cluster);
    ok = ok && p.ok();
    if (p.ok()) s.policy->OnFinished(r, *p, s.cluster);
    benchmark::DoNotOptimize(p);
    next = next + 1 == s.requests.size() ? 0 : next + 1;
  }
  if (!ok) state.SkipWithError("Place failed");
}
BENCHMARK(BM_EarPlace)->Apply(PlaceArgs);

void BM_EarHoldNewSession(benchmark::State& state) {
  // 256 sessions of ~98k tokens: far more than 0.8 of 8 x 362k.
  EarSetup s = BuildEar(policy::AffinityRule::kEar, 256, 4096);
  const std::vector<BlockHash> chain = MakeChain(512, 7);
  const policy::PolicyRequest first = RequestFor(100000, 0, chain);
  bool held = true;
  for (auto _ : state) {
    const bool hold = s.policy->HoldNewSession(first, s.cluster, s.cluster.now);
    held = held && hold;
    benchmark::DoNotOptimize(hold);
  }
  if (!held) state.SkipWithError("the new session was not held");
}
BENCHMARK(BM_EarHoldNewSession);

}  // namespace
}  // namespace kvc_router::bench
