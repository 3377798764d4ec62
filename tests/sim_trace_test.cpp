// Tests of the trace loaders (kvc_router/sim/trace.hpp): the multi-turn
// context accumulation, Mooncake session rebuilding, errors with line
// numbers, and the bundled traces under data/traces/.
#include "kvc_router/sim/trace.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

std::string RepoPath(const std::string& relative) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / relative).string();
}

absl::StatusOr<Trace> ParseMooncake(const std::string& text, uint32_t hub_fanout = 8) {
  std::istringstream in(text);
  TraceOptions options;
  options.hub_fanout = hub_fanout;
  return ParseMooncakeTrace(in, options);
}

absl::StatusOr<Trace> ParseMultiturn(const std::string& text) {
  std::istringstream in(text);
  return ParseMultiturnTrace(in, TraceOptions{});
}

TEST_CASE("multiturn: later prompts are previous prompt + output + new tokens", "[sim][trace]") {
  auto trace = LoadTraceFile(RepoPath("data/traces/samples/multiturn_sample.jsonl"),
                             TraceFormat::kMultiturn);
  REQUIRE(trace.ok());
  REQUIRE(trace->sessions.size() == 2);
  const TraceSession& a = trace->sessions[0];
  const TraceSession& b = trace->sessions[1];
  CHECK(a.name == "a");
  CHECK(a.num_turns == 3);
  CHECK(b.num_turns == 2);
  const TraceTurn& a0 = trace->turns[a.first_turn];
  const TraceTurn& a1 = trace->turns[a.first_turn + 1];
  const TraceTurn& a2 = trace->turns[a.first_turn + 2];
  CHECK(a0.input_tokens == 1300);
  CHECK(a0.reusable_tokens == 0);
  CHECK(a0.prefix_blocks == 0);
  CHECK(a0.input_blocks == 2);
  CHECK(a1.input_tokens == 1300 + 120 + 700);
  CHECK(a1.reusable_tokens == 1420);
  CHECK(a1.prefix_blocks == 2);
  CHECK(a1.input_blocks == 4);
  CHECK(a1.delay_s == Approx(0.25));
  CHECK(a1.arrival_s == Approx(0.25));
  CHECK(a2.input_tokens == 2120 + 80 + 100);
  CHECK(a2.reusable_tokens == 2200);
  CHECK(a2.delay_s == Approx(0.04));
  const TraceTurn& b0 = trace->turns[b.first_turn];
  const TraceTurn& b1 = trace->turns[b.first_turn + 1];
  CHECK(b0.arrival_s == Approx(0.010));
  CHECK(b1.delay_s == Approx(5.0));
  // Sessions a and b share blocks 1 and 2: their first two chained hashes agree.
  const auto ca = trace->InputChain(a1);
  const auto cb = trace->InputChain(b1);
  CHECK(ca[0] == cb[0]);
  CHECK(ca[1] == cb[1]);
  CHECK(ca[2] != cb[2]);
  // A later turn's prefix is the earlier turn's chain, plus the request view.
  CHECK(trace->InputChain(a2)[3] == ca[3]);
  const Request r = trace->MakeRequest(a1);
  CHECK(r.session == 0);
  CHECK(r.turn == 1);
  CHECK(r.prefix_hashes.size() == 2);
  CHECK(r.appended_hashes.size() == 2);
  CHECK(r.input_tokens(512) == a1.input_tokens);
  CHECK(trace->Validate().ok());
}

TEST_CASE("multiturn: errors name the line and refuse the trace", "[sim][trace]") {
  struct Case {
    std::string text;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"{\"session_id\":\"a\",\"input_length\":10,\"output_length\":1}\n", "line 1: the first turn"},
      {"{\"session_id\":\"a\",\"input_length\":10,\"output_length\":1,\"timestamp\":0}\n"
       "{\"session_id\":\"a\",\"input_length\":10,\"output_length\":1}\n",
       "line 2: a later turn"},
      {"{\"session_id\":\"a\",\"input_length\":10,\"output_length\":1,\"timestamp\":0}\n\n"
       "{\"session_id\":\"a\",\"input_length\":-3,\"output_length\":1,\"delay\":1}\n",
       "line 3: field \"input_length\""},
      {"{\"session_id\":[1],\"input_length\":10,\"output_length\":1,\"timestamp\":0}\n",
       "line 1: field \"session_id\""},
      {"{\"session_id\":\"a\",\"input_length\":10,\"output_length\":1,\"timestamp\":0,"
       "\"hash_ids\":[\"x\"]}\n",
       "line 1: field \"hash_ids\""},
      {"{\"session_id\":\"a\",\"input_length\":10,\"output_length\":1,\"timestamp\":0}\n"
       "{\"session_id\":\"a\" \"input_length\":10}\n",
       "line 2: column"},
      {"\n  \n", "no requests"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    auto trace = ParseMultiturn(c.text);
    REQUIRE_FALSE(trace.ok());
    CHECK_THAT(test::Message(trace.status()), Catch::Contains(c.expect));
  }
}

