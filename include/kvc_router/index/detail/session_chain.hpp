// kvc_router/index/detail/session_chain.hpp
//
// How a session's learned chain changes between two placements, shared by the
// placement-learned indexes (EstimateIndex, FastIndex).
#pragma once

#include <cstddef>
#include <span>

#include "kvc_router/types.hpp"

namespace kvc_router::index_detail {

// Length of the common leading run of the chain a session held (`old_chain`)
// and the one it holds now. With chained hashes equal last blocks mean equal
// prefixes, so the usual case, a chain that only grew, costs one comparison.
inline size_t CommonChainPrefix(std::span<const BlockHash> old_chain,
                                std::span<const BlockHash> new_chain) {
  if (!old_chain.empty() && old_chain.size() <= new_chain.size() &&
      new_chain[old_chain.size() - 1] == old_chain.back()) {
    return old_chain.size();
  }
  size_t common = 0;
  while (common < old_chain.size() && common < new_chain.size() &&
         old_chain[common] == new_chain[common]) {
    ++common;
  }
  return common;
}

}  // namespace kvc_router::index_detail
