// kvc_router/index/detail/block_table.hpp
//
// The shared core of the fast indexes: one open-addressing table from block
// hash to the set of decode workers holding that block, and the one-pass
// overlap search over it.
//
// Layout: two flat arrays of 64-bit words, keys and values, linear probing,
// backward-shift deletion (no tombstones), grown at 7/8 load. A value of 0
// marks an empty slot, so every 64-bit key is allowed. Keys are remixed
// before probing because callers may use small integers (Mooncake hash ids)
// rather than XXH3 output.
//
// The worker set of a block is encoded in its 64-bit value:
//  - up to 64 workers: the value is the bit mask itself;
//  - more workers: most blocks live on one to three workers, so the value
//    holds those ids inline (tag 01, a count and three 12-bit ids, sorted);
//    a block on four or more workers points (tag 10) into a pool of full
//    masks. The encoding is canonical (inline exactly when at most three
//    workers), so equal sets have equal values unless both are pooled.
// Every slot therefore costs 16 bytes whatever |D| is. Inline ids have 12
// bits, so the table tells apart at most kMaxWorkers (4096) workers: the
// indexes built on it refuse more in their `Create` (`CheckNumWorkers`), and
// a table constructed for more anyway stores nothing for workers past 4095
// (Insert returns false, Contains is false) rather than recording worker
// 4096's blocks as worker 0's.
//
// Overlap: with chained hashes and prefix-closed residency the set of
// workers holding block i shrinks as i grows, so it is a step function with
// at most |D| steps. `MatchedRuns` finds every step by bisection, sharing the
// probes between workers: O(k log n) look-ups for k distinct run lengths,
// instead of the O(|D| n) of a literal intersection.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kvc_router/config.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::index_detail {

class BlockTable {
 public:
  // Workers the value encoding tells apart: inline ids have kIdBits bits.
  static constexpr int kIdBits = 12;
  static constexpr uint32_t kMaxEncodableWorkers = uint32_t{1} << kIdBits;
  static_assert(kMaxWorkers <= kMaxEncodableWorkers, "inline worker ids are 12 bits");

  // OK when an index of `num_workers` workers fits the encoding (1..4096);
  // otherwise InvalidArgument naming `index_name`.
  static absl::Status CheckNumWorkers(uint32_t num_workers, std::string_view index_name) {
    if (num_workers == 0 || num_workers > kMaxEncodableWorkers) {
      return absl::InvalidArgumentError(
          absl::StrCat(absl::string_view(index_name.data(), index_name.size()),
                       ": num_workers must be in 1..", kMaxEncodableWorkers,
                       " (kMaxWorkers; the block table encodes worker ids in ", kIdBits,
                       " bits), got ", num_workers));
    }
    return absl::OkStatus();
  }

  // Prefer indexes' `Create`, which checks `num_workers` with CheckNumWorkers.
  // Past kMaxEncodableWorkers the table only ever holds workers below it.
  explicit BlockTable(uint32_t num_workers)
      : num_workers_(num_workers),
        encodable_workers_(std::min(num_workers, kMaxEncodableWorkers)),
        words_(std::max<uint32_t>(1, (encodable_workers_ + 63) / 64)),
        compact_(encodable_workers_ > 64) {
    Rehash(64);
  }

  uint32_t num_workers() const { return num_workers_; }
  size_t size() const { return size_; }
  // True when the table can hold blocks of `worker`.
  bool Covers(WorkerId worker) const { return worker < encodable_workers_; }

  bool Contains(BlockHash hash, WorkerId worker) const {
    if (!Covers(worker)) return false;
    const size_t slot = FindSlot(hash);
    return slot != kNone && Holds(values_[slot], worker);
  }