TEST_CASE("mooncake: sessions are rebuilt by longest shared prefix", "[sim][trace]") {
  const std::string text =
      R"({"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]})" "\n"
      R"({"timestamp": 1000, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]})" "\n"
      R"({"timestamp": 2000, "input_length": 700, "output_length": 10, "hash_ids": [0, 5]})" "\n"
      R"({"timestamp": 3000, "input_length": 1400, "output_length": 10, "hash_ids": [0, 5, 6]})" "\n"
      R"({"timestamp": 4000, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 9]})" "\n";
  auto trace = ParseMooncake(text);
  REQUIRE(trace.ok());
  // Lines 1-2 form a session; 3-4 another (line 3's partial last block is
  // shared, so one full block is reusable); line 5 would continue line 1,
  // which already has a continuation, so it starts its own session.
  REQUIRE(trace->sessions.size() == 3);
  CHECK(trace->sessions[0].num_turns == 2);
  CHECK(trace->sessions[1].num_turns == 2);
  CHECK(trace->sessions[2].num_turns == 1);
  const TraceTurn& second = trace->turns[1];
  CHECK(second.line == 2);
  CHECK(second.prefix_blocks == 2);
  CHECK(second.reusable_tokens == 1024);
  CHECK(second.input_blocks == 2);
  CHECK(second.delay_s == Approx(1.0));
  const TraceTurn& fourth = trace->turns[3];
  CHECK(fourth.line == 4);
  CHECK(fourth.prefix_blocks == 1);
  CHECK(fourth.reusable_tokens == 512);
  CHECK(trace->turns[4].line == 5);
  CHECK(trace->turns[4].turn == 0);
  // Chained hashes: equal id prefixes give equal hashes.
  CHECK(trace->InputChain(trace->turns[1])[1] == trace->InputChain(trace->turns[0])[1]);
  CHECK(trace->InputChain(trace->turns[4])[0] == trace->InputChain(trace->turns[0])[0]);
}

TEST_CASE("mooncake: a hub prefix does not join conversations", "[sim][trace]") {
  // Two requests branch from block 9 before a request that is exactly [9]
  // appears; with hub_fanout 2 block 9 is then a shared prompt.
  const std::string text =
      R"({"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [9, 101]})" "\n"
      R"({"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [9, 102]})" "\n"
      R"({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [9]})" "\n"
      R"({"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [9, 103]})" "\n";
  auto hub = ParseMooncake(text, /*hub_fanout=*/2);
  REQUIRE(hub.ok());
  CHECK(hub->sessions.size() == 4);
  auto no_hub = ParseMooncake(text, /*hub_fanout=*/8);
  REQUIRE(no_hub.ok());
  CHECK(no_hub->sessions.size() == 3);
}

TEST_CASE("mooncake: errors name the line and refuse the trace", "[sim][trace]") {
  const std::string good =
      R"({"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]})" "\n";
  struct Case {
    std::string line;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"({"timestamp": 5, "input_length": 1024, "output_length": 10, "hash_ids": [0]})",
       "line 2: \"hash_ids\" has 1 ids but input_length 1024 needs 2"},
      {R"({"timestamp": 5, "input_length": 1024, "output_length": 10})", "line 2: missing field \"hash_ids\""},
      {R"({"input_length": 1024, "output_length": 10, "hash_ids": [0, 1]})", "line 2: missing field \"timestamp\""},
      {R"({"timestamp": -5, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]})",
       "line 2: field \"timestamp\""},
      {R"({"timestamp": 5, "input_length": 1024.5, "output_length": 10, "hash_ids": [0, 1]})",
       "line 2: field \"input_length\""},
      {R"({"timestamp": 5, "input_length": 99999999999, "output_length": 10, "hash_ids": [0, 1]})",
       "above the limit"},
      {R"({"timestamp": 5, "input_length": 1024, "output_length": 10, "hash_ids": [0, -1]})",
       "negative id"},
      {R"({"timestamp": 5, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]}})",
       "line 2: column"},
  };
  for (const Case& c : cases) {
    INFO(c.line);
    auto trace = ParseMooncake(good + c.line + "\n" + good);
    REQUIRE_FALSE(trace.ok());
    CHECK_THAT(test::Message(trace.status()), Catch::Contains(c.expect));
  }
  auto decreasing = ParseMooncake(
      R"({"timestamp": 50, "input_length": 10, "output_length": 1, "hash_ids": [0]})" "\n" + good);
  REQUIRE_FALSE(decreasing.ok());
  CHECK_THAT(test::Message(decreasing.status()), Catch::Contains("line 2: timestamps must not decrease"));
  auto missing = LoadTraceFile("/nonexistent/trace.jsonl", TraceFormat::kMooncake);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("mooncake: the bundled conversation trace", "[sim][trace]") {
  const std::string path = RepoPath("data/traces/mooncake/conversation_trace.jsonl");
  auto trace = LoadTraceFile(path, TraceFormat::kMooncake);
  REQUIRE(trace.ok());
  CHECK(trace->turns.size() == 12031);
  // The README's reconstruction: ~8,100 sessions, 1.48 turns on average.
  CHECK(trace->sessions.size() > 7900);
  CHECK(trace->sessions.size() < 8300);
  uint32_t longest = 0;
  for (const TraceSession& s : trace->sessions) longest = std::max(longest, s.num_turns);
  CHECK(longest >= 20);
  CHECK(trace->IdealSessionHitRate() > 0.25);
  CHECK(trace->IdealSessionHitRate() < 0.366);
  CHECK(trace->span_s() == Approx(3536.999).margin(0.01));

  // The README's global ideal (block-weighted, infinite cache) is 0.366.
  std::ifstream in(path);
  std::string text;
  std::unordered_set<int64_t> seen;
  uint64_t blocks = 0, hits = 0;
  while (std::getline(in, text)) {
    auto json = JsonLine::Parse(text);
    REQUIRE(json.ok());
    for (int64_t id : json->Find("hash_ids")->integers) {
      ++blocks;
      hits += seen.contains(id) ? 1 : 0;
    }
    for (int64_t id : json->Find("hash_ids")->integers) seen.insert(id);
  }
  CHECK(static_cast<double>(hits) / static_cast<double>(blocks) == Approx(0.366).margin(0.001));
}

}  // namespace
}  // namespace kvc_router::sim
