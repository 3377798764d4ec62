// kvc_router/index/kv_event_index.hpp
//
// Exact residency fed by the decode workers' own KV-cache events, in the
// shape vLLM and SGLang publish them: per-worker batches carrying a sequence
// number and a list of events, each one of
//   BlockStored      {block_hashes, parent_block_hash?, token_ids, block_size,
//                     lora_id?, medium?, lora_name?}
//   BlockRemoved     {block_hashes, medium?}
//   AllBlocksCleared {}
// The wire format (msgpack over ZMQ) is decoded by the engine adapter
// (engine/, target kvc_router::engine), which maps each (engine endpoint,
// data-parallel rank) to a WorkerId, folds the engines' hashes to 64 bits and
// calls `Apply`. This header needs neither ZMQ nor msgpack.
//
// Hash spaces. Engines name blocks with their own hashes (vLLM: sha256 or
// xxhash over its own encoding, with a per-process random root unless
// PYTHONHASHSEED is set; SGLang: an int64 cut from a SHA-256 digest), which
// never equal the router's chained XXH3 (block_hash.hpp). So by default
// (`EventHashing::kRehashTokens`) the index re-hashes every stored block from
// its `token_ids` with the router's chain, at the engine's block size, and
// keeps per worker a map engine hash -> router hash, used for removals and to
// find the router hash of a stored event's parent. The engine's block size
// must equal `Options::block_tokens` (the router's RouterConfig.block_tokens):
// a batch whose BlockStored carries another `block_size` is refused with an
// error saying so. The chain of a root block (no parent) starts at
// ChainRootFor(lora_name) for an adapter (or "lora-id:<n>" when an older
// engine sends only lora_id) and at `Options::base_root` otherwise, so
// adapters never share blocks with each other or with the base model. A
// stored block whose parent the worker was not known to hold cannot be
// re-hashed (its chain is unknown): it is skipped and counted as an orphan.
// `EventHashing::kEngineHashes` takes the engines' hashes as router hashes
// as they are, for engines patched to hash with kvc_router's chain (the
// simulator and tests).
//
// Media. Only blocks in GPU memory count as residency: events whose `medium`
// is given and is not "GPU" (any case) are skipped and counted per worker
// (`non_gpu_blocks`), since a block offloaded to CPU or disk must be loaded
// back before it saves a prefill.
//
// Sequence numbers and gaps. The first batch a publisher sends is 0. A batch
// that arrives after a gap (batches lost on the PUB/SUB socket, or a
// subscriber that joined late) is validated and held back, not applied; the
// report names the missing range so the caller can ask the worker's replay
// socket for it. When the missing batches arrive, they and the held ones are
// applied in sequence order. When the replay cannot be had (the publisher's
// buffer no longer holds them) the caller calls `AbandonGap`: the worker's
// residency is cleared (it is unknown now), the report says so, and the held
// batches are applied. More than `Options::max_held_batches` held batches
// abandon the gap the same way. A batch at or below the last applied
// sequence number is refused as a replay.
//
// Reliability: a batch is validated whole before anything changes; a batch
// for an unknown worker, an event without blocks, a wrong block size or
// token count is refused with an error and changes nothing.
//
// Overlap uses the same one-pass bisection as FastIndex: exact while a
// worker's residency is prefix-closed, which radix-tree caches that evict
// leaves first maintain. It satisfies CacheIndex: `Learn` records a placement
// optimistically (the worker is about to store those blocks; its removal
// events correct the picture) unless disabled, and `ForgetSession` does
// nothing because removals arrive as events.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/block_hash.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/index/detail/block_table.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router {

struct BlockStoredEvent {
  // The engine's hashes of the stored blocks, folded to 64 bits.
  std::vector<BlockHash> block_hashes;
  // Engine hash of the block before the first stored one; none for a root block.
  std::optional<BlockHash> parent_block_hash;
  // Tokens of all stored blocks, concatenated (block_size per block).
  std::vector<TokenId> token_ids;
  uint32_t block_size = 0;
  // The LoRA adapter the KV was computed with ("" = base model); older
  // engines send only `lora_id`.
  std::string lora_name;
  std::optional<int64_t> lora_id;
  // Where the blocks live: "" (not sent) or "GPU" count as residency.
  std::string medium;
};

