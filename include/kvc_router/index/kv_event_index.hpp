// kvc_router/index/kv_event_index.hpp
//
// Exact residency fed by the decode workers' own KV-cache events, in the
// shape vLLM and SGLang publish them: per-worker batches carrying a sequence
// number and a list of events, each one of
//   BlockStored      {block_hashes, parent_block_hash?, token_ids, block_size}
//   BlockRemoved     {block_hashes}
//   AllBlocksCleared {}
// (vLLM: vllm/distributed/kv_events.py; SGLang mirrors it). The gateway
// decodes the wire format (msgpack over ZMQ), maps each (engine, data-parallel
// rank) to a WorkerId and converts hashes to 64-bit values, then calls
// `Apply`.
//
// Reliability: a batch is validated whole before anything changes; a batch
// for an unknown worker, an event without blocks, or a replayed/out-of-order
// sequence number is refused with an error and changes nothing. A jump in the
// sequence (batches lost on the PUB/SUB socket) is applied but reported in the
// returned `ApplyReport` and counted per worker, so the gateway can ask the
// worker's replay socket for the missing range. Stored blocks whose parent the
// index has not seen are kept and counted as orphans.
//
// Overlap uses the same one-pass bisection as FastIndex: exact while a
// worker's residency is prefix-closed, which radix-tree caches that evict
// leaves first maintain. It satisfies CacheIndex: `Learn` records a placement
// optimistically (the worker is about to store those blocks; its events
// correct the picture) unless disabled, and `ForgetSession` does nothing
// because removals arrive as events.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/index/detail/block_table.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {

struct BlockStoredEvent {
  std::vector<BlockHash> block_hashes;
  // Hash of the block before the first stored one; none for a root block.
  std::optional<BlockHash> parent_block_hash;
  // Tokens of all stored blocks, concatenated (may be empty: not needed here).
  std::vector<TokenId> token_ids;
  uint32_t block_size = 0;
};

struct BlockRemovedEvent {
  std::vector<BlockHash> block_hashes;
};

struct AllBlocksClearedEvent {};

using KvEvent = std::variant<BlockStoredEvent, BlockRemovedEvent, AllBlocksClearedEvent>;

struct KvEventBatch {
  WorkerId worker = 0;
  // Per-worker publisher sequence number; the first batch a publisher sends is 0.
  uint64_t sequence = 0;
  double timestamp = 0.0;
  std::vector<KvEvent> events;
};

class KvEventIndex {
 public:
  struct ApplyReport {
    size_t events = 0;
    // Batches lost before this one (sequence jumps); 0 when in order.
    uint64_t missed_batches = 0;
    // Stored blocks whose parent this worker was not known to hold.
    size_t orphan_blocks = 0;
  };

  struct Options {
    // Record placements (Learn) as residency until events say otherwise.
    bool learn_placements = true;
  };

  // Checks `num_workers` (1..kMaxWorkers, what the block table encodes).
  static absl::StatusOr<KvEventIndex> Create(uint32_t num_workers) {
    return Create(num_workers, Options());
  }
  static absl::StatusOr<KvEventIndex> Create(uint32_t num_workers, Options options) {
    absl::Status status = index_detail::BlockTable::CheckNumWorkers(num_workers, "KvEventIndex");
    if (!status.ok()) return status;
    return KvEventIndex(num_workers, options);
  }

  // Unchecked: prefer `Create`. With more than kMaxWorkers workers the index
  // refuses batches for workers past kMaxWorkers - 1 and ignores their
  // placements (RoutingState::Create never accepts such a |D| anyway).
  explicit KvEventIndex(uint32_t num_workers) : KvEventIndex(num_workers, Options()) {}
  KvEventIndex(uint32_t num_workers, Options options)
      : table_(num_workers), workers_(num_workers), options_(options) {}

  size_t num_workers() const { return workers_.size(); }

  absl::StatusOr<ApplyReport> Apply(const KvEventBatch& batch) {
    if (absl::Status status = Validate(batch); !status.ok()) return status;
    Worker& w = workers_[batch.worker];
    ApplyReport report;
    report.events = batch.events.size();
    const uint64_t expected = w.seen_any ? w.last_sequence + 1 : 0;
    report.missed_batches = batch.sequence - expected;
    w.missed_batches += report.missed_batches;
    w.gaps += report.missed_batches > 0 ? 1 : 0;
    w.last_sequence = batch.sequence;
    w.seen_any = true;
    for (const KvEvent& event : batch.events) {
      if (const auto* stored = std::get_if<BlockStoredEvent>(&event)) {
        if (stored->parent_block_hash.has_value() &&
            !table_.Contains(*stored->parent_block_hash, batch.worker)) {
          report.orphan_blocks += stored->block_hashes.size();
        }
        for (BlockHash hash : stored->block_hashes) {
          if (table_.Insert(hash, batch.worker)) ++entries_;
        }
      } else if (const auto* removed = std::get_if<BlockRemovedEvent>(&event)) {
        for (BlockHash hash : removed->block_hashes) {
          if (table_.Erase(hash, batch.worker)) --entries_;
        }
      } else {
        ClearWorker(batch.worker);
      }
    }
    w.orphan_blocks += report.orphan_blocks;
    return report;
  }

