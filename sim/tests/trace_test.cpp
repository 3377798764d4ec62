// Tests of the trace loaders (kvc_sim/trace.hpp): the multi-turn context
// accumulation, Mooncake session rebuilding, the JSON each line may hold,
// errors with line (and, for invalid JSON, column) numbers, a fuzz-style
// property over mutated lines, and the bundled traces under data/traces/.
#include "kvc_sim/trace.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "kvc_router/detail/splitmix.hpp"
#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

// `relative` to the repository root (this file is sim/tests/trace_test.cpp).
std::string RepoPath(const std::string& relative) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / relative)
      .string();
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

// The column an error names ("... column 27: ..."), or 0 when it names none.
uint64_t ColumnOf(const std::string& message) {
  const size_t at = message.find("column ");
  return at == std::string::npos ? 0 : std::stoull(message.substr(at + 7));
}

// A Mooncake line with the given fields, valid unless the caller says otherwise.
std::string MooncakeLine(const std::string& timestamp, const std::string& input,
                         const std::string& output, const std::string& hash_ids) {
  return "{\"timestamp\": " + timestamp + ", \"input_length\": " + input +
         ", \"output_length\": " + output + ", \"hash_ids\": " + hash_ids + "}";
}

TEST_CASE("trace lines: invalid JSON names the line and the column", "[sim][trace]") {
  const std::string good_mooncake =
      R"({"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]})" "\n";
  const std::string good_multiturn =
      R"({"session_id": "s", "input_length": 10, "output_length": 1, "timestamp": 0})" "\n";
  // Each is refused on line 2 with a column, by both loaders.
  const std::vector<std::string> bad = {
      R"({"timestamp": 5, "input_length": 1024 "output_length": 10, "hash_ids": [0, 1]})",
      "[1, 2]",
      "5",
      "\"just a string\"",
      "{\"a\": 1",
      "{\"a\": 1,}",
      "{\"a\" 1}",
      "{a: 1}",
      "{\"a\": 01}",
      "{\"a\": 1.}",
      "{\"a\": -}",
      "{\"a\": 1e}",
      "{\"a\": tru}",
      "{\"a\": \"unterminated}",
      "{\"a\": \"bad \\x escape\"}",
      "{\"a\": \"\\ud800\"}",
      "{\"a\": [1, 2}",
      "{\"a\": 1} trailing",
      "{\"a\": 1}}",
      "{\"a\": 1e999}",
      "{\"a\": \"tab\there\"}",
      "{\"a\": \"bad utf-8 \xff\"}",
      "{\"a\": 1, \"b\": [1, 2, }",
  };
  for (const std::string& line : bad) {
    INFO(line);
    auto mooncake = ParseMooncake(good_mooncake + line + "\n" + good_mooncake);
    REQUIRE_FALSE(mooncake.ok());
    CHECK(mooncake.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(test::Message(mooncake.status()), Catch::Matches("line 2: column [0-9]+: .+"));
    CHECK(ColumnOf(test::Message(mooncake.status())) >= 1);
    CHECK(ColumnOf(test::Message(mooncake.status())) <= line.size() + 1);
    auto multiturn = ParseMultiturn(good_multiturn + line + "\n" + good_multiturn);
    REQUIRE_FALSE(multiturn.ok());
    CHECK_THAT(test::Message(multiturn.status()), Catch::Matches("line 2: column [0-9]+: .+"));
  }

  // The column points at the offending token: here the key after the missing comma.
  const std::string missing_comma =
      R"({"timestamp": 5, "input_length": 1024 "output_length": 10, "hash_ids": [0, 1]})";
  const uint64_t key_at = missing_comma.find("\"output_length\"");
  auto trace = ParseMooncake(good_mooncake + missing_comma + "\n");
  REQUIRE_FALSE(trace.ok());
  const uint64_t column = ColumnOf(test::Message(trace.status()));
  CHECK(column > key_at);
  CHECK(column <= key_at + std::string("\"output_length\"").size());
  // Leading blanks count: a non-object line is refused at its first character.
  auto array = ParseMooncake("   [1]\n");
  REQUIRE_FALSE(array.ok());
  CHECK_THAT(test::Message(array.status()), Catch::StartsWith("line 1: column 4: "));

  // LoadTraceFile adds the path; kvc-replay's smoke test matches this shape.
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "kvc_sim_trace_test_malformed.jsonl";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]})" "\n"
        << R"({"timestamp": 1, "input_length": 10 "output_length": 1, "hash_ids": [0]})" "\n";
  }
  auto loaded = LoadTraceFile(path.string(), TraceFormat::kMooncake);
  std::filesystem::remove(path);
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(test::Message(loaded.status()),
             Catch::Matches(".*kvc_sim_trace_test_malformed\\.jsonl: line 2: column [0-9]+: .+"));
}

