// Tests of the JSONL line parser (kvc_router/sim/json_line.hpp): the JSON it
// accepts, the errors it names, and a fuzz-style property: random byte
// mutations of valid trace lines never crash and either parse or fail cleanly.
#include "kvc_router/sim/json_line.hpp"

#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kvc_router/sim/synthetic.hpp"
#include "kvc_router/sim/trace.hpp"
#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

using Kind = JsonValue::Kind;

// A loader error names the line, or says the input had no request at all.
bool NamesTheLine(const std::string& message) {
  return message.find("line 1:") != std::string::npos ||
         message.find("no requests") != std::string::npos;
}

TEST_CASE("json line: flat objects with numbers, strings and integer arrays", "[sim][json]") {
  auto line = JsonLine::Parse(
      R"({"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 1e0]})");
  // 1e0 is a number but not an integer literal: the array is kept as "other".
  REQUIRE(line.ok());
  CHECK(line->Find("timestamp")->kind == Kind::kNumber);
  CHECK(line->Find("timestamp")->is_integer);
  CHECK(line->Find("timestamp")->integer == 27482);
  CHECK(line->Find("hash_ids")->kind == Kind::kOther);

  line = JsonLine::Parse(
      "  {\"session_id\":\"a\\u00e9\\n\",\"delay\":250.5,\"hash_ids\":[1,-2,3],\"x\":{\"y\":[true,null]}}\r");
  REQUIRE(line.ok());
  CHECK(line->Find("session_id")->string == "a\xc3\xa9\n");
  CHECK(line->Find("delay")->number == 250.5);
  CHECK_FALSE(line->Find("delay")->is_integer);
  CHECK(line->Find("hash_ids")->integers == std::vector<int64_t>{1, -2, 3});
  CHECK(line->Find("x")->kind == Kind::kOther);
  CHECK(line->Find("missing") == nullptr);

  line = JsonLine::Parse(R"({"empty": [], "b": false, "n": null, "s": "\ud83d\ude00"})");
  REQUIRE(line.ok());
  CHECK(line->Find("empty")->kind == Kind::kIntArray);
  CHECK(line->Find("empty")->integers.empty());
  CHECK(line->Find("b")->kind == Kind::kBool);
  CHECK(line->Find("n")->kind == Kind::kNull);
  CHECK(line->Find("s")->string == "\xf0\x9f\x98\x80");
  CHECK(JsonLine::Parse("{}").ok());
}

TEST_CASE("json line: malformed input is an error naming the column", "[sim][json]") {
  const std::vector<std::string> bad = {
      "",
      "[1, 2]",
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
      "{\"a\": 1, \"a\": 2}",
      "{\"a\": 1e999}",
      "{\"a\": \"tab\there\"}",
  };
  for (const std::string& text : bad) {
    INFO(text);
    auto line = JsonLine::Parse(text);
    REQUIRE_FALSE(line.ok());
    CHECK(test::Message(line.status()).find("column ") == 0);
  }
  // Deep nesting is bounded, not recursive without limit.
  std::string deep = "{\"a\": ";
  for (int i = 0; i < 10000; ++i) deep += "[";
  deep += "}";
  CHECK_FALSE(JsonLine::Parse(deep).ok());
}

TEST_CASE("json line: random mutations of valid lines never crash", "[sim][json][property]") {
  const std::vector<std::string> seeds_lines = {
      R"({"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]})",
      R"({"session_id":"a","input_length":700,"output_length":80,"hash_ids":[4,5],"delay":250.0})",
      R"({"session_id":7,"input_length":1100,"output_length":50,"hash_ids":[1,2,7],"timestamp":10.0,"group_id":{"k":["x",1.5,null]}})",
  };
  const uint64_t seed = test::PropertySeed();
  INFO("seed " << seed << " (KVC_ROUTER_SEED overrides)");
  SimRng rng(seed);
  const std::string alphabet = "{}[]:,\"\\-+.eE0123456789 tfnulrsa\x01\xff";
  const uint32_t scenarios = std::max<uint32_t>(200, test::PropertyScenarios());
  uint64_t parsed = 0, refused = 0;
  for (uint32_t i = 0; i < scenarios; ++i) {
    std::string text = seeds_lines[rng.Next() % seeds_lines.size()];
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
    auto line = JsonLine::Parse(text);
    if (line.ok()) {
      ++parsed;
    } else {
      ++refused;
      REQUIRE(line.status().code() == absl::StatusCode::kInvalidArgument);
    }
    // The trace loaders on the same line: a trace or an error naming line 1.
    std::istringstream mooncake(text);
    auto m = ParseMooncakeTrace(mooncake, TraceOptions{});
    if (!m.ok()) CHECK(NamesTheLine(test::Message(m.status())));
    std::istringstream multiturn(text);
    auto t = ParseMultiturnTrace(multiturn, TraceOptions{});
    if (!t.ok()) CHECK(NamesTheLine(test::Message(t.status())));
  }
  CHECK(parsed + refused == scenarios);
  CHECK(refused > 0);
}

}  // namespace
}  // namespace kvc_router::sim