  // Adds `worker` to the block; returns false when it was already there (or
  // the table does not cover `worker`).
  bool Insert(BlockHash hash, WorkerId worker) {
    if (!Covers(worker)) return false;
    if ((size_ + 1) * 8 > (mask_ + 1) * 7) Rehash((mask_ + 1) * 2);
    size_t slot = Home(hash);
    while (values_[slot] != 0 && keys_[slot] != hash) slot = (slot + 1) & mask_;
    uint64_t& value = values_[slot];
    if (value == 0) {
      keys_[slot] = hash;
      ++size_;
    } else if (Holds(value, worker)) {
      return false;
    }
    value = With(value, worker);
    return true;
  }

  // Removes `worker` from the block; returns false when it was not there.
  bool Erase(BlockHash hash, WorkerId worker) {
    if (!Covers(worker)) return false;
    const size_t slot = FindSlot(hash);
    if (slot == kNone || !Holds(values_[slot], worker)) return false;
    values_[slot] = Without(values_[slot], worker);
    if (values_[slot] == 0) RemoveSlot(slot);
    return true;
  }

  // Removes `worker` from every block (O(table)); returns how many it held.
  size_t EraseWorker(WorkerId worker) {
    if (!Covers(worker)) return 0;
    std::vector<BlockHash> held;
    for (size_t slot = 0; slot <= mask_; ++slot) {
      if (values_[slot] != 0 && Holds(values_[slot], worker)) held.push_back(keys_[slot]);
    }
    for (BlockHash hash : held) Erase(hash, worker);
    return held.size();
  }

  // Elastic membership: the table now covers workers 0..num_workers-1
  // (never shrinks; at most kMaxEncodableWorkers). Free while the worker-set
  // encoding stays the same (up to 64 workers, then per 64 more); crossing
  // one re-encodes the stored sets in place, O(table), keeping every entry.
  void Resize(uint32_t num_workers) {
    const uint32_t n = std::min(num_workers, kMaxEncodableWorkers);
    if (n <= encodable_workers_) {
      num_workers_ = std::max(num_workers_, num_workers);
      return;
    }
    const bool compact = n > 64;
    const uint32_t words = std::max<uint32_t>(1, (n + 63) / 64);
    if (compact == compact_ && words == words_) {
      encodable_workers_ = n;
      num_workers_ = std::max(num_workers_, num_workers);
      return;
    }
    std::vector<std::pair<size_t, std::vector<WorkerId>>> sets;
    sets.reserve(size_);
    for (size_t slot = 0; slot <= mask_; ++slot) {
      if (values_[slot] == 0) continue;
      std::vector<WorkerId> ids;
      ForEachWorker(values_[slot], [&](WorkerId d) { ids.push_back(d); });
      sets.emplace_back(slot, std::move(ids));
    }
    pool_.clear();
    free_pool_.clear();
    compact_ = compact;
    words_ = words;
    encodable_workers_ = n;
    num_workers_ = std::max(num_workers_, num_workers);
    for (auto& [slot, ids] : sets) {
      uint64_t value = 0;
      for (WorkerId d : ids) value = With(value, d);
      values_[slot] = value;
    }
  }

  // out[d] = length of the leading run of `prefix` that worker d holds,
  // exact when each worker's residency is prefix-closed.
  void MatchedRuns(std::span<const BlockHash> prefix, std::span<uint32_t> out) const {
    std::fill(out.begin(), out.end(), 0);
    const size_t n = prefix.size();
    if (n == 0) return;
    const uint64_t first = Lookup(prefix[0]);
    if (first == 0) return;
    const uint64_t last = n == 1 ? first : Lookup(prefix[n - 1]);
    // Workers holding both ends match the whole prefix.
    ForEachWorker(last, [&](WorkerId d) {
      if (d < out.size() && Holds(first, d)) out[d] = static_cast<uint32_t>(n);
    });
    if (n > 1) Bisect(prefix, 0, n - 1, first, last, out);
  }

  // Bytes held by the table and its pool.
  size_t memory_bytes() const {
    return (keys_.capacity() + values_.capacity() + pool_.capacity()) * sizeof(uint64_t) +
           free_pool_.capacity() * sizeof(uint32_t);
  }