TEST_CASE("trace lines: wrong types, negatives and missing fields name the field", "[sim][trace]") {
  struct Case {
    std::string line;
    std::string expect;
  };
  const std::vector<Case> mooncake = {
      {MooncakeLine("0", "\"1024\"", "10", "[0, 1]"),
       "line 1: field \"input_length\" must be a non-negative integer"},
      {MooncakeLine("0", "1024", "null", "[0, 1]"),
       "line 1: field \"output_length\" must be a non-negative integer"},
      {MooncakeLine("0", "1024", "true", "[0, 1]"),
       "line 1: field \"output_length\" must be a non-negative integer"},
      {MooncakeLine("0", "1024", "[10]", "[0, 1]"),
       "line 1: field \"output_length\" must be a non-negative integer"},
      {MooncakeLine("\"0\"", "1024", "10", "[0, 1]"),
       "line 1: field \"timestamp\" must be a non-negative number"},
      {MooncakeLine("{}", "1024", "10", "[0, 1]"),
       "line 1: field \"timestamp\" must be a non-negative number"},
      {MooncakeLine("0", "1024", "10", "7"),
       "line 1: field \"hash_ids\" must be an array of integers"},
      {MooncakeLine("0", "1024", "10", "{\"0\": 1}"),
       "line 1: field \"hash_ids\" must be an array of integers"},
      {MooncakeLine("0", "1024", "10", "[0, \"1\"]"),
       "line 1: field \"hash_ids\" must be an array of integers"},
      {MooncakeLine("0", "1024", "10", "[0, 1.0]"),
       "line 1: field \"hash_ids\" must be an array of integers"},
      {MooncakeLine("0", "1024", "10", "[0, [1]]"),
       "line 1: field \"hash_ids\" must be an array of integers"},
      // Ids are int64: one past INT64_MAX is refused, not wrapped.
      {MooncakeLine("0", "1024", "10", "[0, 9223372036854775808]"),
       "line 1: field \"hash_ids\" must be an array of integers"},
      {MooncakeLine("0", "1024", "10", "[-1, \"x\"]"),
       "line 1: field \"hash_ids\" must be an array of integers"},
      {MooncakeLine("0", "1024", "10", "[0, -7]"),
       "line 1: field \"hash_ids\" has a negative id -7"},
      {MooncakeLine("0", "-1", "10", "[]"),
       "line 1: field \"input_length\" must be a non-negative integer"},
      {MooncakeLine("0", "1024", "-10", "[0, 1]"),
       "line 1: field \"output_length\" must be a non-negative integer"},
      {MooncakeLine("-0.5", "1024", "10", "[0, 1]"), "line 1: field \"timestamp\""},
      {R"({"timestamp": 0, "output_length": 10, "hash_ids": [0, 1]})",
       "line 1: missing field \"input_length\""},
      {R"({"timestamp": 0, "input_length": 1024, "hash_ids": [0, 1]})",
       "line 1: missing field \"output_length\""},
      {"{}", "line 1: missing field \"timestamp\""},
  };
  for (const Case& c : mooncake) {
    INFO(c.line);
    auto trace = ParseMooncake(c.line + "\n");
    REQUIRE_FALSE(trace.ok());
    CHECK(trace.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(test::Message(trace.status()), Catch::Contains(c.expect));
    CHECK(ColumnOf(test::Message(trace.status())) == 0);
  }

  const std::string first =
      R"({"session_id": "s", "input_length": 10, "output_length": 1, "timestamp": 0})";
  const std::vector<Case> multiturn = {
      {R"({"input_length": 10, "output_length": 1, "timestamp": 0})",
       "line 2: missing field \"session_id\""},
      {R"({"session_id": "s", "output_length": 1, "delay": 0})",
       "line 2: missing field \"input_length\""},
      {R"({"session_id": "s", "input_length": 10, "delay": 0})",
       "line 2: missing field \"output_length\""},
      {R"({"session_id": 1.5, "input_length": 10, "output_length": 1, "timestamp": 0})",
       "line 2: field \"session_id\" must be a string or an integer"},
      {R"({"session_id": true, "input_length": 10, "output_length": 1, "timestamp": 0})",
       "line 2: field \"session_id\" must be a string or an integer"},
      {R"({"session_id": null, "input_length": 10, "output_length": 1, "timestamp": 0})",
       "line 2: field \"session_id\" must be a string or an integer"},
      {R"({"session_id": "s", "input_length": 10, "output_length": 1, "delay": -1})",
       "line 2: field \"delay\" must be a non-negative number"},
      {R"({"session_id": "s", "input_length": 10, "output_length": 1, "delay": "1"})",
       "line 2: field \"delay\" must be a non-negative number"},
      {R"({"session_id": "t", "input_length": 10, "output_length": 1, "timestamp": "0"})",
       "line 2: field \"timestamp\" must be a non-negative number"},
      {R"({"session_id": "t", "input_length": 10, "output_length": 1, "timestamp": 0, "hash_ids": [-2]})",
       "line 2: field \"hash_ids\" has a negative id -2"},
      {R"({"session_id": "s", "input_length": 10, "output_length": 1, "delay": 0, "hash_ids": "x"})",
       "line 2: field \"hash_ids\" must be an array of integers"},
      {R"({"session_id": "s", "input_length": 10.5, "output_length": 1, "delay": 0})",
       "line 2: field \"input_length\" must be a non-negative integer"},
  };
  for (const Case& c : multiturn) {
    INFO(c.line);
    auto trace = ParseMultiturn(first + "\n" + c.line + "\n");
    REQUIRE_FALSE(trace.ok());
    CHECK(trace.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(test::Message(trace.status()), Catch::Contains(c.expect));
  }
}

TEST_CASE("trace lines: integer fields, numeric forms and limits", "[sim][trace]") {
  // Float-valued integers (as a float-typed writer prints them) are accepted;
  // so is "-0", which JSON allows.
  auto floats = ParseMooncake(MooncakeLine("1.5e3", "1024.0", "1e1", "[0, 1]") + "\n" +
                              MooncakeLine("2000", "-0", "0.0", "[]") + "\n");
  REQUIRE(floats.ok());
  REQUIRE(floats->turns.size() == 2);
  CHECK(floats->turns[0].input_tokens == 1024);
  CHECK(floats->turns[0].output_tokens == 10);
  CHECK(floats->turns[0].arrival_s == Approx(1.5));
  CHECK(floats->turns[1].input_tokens == 0);
  CHECK(floats->turns[1].output_tokens == 0);

  struct Case {
    std::string output;
    std::string expect;
  };
  const std::string limit = std::to_string(kMaxTurnTokens);
  const std::vector<Case> refused = {
      {std::to_string(kMaxTurnTokens + 1), "line 1: field \"output_length\" is " +
                                               std::to_string(kMaxTurnTokens + 1) +
                                               ", above the limit of " + limit},
      {std::to_string(kMaxTurnTokens + 1) + ".0", "above the limit of " + limit},
      {"99999999999",
       "line 1: field \"output_length\" is 99999999999, above the limit of " + limit},
      {"18446744073709551615", "above the limit of " + limit},
      // Past uint64 and past 2^53: not an integer the loader can trust.
      {"18446744073709551616", "line 1: field \"output_length\" must be a non-negative integer"},
      {"9007199254740994.0", "line 1: field \"output_length\" must be a non-negative integer"},
      {"1e300", "line 1: field \"output_length\" must be a non-negative integer"},
      {"10.5", "line 1: field \"output_length\" must be a non-negative integer"},
  };
  for (const Case& c : refused) {
    INFO(c.output);
    auto trace = ParseMooncake(MooncakeLine("0", "1024", c.output, "[0, 1]") + "\n");
    REQUIRE_FALSE(trace.ok());
    CHECK_THAT(test::Message(trace.status()), Catch::Contains(c.expect));
  }
  // A number no double holds is invalid JSON to the parser, with a column.
  auto overflow = ParseMooncake(MooncakeLine("0", "1024", "1e999", "[0, 1]") + "\n");
  REQUIRE_FALSE(overflow.ok());
  CHECK_THAT(test::Message(overflow.status()), Catch::Matches("line 1: column [0-9]+: .+"));

  // The limit itself is allowed.
  auto at_limit = ParseMooncake(MooncakeLine("0", "1024", limit, "[0, 1]") + "\n");
  REQUIRE(at_limit.ok());
  CHECK(at_limit->turns[0].output_tokens == kMaxTurnTokens);

  // A multi-turn session may grow to kMaxSessionContextTokens, not past it.
  std::string session;
  const uint64_t turns_to_limit = kMaxSessionContextTokens / kMaxTurnTokens;
  for (uint64_t k = 0; k < turns_to_limit; ++k) {
    session += "{\"session_id\": \"big\", \"input_length\": " + limit + ", \"output_length\": 0, " +
               (k == 0 ? "\"timestamp\": 0}" : "\"delay\": 0}") + "\n";
  }
  auto full = ParseMultiturn(session);
  REQUIRE(full.ok());
  CHECK(full->turns.back().input_tokens == kMaxSessionContextTokens);
  auto past = ParseMultiturn(
      session + R"({"session_id": "big", "input_length": 0, "output_length": 1, "delay": 0})" "\n");
  REQUIRE_FALSE(past.ok());
  CHECK_THAT(test::Message(past.status()),
             Catch::Contains("line " + std::to_string(turns_to_limit + 1) +
                             ": session \"big\" grows past " +
                             std::to_string(kMaxSessionContextTokens) + " tokens"));
}

TEST_CASE("trace lines: any JSON object is read; unknown fields are ignored", "[sim][trace]") {
  // Unknown members of every JSON type, escapes, a trailing '\r' and blanks.
  const std::string text =
      "  {\"session_id\":\"a\\u00e9\\n\",\"input_length\":1100,\"output_length\":50,"
      "\"timestamp\":10.0,\"hash_ids\":[1,2,7],\"x\":{\"y\":[true,null,\"s\",1.5,{\"z\":{}}]},"
      "\"flag\":false,\"nothing\":null,\"names\":[\"p\",\"q\"],\"empty\":[]}\r\n"
      "{\"session_id\":\"\\ud83d\\ude00\",\"input_length\":10,\"output_length\":1,\"timestamp\":0,"
      "\"nested\":{\"dup\":1,\"dup\":2}}\n"
      "\t{\"session_id\":7,\"input_length\":1,\"output_length\":1,\"timestamp\":0}\t\n"
      "{\"session_id\":-3,\"input_length\":1,\"output_length\":1,\"timestamp\":0}\n"
      "{\"session_id\":7,\"input_length\":1,\"output_length\":1,\"delay\":0}\n";
  auto trace = ParseMultiturn(text);
  REQUIRE(trace.ok());
  REQUIRE(trace->sessions.size() == 4);
  CHECK(trace->sessions[0].name == "a\xc3\xa9\n");
  CHECK(trace->sessions[1].name == "\xf0\x9f\x98\x80");
  // An integer session id is named by its decimal form (the string "7" is a
  // different session: see "multiturn: a number and a string session id").
  CHECK(trace->sessions[2].name == "7");
  CHECK(trace->sessions[2].num_turns == 2);
  CHECK(trace->sessions[3].name == "-3");
  CHECK(trace->turns[0].input_tokens == 1100);
  CHECK(trace->turns[0].arrival_s == Approx(0.010));
  // A session's first turn chains its "hash_ids": the same ids give the same hashes.
  auto same_ids = ParseMooncake(
      R"({"timestamp": 0, "input_length": 1100, "output_length": 50, "hash_ids": [1, 2, 7]})" "\n");
  REQUIRE(same_ids.ok());
  CHECK(trace->InputChain(trace->turns[0])[1] == same_ids->InputChain(same_ids->turns[0])[1]);
  CHECK(ChainTraceId(ChainTraceId(kChainRootHash, 1), 2) == same_ids->hashes[1]);
}

TEST_CASE("trace lines: repeated keys and deep nesting are refused", "[sim][trace]") {
  // A line that says two things about one field is ambiguous; nlohmann-json
  // alone would keep the last value.
  auto duplicate = ParseMooncake(
      R"({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0], "hash_ids": [1]})" "\n");
  REQUIRE_FALSE(duplicate.ok());
  CHECK_THAT(test::Message(duplicate.status()),
             Catch::Contains("line 1: duplicate key \"hash_ids\""));
  auto duplicate_unknown = ParseMultiturn(
      R"({"session_id": "s", "input_length": 1, "output_length": 1, "timestamp": 0, "x": 1, "x": 2})" "\n");
  REQUIRE_FALSE(duplicate_unknown.ok());
  CHECK_THAT(test::Message(duplicate_unknown.status()),
             Catch::Contains("line 1: duplicate key \"x\""));

  const auto nested = [](size_t depth) {
    return R"({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0], "x": )" +
           std::string(depth, '[') + "1" + std::string(depth, ']') + "}\n";
  };
  // The member's value is depth 1, so `1` inside 31 arrays sits at depth 32.
  CHECK(ParseMooncake(nested(kMaxJsonDepth - 1)).ok());
  auto deep = ParseMooncake(nested(kMaxJsonDepth));
  REQUIRE_FALSE(deep.ok());
  CHECK_THAT(test::Message(deep.status()),
             Catch::Contains("line 1: nesting deeper than 32 levels"));
  // An unterminated, very deep line stops at the bound instead of growing a
  // value of unbounded depth.
  auto hostile = ParseMultiturn("{\"session_id\": " + std::string(100000, '[') + "\n");
  REQUIRE_FALSE(hostile.ok());
  CHECK_THAT(test::Message(hostile.status()), Catch::Contains("line 1: nesting deeper than"));
}

TEST_CASE("trace lines: random mutations of valid lines never crash", "[sim][trace][property]") {
  const std::vector<std::string> seed_lines = {
      R"({"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]})",
      R"({"session_id":"a","input_length":700,"output_length":80,"hash_ids":[4,5],"delay":250.0})",
      R"({"session_id":7,"input_length":1100,"output_length":50,"hash_ids":[1,2,7],"timestamp":10.0,"group_id":{"k":["x",1.5,null]}})",
      R"({"timestamp": 1.5e3, "input_length": 1024.0, "output_length": 1e1, "hash_ids": [0, 1], "session_id": -3})",
  };
  const uint64_t seed = test::PropertySeed();
  INFO("seed " << seed << " (KVC_ROUTER_SEED overrides)");
  kvc_router::detail::SplitMix64 rng(seed);
  const std::string alphabet = "{}[]:,\"\\-+.eE0123456789 tfnulrsa\x01\xff";
  const uint32_t scenarios = std::max<uint32_t>(200, test::PropertyScenarios());
  uint64_t loaded = 0, refused = 0, invalid_json = 0;
  for (uint32_t i = 0; i < scenarios; ++i) {
    std::string text = seed_lines[rng.Next() % seed_lines.size()];
    const int edits = 1 + static_cast<int>(rng.Next() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = text.empty() ? 0 : rng.Next() % (text.size() + 1);
      const char c = alphabet[rng.Next() % alphabet.size()];
      switch (rng.Next() % 4) {
        case 0:  // replace
          if (at < text.size()) text[at] = c;
          break;
        case 1:  // insert
          text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        case 2:  // delete
          if (at < text.size()) text.erase(at, 1);
          break;
        default:  // truncate
          text.resize(at);
          break;
      }
    }
    INFO(text);
    const bool blank = text.find_first_not_of(" \t\r") == std::string::npos;
    const bool valid_json = nlohmann::json::accept(text);
    invalid_json += valid_json ? 0 : 1;
    for (const TraceFormat format : {TraceFormat::kMooncake, TraceFormat::kMultiturn}) {
      std::istringstream in(text);
      absl::StatusOr<Trace> trace;
      REQUIRE_NOTHROW(trace = format == TraceFormat::kMooncake
                                  ? ParseMooncakeTrace(in, TraceOptions{})
                                  : ParseMultiturnTrace(in, TraceOptions{}));
      if (trace.ok()) {
        ++loaded;
        CHECK(valid_json);
        CHECK(trace->Validate().ok());
        continue;
      }
      ++refused;
      REQUIRE(trace.status().code() == absl::StatusCode::kInvalidArgument);
      const std::string message = test::Message(trace.status());
      if (blank) {
        CHECK_THAT(message, Catch::Contains("no requests"));
      } else if (!valid_json) {
        CHECK_THAT(message, Catch::Matches("line 1: column [0-9]+: .+"));
      } else {
        CHECK_THAT(message, Catch::StartsWith("line 1: "));
      }
    }
  }
  CHECK(loaded + refused == 2 * uint64_t{scenarios});
  CHECK(loaded > 0);
  CHECK(invalid_json > 0);
}

