// Fuzz target: the KV event path, KvEventIndex::Apply and AbandonGap, against
// a model of per-worker block sets, expected sequence numbers and batches
// held back behind gaps. The index runs with EventHashing::kEngineHashes so
// that the model can name blocks by the hashes the events carry (the
// re-hashing from token_ids has its own unit tests and the engine decoder's
// mutation property). Batches come with any worker id (unknown ones
// included), any sequence number (replays, gaps, duplicates of held
// batches), empty or huge events, GPU and other media.
// Invariants after every call: a refused batch changes nothing; an accepted
// one is applied at once when it is the next in sequence (with every held
// batch that then follows on) and held back otherwise; more than
// max_held_batches held batches abandon the gap (residency cleared, held
// batches applied); the index holds exactly the model's blocks (Contains,
// entries()); overlap never exceeds the prefix; the index grows
// (ResizeWorkers) and forgets workers (ForgetWorker) without losing anyone
// else's blocks.
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
constexpr uint32_t kMaxHeld = 3;    // small, so that overflowing gaps are fuzzed

struct WorkerModel {
  std::set<BlockHash> blocks;
  uint64_t next = 0;
  std::map<uint64_t, KvEventBatch> held;
};

struct Model {
  std::vector<WorkerModel> workers;

  void ApplyEvents(WorkerModel& w, const KvEventBatch& batch) {
    for (const auto& event : batch.events) {
      if (const auto* stored = std::get_if<kvc_router::BlockStoredEvent>(&event)) {
        if (kvc_router::IsGpuMedium(stored->medium)) {
          w.blocks.insert(stored->block_hashes.begin(), stored->block_hashes.end());
        }
      } else if (const auto* removed = std::get_if<kvc_router::BlockRemovedEvent>(&event)) {
        if (kvc_router::IsGpuMedium(removed->medium)) {
          for (BlockHash h : removed->block_hashes) w.blocks.erase(h);
        }
      } else {
        w.blocks.clear();
      }
    }
    w.next = batch.sequence + 1;
  }
  void Drain(WorkerModel& w) {
    while (!w.held.empty() && w.held.begin()->first == w.next) {
      const KvEventBatch batch = w.held.begin()->second;
      w.held.erase(w.held.begin());
      ApplyEvents(w, batch);
    }
  }
  void Abandon(WorkerModel& w) {
    w.blocks.clear();
    w.next = w.held.begin()->first;
    Drain(w);
  }
  // Whether the index must accept `batch`, and then what it does.
  bool Accept(const KvEventBatch& batch) {
    if (batch.worker >= workers.size()) return false;
    WorkerModel& w = workers[batch.worker];
    if (batch.sequence < w.next || w.held.contains(batch.sequence)) return false;
    for (const auto& event : batch.events) {
      if (const auto* stored = std::get_if<kvc_router::BlockStoredEvent>(&event)) {
        if (stored->block_hashes.empty()) return false;
      } else if (const auto* removed = std::get_if<kvc_router::BlockRemovedEvent>(&event)) {
        if (removed->block_hashes.empty()) return false;
      }
    }
    if (batch.sequence == w.next) {
      ApplyEvents(w, batch);
      Drain(w);
    } else {
      w.held.emplace(batch.sequence, batch);
      if (w.held.size() > kMaxHeld) Abandon(w);
    }
    return true;
  }
};

void CheckAgainst(const KvEventIndex& index, const Model& model) {
  FUZZ_CHECK(index.num_workers() == model.workers.size());
  uint64_t entries = 0;
  for (uint32_t w = 0; w < model.workers.size(); ++w) {
    const WorkerModel& m = model.workers[w];
    entries += m.blocks.size();
    for (BlockHash h = 0; h < kAlphabet; ++h) {
      FUZZ_CHECK(index.Contains(w, h) == m.blocks.contains(h));
    }
    FUZZ_CHECK(index.next_sequence(w) == m.next);
    FUZZ_CHECK(index.held_batches(w) == m.held.size());
  }
  FUZZ_CHECK(index.entries() == entries);
}

const char* Medium(uint8_t choice) {
  switch (choice % 4) {
    case 0:
      return "";
    case 1:
      return "GPU";
    case 2:
      return "cpu";
    default:
      return "disk";
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvc_fuzz::FuzzInput in(data, size);
  const uint32_t workers = 1 + in.U8() % 70;  // crosses the 64-worker encoding step
  KvEventIndex::Options options;
  options.hashing = kvc_router::EventHashing::kEngineHashes;
  options.learn_placements = false;
  options.max_held_batches = kMaxHeld;
  auto created = KvEventIndex::Create(workers, options);
  FUZZ_CHECK(created.ok());
  KvEventIndex& index = *created;
  FUZZ_CHECK(!KvEventIndex::Create(0, options).ok());
  FUZZ_CHECK(!KvEventIndex::Create(kvc_router::kMaxWorkers + 1, options).ok());
  Model model{std::vector<WorkerModel>(workers)};
  while (!in.empty()) {
    const uint8_t action = in.U8() % 16;
    if (action == 0) {  // grow
      const uint32_t to = static_cast<uint32_t>(model.workers.size()) + in.U8() % 80;
      index.ResizeWorkers(to);
      if (to > model.workers.size()) model.workers.resize(to);
    } else if (action == 1) {  // a worker leaves
      const uint32_t w = in.Below(static_cast<uint32_t>(model.workers.size()) + 2);
      index.ForgetWorker(w);
      if (w < model.workers.size()) model.workers[w] = WorkerModel();
    } else if (action == 2) {  // the replay cannot be had
      const uint32_t w = in.Below(static_cast<uint32_t>(model.workers.size()) + 2);
      auto report = index.AbandonGap(w);
      const bool open = w < model.workers.size() && !model.workers[w].held.empty();
      FUZZ_CHECK(report.ok() == open);
      if (open) {
        FUZZ_CHECK(report->residency_cleared);
        model.Abandon(model.workers[w]);
      }
    } else {
      KvEventBatch batch;
      batch.worker = in.Below(static_cast<uint32_t>(model.workers.size()) + 2);
      const bool known = batch.worker < model.workers.size();
      const uint64_t expected = known ? model.workers[batch.worker].next : 0;
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
          stored.medium = Medium(in.U8());
          batch.events.emplace_back(std::move(stored));
        } else if (kind < 7) {
          kvc_router::BlockRemovedEvent removed;
          const uint32_t n = in.U8() % 12;
          for (uint32_t i = 0; i < n; ++i) removed.block_hashes.push_back(in.U8() % kAlphabet);
          removed.medium = Medium(in.U8());
          batch.events.emplace_back(std::move(removed));
        } else {
          batch.events.emplace_back(kvc_router::AllBlocksClearedEvent{});
        }
      }
      const bool accepted = model.Accept(batch);
      auto report = index.Apply(batch);
      FUZZ_CHECK(report.ok() == accepted);
      if (accepted) FUZZ_CHECK(report->held_back == (batch.sequence != expected));
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
      while (run < prefix.size() && model.workers[w].blocks.contains(prefix[run])) ++run;
      if (run == prefix.size()) FUZZ_CHECK(overlap[w] == run);
    }
  }
  return 0;
}
