// kvc_router/index/detail/block_table.hpp
//
// The shared core of the fast indexes: one open-addressing table from block
// hash to the set of decode workers holding that block (a bit per worker),
// and the one-pass overlap search over it.
//
// Layout: two flat arrays, keys and worker masks (`words` 64-bit words per
// slot), linear probing, backward-shift deletion (no tombstones), grown at
// 7/8 load. A slot is empty exactly when its mask is all zero, so every
// 64-bit key is allowed. Keys are remixed before probing because callers may
// use small integers (Mooncake hash ids) rather than XXH3 output.
//
// Overlap: with chained hashes and prefix-closed residency the set of
// workers holding block i shrinks as i grows, so it is a step function with
// at most |D| steps. `MatchedRuns` finds every step by bisection, sharing the
// probes between workers: O(k log n) look-ups for k distinct run lengths,
// instead of the O(|D| n) of a literal intersection.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvc_router/config.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::index_detail {

class BlockTable {
 public:
  static constexpr uint32_t kMaxWords = (kMaxWorkers + 63) / 64;

  explicit BlockTable(uint32_t num_workers)
      : num_workers_(num_workers), words_(std::max<uint32_t>(1, (num_workers + 63) / 64)) {
    Rehash(64);
  }

  uint32_t num_workers() const { return num_workers_; }
  uint32_t words() const { return words_; }
  size_t size() const { return size_; }

  // The worker mask of `hash`, or nullptr when no worker holds it.
  const uint64_t* Find(BlockHash hash) const {
    for (size_t slot = Home(hash);; slot = (slot + 1) & mask_) {
      const uint64_t* m = Mask(slot);
      if (IsEmpty(m)) return nullptr;
      if (keys_[slot] == hash) return m;
    }
  }

  bool Contains(BlockHash hash, WorkerId worker) const {
    const uint64_t* m = Find(hash);
    return m != nullptr && (m[worker / 64] >> (worker % 64)) & 1;
  }

  // Sets `worker`'s bit; returns false when it was already set.
  bool Insert(BlockHash hash, WorkerId worker) {
    if ((size_ + 1) * 8 > (mask_ + 1) * 7) Rehash((mask_ + 1) * 2);
    size_t slot = Home(hash);
    for (;; slot = (slot + 1) & mask_) {
      uint64_t* m = Mask(slot);
      if (IsEmpty(m)) {
        keys_[slot] = hash;
        ++size_;
        break;
      }
      if (keys_[slot] == hash) break;
    }
    uint64_t& word = Mask(slot)[worker / 64];
    const uint64_t bit = uint64_t{1} << (worker % 64);
    if (word & bit) return false;
    word |= bit;
    return true;
  }

  // Clears `worker`'s bit; returns false when it was not set.
  bool Erase(BlockHash hash, WorkerId worker) {
    size_t slot = Home(hash);
    for (;; slot = (slot + 1) & mask_) {
      uint64_t* m = Mask(slot);
      if (IsEmpty(m)) return false;
      if (keys_[slot] == hash) break;
    }
    uint64_t* m = Mask(slot);
    const uint64_t bit = uint64_t{1} << (worker % 64);
    if (!(m[worker / 64] & bit)) return false;
    m[worker / 64] &= ~bit;
    if (IsEmpty(m)) RemoveSlot(slot);
    return true;
  }

  // Clears `worker` from every block (O(table)); returns how many it held.
  size_t EraseWorker(WorkerId worker) {
    const uint64_t bit = uint64_t{1} << (worker % 64);
    size_t cleared = 0;
    std::vector<BlockHash> sole;  // blocks only this worker holds
    for (size_t slot = 0; slot <= mask_; ++slot) {
      uint64_t* m = Mask(slot);
      if (IsEmpty(m) || !(m[worker / 64] & bit)) continue;
      ++cleared;
      m[worker / 64] &= ~bit;
      if (IsEmpty(m)) {
        m[worker / 64] |= bit;  // stays occupied until Erase removes it in probe order
        sole.push_back(keys_[slot]);
      }
    }
    for (BlockHash hash : sole) Erase(hash, worker);
    return cleared;
  }

  // out[d] = length of the leading run of `prefix` that worker d holds,
  // exact when each worker's residency is prefix-closed.
  void MatchedRuns(std::span<const BlockHash> prefix, std::span<uint32_t> out) const {
    std::fill(out.begin(), out.end(), 0);
    const size_t n = prefix.size();
    if (n == 0) return;
    const uint64_t* first = FindOrZero(prefix[0]);
    if (IsEmpty(first)) return;
    const uint64_t* last = n == 1 ? first : FindOrZero(prefix[n - 1]);
    // Workers holding the first and the last block match the whole prefix.
    std::array<uint64_t, kMaxWords> both;
    for (uint32_t w = 0; w < words_; ++w) both[w] = first[w] & last[w];
    Assign(both.data(), nullptr, static_cast<uint32_t>(n), out);
    if (n > 1) Bisect(prefix, 0, n - 1, first, both.data(), out);
  }

