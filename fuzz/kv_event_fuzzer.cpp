// Fuzz target: the KV event path, KvEventIndex::Apply, against a model of
// per-worker block sets. Batches come with any worker id (unknown ones
// included), any sequence number (replays, gaps), empty or huge events. The
// index takes the events' hashes as router hashes (EventHashing::
// kEngineHashes; re-hashing from tokens is covered by the unit tests and the
// engine adapter's decoder fuzz property).
// Invariants after every batch: a refused batch changes nothing; a batch
// after a gap is held back and applied, in sequence order, once the gap is
// filled (or abandoned with AbandonGap, which clears the worker first); the
// index then holds exactly the model's blocks (Contains, entries()); the
// expected sequence is the model's; overlap never exceeds the prefix; the
// index grows (ResizeWorkers) and forgets workers (ForgetWorker) without
// losing anyone else's blocks.
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "fuzz_input.hpp"
#include "kvc_router/index/kv_event_index.hpp"

namespace {

using kvc_router::BlockHash;
using kvc_router::KvEventBatch;
using kvc_router::KvEventIndex;

constexpr uint32_t kAlphabet = 48;  // few distinct hashes: frequent collisions

struct Model {
  std::vector<std::set<BlockHash>> blocks;
  std::vector<uint64_t> next;                             // next sequence to apply
  std::vector<std::map<uint64_t, KvEventBatch>> held;     // held back behind a gap