 private:
  static constexpr size_t kNone = ~size_t{0};
  static constexpr uint64_t kTagMask = 3;
  static constexpr uint64_t kInlineTag = 1;
  static constexpr uint64_t kPooledTag = 2;

  static uint64_t Mix(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return key;
  }
  size_t Home(BlockHash hash) const { return Mix(hash) & mask_; }

  size_t FindSlot(BlockHash hash) const {
    for (size_t slot = Home(hash);; slot = (slot + 1) & mask_) {
      if (values_[slot] == 0) return kNone;
      if (keys_[slot] == hash) return slot;
    }
  }
  uint64_t Lookup(BlockHash hash) const {
    const size_t slot = FindSlot(hash);
    return slot == kNone ? 0 : values_[slot];
  }

  // --- the worker-set encoding -------------------------------------------
  static uint32_t InlineCount(uint64_t v) { return static_cast<uint32_t>((v >> 2) & 3); }
  static WorkerId InlineId(uint64_t v, uint32_t i) {
    return static_cast<WorkerId>((v >> (4 + kIdBits * i)) & ((1u << kIdBits) - 1));
  }
  static uint64_t MakeInline(const WorkerId* ids, uint32_t count) {
    uint64_t v = kInlineTag | (uint64_t{count} << 2);
    for (uint32_t i = 0; i < count; ++i) v |= uint64_t{ids[i]} << (4 + kIdBits * i);
    return v;
  }
  const uint64_t* Pooled(uint64_t v) const { return pool_.data() + (v >> 2) * words_; }
  uint64_t* Pooled(uint64_t v) { return pool_.data() + (v >> 2) * words_; }

  bool Holds(uint64_t v, WorkerId d) const {
    if (!compact_) return d < 64 && (v >> d) & 1;
    if ((v & kTagMask) == kInlineTag) {
      for (uint32_t i = 0; i < InlineCount(v); ++i) {
        if (InlineId(v, i) == d) return true;
      }
      return false;
    }
    return v != 0 && (Pooled(v)[d / 64] >> (d % 64)) & 1;
  }