// Issue 10, json-1: a line with many distinct keys parses in linear time
// (keys go into a hash set; unknown members are checked but not stored).
// Timed against nlohmann-json building the same line as a DOM, so the bound
// holds in Debug and sanitizer builds too: a quadratic check would take
// hundreds of times longer.
TEST_CASE("trace lines: a line with 40000 distinct keys loads quickly", "[sim][trace]") {
  std::string keys;
  for (int k = 0; k < 40000; ++k) keys += ",\"key_number_" + std::to_string(k) + "\":1";
  const std::string line =
      R"({"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1])" + keys +
      "}";
  REQUIRE(line.size() > 430000);
  const auto seconds_of = [](auto&& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  absl::StatusOr<Trace> mooncake;
  const double load_s = seconds_of([&] { mooncake = ParseMooncake(line + "\n"); });
  nlohmann::json dom;
  const double dom_s = seconds_of([&] { dom = nlohmann::json::parse(line, nullptr, false); });
  REQUIRE(dom.size() == 40004);
  REQUIRE(mooncake.ok());
  CHECK(mooncake->turns.size() == 1);
  CHECK(mooncake->turns[0].input_blocks == 2);
  INFO("loader " << load_s << " s, nlohmann-json DOM " << dom_s << " s");
  CHECK(load_s < 5 * dom_s + 0.05);

  // The last of 40,000 keys repeating the first one (or a known field) is
  // still found.
  auto repeated = ParseMultiturn(
      R"({"session_id": "s", "input_length": 1024, "output_length": 1, "timestamp": 0)" + keys +
      ",\"key_number_0\":2}\n");
  REQUIRE_FALSE(repeated.ok());
  CHECK_THAT(test::Message(repeated.status()),
             Catch::Contains("line 1: duplicate key \"key_number_0\""));
  auto repeated_known = ParseMultiturn(
      R"({"session_id": "s", "input_length": 1024, "output_length": 1, "timestamp": 0, "x": 1, )"
      R"("timestamp": 0})" "\n");
  REQUIRE_FALSE(repeated_known.ok());
  CHECK_THAT(test::Message(repeated_known.status()),
             Catch::Contains("line 1: duplicate key \"timestamp\""));
}

