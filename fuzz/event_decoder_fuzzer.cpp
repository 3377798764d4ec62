// Fuzz target: the KV-event payload decoder of the engine adapters
// (engine::DecodeEventBatch, kvc_engine/event_decoder.hpp), which reads the
// msgpack bytes vLLM and SGLang publish, so every byte string an engine or a
// stranger on the socket could send reaches it. Seed corpus: valid batches
// in both encodings (array and map), with byte, int and negative-int hashes,
// every event kind, another medium and another KV-cache group.
// Invariants for every input: decoding never crashes and is deterministic;
// a refusal is an InvalidArgument that says it is about the payload; an
// accepted batch respects the decoder's limits (events per batch, block
// sizes in 1..kMaxBlockTokens); and a KvEventIndex that re-hashes from
// tokens either applies it, never indexing more blocks than the batch
// stored, or refuses it as invalid and holds nothing.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include "fuzz_input.hpp"
#include "kvc_engine/event_decoder.hpp"

namespace {

using kvc_router::BlockStoredEvent;
using kvc_router::KvEventBatch;
using kvc_router::KvEventIndex;
using kvc_router::engine::DecodedEventBatch;
using kvc_router::engine::DecodeEventBatch;

// The seed corpus's block size; batches of other sizes are refused by the
// index (and still decoded).
constexpr uint32_t kIndexBlockTokens = 4;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> payload(data, size);
  absl::StatusOr<DecodedEventBatch> batch = DecodeEventBatch(payload);
  absl::StatusOr<DecodedEventBatch> again = DecodeEventBatch(payload);
  FUZZ_CHECK(batch.ok() == again.ok());
  if (!batch.ok()) {
    FUZZ_CHECK(batch.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(std::string(batch.status().message()).rfind("KV event payload", 0) == 0);
    FUZZ_CHECK(batch.status() == again.status());
    return 0;
  }
  FUZZ_CHECK(batch->events.size() <= kvc_router::engine::kMaxEventsPerBatch);
  FUZZ_CHECK(batch->events.size() == again->events.size());
  FUZZ_CHECK(batch->skipped_group_events == again->skipped_group_events);
  size_t stored_blocks = 0;
  size_t removed_blocks = 0;
  for (size_t i = 0; i < batch->events.size(); ++i) {
    FUZZ_CHECK(batch->events[i].index() == again->events[i].index());
    if (const auto* stored = std::get_if<BlockStoredEvent>(&batch->events[i])) {
      FUZZ_CHECK(stored->block_size >= 1 && stored->block_size <= kvc_router::kMaxBlockTokens);
      const auto& twin = std::get<BlockStoredEvent>(again->events[i]);
      FUZZ_CHECK(stored->block_hashes == twin.block_hashes);
      FUZZ_CHECK(stored->token_ids == twin.token_ids);
      FUZZ_CHECK(stored->parent_block_hash == twin.parent_block_hash);
      stored_blocks += stored->block_hashes.size();
    } else if (const auto* removed = std::get_if<kvc_router::BlockRemovedEvent>(&batch->events[i])) {
      removed_blocks += removed->block_hashes.size();
    }
  }
  // One index for the whole run (building one per input would dominate the
  // time): batches go in sequence, each followed by a clear.
  static KvEventIndex index = [] {
    KvEventIndex::Options options;
    options.hashing = kvc_router::EventHashing::kRehashTokens;
    options.block_tokens = kIndexBlockTokens;
    return *KvEventIndex::Create(1, options);
  }();
  static uint64_t sequence = 0;
  KvEventBatch applied{.worker = 0, .sequence = sequence++, .timestamp = batch->timestamp,
                       .events = std::move(batch->events)};
  absl::StatusOr<KvEventIndex::ApplyReport> report = index.Apply(applied);
  if (!report.ok()) {
    // What decodes may still break the index's rules (a block count that does
    // not match the tokens, another block size): refused, nothing applied.
    FUZZ_CHECK(report.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(index.entries() == 0);
    --sequence;
    return 0;
  }
  FUZZ_CHECK(report->orphan_blocks <= stored_blocks);
  FUZZ_CHECK(report->non_gpu_blocks <= stored_blocks + removed_blocks);
  FUZZ_CHECK(index.entries() <= stored_blocks);
  KvEventBatch clear{.worker = 0, .sequence = sequence++, .timestamp = 0,
                     .events = {kvc_router::AllBlocksClearedEvent{}}};
  FUZZ_CHECK(index.Apply(clear).ok());
  FUZZ_CHECK(index.entries() == 0);
  return 0;
}