struct BlockRemovedEvent {
  std::vector<BlockHash> block_hashes;
  std::string medium;
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

// How KvEventIndex turns the engines' block hashes into router hashes.
enum class EventHashing : uint8_t {
  // Re-hash each stored block from its token_ids with the router's chain.
  kRehashTokens,
  // The engines already hash with kvc_router's chain: use their hashes.
  kEngineHashes,
};

// True for the media that count as residency: not given, or "GPU".
inline bool IsGpuMedium(std::string_view medium) {
  return medium.empty() || absl::EqualsIgnoreCase(absl::string_view(medium.data(), medium.size()),
                                                  "gpu");
}

class KvEventIndex {
 public:
  struct ApplyReport {
    // Events and batches applied by this call (a batch that fills a gap
    // also applies the held batches after it).
    size_t events = 0;
    uint64_t applied_batches = 0;
    // The batch was held back behind a gap (nothing applied yet).
    bool held_back = false;
    // The gap still open after this call: batches [gap_from, gap_from +
    // gap_batches) are missing; ask the replay socket from gap_from.
    uint64_t gap_from = 0;
    uint64_t gap_batches = 0;
    // Batches skipped by a sequence jump this batch revealed.
    uint64_t missed_batches = 0;
    // Stored blocks skipped because their parent was unknown on this worker.
    size_t orphan_blocks = 0;
    // Blocks of events for other media than GPU, skipped.
    size_t non_gpu_blocks = 0;
    // A gap was abandoned: the worker's residency was cleared first.
    bool residency_cleared = false;
  };

  struct Options {
    // Record placements (Learn) as residency until events say otherwise.
    bool learn_placements = true;
    EventHashing hashing = EventHashing::kRehashTokens;
    // The router's block size, which the engines' block_size must equal
    // (kRehashTokens). Use RouterConfig.block_tokens.
    uint32_t block_tokens = 24;
    // Chain root of blocks stored without an adapter: ChainRootFor(model)
    // when the gateway salts by model name, else kChainRootHash.
    BlockHash base_root = kChainRootHash;
    // Batches held back behind one gap before it is abandoned.
    uint32_t max_held_batches = 4096;
  };