  void Resize(size_t n) {
    blocks.resize(n);
    next.resize(n, 0);
    held.resize(n);
  }
  void ApplyOne(const KvEventBatch& batch) {
    auto& set = blocks[batch.worker];
    for (const auto& event : batch.events) {
      if (const auto* stored = std::get_if<kvc_router::BlockStoredEvent>(&event)) {
        set.insert(stored->block_hashes.begin(), stored->block_hashes.end());
      } else if (const auto* removed = std::get_if<kvc_router::BlockRemovedEvent>(&event)) {
        for (BlockHash h : removed->block_hashes) set.erase(h);
      } else {
        set.clear();
      }
    }
    next[batch.worker] = batch.sequence + 1;
  }
  void Drain(uint32_t w) {
    while (!held[w].empty() && held[w].begin()->first == next[w]) {
      KvEventBatch batch = std::move(held[w].begin()->second);
      held[w].erase(held[w].begin());
      ApplyOne(batch);
    }
  }
  void Abandon(uint32_t w) {
    blocks[w].clear();
    next[w] = held[w].begin()->first;
    Drain(w);
  }
};

void CheckAgainst(const KvEventIndex& index, const Model& model) {
  FUZZ_CHECK(index.num_workers() == model.blocks.size());
  uint64_t entries = 0;
  for (uint32_t w = 0; w < model.blocks.size(); ++w) {
    entries += model.blocks[w].size();
    for (BlockHash h = 0; h < kAlphabet; ++h) {
      FUZZ_CHECK(index.Contains(w, h) == model.blocks[w].contains(h));
    }
    FUZZ_CHECK(index.next_sequence(w) == model.next[w]);
    FUZZ_CHECK(index.held_batches(w) == model.held[w].size());
  }
  FUZZ_CHECK(index.entries() == entries);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvc_fuzz::FuzzInput in(data, size);
  const uint32_t workers = 1 + in.U8() % 70;  // crosses the 64-worker encoding step
  KvEventIndex::Options options;
  options.hashing = kvc_router::EventHashing::kEngineHashes;
  options.max_held_batches = 1 + in.U8() % 8;  // small: overflowing abandons the gap
  auto created = KvEventIndex::Create(workers, options);
  FUZZ_CHECK(created.ok());
  KvEventIndex& index = *created;
  FUZZ_CHECK(!KvEventIndex::Create(0).ok());
  FUZZ_CHECK(!KvEventIndex::Create(kvc_router::kMaxWorkers + 1).ok());
  Model model;
  model.Resize(workers);
  while (!in.empty()) {
    const uint8_t action = in.U8() % 16;
    if (action == 0) {  // grow
      const uint32_t to = static_cast<uint32_t>(model.blocks.size()) + in.U8() % 80;
      index.ResizeWorkers(to);
      if (to > model.blocks.size()) model.Resize(to);
    } else if (action == 1) {  // a worker leaves
      const uint32_t w = in.Below(static_cast<uint32_t>(model.blocks.size()) + 2);
      index.ForgetWorker(w);
      if (w < model.blocks.size()) {
        model.blocks[w].clear();
        model.next[w] = 0;
        model.held[w].clear();
      }
    } else if (action == 2) {  // the replay cannot be had
      const uint32_t w = in.Below(static_cast<uint32_t>(model.blocks.size()) + 2);
      auto report = index.AbandonGap(w);
      const bool open = w < model.blocks.size() && !model.held[w].empty();
      FUZZ_CHECK(report.ok() == open);
      if (open) {
        FUZZ_CHECK(report->residency_cleared);
        model.Abandon(w);
      }
    } else {
      KvEventBatch batch;
      batch.worker = in.Below(static_cast<uint32_t>(model.blocks.size()) + 2);
      const bool known = batch.worker < model.blocks.size();
      const uint64_t expected = known ? model.next[batch.worker] : 0;
      switch (in.U8() % 4) {
        case 0:
          batch.sequence = in.U64();
          break;
        case 1:
          batch.sequence = expected - (expected > 0 ? in.U8() % 3 : 0);  // replay
          break;
        default:
          batch.sequence = expected + in.U8() % 3;  // in order or a gap
          break;
      }
      const uint32_t events = in.U8() % 6;
      for (uint32_t e = 0; e < events; ++e) {
        const uint8_t kind = in.U8() % 8;
        if (kind < 4) {
          kvc_router::BlockStoredEvent stored;
          const uint32_t n = in.U8() % 12;
          for (uint32_t i = 0; i < n; ++i) stored.block_hashes.push_back(in.U8() % kAlphabet);
          if (in.U8() % 2) stored.parent_block_hash = in.U8() % kAlphabet;
          stored.block_size = in.U8() % 32;
          batch.events.emplace_back(std::move(stored));
        } else if (kind < 7) {
          kvc_router::BlockRemovedEvent removed;
          const uint32_t n = in.U8() % 12;
          for (uint32_t i = 0; i < n; ++i) removed.block_hashes.push_back(in.U8() % kAlphabet);
          batch.events.emplace_back(std::move(removed));
        } else {
          batch.events.emplace_back(kvc_router::AllBlocksClearedEvent{});
        }
      }
      auto report = index.Apply(batch);
      bool valid = known && batch.sequence >= expected &&
                   !model.held[batch.worker].contains(batch.sequence);
      for (const auto& event : batch.events) {
        if (const auto* stored = std::get_if<kvc_router::BlockStoredEvent>(&event)) {
          valid = valid && !stored->block_hashes.empty();
        } else if (const auto* removed = std::get_if<kvc_router::BlockRemovedEvent>(&event)) {
          valid = valid && !removed->block_hashes.empty();
        }
      }
      FUZZ_CHECK(report.ok() == valid);
      if (report.ok()) {
        const uint32_t w = batch.worker;
        if (batch.sequence == expected) {
          FUZZ_CHECK(!report->held_back);
          model.ApplyOne(batch);
          model.Drain(w);
        } else {
          FUZZ_CHECK(report->held_back);
          const uint64_t first_missing =
              model.held[w].empty() ? expected : model.held[w].rbegin()->first + 1;
          FUZZ_CHECK(report->missed_batches ==
                     (batch.sequence > first_missing ? batch.sequence - first_missing : 0));
          model.held[w].emplace(batch.sequence, batch);
          if (model.held[w].size() > options.max_held_batches) {
            FUZZ_CHECK(report->residency_cleared);
            model.Abandon(w);
          }
        }
        FUZZ_CHECK(report->gap_from == model.next[w]);
        FUZZ_CHECK(report->gap_batches ==
                   (model.held[w].empty() ? 0 : model.held[w].begin()->first - model.next[w]));
      }
    }
    CheckAgainst(index, model);
    std::vector<BlockHash> prefix;
    for (uint32_t i = 0; i < in.U8() % 10; ++i) prefix.push_back(in.U8() % kAlphabet);
    std::vector<uint32_t> overlap(index.num_workers(), 0xdeadbeef);
    index.Overlap(prefix, overlap);
    for (uint32_t w = 0; w < overlap.size(); ++w) {
      FUZZ_CHECK(overlap[w] <= prefix.size());
      // Exact where the worker holds the whole prefix (the bisection is
      // exact only for prefix-closed residency, which random events break).
      uint32_t run = 0;
      while (run < prefix.size() && model.blocks[w].contains(prefix[run])) ++run;
      if (run == prefix.size()) FUZZ_CHECK(overlap[w] == run);
    }
  }
  return 0;
}