  // Bytes held by the table's arrays.
  size_t memory_bytes() const {
    return keys_.capacity() * sizeof(uint64_t) + masks_.capacity() * sizeof(uint64_t);
  }

 private:
  static uint64_t Mix(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return key;
  }
  size_t Home(BlockHash hash) const { return Mix(hash) & mask_; }
  uint64_t* Mask(size_t slot) { return masks_.data() + slot * words_; }
  const uint64_t* Mask(size_t slot) const { return masks_.data() + slot * words_; }
  bool IsEmpty(const uint64_t* m) const {
    for (uint32_t w = 0; w < words_; ++w) {
      if (m[w] != 0) return false;
    }
    return true;
  }
  const uint64_t* FindOrZero(BlockHash hash) const {
    const uint64_t* m = Find(hash);
    return m != nullptr ? m : zeros_.data();
  }
  bool SameMask(const uint64_t* a, const uint64_t* b) const {
    return std::memcmp(a, b, words_ * sizeof(uint64_t)) == 0;
  }

  // Every worker in `have` but not in `minus` gets run length `run`.
  void Assign(const uint64_t* have, const uint64_t* minus, uint32_t run,
              std::span<uint32_t> out) const {
    for (uint32_t w = 0; w < words_; ++w) {
      uint64_t bits = have[w] & (minus != nullptr ? ~minus[w] : ~uint64_t{0});
      while (bits != 0) {
        const uint32_t d = w * 64 + static_cast<uint32_t>(__builtin_ctzll(bits));
        if (d < out.size()) out[d] = run;
        bits &= bits - 1;
      }
    }
  }

  // Invariant: `lo_mask` = workers of prefix[lo], `hi_mask` = of prefix[hi].
  void Bisect(std::span<const BlockHash> prefix, size_t lo, size_t hi, const uint64_t* lo_mask,
              const uint64_t* hi_mask, std::span<uint32_t> out) const {
    while (true) {
      if (SameMask(lo_mask, hi_mask)) return;  // no step inside (lo, hi]
      if (hi - lo == 1) {
        Assign(lo_mask, hi_mask, static_cast<uint32_t>(hi), out);
        return;
      }
      const size_t mid = lo + (hi - lo) / 2;
      const uint64_t* mid_mask = FindOrZero(prefix[mid]);
      // Recurse into the smaller-index half, loop on the other.
      Bisect(prefix, lo, mid, lo_mask, mid_mask, out);
      lo = mid;
      lo_mask = mid_mask;
    }
  }

  void Rehash(size_t capacity) {
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<uint64_t> old_masks = std::move(masks_);
    const size_t old_capacity = old_keys.size();
    keys_.assign(capacity, 0);
    masks_.assign(capacity * words_, 0);
    zeros_.assign(words_, 0);
    mask_ = capacity - 1;
    for (size_t slot = 0; slot < old_capacity; ++slot) {
      const uint64_t* m = old_masks.data() + slot * words_;
      if (IsEmpty(m)) continue;
      size_t to = Home(old_keys[slot]);
      while (!IsEmpty(Mask(to))) to = (to + 1) & mask_;
      keys_[to] = old_keys[slot];
      std::memcpy(Mask(to), m, words_ * sizeof(uint64_t));
    }
  }

  // Backward-shift deletion keeps every probe chain unbroken.
  void RemoveSlot(size_t hole) {
    --size_;
    size_t next = (hole + 1) & mask_;
    while (!IsEmpty(Mask(next))) {
      const size_t home = Home(keys_[next]);
      // Move `next` into the hole unless its home lies cyclically in (hole, next].
      const bool stays = hole < next ? (home > hole && home <= next) : (home > hole || home <= next);
      if (!stays) {
        keys_[hole] = keys_[next];
        std::memcpy(Mask(hole), Mask(next), words_ * sizeof(uint64_t));
        hole = next;
      }
      next = (next + 1) & mask_;
    }
    std::memset(Mask(hole), 0, words_ * sizeof(uint64_t));
  }

  uint32_t num_workers_;
  uint32_t words_;
  size_t mask_ = 0;
  size_t size_ = 0;
  std::vector<uint64_t> keys_;
  std::vector<uint64_t> masks_;
  std::vector<uint64_t> zeros_;
};

}  // namespace kvc_router::index_detail