// Issue 10, trace-1: a continuation shares ALL of its predecessor's ids (or
// all but a partial last block), not just one id at the right index.
TEST_CASE("mooncake: one matching id at the right index does not join sessions",
          "[sim][trace]") {
  const std::string text =
      MooncakeLine("0", "1024", "1", "[1, 2]") + "\n" +
      // Only the last id matches line 1's last id, at the same index.
      MooncakeLine("1000", "1536", "1", "[7, 2, 3]") + "\n" +
      MooncakeLine("2000", "1100", "1", "[10, 11, 12]") + "\n" +
      // Only id 11 matches line 3's second-to-last id (its last block is partial).
      MooncakeLine("3000", "2048", "1", "[20, 11, 30, 31]") + "\n" +
      // A genuine continuation of line 1, which is therefore still free.
      MooncakeLine("4000", "1536", "1", "[1, 2, 5]") + "\n" +
      // A genuine continuation of line 3 through its partial last block.
      MooncakeLine("5000", "1536", "1", "[10, 11, 40]") + "\n";
  auto trace = ParseMooncake(text);
  REQUIRE(trace.ok());
  REQUIRE(trace->sessions.size() == 4);
  // Sessions in order of first request: {1, 5}, {2}, {3, 6}, {4}.
  CHECK(trace->sessions[0].num_turns == 2);
  CHECK(trace->sessions[1].num_turns == 1);
  CHECK(trace->sessions[2].num_turns == 2);
  CHECK(trace->sessions[3].num_turns == 1);
  for (const TraceTurn& t : trace->turns) {
    INFO("line " << t.line);
    if (t.line == 2 || t.line == 4) {
      CHECK(t.turn == 0);
      CHECK(t.reusable_tokens == 0);
    }
    if (t.line == 5 || t.line == 6) {
      CHECK(t.turn == 1);
      CHECK(t.reusable_tokens == 1024);
    }
  }
  CHECK(trace->IdealSessionHitRate() ==
        Approx(2048.0 / (1024 + 1536 + 1100 + 2048 + 1536 + 1536)));

  // Without the genuine continuations, nothing is shared at all (before the
  // fix lines 2 and 4 were credited 1024 tokens each).
  const size_t genuine = text.find(MooncakeLine("4000", "1536", "1", "[1, 2, 5]"));
  std::istringstream crafted(text.substr(0, genuine));
  auto only_crafted = ParseMooncakeTrace(crafted, TraceOptions{});
  REQUIRE(only_crafted.ok());
  CHECK(only_crafted->sessions.size() == 4);
  CHECK(only_crafted->IdealSessionHitRate() == 0.0);
}

