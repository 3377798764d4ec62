// kvc-events-listen: subscribes to engines' KV-event publishers (vLLM or
// SGLang wire format), feeds a KvEventIndex and prints what the index holds
// as one JSON line. A diagnostic for operators ("does my gateway see my
// engines' cache?") and the subscriber half of the Python publisher tests
// (engine/tests/vllm_publisher_test.py).
//
//   kvc-events-listen --pub tcp://10.0.0.5:5557 --replay tcp://10.0.0.5:5558
//       --block-tokens 16 --seconds 10 [--queries q.json] [--expect-applied N]
//
// Source i maps data-parallel rank r to worker i + r unless --rank-base says
// otherwise. Prints "READY" once the sockets are connected, then the JSON.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/synchronization/mutex.h"
#include "kvc_engine/zmq_subscriber.hpp"
#include "kvc_router/block_hash.hpp"

int main(int argc, char** argv) {
  using namespace kvc_router;
  CLI::App app{"Subscribe to KV-event publishers and print the router index they build"};
  std::vector<std::string> pubs;
  std::vector<std::string> replays;
  uint32_t workers = 0;
  uint32_t block_tokens = 16;
  uint32_t ranks_per_source = 1;
  double seconds = 10;
  uint64_t expect_applied = 0;
  uint64_t expect_errors = 0;
  int settle_ms = 300;
  std::string queries_path;
  std::string base_model;
  app.add_option("--pub", pubs, "PUB endpoint of a publisher (repeatable)")->required();
  app.add_option("--replay", replays, "its replay endpoint, '-' for none (repeatable, in order)");
  app.add_option("--workers", workers, "decode workers (default: sources * ranks)");
  app.add_option("--ranks-per-source", ranks_per_source,
                 "data-parallel ranks per source; source i rank r is worker i*ranks+r")
      ->capture_default_str();
  app.add_option("--block-tokens", block_tokens, "engine block size")->capture_default_str();
  app.add_option("--base-model", base_model, "salt of the base model's chains ('' = none)");
  app.add_option("--seconds", seconds, "stop after this long")->capture_default_str();
  app.add_option("--expect-applied", expect_applied, "stop once this many batches were applied");
  app.add_option("--expect-errors", expect_errors, "... and this many decode errors were seen");
  app.add_option("--settle-ms", settle_ms, "keep listening this long after the expectation")
      ->capture_default_str();
  app.add_option("--queries", queries_path,
                 "JSON file {name: {tokens: [...], lora: \"\"}}: overlap per worker of each");
  CLI11_PARSE(app, argc, argv);

  if (workers == 0) workers = static_cast<uint32_t>(pubs.size()) * ranks_per_source;
  KvEventIndex::Options options;
  options.learn_placements = false;
  options.block_tokens = block_tokens;
  options.base_root = ChainRootFor(base_model);
  absl::StatusOr<KvEventIndex> index = KvEventIndex::Create(workers, options);
  if (!index.ok()) {
    std::cerr << "kvc-events-listen: " << index.status().message() << "\n";
    return 2;
  }
  absl::Mutex mu;
  std::vector<engine::EventSource> sources;
  for (size_t i = 0; i < pubs.size(); ++i) {
    engine::EventSource source;
    source.endpoint = pubs[i];
    if (i < replays.size() && replays[i] != "-") source.replay_endpoint = replays[i];
    source.ranks.clear();
    for (uint32_t r = 0; r < ranks_per_source; ++r) {
      source.ranks.emplace_back(r, static_cast<WorkerId>(i * ranks_per_source + r));
    }
    sources.push_back(std::move(source));
  }
  auto subscriber = engine::KvEventSubscriber::Create(sources, engine::SinkFor(*index, mu));
  if (!subscriber.ok()) {
    std::cerr << "kvc-events-listen: " << subscriber.status().message() << "\n";
    return 2;
  }
  std::cout << "READY" << std::endl;
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> met;
  while (std::chrono::steady_clock::now() - start < std::chrono::duration<double>(seconds)) {
    (*subscriber)->PollOnce(std::chrono::milliseconds(20));
    const engine::SubscriberStats stats = (*subscriber)->stats();
    if (expect_applied > 0 && stats.batches_applied >= expect_applied &&
        stats.decode_errors >= expect_errors) {
      if (!met) met = std::chrono::steady_clock::now();
      if (std::chrono::steady_clock::now() - *met > std::chrono::milliseconds(settle_ms)) break;
    }
  }
  const engine::SubscriberStats stats = (*subscriber)->stats();
  nlohmann::json out;
  out["stats"] = {{"messages", stats.messages},
                  {"batches_applied", stats.batches_applied},
                  {"batches_held", stats.batches_held},
                  {"decode_errors", stats.decode_errors},
                  {"apply_errors", stats.apply_errors},
                  {"duplicates", stats.duplicates},
                  {"unknown_ranks", stats.unknown_ranks},
                  {"replay_requests", stats.replay_requests},
                  {"replayed_batches", stats.replayed_batches},
                  {"abandoned_gaps", stats.abandoned_gaps},
                  {"last_error", stats.last_error}};
  absl::MutexLock lock(&mu);
  out["workers"] = nlohmann::json::array();
  for (WorkerId w = 0; w < workers; ++w) {
    out["workers"].push_back({{"next_sequence", index->next_sequence(w)},
                              {"held_batches", index->held_batches(w)},
                              {"blocks", index->event_blocks(w)},
                              {"orphan_blocks", index->orphan_blocks(w)},
                              {"non_gpu_blocks", index->non_gpu_blocks(w)},
                              {"unknown_removals", index->unknown_removals(w)},
                              {"abandoned_gaps", index->abandoned_gaps(w)}});
  }
  out["queries"] = nlohmann::json::object();
  if (!queries_path.empty()) {
    std::ifstream in(queries_path);
    const nlohmann::json queries = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!queries.is_object()) {
      std::cerr << "kvc-events-listen: " << queries_path << " is not a JSON object\n";
      return 2;
    }
    for (const auto& [name, query] : queries.items()) {
      std::vector<TokenId> tokens = query.value("tokens", std::vector<TokenId>{});
      const std::string lora = query.value("lora", std::string());
      std::vector<BlockHash> chain;
      AppendChainedHashes(lora.empty() ? options.base_root : ChainRootFor(lora), tokens,
                          block_tokens, chain);
      std::vector<uint32_t> overlap(workers, 0);
      index->Overlap(chain, overlap);
      out["queries"][name] = overlap;
    }
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
