// Fuzz target: the simulator's trace loaders (kvc_sim/trace.hpp), Mooncake
// and multi-turn JSONL, on arbitrary text. The first byte picks the format
// and the block size. Invariants: a loader either refuses with an error or
// returns a trace that passes Trace::Validate (every turn's ranges inside
// the hash arena, finite non-negative times, contiguous sessions); every
// turn's router Request is well formed (input_tokens fits and matches); the
// same text loads to the same trace twice (determinism).
#include <cstdint>
#include <sstream>
#include <string>

#include "fuzz_input.hpp"
#include "kvc_sim/trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool mooncake = data[0] % 2 == 0;
  kvc_router::sim::TraceOptions options;
  options.block_tokens = 1u << (data[0] / 2 % 10);  // 1..512
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto load = [&]() {
    std::istringstream stream(text);
    return mooncake ? kvc_router::sim::ParseMooncakeTrace(stream, options)
                    : kvc_router::sim::ParseMultiturnTrace(stream, options);
  };
  auto trace = load();
  if (!trace.ok()) {
    FUZZ_CHECK(!trace.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(trace->Validate().ok());
  for (const kvc_router::sim::TraceTurn& turn : trace->turns) {
    const kvc_router::Request request = trace->MakeRequest(turn);
    FUZZ_CHECK(request.input_tokens_fit(trace->block_tokens));
    FUZZ_CHECK(request.input_tokens(trace->block_tokens) == turn.input_tokens);
    FUZZ_CHECK(request.appended_hashes.size() <= request.append_tokens / trace->block_tokens);
  }
  auto again = load();
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->turns.size() == trace->turns.size());
  FUZZ_CHECK(again->hashes == trace->hashes);
  FUZZ_CHECK(again->sessions.size() == trace->sessions.size());
  return 0;
}