// Issue 10, trace-2: times are bounded (kMaxTraceTimeMs), also as a
// session's delays add up, so no arrival is huge or infinite.
TEST_CASE("trace lines: absurd and non-finite times are refused", "[sim][trace]") {
  const std::string limit = "1e+15";
  struct Case {
    std::string text;
    std::string expect;
  };
  const std::vector<Case> mooncake = {
      {MooncakeLine("1e308", "1024", "1", "[0, 1]"),
       "line 1: field \"timestamp\" is 1e+308 ms, above the limit of " + limit + " ms"},
      {MooncakeLine("1000000000000001", "1024", "1", "[0, 1]"),
       "line 1: field \"timestamp\" is 1e+15 ms, above the limit"},
      {MooncakeLine("18446744073709551615", "1024", "1", "[0, 1]"),
       "line 1: field \"timestamp\" is 1.84467e+19 ms, above the limit"},
  };
  for (const Case& c : mooncake) {
    INFO(c.text);
    auto trace = ParseMooncake(c.text + "\n");
    REQUIRE_FALSE(trace.ok());
    CHECK_THAT(test::Message(trace.status()), Catch::Contains(c.expect));
  }
  const std::string first =
      R"({"session_id": "s", "input_length": 10, "output_length": 1, "timestamp": 0})" "\n";
  const auto later = [](const std::string& delay) {
    return R"({"session_id": "s", "input_length": 10, "output_length": 1, "delay": )" + delay +
           "}\n";
  };
  const std::vector<Case> multiturn = {
      {R"({"session_id": "s", "input_length": 10, "output_length": 1, "timestamp": 1e308})" "\n",
       "line 1: field \"timestamp\" is 1e+308 ms, above the limit of " + limit + " ms"},
      {first + later("1e308"), "line 2: field \"delay\" is 1e+308 ms, above the limit"},
      // Each delay is allowed; their sum is not.
      {first + later("6e14") + later("6e14"),
       "line 3: field \"delay\" takes session \"s\" to 1.2e+15 ms, past the limit of " + limit +
           " ms"},
      {R"({"session_id": 5, "input_length": 10, "output_length": 1, "timestamp": 1e15})" "\n"
       R"({"session_id": 5, "input_length": 10, "output_length": 1, "delay": 0.5})" "\n",
       "line 2: field \"delay\" takes session 5 to"},
      {first + R"({"session_id": "s", "input_length": 10, "output_length": 1, "timestamp": 2e15})"
               "\n",
       "line 2: field \"timestamp\" is 2e+15 ms, above the limit"},
  };
  for (const Case& c : multiturn) {
    INFO(c.text);
    auto trace = ParseMultiturn(c.text);
    REQUIRE_FALSE(trace.ok());
    CHECK_THAT(test::Message(trace.status()), Catch::Contains(c.expect));
  }
  // Many huge delays: refused where the sum first passes the limit.
  std::string many = first;
  for (int k = 0; k < 200; ++k) many += later("9e14");
  auto summed = ParseMultiturn(many);
  REQUIRE_FALSE(summed.ok());
  CHECK_THAT(test::Message(summed.status()), Catch::StartsWith("line 3: field \"delay\""));

  // Unix-epoch milliseconds are ordinary timestamps.
  auto epoch = ParseMooncake(MooncakeLine("1764547200000", "1024", "1", "[0, 1]") + "\n");
  REQUIRE(epoch.ok());
  CHECK(epoch->turns[0].arrival_s == Approx(1764547200.0));
  // The limit itself is allowed.
  auto at_limit = ParseMooncake(MooncakeLine("1e15", "1024", "1", "[0, 1]") + "\n");
  REQUIRE(at_limit.ok());
  CHECK(at_limit->turns[0].arrival_s == Approx(1e12));
  auto sum_at_limit = ParseMultiturn(first + later("5e14") + later("5e14"));
  REQUIRE(sum_at_limit.ok());
  CHECK(sum_at_limit->turns.back().arrival_s == Approx(1e12));
  CHECK(sum_at_limit->Validate().ok());
}

