// kvc_router/detail/xxhash.hpp
//
// The one place that includes xxHash. Debian's libxxhash-dev ships no CMake
// package, so the library uses the header in its inline form: no link step,
// and the hash functions inline into the hashing loops.
#pragma once

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>