  template <class Fn>
  void ForEachWorker(uint64_t v, Fn&& fn) const {
    if (v == 0) return;
    if (!compact_) {
      for (uint64_t bits = v; bits != 0; bits &= bits - 1) {
        fn(static_cast<WorkerId>(__builtin_ctzll(bits)));
      }
      return;
    }
    if ((v & kTagMask) == kInlineTag) {
      for (uint32_t i = 0; i < InlineCount(v); ++i) fn(InlineId(v, i));
      return;
    }
    const uint64_t* words = Pooled(v);
    for (uint32_t w = 0; w < words_; ++w) {
      for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
        fn(static_cast<WorkerId>(w * 64 + __builtin_ctzll(bits)));
      }
    }
  }

  bool SameSet(uint64_t a, uint64_t b) const {
    if (a == b) return true;
    if (!compact_ || (a & kTagMask) != kPooledTag || (b & kTagMask) != kPooledTag) return false;
    return std::memcmp(Pooled(a), Pooled(b), words_ * sizeof(uint64_t)) == 0;
  }

  uint64_t With(uint64_t v, WorkerId d) {
    if (!compact_) return v | (uint64_t{1} << d);
    if (v == 0) return MakeInline(&d, 1);
    if ((v & kTagMask) == kInlineTag) {
      WorkerId ids[4];
      const uint32_t count = InlineCount(v);
      for (uint32_t i = 0; i < count; ++i) ids[i] = InlineId(v, i);
      ids[count] = d;
      std::sort(ids, ids + count + 1);
      if (count < 3) return MakeInline(ids, count + 1);
      const uint64_t pooled = AllocatePooled();
      for (WorkerId id : ids) Pooled(pooled)[id / 64] |= uint64_t{1} << (id % 64);
      return pooled;
    }
    Pooled(v)[d / 64] |= uint64_t{1} << (d % 64);
    return v;
  }

  uint64_t Without(uint64_t v, WorkerId d) {
    if (!compact_) return v & ~(uint64_t{1} << d);
    WorkerId ids[4];
    uint32_t count = 0;
    if ((v & kTagMask) == kInlineTag) {
      for (uint32_t i = 0; i < InlineCount(v); ++i) {
        if (InlineId(v, i) != d) ids[count++] = InlineId(v, i);
      }
      return count == 0 ? 0 : MakeInline(ids, count);
    }
    uint64_t* words = Pooled(v);
    words[d / 64] &= ~(uint64_t{1} << (d % 64));
    uint32_t members = 0;
    for (uint32_t w = 0; w < words_; ++w) members += static_cast<uint32_t>(__builtin_popcountll(words[w]));
    if (members > 3) return v;
    ForEachWorker(v, [&](WorkerId id) { ids[count++] = id; });
    std::memset(words, 0, words_ * sizeof(uint64_t));
    free_pool_.push_back(static_cast<uint32_t>(v >> 2));
    return MakeInline(ids, count);
  }

  uint64_t AllocatePooled() {
    uint64_t index;
    if (!free_pool_.empty()) {
      index = free_pool_.back();
      free_pool_.pop_back();
    } else {
      index = pool_.size() / words_;
      pool_.resize(pool_.size() + words_, 0);
    }
    return kPooledTag | (index << 2);
  }

  // --- overlap search ------------------------------------------------------
  // Invariant: `lo_set` holds prefix[lo], `hi_set` holds prefix[hi]. Workers
  // in lo_set but not hi_set stop somewhere in (lo, hi].
  void Bisect(std::span<const BlockHash> prefix, size_t lo, size_t hi, uint64_t lo_set,
              uint64_t hi_set, std::span<uint32_t> out) const {
    while (true) {
      if (SameSet(lo_set, hi_set)) return;
      if (hi - lo == 1) {
        ForEachWorker(lo_set, [&](WorkerId d) {
          if (d < out.size() && !Holds(hi_set, d)) out[d] = static_cast<uint32_t>(hi);
        });
        return;
      }
      const size_t mid = lo + (hi - lo) / 2;
      const uint64_t mid_set = Lookup(prefix[mid]);
      Bisect(prefix, lo, mid, lo_set, mid_set, out);
      lo = mid;
      lo_set = mid_set;
    }
  }

  // --- table maintenance -------------------------------------------------
  void Rehash(size_t capacity) {
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<uint64_t> old_values = std::move(values_);
    keys_.assign(capacity, 0);
    values_.assign(capacity, 0);
    mask_ = capacity - 1;
    for (size_t slot = 0; slot < old_keys.size(); ++slot) {
      if (old_values[slot] == 0) continue;
      size_t to = Home(old_keys[slot]);
      while (values_[to] != 0) to = (to + 1) & mask_;
      keys_[to] = old_keys[slot];
      values_[to] = old_values[slot];
    }
  }

  // Backward-shift deletion keeps every probe chain unbroken.
  void RemoveSlot(size_t hole) {
    --size_;
    values_[hole] = 0;
    size_t next = (hole + 1) & mask_;
    while (values_[next] != 0) {
      const size_t home = Home(keys_[next]);
      // `next` may move into the hole unless its home lies cyclically in (hole, next].
      const bool stays =
          hole < next ? (home > hole && home <= next) : (home > hole || home <= next);
      if (!stays) {
        keys_[hole] = keys_[next];
        values_[hole] = values_[next];
        values_[next] = 0;
        hole = next;
      }
      next = (next + 1) & mask_;
    }
  }

  uint32_t num_workers_;
  uint32_t encodable_workers_;  // min(num_workers_, kMaxEncodableWorkers)
  uint32_t words_;
  bool compact_;
  size_t mask_ = 0;
  size_t size_ = 0;
  std::vector<uint64_t> keys_;
  std::vector<uint64_t> values_;
  std::vector<uint64_t> pool_;        // words_ words per pooled set
  std::vector<uint32_t> free_pool_;   // recycled pool entries
};

}  // namespace kvc_router::index_detail