// Issue 10, trace-3: a later turn's timestamp may not go back in time.
TEST_CASE("multiturn: a later timestamp before the previous turn is refused", "[sim][trace]") {
  auto back = ParseMultiturn(
      R"({"session_id": "s", "input_length": 10, "output_length": 1, "timestamp": 1000})" "\n"
      R"({"session_id": "t", "input_length": 10, "output_length": 1, "timestamp": 0})" "\n"
      R"({"session_id": "s", "input_length": 10, "output_length": 1, "timestamp": 500})" "\n");
  REQUIRE_FALSE(back.ok());
  CHECK(back.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(test::Message(back.status()),
             Catch::Contains("line 3: field \"timestamp\" is 500 ms, before the previous turn of "
                             "session \"s\" (line 1, at 1000 ms)"));
  // After a delay the previous turn's arrival is the sum: 100 + 200 ms.
  auto after_delay = ParseMultiturn(
      R"({"session_id": 9, "input_length": 10, "output_length": 1, "timestamp": 100})" "\n"
      R"({"session_id": 9, "input_length": 10, "output_length": 1, "delay": 200})" "\n"
      R"({"session_id": 9, "input_length": 10, "output_length": 1, "timestamp": 299.5})" "\n");
  REQUIRE_FALSE(after_delay.ok());
  CHECK_THAT(test::Message(after_delay.status()),
             Catch::Contains("line 3: field \"timestamp\" is 299.5 ms, before the previous turn of "
                             "session 9 (line 2, at 300 ms)"));
  // An equal timestamp (exactly, in ms, despite 0.1 + 0.2 != 0.3 in seconds)
  // is a delay of 0; a later one the difference.
  auto ok = ParseMultiturn(
      R"({"session_id": 9, "input_length": 10, "output_length": 1, "timestamp": 100})" "\n"
      R"({"session_id": 9, "input_length": 10, "output_length": 1, "delay": 200})" "\n"
      R"({"session_id": 9, "input_length": 10, "output_length": 1, "timestamp": 300})" "\n"
      R"({"session_id": 9, "input_length": 10, "output_length": 1, "timestamp": 1300})" "\n");
  REQUIRE(ok.ok());
  REQUIRE(ok->turns.size() == 4);
  CHECK(ok->turns[2].delay_s == Approx(0.0).margin(1e-12));
  CHECK(ok->turns[3].delay_s == Approx(1.0));
  CHECK(ok->turns[3].arrival_s == Approx(1.3));
}

// Issue 10, trace-4: a line's hash_ids describe its input_length tokens (the
// whole prompt on a first turn, the new tokens on a later one) in blocks from
// the first of them: their count is checked, and later turns' ids are used.
TEST_CASE("multiturn: hash_ids are counted, and later turns' ids are chained", "[sim][trace]") {
  const auto turn = [](const std::string& session, uint64_t input, uint64_t output,
                       const std::string& ids, bool first) {
    return "{\"session_id\": \"" + session + "\", \"input_length\": " + std::to_string(input) +
           ", \"output_length\": " + std::to_string(output) +
           (ids.empty() ? std::string() : ", \"hash_ids\": " + ids) +
           (first ? ", \"timestamp\": 0}\n" : ", \"delay\": 0}\n");
  };
  struct Case {
    std::string text;
    std::string expect;
  };
  std::string many_ids = "[0";
  for (int k = 1; k < 100000; ++k) many_ids += "," + std::to_string(k);
  many_ids += "]";
  const std::vector<Case> refused = {
      {turn("s", 1300, 1, many_ids, true),
       "line 1: \"hash_ids\" has 100000 ids but input_length 1300 needs 3 blocks of 512 tokens "
       "(is the block size right?)"},
      {turn("s", 1300, 1, "[1, 2]", true), "line 1: \"hash_ids\" has 2 ids but input_length 1300"},
      {turn("s", 0, 1, "[1]", true), "line 1: \"hash_ids\" has 1 ids but input_length 0 needs 0"},
      {turn("s", 1300, 1, "[1, 2, 3]", true) + turn("s", 700, 1, "[4, 5, 6]", false),
       "line 2: \"hash_ids\" has 3 ids but input_length 700 needs 2 blocks of 512 tokens (a later "
       "turn lists only its new tokens' ids)"},
      {turn("s", 1300, 1, "[1, 2, 3]", true) + turn("s", 700, 1, many_ids, false),
       "line 2: \"hash_ids\" has 100000 ids"},
  };
  for (const Case& c : refused) {
    INFO(c.text.substr(0, 200));
    auto trace = ParseMultiturn(c.text);
    REQUIRE_FALSE(trace.ok());
    CHECK_THAT(test::Message(trace.status()), Catch::Contains(c.expect));
  }
  // Without hash_ids every line is still accepted (blocks unique to the session).
  REQUIRE(ParseMultiturn(turn("s", 1300, 1, "", true) + turn("s", 700, 1, "", false)).ok());

  // Block-aligned context (no output): a later turn's new full blocks chain
  // its ids, exactly as a first turn (or a Mooncake line) with all the ids.
  auto aligned = ParseMultiturn(turn("x", 1024, 0, "[1, 2]", true) +
                                turn("y", 2048, 0, "[1, 2, 3, 4]", true) +
                                turn("x", 1100, 0, "[3, 4, 5]", false));
  REQUIRE(aligned.ok());
  const TraceTurn& x1 = aligned->turns[aligned->sessions[0].first_turn + 1];
  const TraceTurn& y0 = aligned->turns[aligned->sessions[1].first_turn];
  REQUIRE(x1.input_blocks == 4);
  BlockHash chain = kChainRootHash;
  for (uint64_t k = 0; k < 4; ++k) {
    chain = ChainTraceId(chain, k + 1);
    CHECK(aligned->InputChain(x1)[k] == chain);
    CHECK(aligned->InputChain(y0)[k] == chain);
  }
  auto mooncake = ParseMooncake(MooncakeLine("0", "2124", "0", "[1, 2, 3, 4, 5]") + "\n");
  REQUIRE(mooncake.ok());
  CHECK(std::ranges::equal(mooncake->InputChain(mooncake->turns[0]), aligned->InputChain(x1)));

  // Unaligned context, no output: blocks straddling two lines' blocks get an
  // id derived from what they hold, so equal ids give equal hashes and the
  // first differing id a different one.
  auto straddle = ParseMultiturn(
      turn("p", 1300, 0, "[1, 2, 3]", true) + turn("q", 1300, 0, "[1, 2, 3]", true) +
      turn("r", 1300, 0, "[1, 2, 3]", true) + turn("p", 1300, 0, "[4, 5, 6]", false) +
      turn("q", 1300, 0, "[4, 5, 6]", false) + turn("r", 1300, 0, "[4, 5, 9]", false));
  REQUIRE(straddle.ok());
  const auto second = [&](uint32_t s) {
    return straddle->InputChain(straddle->turns[straddle->sessions[s].first_turn + 1]);
  };
  REQUIRE(second(0).size() == 5);
  CHECK(std::ranges::equal(second(0), second(1)));
  CHECK(std::ranges::equal(second(0).first(4), second(2).first(4)));
  CHECK(second(0)[4] != second(2)[4]);  // holds the head of id 6 vs id 9
  CHECK(second(0)[2] != ChainTraceId(second(0)[1], 3));
  CHECK(second(0)[2] != ChainTraceId(second(0)[1], 4));

  // A previous output (whose tokens no id describes) makes the blocks after
  // it the session's own, whatever ids follow.
  auto with_output = ParseMultiturn(turn("u", 1024, 0, "[1, 2]", true) +
                                    turn("v", 1024, 512, "[1, 2]", true) +
                                    turn("u", 1024, 0, "[3, 4]", false) +
                                    turn("v", 512, 0, "[3]", false));
  REQUIRE(with_output.ok());
  const TraceTurn& u1 = with_output->turns[with_output->sessions[0].first_turn + 1];
  const TraceTurn& v1 = with_output->turns[with_output->sessions[1].first_turn + 1];
  REQUIRE(v1.input_blocks == 4);
  CHECK(with_output->InputChain(u1)[1] == with_output->InputChain(v1)[1]);
  CHECK(with_output->InputChain(v1)[2] ==
        ChainTraceId(with_output->InputChain(v1)[1], SyntheticBlockId(1, 2)));
  // v's new block follows its output block: chained with id 3, but not u's block 3.
  CHECK(with_output->InputChain(v1)[3] == ChainTraceId(with_output->InputChain(v1)[2], 3));
  CHECK(with_output->InputChain(u1)[2] == ChainTraceId(with_output->InputChain(u1)[1], 3));
  CHECK(with_output->InputChain(v1)[3] != with_output->InputChain(u1)[2]);
}

// Issue 10, trace-5: a number and a string session id never name one session.
TEST_CASE("multiturn: a number and a string session id are different sessions",
          "[sim][trace]") {
  auto trace = ParseMultiturn(
      R"({"session_id": 1, "input_length": 10, "output_length": 1, "timestamp": 0})" "\n"
      R"({"session_id": "1", "input_length": 20, "output_length": 1, "timestamp": 5})" "\n"
      R"({"session_id": 1, "input_length": 30, "output_length": 1, "delay": 7})" "\n"
      R"({"session_id": "1", "input_length": 40, "output_length": 1, "delay": 9})" "\n");
  REQUIRE(trace.ok());
  REQUIRE(trace->sessions.size() == 2);
  CHECK(trace->sessions[0].num_turns == 2);
  CHECK(trace->sessions[1].num_turns == 2);
  CHECK(trace->turns[1].line == 3);
  CHECK(trace->turns[1].reusable_tokens == 11);
  CHECK(trace->turns[3].line == 4);
  CHECK(trace->turns[3].reusable_tokens == 21);
  CHECK(trace->turns[2].arrival_s == Approx(0.005));

  // A string id after a number one starts its own session, which needs a timestamp.
  auto string_after_number = ParseMultiturn(
      R"({"session_id": 1, "input_length": 10, "output_length": 1, "timestamp": 0})" "\n"
      R"({"session_id": "1", "input_length": 10, "output_length": 1, "delay": 0})" "\n");
  REQUIRE_FALSE(string_after_number.ok());
  CHECK_THAT(test::Message(string_after_number.status()),
             Catch::Contains("line 2: the first turn of session \"1\" needs a \"timestamp\""));
  auto number_after_string = ParseMultiturn(
      R"({"session_id": "-3", "input_length": 10, "output_length": 1, "timestamp": 0})" "\n"
      R"({"session_id": -3, "input_length": 10, "output_length": 1, "delay": 0})" "\n");
  REQUIRE_FALSE(number_after_string.ok());
  CHECK_THAT(test::Message(number_after_string.status()),
             Catch::Contains("line 2: the first turn of session -3 needs a \"timestamp\""));
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
    const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    REQUIRE_FALSE(json.is_discarded());
    const std::vector<int64_t> ids = json.at("hash_ids").get<std::vector<int64_t>>();
    for (int64_t id : ids) {
      ++blocks;
      hits += seen.contains(id) ? 1 : 0;
    }
    seen.insert(ids.begin(), ids.end());
  }
  CHECK(static_cast<double>(hits) / static_cast<double>(blocks) == Approx(0.366).margin(0.001));
}

}  // namespace
}  // namespace kvc_router::sim
