// Fuzz target: sequences of dispatch-op calls with arbitrary admission
// answers (any byte in the mode and reason enums, any room), interleaved with
// completions, abandoned ops, worker churn (add, drain, remove), residency
// updates for any worker id and a clock that jumps (health breakers, idle
// expiry). Invariants after every call: a refused call changes nothing it
// should not; inflight per worker equals the placed, unfinished ops there;
// every worker an op is told to ask is an active slot; a new placement is on
// an active worker (or a draining one whose answer was already out);
// when everything completes, inflight is 0 everywhere.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "fuzz_input.hpp"
#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/fast_index.hpp"
#include "kvc_router/routing_state.hpp"

namespace {

using kvc_router::AdmitResult;
using kvc_router::BlockHash;
using kvc_router::DispatchOp;
using kvc_router::FastIndex;
using kvc_router::WorkerId;
using kvc_router::WorkerStatus;
using State = kvc_router::RoutingState<FastIndex>;

void CheckInflight(const State& state, const std::vector<DispatchOp<FastIndex>>& ops) {
  std::vector<uint64_t> expected(state.num_decode_workers(), 0);
  for (const auto& op : ops) {
    if (op.placed()) {
      FUZZ_CHECK(op.decision().decode < expected.size());
      ++expected[op.decision().decode];
    }
  }
  uint64_t total = 0;
  for (WorkerId d = 0; d < expected.size(); ++d) {
    FUZZ_CHECK(state.inflight(d) == expected[d]);
    total += expected[d];
  }
  FUZZ_CHECK(state.total_inflight() == total);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvc_fuzz::FuzzInput in(data, size);
  kvc_router::RouterConfig config;
  config.num_decode_workers = 1 + in.U8() % 6;
  config.num_prefill_workers = in.U8() % 3;
  config.block_tokens = 1 + in.U8() % 32;
  config.reject_threshold = 1 + in.U8() % 4;
  config.max_admit_attempts = in.U8() % 5;
  config.reset_on_success = in.U8() % 4 != 0;
  config.place_by_room = in.U8() % 2 == 0;
  config.health.enabled = in.U8() % 4 != 0;
  config.health.failure_threshold = 1 + in.U8() % 3;
  config.max_prefix_blocks = 1 + in.U8() % 40;
  config.max_sessions = 1 + in.U8() % 16;
  auto now = std::make_shared<absl::Time>(absl::UnixEpoch());
  auto created = State::Create(config, FastIndex(config.num_decode_workers, 600, config.block_tokens),
                               [now] { return *now; });
  FUZZ_CHECK(created.ok());
  State& state = **created;
  // Chains the requests draw prefixes from (they share leading blocks).
  std::vector<std::vector<BlockHash>> chains(4);
  for (size_t c = 0; c < chains.size(); ++c) {
    BlockHash h = c < 2 ? 1 : 1000 + c;
    for (int i = 0; i < 48; ++i) chains[c].push_back(h = h * 0x9e3779b97f4a7c15ULL + c + 1);
  }
  std::vector<DispatchOp<FastIndex>> ops;
  while (!in.empty()) {
    const uint8_t action = in.U8() % 16;
    if (action < 4) {
      const auto& chain = chains[in.U8() % chains.size()];
      const size_t prefix = in.U8() % 50;  // may pass max_prefix_blocks or the chain
      const size_t appended = in.U8() % 4;
      kvc_router::Request request;
      request.session = in.U8() % 12;
      request.turn = in.U8() % 4;
      request.prefix_hashes = std::span<const BlockHash>(chain).first(std::min(prefix, chain.size()));
      const size_t room = chain.size() - request.prefix_hashes.size();
      request.appended_hashes = std::span<const BlockHash>(chain).subspan(
          request.prefix_hashes.size(), std::min(appended, room));
      request.append_tokens = in.Tokens();
      const size_t before = state.num_sessions();
      auto op = kvc_router::StartDispatch(state, request);
      if (!op.ok()) {
        FUZZ_CHECK(state.num_sessions() == before);
      } else {
        if (op->awaiting_admit()) {
          FUZZ_CHECK(op->admit_target() < state.num_decode_workers());
          FUZZ_CHECK(state.decode_status(op->admit_target()) == WorkerStatus::kActive);
        } else {
          FUZZ_CHECK(op->placed());
          FUZZ_CHECK(state.decode_status(op->decision().decode) == WorkerStatus::kActive);
        }
        ops.push_back(std::move(*op));
      }
    } else if (action < 9) {  // an answer, well formed or not
      if (ops.empty()) continue;
      auto& op = ops[in.Below(static_cast<uint32_t>(ops.size()))];
      AdmitResult result;
      result.admitted = in.U8() % 2 == 0;
      const uint8_t mode = in.U8();
      const uint8_t reason = in.U8();
      result.mode = static_cast<kvc_router::DecisionMode>(mode % 8 < 6 ? mode % 4 : mode);
      result.reason = static_cast<kvc_router::RejectReason>(reason % 8 < 6 ? reason % 5 : reason);
      result.room_tokens = in.U8() % 2 ? kvc_router::kUnknownRoomTokens : in.Tokens();
      const bool was_awaiting = op.awaiting_admit();
      const WorkerId target = op.admit_target();
      const auto status = op.OnAdmitResult(result);
      if (!was_awaiting) FUZZ_CHECK(!status.ok());
      if (!status.ok()) {
        FUZZ_CHECK(op.awaiting_admit() == was_awaiting);
      } else if (op.awaiting_admit()) {
        FUZZ_CHECK(op.admit_target() < state.num_decode_workers());
        FUZZ_CHECK(state.decode_status(op.admit_target()) == WorkerStatus::kActive);
      } else {
        FUZZ_CHECK(op.placed());
        const WorkerStatus where = state.decode_status(op.decision().decode);
        FUZZ_CHECK(where == WorkerStatus::kActive ||
                   (where == WorkerStatus::kDraining && op.decision().decode == target));
        FUZZ_CHECK(op.decision().mode != kvc_router::DecisionMode::kFallback ||
                   where == WorkerStatus::kActive);
      }
    } else if (action < 11) {  // complete (or complete twice)
      if (ops.empty()) continue;
      const uint32_t k = in.Below(static_cast<uint32_t>(ops.size()));
      const bool done = ops[k].completed();
      const auto status = ops[k].Complete();
      FUZZ_CHECK(status.ok() != done);
      if (in.U8() % 2) ops.erase(ops.begin() + k);  // the destructor must not release again
    } else if (action == 11) {  // abandon: the destructor releases
      if (!ops.empty()) ops.erase(ops.begin() + in.Below(static_cast<uint32_t>(ops.size())));
    } else if (action == 12) {
      const uint8_t what = in.U8() % 5;
      const WorkerId d = in.Below(state.num_decode_workers() + 1);
      if (what == 0) {
        auto added = state.AddDecodeWorker();
        FUZZ_CHECK(added.ok() && state.decode_status(*added) == WorkerStatus::kActive);
      } else if (what == 1) {
        (void)state.DrainDecodeWorker(d);
      } else if (what == 2) {
        if (state.RemoveDecodeWorker(d).ok()) {
          FUZZ_CHECK(state.decode_status(d) == WorkerStatus::kRemoved);
          for (kvc_router::SessionId s = 0; s < 12; ++s) FUZZ_CHECK(state.pin(s) != d);
        }
      } else if (what == 3) {
        (void)state.AddPrefillWorker();
      } else {
        (void)state.RemovePrefillWorker(in.Below(state.num_prefill_workers() + 1));
      }
      FUZZ_CHECK(state.num_active_decode_workers() >= 1);
    } else if (action == 13) {
      const WorkerId d = in.Below(state.num_decode_workers() + 2);
      const auto& chain = chains[in.U8() % chains.size()];
      const auto learned = state.LearnResidency(
          d, in.U8() % 12, std::span<const BlockHash>(chain).first(in.U8() % 49));
      if (d >= state.num_decode_workers()) FUZZ_CHECK(!learned.ok());
      const auto evicted = state.OnSessionEvicted(d, in.U8() % 12);
      FUZZ_CHECK(evicted.ok() == (d < state.num_decode_workers()));
    } else if (action == 14) {
      *now += absl::Milliseconds(in.U16()) * (in.U8() % 2 ? 1 : 1000);
      (void)state.ExpireIdleSessions();
    } else {
      (void)state.ForgetSession(in.U8() % 12);
    }
    CheckInflight(state, ops);
  }
  for (auto& op : ops) (void)op.Complete();
  ops.clear();
  FUZZ_CHECK(state.total_inflight() == 0);
  for (kvc_router::SessionId s = 0; s < 12; ++s) FUZZ_CHECK(state.session_inflight(s) == 0);
  return 0;
}