  void Overlap(std::span<const BlockHash> prefix, std::span<uint32_t> out) const {
    table_.MatchedRuns(prefix, out);
  }

  void Learn(WorkerId worker, SessionId, std::span<const BlockHash> hashes) {
    if (!options_.learn_placements || !table_.Covers(worker)) return;
    for (BlockHash hash : hashes) {
      if (table_.Insert(hash, worker)) ++entries_;
    }
  }

  void ForgetSession(WorkerId, SessionId) {}

  // Elastic membership (ElasticCacheIndex): grow to `num_workers` workers
  // (at most kMaxWorkers); forget everything `worker` holds, including its
  // event sequence (a worker joining in the slot starts at sequence 0).
  void ResizeWorkers(uint32_t num_workers) {
    if (num_workers <= workers_.size()) return;
    table_.Resize(num_workers);
    workers_.resize(num_workers);
  }
  void ForgetWorker(WorkerId worker) {
    if (worker >= workers_.size()) return;
    ClearWorker(worker);
    workers_[worker] = Worker();
  }

  bool Contains(WorkerId worker, BlockHash hash) const {
    return worker < workers_.size() && table_.Contains(hash, worker);
  }
  uint64_t entries() const { return entries_; }
  size_t memory_bytes() const { return table_.memory_bytes(); }
  // Sequence jumps seen from `worker`, and the batches they skipped.
  uint64_t gaps(WorkerId worker) const { return worker < workers_.size() ? workers_[worker].gaps : 0; }
  uint64_t missed_batches(WorkerId worker) const {
    return worker < workers_.size() ? workers_[worker].missed_batches : 0;
  }
  uint64_t orphan_blocks(WorkerId worker) const {
    return worker < workers_.size() ? workers_[worker].orphan_blocks : 0;
  }
  // The sequence number the index expects next from `worker`.
  uint64_t next_sequence(WorkerId worker) const {
    if (worker >= workers_.size() || !workers_[worker].seen_any) return 0;
    return workers_[worker].last_sequence + 1;
  }

 private:
  struct Worker {
    bool seen_any = false;
    uint64_t last_sequence = 0;
    uint64_t gaps = 0;
    uint64_t missed_batches = 0;
    uint64_t orphan_blocks = 0;
  };

  absl::Status Validate(const KvEventBatch& batch) const {
    if (batch.worker >= workers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvEventIndex: event batch for unknown worker ", batch.worker, " (|D|=",
          workers_.size(), ")"));
    }
    if (!table_.Covers(batch.worker)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvEventIndex: event batch for worker ", batch.worker, ", but the index encodes at most ",
          index_detail::BlockTable::kMaxEncodableWorkers,
          " workers (it was built for ", workers_.size(), "; KvEventIndex::Create refuses that)"));
    }
    const Worker& w = workers_[batch.worker];
    if (w.seen_any && batch.sequence <= w.last_sequence) {
      return absl::FailedPreconditionError(absl::StrCat(
          "KvEventIndex: worker ", batch.worker, " batch ", batch.sequence,
          " is a replay or out of order (last applied ", w.last_sequence, ")"));
    }
    for (size_t i = 0; i < batch.events.size(); ++i) {
      const KvEvent& event = batch.events[i];
      if (const auto* stored = std::get_if<BlockStoredEvent>(&event)) {
        if (stored->block_hashes.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "KvEventIndex: worker ", batch.worker, " batch ", batch.sequence, " event ", i,
              ": BlockStored without block hashes"));
        }
        if (!stored->token_ids.empty() &&
            (stored->block_size == 0 ||
             stored->token_ids.size() > stored->block_hashes.size() * uint64_t{stored->block_size} ||
             stored->token_ids.size() <=
                 (stored->block_hashes.size() - 1) * uint64_t{stored->block_size})) {
          return absl::InvalidArgumentError(absl::StrCat(
              "KvEventIndex: worker ", batch.worker, " batch ", batch.sequence, " event ", i,
              ": BlockStored has ", stored->token_ids.size(), " tokens for ",
              stored->block_hashes.size(), " blocks of size ", stored->block_size));
        }
      } else if (const auto* removed = std::get_if<BlockRemovedEvent>(&event)) {
        if (removed->block_hashes.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "KvEventIndex: worker ", batch.worker, " batch ", batch.sequence, " event ", i,
              ": BlockRemoved without block hashes"));
        }
      }
    }
    return absl::OkStatus();
  }

  void ClearWorker(WorkerId worker) { entries_ -= table_.EraseWorker(worker); }

  index_detail::BlockTable table_;
  std::vector<Worker> workers_;
  Options options_;
  uint64_t entries_ = 0;
};

}  // namespace kvc_router
