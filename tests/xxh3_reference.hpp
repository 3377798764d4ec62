// An independent route to XXH3-64: the streaming API over explicitly
// little-endian bytes, to cross-check HashBlock's one-shot form.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc_router/detail/xxhash.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::test {

inline uint64_t ReferenceXxh3(const TokenId* tokens, size_t count, uint64_t seed) {
  XXH3_state_t state;
  XXH3_64bits_reset_withSeed(&state, seed);
  for (size_t i = 0; i < count; ++i) {
    const unsigned char bytes[4] = {
        static_cast<unsigned char>(tokens[i]), static_cast<unsigned char>(tokens[i] >> 8),
        static_cast<unsigned char>(tokens[i] >> 16), static_cast<unsigned char>(tokens[i] >> 24)};
    XXH3_64bits_update(&state, bytes, 4);
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace kvc_router::test