  // Checks `num_workers` (1..kMaxWorkers, what the block table encodes) and,
  // for kRehashTokens, block_tokens (1..kMaxBlockTokens).
  static absl::StatusOr<KvEventIndex> Create(uint32_t num_workers) {
    return Create(num_workers, Options());
  }
  static absl::StatusOr<KvEventIndex> Create(uint32_t num_workers, Options options) {
    absl::Status status = index_detail::BlockTable::CheckNumWorkers(num_workers, "KvEventIndex");
    if (!status.ok()) return status;
    if (options.hashing == EventHashing::kRehashTokens &&
        (options.block_tokens == 0 || options.block_tokens > kMaxBlockTokens)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvEventIndex: Options.block_tokens must be in 1..", kMaxBlockTokens,
          " (the engines' block size), got ", options.block_tokens));
    }
    if (options.max_held_batches == 0) {
      return absl::InvalidArgumentError("KvEventIndex: Options.max_held_batches must be >= 1");
    }
    return KvEventIndex(num_workers, options);
  }

  // Unchecked: prefer `Create`. With more than kMaxWorkers workers the index
  // refuses batches for workers past kMaxWorkers - 1 and ignores their
  // placements (RoutingState::Create never accepts such a |D| anyway).
  explicit KvEventIndex(uint32_t num_workers) : KvEventIndex(num_workers, Options()) {}
  KvEventIndex(uint32_t num_workers, Options options)
      : table_(num_workers), workers_(num_workers), options_(options) {
    if (options_.block_tokens == 0) options_.block_tokens = 1;
    if (options_.max_held_batches == 0) options_.max_held_batches = 1;
  }

  size_t num_workers() const { return workers_.size(); }
  const Options& options() const { return options_; }

  // Applies `batch`, or holds it back behind a gap (see the file comment).
  // Errors, and changes nothing, on a batch that is malformed, for an unknown
  // worker, or at or below the last applied (or an already held) sequence.
  absl::StatusOr<ApplyReport> Apply(const KvEventBatch& batch) {
    if (absl::Status status = Validate(batch); !status.ok()) return status;
    Worker& w = workers_[batch.worker];
    const WorkerId worker = batch.worker;
    ApplyReport report;
    if (batch.sequence == w.next_sequence) {
      ApplyBatch(batch, report);
      Drain(worker, report);
    } else {
      const uint64_t first_missing =
          w.held.empty() ? w.next_sequence : std::prev(w.held.end())->first + 1;
      if (batch.sequence > first_missing) {
        report.missed_batches = batch.sequence - first_missing;
        w.missed_batches += report.missed_batches;
        ++w.gaps;
      }
      w.held.emplace(batch.sequence, batch);
      report.held_back = true;
      if (w.held.size() > options_.max_held_batches) AbandonGapOf(worker, report);
    }
    FillGap(worker, report);
    return report;
  }

  // The replay of `worker`'s missing batches cannot be had: clears the
  // worker's residency and applies the held batches from the first one held.
  // Errors when the worker is unknown or has no open gap.
  absl::StatusOr<ApplyReport> AbandonGap(WorkerId worker) {
    if (worker >= workers_.size() || !table_.Covers(worker)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvEventIndex::AbandonGap: unknown worker ", worker));
    }
    if (workers_[worker].held.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "KvEventIndex::AbandonGap: worker ", worker, " has no open gap"));
    }
    ApplyReport report;
    AbandonGapOf(worker, report);
    FillGap(worker, report);
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
  // event sequence, held batches and engine-hash map (a worker joining in
  // the slot starts at sequence 0).
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

  // Whether `worker` holds the block with router hash `hash`.
  bool Contains(WorkerId worker, BlockHash hash) const {
    return worker < workers_.size() && table_.Contains(hash, worker);
  }
  // The router hash `worker`'s engine hash maps to (kRehashTokens), if known.
  std::optional<BlockHash> RouterHashOf(WorkerId worker, BlockHash engine_hash) const {
    if (worker >= workers_.size()) return std::nullopt;
    const auto& map = workers_[worker].engine_to_router;
    auto it = map.find(engine_hash);
    if (it == map.end()) return std::nullopt;
    return it->second;
  }
  uint64_t entries() const { return entries_; }
  // Distinct blocks `worker` holds according to its events (kRehashTokens;
  // placements recorded by Learn are not counted).
  size_t event_blocks(WorkerId worker) const {
    return worker < workers_.size() ? workers_[worker].router_refs.size() : 0;
  }
  size_t memory_bytes() const {
    size_t bytes = table_.memory_bytes();
    for (const Worker& w : workers_) {
      bytes += w.engine_to_router.capacity() * (2 * sizeof(BlockHash) + 1) +
               w.router_refs.capacity() * (sizeof(BlockHash) + sizeof(uint32_t) + 1);
    }
    return bytes;
  }
  // Sequence jumps seen from `worker`, and the batches they skipped (whether
  // replayed later or not).
  uint64_t gaps(WorkerId worker) const { return Stat(worker, &Worker::gaps); }
  uint64_t missed_batches(WorkerId worker) const { return Stat(worker, &Worker::missed_batches); }
  uint64_t orphan_blocks(WorkerId worker) const { return Stat(worker, &Worker::orphan_blocks); }
  uint64_t non_gpu_blocks(WorkerId worker) const { return Stat(worker, &Worker::non_gpu_blocks); }
  // Removals of engine hashes the index did not know on that worker.
  uint64_t unknown_removals(WorkerId worker) const {
    return Stat(worker, &Worker::unknown_removals);
  }
  // Gaps abandoned (residency cleared) for `worker`.
  uint64_t abandoned_gaps(WorkerId worker) const { return Stat(worker, &Worker::abandoned_gaps); }
  // Batches held back behind a gap right now.
  size_t held_batches(WorkerId worker) const {
    return worker < workers_.size() ? workers_[worker].held.size() : 0;
  }
  // The sequence number the index applies next from `worker` (the first
  // missing one while a gap is open).
  uint64_t next_sequence(WorkerId worker) const {
    return worker < workers_.size() ? workers_[worker].next_sequence : 0;
  }

 private:
  struct Worker {
    uint64_t next_sequence = 0;
    uint64_t gaps = 0;
    uint64_t missed_batches = 0;
    uint64_t orphan_blocks = 0;
    uint64_t non_gpu_blocks = 0;
    uint64_t unknown_removals = 0;
    uint64_t abandoned_gaps = 0;
    // Held back behind a gap, by sequence number.
    std::map<uint64_t, KvEventBatch> held;
    // kRehashTokens: engine hash -> router hash of the blocks held, and how
    // many engine hashes name each router hash (engines that hash extra keys
    // may name one token chain twice).
    absl::flat_hash_map<BlockHash, BlockHash> engine_to_router;
    absl::flat_hash_map<BlockHash, uint32_t> router_refs;
  };

  uint64_t Stat(WorkerId worker, uint64_t Worker::*field) const {
    return worker < workers_.size() ? workers_[worker].*field : 0;
  }

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
    if (batch.sequence < w.next_sequence) {
      return absl::FailedPreconditionError(absl::StrCat(
          "KvEventIndex: worker ", batch.worker, " batch ", batch.sequence,
          " is a replay or out of order (next expected ", w.next_sequence, ")"));
    }
    if (w.held.contains(batch.sequence)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "KvEventIndex: worker ", batch.worker, " batch ", batch.sequence,
          " is a replay or out of order (already held back behind a gap)"));
    }
    const bool rehash = options_.hashing == EventHashing::kRehashTokens;
    for (size_t i = 0; i < batch.events.size(); ++i) {
      const KvEvent& event = batch.events[i];
      auto where = [&] {
        return absl::StrCat("KvEventIndex: worker ", batch.worker, " batch ", batch.sequence,
                            " event ", i, ": ");
      };
      if (const auto* stored = std::get_if<BlockStoredEvent>(&event)) {
        if (stored->block_hashes.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(), "BlockStored without block hashes"));
        }
        const bool gpu = IsGpuMedium(stored->medium);
        if (rehash && gpu && stored->token_ids.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where(), "BlockStored without token_ids; the index re-hashes blocks from their "
                       "tokens (EventHashing::kRehashTokens)"));
        }
        if (rehash && gpu && stored->block_size != options_.block_tokens) {
          return absl::InvalidArgumentError(absl::StrCat(
              where(), "BlockStored has block_size ", stored->block_size,
              " but the index hashes blocks of ", options_.block_tokens,
              " tokens; set RouterConfig.block_tokens (and KvEventIndex Options.block_tokens) "
              "to the engine's block size"));
        }
        if (!stored->token_ids.empty() &&
            (stored->block_size == 0 ||
             stored->token_ids.size() > stored->block_hashes.size() * uint64_t{stored->block_size} ||
             stored->token_ids.size() <=
                 (stored->block_hashes.size() - 1) * uint64_t{stored->block_size})) {
          return absl::InvalidArgumentError(absl::StrCat(
              where(), "BlockStored has ", stored->token_ids.size(), " tokens for ",
              stored->block_hashes.size(), " blocks of size ", stored->block_size));
        }
      } else if (const auto* removed = std::get_if<BlockRemovedEvent>(&event)) {
        if (removed->block_hashes.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(), "BlockRemoved without block hashes"));
        }
      }
    }
    return absl::OkStatus();
  }

  void ApplyBatch(const KvEventBatch& batch, ApplyReport& report) {
    Worker& w = workers_[batch.worker];
    const size_t orphans_before = report.orphan_blocks;
    const size_t non_gpu_before = report.non_gpu_blocks;
    for (const KvEvent& event : batch.events) {
      if (const auto* stored = std::get_if<BlockStoredEvent>(&event)) {
        Store(batch.worker, *stored, report);
      } else if (const auto* removed = std::get_if<BlockRemovedEvent>(&event)) {
        Remove(batch.worker, *removed, report);
      } else {
        ClearWorker(batch.worker);
      }
    }
    w.orphan_blocks += report.orphan_blocks - orphans_before;
    w.non_gpu_blocks += report.non_gpu_blocks - non_gpu_before;
    report.events += batch.events.size();
    ++report.applied_batches;
    w.next_sequence = batch.sequence + 1;
  }

  void Store(WorkerId worker, const BlockStoredEvent& stored, ApplyReport& report) {
    if (!IsGpuMedium(stored.medium)) {
      report.non_gpu_blocks += stored.block_hashes.size();
      return;
    }
    if (options_.hashing == EventHashing::kEngineHashes) {
      if (stored.parent_block_hash.has_value() &&
          !table_.Contains(*stored.parent_block_hash, worker)) {
        report.orphan_blocks += stored.block_hashes.size();
      }
      for (BlockHash hash : stored.block_hashes) {
        if (table_.Insert(hash, worker)) ++entries_;
      }
      return;
    }
    Worker& w = workers_[worker];
    BlockHash parent = RootOf(stored);
    if (stored.parent_block_hash.has_value()) {
      auto it = w.engine_to_router.find(*stored.parent_block_hash);
      if (it == w.engine_to_router.end()) {
        // Its chain is unknown: the blocks cannot be named in router hashes.
        report.orphan_blocks += stored.block_hashes.size();
        return;
      }
      parent = it->second;
    }
    const std::span<const TokenId> tokens(stored.token_ids);
    const size_t block = stored.block_size;
    for (size_t i = 0; i < stored.block_hashes.size(); ++i) {
      // A trailing partial block has no router hash (the router hashes full
      // blocks only); engines publish full blocks, so this is rare.
      if ((i + 1) * block > tokens.size()) break;
      parent = HashBlock(parent, tokens.subspan(i * block, block));
      MapBlock(worker, stored.block_hashes[i], parent);
    }
  }

  BlockHash RootOf(const BlockStoredEvent& stored) const {
    if (!stored.lora_name.empty()) return ChainRootFor(stored.lora_name);
    if (stored.lora_id.has_value() && *stored.lora_id != 0) {
      return ChainRootFor(absl::StrCat("lora-id:", *stored.lora_id));
    }
    return options_.base_root;
  }

  void MapBlock(WorkerId worker, BlockHash engine, BlockHash router) {
    Worker& w = workers_[worker];
    auto [it, inserted] = w.engine_to_router.try_emplace(engine, router);
    if (!inserted) {
      if (it->second == router) return;
      Unref(worker, it->second);
      it->second = router;
    }
    if (++w.router_refs[router] == 1 && table_.Insert(router, worker)) ++entries_;
  }

  void Unref(WorkerId worker, BlockHash router) {
    Worker& w = workers_[worker];
    auto it = w.router_refs.find(router);
    if (it == w.router_refs.end()) return;
    if (--it->second == 0) {
      w.router_refs.erase(it);
      if (table_.Erase(router, worker)) --entries_;
    }
  }

  void Remove(WorkerId worker, const BlockRemovedEvent& removed, ApplyReport& report) {
    if (!IsGpuMedium(removed.medium)) {
      report.non_gpu_blocks += removed.block_hashes.size();
      return;
    }
    if (options_.hashing == EventHashing::kEngineHashes) {
      for (BlockHash hash : removed.block_hashes) {
        if (table_.Erase(hash, worker)) --entries_;
      }
      return;
    }
    Worker& w = workers_[worker];
    for (BlockHash hash : removed.block_hashes) {
      auto it = w.engine_to_router.find(hash);
      if (it == w.engine_to_router.end()) {
        ++w.unknown_removals;
        continue;
      }
      const BlockHash router = it->second;
      w.engine_to_router.erase(it);
      Unref(worker, router);
    }
  }

  // Applies held batches that follow on from next_sequence.
  void Drain(WorkerId worker, ApplyReport& report) {
    Worker& w = workers_[worker];
    while (!w.held.empty() && w.held.begin()->first == w.next_sequence) {
      auto node = w.held.extract(w.held.begin());
      ApplyBatch(node.mapped(), report);
    }
  }

  void AbandonGapOf(WorkerId worker, ApplyReport& report) {
    Worker& w = workers_[worker];
    ClearWorker(worker);
    ++w.abandoned_gaps;
    report.residency_cleared = true;
    w.next_sequence = w.held.begin()->first;
    Drain(worker, report);
  }

  void FillGap(WorkerId worker, ApplyReport& report) const {
    const Worker& w = workers_[worker];
    report.gap_from = w.next_sequence;
    report.gap_batches = w.held.empty() ? 0 : w.held.begin()->first - w.next_sequence;
  }

  void ClearWorker(WorkerId worker) {
    entries_ -= table_.EraseWorker(worker);
    Worker& w = workers_[worker];
    w.engine_to_router.clear();
    w.router_refs.clear();
  }

  index_detail::BlockTable table_;
  std::vector<Worker> workers_;
  Options options_;
  uint64_t entries_ = 0;
};

}  // namespace kvc_router
