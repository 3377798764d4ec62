// BM_HashAppend: incremental chained hashing of a turn's new tokens
// (bytes/s of 32-bit token ids), 24-token blocks.
#include <benchmark/benchmark.h>

#include <vector>

#include "kvc_router/block_hash.hpp"

namespace kvc_router {
namespace {

void BM_HashAppend(benchmark::State& state) {
  const auto tokens = static_cast<size_t>(state.range(0));
  std::vector<TokenId> turn(tokens);
  for (size_t i = 0; i < tokens; ++i) turn[i] = static_cast<TokenId>(i * 2654435761u);
  SessionHasher hasher(1, 24);
  size_t turns = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(hasher.BeginTurn(turn));
    if (++turns * tokens > (size_t{1} << 24)) {  // keep the chain from growing forever
      state.PauseTiming();
      hasher = SessionHasher(1, 24);
      turns = 0;
      state.ResumeTiming();
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * tokens * sizeof(TokenId)));
}
BENCHMARK(BM_HashAppend)->Arg(256)->Arg(4096)->Arg(65536);

}  // namespace
}  // namespace kvc_router
