// minimal_gateway: the README's embedding example, runnable.
//
// A toy gateway routes 8 agentic sessions over 2 prefill and 4 decode
// workers. The "RPC" is an in-memory transport whose decode workers run the
// library's own AdmissionController, so admission answers are real: turns go
// Direct while a session's KV stays resident, Seed/Reseed when it must move,
// and Fallback when no decode worker has room. It prints every decision and
// the share of each mode.
//
//   minimal_gateway [--sessions N] [--turns N] [--quiet]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvc_router/kvc_router.hpp"

namespace {

using namespace kvc_router;

// The caller's side of "decide, don't send": here, in-process workers.
class InMemoryTransport {
 public:
  InMemoryTransport(uint32_t decode_workers, const AdmissionConfig& config) {
    for (uint32_t d = 0; d < decode_workers; ++d) {
      workers_.push_back(*AdmissionController::Create(config));
    }
  }

  absl::StatusOr<AdmitResult> Admit(WorkerId d, const AdmitQuery& query) {
    // A real worker frees cold sessions before it says no.
    if (workers_[d].free_tokens() < query.input_tokens) {
      for (SessionId evicted : workers_[d].EvictLeastRecentlyUsed(query.input_tokens)) {
        evictions_.push_back({d, evicted});
      }
    }
    return workers_[d].Admit(query);
  }
  absl::Status RunDirect(WorkerId d, const Request& r) { return Finish(d, r); }
  absl::Status Prefill(WorkerId, const Request&) { return absl::OkStatus(); }
  absl::Status TransferKv(WorkerId, WorkerId, const Request&) { return absl::OkStatus(); }
  absl::Status Decode(WorkerId d, const Request& r) { return Finish(d, r); }
  absl::Status RunFallback(WorkerId, WorkerId, const Request&) { return absl::OkStatus(); }

  // Evictions since the last call, for the router's index.
  std::vector<std::pair<WorkerId, SessionId>> TakeEvictions() { return std::move(evictions_); }

 private:
  absl::Status Finish(WorkerId d, const Request& r) { return workers_[d].OnRequestFinished(r.session); }

  std::vector<AdmissionController> workers_;
  std::vector<std::pair<WorkerId, SessionId>> evictions_;
};

}  // namespace

int main(int argc, char** argv) {
  int sessions = 8;
  int turns = 12;
  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sessions") && i + 1 < argc) {
      sessions = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--turns") && i + 1 < argc) {
      turns = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quiet")) {
      quiet = true;
    } else {
      std::fprintf(stderr, "usage: %s [--sessions N] [--turns N] [--quiet]\n", argv[0]);
      return 2;
    }
  }
  if (sessions <= 0 || turns <= 0) {
    std::fprintf(stderr, "--sessions and --turns must be positive\n");
    return 2;
  }

  RouterConfig config;
  config.num_decode_workers = 4;
  config.num_prefill_workers = 2;
  AdmissionConfig worker;
  worker.capacity_tokens = 60'000;

  auto state = RoutingState<EstimateIndex>::Create(
      config, EstimateIndex(config.num_decode_workers, worker.capacity_tokens, config.block_tokens));
  if (!state.ok()) {
    std::fprintf(stderr, "bad configuration: %s\n", std::string(state.status().message()).c_str());
    return 1;
  }
  InMemoryTransport transport(config.num_decode_workers, worker);

  // Each session is an agent: a long first prompt, then tool results.
  std::vector<SessionHasher> hashers;
  for (int s = 0; s < sessions; ++s) hashers.emplace_back(SessionId(100 + s), config.block_tokens);
  uint64_t lcg = 12345;
  auto next = [&lcg] { return (lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };

  int counts[kNumDecisionModes] = {};
  int total = 0;
  for (int t = 0; t < turns; ++t) {
    for (int s = 0; s < sessions; ++s) {
      std::vector<TokenId> tokens(t == 0 ? 4000 + next() % 8000 : 200 + next() % 1500);
      for (TokenId& token : tokens) token = static_cast<TokenId>(next() % 50000);
      const Request request = hashers[s].BeginTurn(tokens);

      absl::StatusOr<Decision> decision = Dispatch(**state, request, transport);
      if (!decision.ok()) {
        std::fprintf(stderr, "dispatch failed: %s\n", std::string(decision.status().message()).c_str());
        return 1;
      }
      for (auto [d, evicted] : transport.TakeEvictions()) (void)(*state)->OnSessionEvicted(d, evicted);
      ++counts[static_cast<int>(decision->mode)];
      ++total;
      if (!quiet) {
        std::printf("session %3llu turn %2u  %-8s prefill=%-2s decode=d%u  input=%llu tokens\n",
                    static_cast<unsigned long long>(request.session), request.turn,
                    std::string(DecisionModeName(decision->mode)).c_str(),
                    decision->prefill == kNoWorker ? "-" : std::to_string(decision->prefill).c_str(),
                    decision->decode,
                    static_cast<unsigned long long>(request.input_tokens(config.block_tokens)));
      }
      // The model answers; its output is part of the next turn's context.
      std::vector<TokenId> output(100 + next() % 400);
      for (TokenId& token : output) token = static_cast<TokenId>(next() % 50000);
      hashers[s].AppendContext(output);
    }
  }
  std::printf("\n%d requests over %u decode workers\n", total, config.num_decode_workers);
  for (int m = 0; m < kNumDecisionModes; ++m) {
    std::printf("  %-8s %5.1f%%\n", std::string(DecisionModeName(static_cast<DecisionMode>(m))).c_str(),
                100.0 * counts[m] / total);
  }
  return 0;
}
