// kvc_sim/trace.hpp
//
// The workload the simulator replays, and the loaders that build it from
// JSONL trace files.
//
// A `Trace` is a list of sessions, each a list of turns. Every turn knows its
// token counts, its nominal timing (an absolute arrival for open-loop replay
// and a delay after the previous turn for closed-loop replay), how many of
// its leading input tokens are the session's own previous context
// (`reusable_tokens`, the most a session-aware cache can save), and the
// chained block hashes of its input and of the blocks its output completes.
// Hashes live in one arena (`Trace::hashes`); turns of one context share a
// range, so a long agentic session costs its hashes once, not once per turn.
//
// Formats (see data/traces/ and docs/simulator.md):
//  * Mooncake: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
//    (one id per block of `block_tokens`, prefix-identifying; exactly
//    ceil(input_length / block_tokens) of them). There are no session ids;
//    sessions are rebuilt by longest shared prefix: a request whose ids start
//    with ALL of an earlier request's ids (or all but its partial last block)
//    continues it (prefixes are compared whole, never by one id that happens
//    to sit at the right index), unless the shared prefix is a "hub" that
//    already branches into `hub_fanout` or more different next blocks (a
//    shared system prompt). A request continues at most one earlier one, and
//    each request has at most one continuation.
//  * Multi-turn: `session_id`, a string or an integer (7 and "7" are
//    different sessions; both are named "7"); a session's first line has
//    `timestamp` (ms) and its whole prompt; later lines have `delay` (ms after
//    the previous turn finished) and only their NEW tokens. A later line may
//    give a `timestamp` instead of a `delay`: its delay is then the time since
//    the previous turn's arrival, and a timestamp before that arrival is an
//    error. A later prompt is the previous prompt + the previous output + the
//    new tokens.
//    `hash_ids` (optional) describe a line's `input_length` tokens, one id per
//    block of `block_tokens` counted from the first of those tokens, so there
//    are exactly ceil(input_length / block_tokens) of them: on a first turn
//    the prompt's blocks (as in Mooncake), on a later turn the new tokens'
//    blocks. A prompt block that is exactly one of a line's full blocks is
//    chained with that block's id (so when the context before a later turn
//    ends on a block boundary, its new full blocks chain the given ids, as
//    one line with all the ids would); a block made of pieces of several
//    lines' blocks (the context did not end on a boundary) gets an id
//    derived from those pieces (MixedBlockId); a block holding any token no
//    id describes (an output, or a line without `hash_ids`) gets an id unique
//    to the session (SyntheticBlockId), which makes the hash of every later
//    block of the session its own too. A line's last, partial block has no
//    hash of its own: its id only enters the block it is completed into.
//  Times: a `timestamp` or `delay` is at most kMaxTraceTimeMs (1e15 ms, about
//  31,700 years: Unix-epoch milliseconds fit), and so is the arrival a
//  session's delays add up to.
// Each line is one JSON object, parsed with nlohmann-json. Unknown fields are
// ignored, whatever their type (parsed and checked, not stored); a repeated
// key (found through a hash set, so many keys cost linear time) or nesting
// deeper than kMaxJsonDepth is refused. A malformed line is an error naming
// the line (and for invalid JSON the column, for a bad value the field), and
// the loader returns no trace at all then.
// Nothing throws out of the loaders.
//
// Trace ids become router block hashes by chaining: hash_i =
// HashBlock(hash_{i-1}, id_i as two 32-bit words), so equal id prefixes give
// equal hashes and a hash names its whole prefix, as the router expects.
//
//   absl::StatusOr<kvc_router::sim::Trace> trace = kvc_router::sim::LoadTraceFile(
//       "data/traces/mooncake/conversation_trace.jsonl", kvc_router::sim::TraceFormat::kMooncake);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <istream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/block_hash.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::sim {

enum class TraceFormat : uint8_t { kMooncake, kMultiturn, kSynthetic };

inline std::string_view TraceFormatName(TraceFormat format) {
  switch (format) {
    case TraceFormat::kMooncake:
      return "mooncake";
    case TraceFormat::kMultiturn:
      return "multiturn";
    case TraceFormat::kSynthetic:
      return "synthetic";
  }
  return "unknown";
}

// Largest input or output of one line, and largest context of one session,
// in tokens: bounds the memory a hostile trace can make the loader allocate.
inline constexpr uint64_t kMaxTurnTokens = uint64_t{1} << 24;
inline constexpr uint64_t kMaxSessionContextTokens = uint64_t{1} << 26;
// Deepest nesting of arrays/objects inside a line's object. No trace field
// nests; the bound keeps a hostile line from making the loader build an
// arbitrarily deep value.
inline constexpr size_t kMaxJsonDepth = 32;
// Largest timestamp or delay, and latest arrival a multi-turn session's
// delays may add up to, in milliseconds (1e15 ms, about 31,700 years, so
// Unix-epoch timestamps in milliseconds are accepted): keeps
// the nominal clock finite and precise to far below a millisecond. Checked
// as each line's sum accumulates, so no sum of delays overflows.
inline constexpr double kMaxTraceTimeMs = 1e15;

// Chains one trace block id onto `parent`.
inline BlockHash ChainTraceId(BlockHash parent, uint64_t id) {
  const TokenId words[2] = {static_cast<TokenId>(id), static_cast<TokenId>(id >> 32)};
  return HashBlock(parent, std::span<const TokenId>(words, 2));
}

// A block id no trace id can collide with: block `index` of context `segment`.
inline uint64_t SyntheticBlockId(uint64_t segment, uint64_t index) {
  uint64_t z = (segment << 32) ^ index ^ 0xa5a5000000000000ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return (z ^ (z >> 31)) | (uint64_t{1} << 63);
}

struct TraceTurn {
  uint32_t session = 0;    // index into Trace::sessions
  uint32_t turn = 0;       // 0-based within the session
  uint32_t line = 0;       // 1-based source line; generation order for synthetic traces
  uint32_t segment = 0;    // context generation; a new one when the context restarts
  double arrival_s = 0;    // nominal issue time for open-loop replay
  double delay_s = 0;      // closed loop: wait after the previous turn finished
  uint64_t input_tokens = 0;
  uint64_t output_tokens = 0;
  // Leading input tokens that are the session's previous context (same
  // segment): what a worker holding the session's KV does not recompute.
  uint64_t reusable_tokens = 0;
  uint64_t hash_begin = 0;     // this turn's chain starts at Trace::hashes[hash_begin]
  uint32_t prefix_blocks = 0;  // full blocks of the context before this turn's new tokens
  uint32_t input_blocks = 0;   // full blocks of the whole input
  uint32_t output_blocks = 0;  // further blocks completed by the output
};

struct TraceSession {
  std::string name;
  uint32_t first_turn = 0;  // turns of a session are contiguous in Trace::turns
  uint32_t num_turns = 0;
};

struct Trace {
  std::string description;
  TraceFormat format = TraceFormat::kSynthetic;
  uint32_t block_tokens = 512;
  std::vector<BlockHash> hashes;
  std::vector<TraceSession> sessions;
  std::vector<TraceTurn> turns;

  // The router's view of a turn: prefix, append and appended blocks.
  Request MakeRequest(const TraceTurn& t) const {
    Request request;
    request.session = t.session;
    request.turn = t.turn;
    request.prefix_hashes = std::span<const BlockHash>(hashes).subspan(t.hash_begin, t.prefix_blocks);
    request.appended_hashes = std::span<const BlockHash>(hashes).subspan(
        t.hash_begin + t.prefix_blocks, t.input_blocks - t.prefix_blocks);
    request.append_tokens = t.input_tokens - uint64_t{t.prefix_blocks} * block_tokens;
    return request;
  }
  // Full blocks of the input.
  std::span<const BlockHash> InputChain(const TraceTurn& t) const {
    return std::span<const BlockHash>(hashes).subspan(t.hash_begin, t.input_blocks);
  }
  // Input blocks plus the blocks the output completes: what a worker holds
  // for the session once the turn finished.
  std::span<const BlockHash> ContextChain(const TraceTurn& t) const {
    return std::span<const BlockHash>(hashes).subspan(t.hash_begin,
                                                      t.input_blocks + t.output_blocks);
  }

  uint64_t total_input_tokens() const {
    uint64_t total = 0;
    for (const TraceTurn& t : turns) total += t.input_tokens;
    return total;
  }
  uint64_t total_output_tokens() const {
    uint64_t total = 0;
    for (const TraceTurn& t : turns) total += t.output_tokens;
    return total;
  }
  // Nominal span of the open-loop schedule (last minus first arrival).
  double span_s() const {
    if (turns.empty()) return 0;
    double lo = turns.front().arrival_s, hi = lo;
    for (const TraceTurn& t : turns) {
      lo = std::min(lo, t.arrival_s);
      hi = std::max(hi, t.arrival_s);
    }
    return hi - lo;
  }
  // Token-weighted hit rate of a session-aware cache that never evicts:
  // sum(reusable) / sum(input).
  double IdealSessionHitRate() const {
    uint64_t reusable = 0, input = 0;
    for (const TraceTurn& t : turns) {
      reusable += t.reusable_tokens;
      input += t.input_tokens;
    }
    return input == 0 ? 0.0 : static_cast<double>(reusable) / static_cast<double>(input);
  }

  // Checks the invariants every loader and generator must establish.
  absl::Status Validate() const {
    if (block_tokens == 0) return absl::InvalidArgumentError("trace: block_tokens must be >= 1");
    if (turns.empty()) return absl::InvalidArgumentError("trace: no requests");
    uint32_t expected_first = 0;
    for (size_t s = 0; s < sessions.size(); ++s) {
      const TraceSession& session = sessions[s];
      if (session.first_turn != expected_first || session.num_turns == 0) {
        return absl::InternalError(absl::StrCat("trace: session ", s, " has a bad turn range"));
      }
      expected_first += session.num_turns;
      for (uint32_t k = 0; k < session.num_turns; ++k) {
        const TraceTurn& t = turns[session.first_turn + k];
        if (t.session != s || t.turn != k) {
          return absl::InternalError(absl::StrCat("trace: turn ", session.first_turn + k,
                                                  " is not turn ", k, " of session ", s));
        }
        if (t.prefix_blocks > t.input_blocks ||
            uint64_t{t.input_blocks} * block_tokens > t.input_tokens ||
            uint64_t{t.prefix_blocks} * block_tokens > t.reusable_tokens ||
            t.reusable_tokens > t.input_tokens ||
            t.hash_begin + t.input_blocks + t.output_blocks > hashes.size() ||
            (k == 0 && t.reusable_tokens != 0) || !(t.delay_s >= 0) || !(t.arrival_s >= 0) ||
            !std::isfinite(t.delay_s) || !std::isfinite(t.arrival_s)) {
          return absl::InternalError(absl::StrCat("trace: turn ", k, " of session ", s,
                                                  " (line ", t.line, ") is inconsistent"));
        }
      }
    }
    if (expected_first != turns.size()) {
      return absl::InternalError("trace: sessions do not cover every turn");
    }
    return absl::OkStatus();
  }
};

struct TraceOptions {
  // Tokens per trace block (Mooncake: 512).
  uint32_t block_tokens = 512;
  // Mooncake session rebuilding: a prefix that already branches into this
  // many different next blocks is a shared prompt, not a conversation.
  uint32_t hub_fanout = 8;
};

namespace detail {

inline absl::Status LineError(uint64_t line, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", std::string(what)));
}

// nlohmann-json's explanation without its "[json.exception.parse_error.101]
// parse error at line 1, column 8: " preamble: the loaders name the trace's
// line and the column themselves, and nlohmann-json only ever sees one line.
inline std::string JsonErrorReason(const nlohmann::json::exception& e) {
  std::string_view what = e.what();
  if (const size_t end = what.find("] ");
      what.starts_with("[json.exception.") && end != std::string_view::npos) {
    what.remove_prefix(end + 2);
  }
  if (const size_t colon = what.find(": ");
      what.starts_with("parse error") && colon != std::string_view::npos) {
    what.remove_prefix(colon + 2);
  }
  return std::string(what);
}

// Builds one line's value from nlohmann-json's SAX events. json::parse would
// either throw or, without exceptions, lose the position of the error, and it
// reports a number overflow (1e999) as an out_of_range with no position at
// all; the SAX parser hands every error to parse_error() with its byte
// offset, so each malformed line names its column and nothing throws.
// It also refuses what nlohmann-json would quietly accept but a trace line
// must not contain: a key repeated in the line's object (nlohmann-json keeps
// the last one; the line says two things about one field) and nesting deeper
// than kMaxJsonDepth.
// Only the members named in `fields` are kept in the built value; the others
// are parsed and checked just the same (syntax, depth, repeated keys) but not
// stored, so a line full of unknown fields costs no memory beyond its keys.
// The line's keys go into a hash set, so checking for repeats costs O(1) per
// key whatever the object container (a line with 40,000 distinct keys loads
// in milliseconds).
class JsonLineBuilder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit JsonLineBuilder(std::span<const std::string_view> fields) : fields_(fields) {}

  bool null() override { return Add(nullptr); }
  bool boolean(bool value) override { return Add(value); }
  bool number_integer(number_integer_t value) override { return Add(value); }
  bool number_unsigned(number_unsigned_t value) override { return Add(value); }
  bool number_float(number_float_t value, const string_t& /*text*/) override { return Add(value); }
  bool string(string_t& value) override { return Add(std::move(value)); }
  bool binary(binary_t& value) override { return Add(nlohmann::json::binary(std::move(value))); }
  bool start_object(std::size_t /*elements*/) override { return Open(nlohmann::json::object()); }
  bool key(string_t& name) override {
    // Only the line's own object (depth 1 is always it: arrays have no
    // keys): nested values are never read, so their keys cannot make the
    // line ambiguous.
    if (depth_ == 1) {
      if (!keys_.insert(name).second) {
        error_ = absl::StrCat("duplicate key \"", name, "\"");
        return false;
      }
      skipping_ =
          std::find(fields_.begin(), fields_.end(), std::string_view(name)) == fields_.end();
    }
    if (!skipping_) key_ = std::move(name);
    return true;
  }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t /*elements*/) override { return Open(nlohmann::json::array()); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::json::exception& e) override {
    // One line in, so the byte offset is the column.
    error_ = absl::StrCat("column ", position, ": ", JsonErrorReason(e));
    return false;
  }

  nlohmann::json& root() { return root_; }
  const std::string& error() const { return error_; }

 private:
  // Puts `value` into the innermost open container (or makes it the root)
  // and returns where it now lives; nullptr when it nests too deep, and
  // also (with no error) when it belongs to a member that is not kept.
  nlohmann::json* Place(nlohmann::json&& value) {
    if (depth_ > kMaxJsonDepth) {
      error_ = absl::StrCat("nesting deeper than ", kMaxJsonDepth, " levels");
      return nullptr;
    }
    if (skipping_) return nullptr;
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    nlohmann::json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    return &(parent[key_] = std::move(value));
  }
  bool Add(nlohmann::json&& value) { return Place(std::move(value)) != nullptr || error_.empty(); }
  bool Open(nlohmann::json&& container) {
    nlohmann::json* placed = Place(std::move(container));
    if (placed == nullptr && !error_.empty()) return false;
    if (placed != nullptr) open_.push_back(placed);
    ++depth_;
    return true;
  }
  bool Close() {
    // Kept containers are the outermost ones (a skipped member skips all
    // it holds), so the one closing is kept exactly when all open ones are.
    if (open_.size() == depth_) open_.pop_back();
    --depth_;
    return true;
  }

  std::span<const std::string_view> fields_;
  nlohmann::json root_;
  // Kept containers still being filled, outermost first. Nothing is added to
  // a container while a child of it is open, so these pointers stay valid.
  std::vector<nlohmann::json*> open_;
  size_t depth_ = 0;        // containers open, kept or not
  bool skipping_ = false;   // inside a member of the line's object that is not kept
  absl::flat_hash_set<std::string> keys_;  // the line's own keys so far
  std::string key_;  // the key whose value comes next, when open_.back() is an object
  std::string error_;
};

// Parses one trace line into a JSON object holding the members named in
// `fields` (the others are checked and dropped); errors name the line.
inline absl::StatusOr<nlohmann::json> ParseLine(uint64_t line, std::string_view text,
                                                std::span<const std::string_view> fields) {
  JsonLineBuilder builder(fields);
  if (!nlohmann::json::sax_parse(text, &builder)) {
    return LineError(line, builder.error().empty() ? "invalid JSON" : builder.error());
  }
  if (!builder.root().is_object()) {
    const size_t start = text.find_first_not_of(" \t\r\n");
    return LineError(line, absl::StrCat("column ", start == std::string_view::npos ? 1 : start + 1,
                                        ": expected a JSON object"));
  }
  return std::move(builder.root());
}

// The member `key` of a line's object, or nullptr when the line has none.
inline const nlohmann::json* Find(const nlohmann::json& object, std::string_view key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

inline absl::StatusOr<uint64_t> FieldUint(const nlohmann::json& json, std::string_view key,
                                          uint64_t line, uint64_t max_value) {
  const nlohmann::json* value = Find(json, key);
  if (value == nullptr) {
    return LineError(line, absl::StrCat("missing field \"", std::string(key), "\""));
  }
  uint64_t result = 0;
  if (value->is_number_unsigned()) {
    result = value->get<uint64_t>();
  } else if (value->is_number_integer() && value->get<int64_t>() >= 0) {
    // Only "-0": nlohmann-json stores every other non-negative integer as unsigned.
    result = static_cast<uint64_t>(value->get<int64_t>());
  } else if (const double number = value->is_number_float() ? value->get<double>() : -1;
             number >= 0 && number <= 9007199254740992.0 &&
             number == static_cast<double>(static_cast<uint64_t>(number))) {
    // Trace writers that go through a float type print 1024.0 or 1.024e3;
    // only values a double represents exactly (up to 2^53) are trusted.
    result = static_cast<uint64_t>(number);
  } else {
    return LineError(line, absl::StrCat("field \"", std::string(key),
                                        "\" must be a non-negative integer"));
  }
  if (result > max_value) {
    return LineError(line, absl::StrCat("field \"", std::string(key), "\" is ", result,
                                        ", above the limit of ", max_value));
  }
  return result;
}

// A time in milliseconds: a number from 0 to kMaxTraceTimeMs.
inline absl::StatusOr<double> FieldMs(const nlohmann::json& value, std::string_view key,
                                      uint64_t line) {
  if (!value.is_number() || !(value.get<double>() >= 0)) {
    return LineError(line, absl::StrCat("field \"", std::string(key),
                                        "\" must be a non-negative number"));
  }
  const double ms = value.get<double>();
  if (!(ms <= kMaxTraceTimeMs)) {
    return LineError(line, absl::StrCat("field \"", std::string(key), "\" is ", ms,
                                        " ms, above the limit of ", kMaxTraceTimeMs, " ms"));
  }
  return ms;
}

// The ids of an array of non-negative integers; empty when the field is
// absent and not required.
inline absl::StatusOr<std::vector<int64_t>> FieldIds(const nlohmann::json& json,
                                                     std::string_view key, uint64_t line,
                                                     bool required) {
  const nlohmann::json* value = Find(json, key);
  if (value == nullptr) {
    if (required) {
      return LineError(line, absl::StrCat("missing field \"", std::string(key), "\""));
    }
    return std::vector<int64_t>();
  }
  std::vector<int64_t> ids;
  // Ids are kept as int64_t, so larger ones are refused rather than wrapped.
  const auto is_id = [](const nlohmann::json& id) {
    return id.is_number_integer() &&
           !(id.is_number_unsigned() && id.get<uint64_t>() > uint64_t{INT64_MAX});
  };
  if (!value->is_array() || !std::all_of(value->begin(), value->end(), is_id)) {
    return LineError(line, absl::StrCat("field \"", std::string(key),
                                        "\" must be an array of integers"));
  }
  ids.reserve(value->size());
  for (const nlohmann::json& id : *value) {
    ids.push_back(id.get<int64_t>());
    if (ids.back() < 0) {
      return LineError(line, absl::StrCat("field \"", std::string(key),
                                          "\" has a negative id ", ids.back()));
    }
  }
  return ids;
}

// Part of a block of a multi-turn session: `tokens` tokens from `begin` in
// the block a line's hash id `id` describes.
struct BlockPiece {
  uint64_t id;
  uint64_t begin;
  uint64_t tokens;
};

// The id of a block made of several described pieces: a function of the
// pieces only (the chain adds the prefix), with the top bit set, so it is
// never a trace id.
inline uint64_t MixedBlockId(std::span<const BlockPiece> pieces) {
  const auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t z = 0x6d69786564626c6bULL;
  for (const BlockPiece& piece : pieces) {
    z = mix(z ^ piece.id);
    z = mix(z ^ (piece.begin << 32) ^ piece.tokens);
  }
  return z | (uint64_t{1} << 63);
}

// Reads non-blank lines, calling `fn(line_number, text)`; stops at the first error.
template <class Fn>
absl::Status ForEachLine(std::istream& in, Fn&& fn) {
  std::string text;
  uint64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (absl::Status s = fn(line, std::string_view(text)); !s.ok()) return s;
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("read error after line ", line));
  return absl::OkStatus();
}

}  // namespace detail

// Parses a Mooncake JSONL trace and rebuilds its sessions.
inline absl::StatusOr<Trace> ParseMooncakeTrace(std::istream& in, const TraceOptions& options,
                                                std::string description = "mooncake") {
  if (options.block_tokens == 0) {
    return absl::InvalidArgumentError("TraceOptions.block_tokens must be >= 1");
  }
  const uint64_t block = options.block_tokens;
  struct Raw {
    uint32_t line;
    double arrival_s;
    uint64_t input, output;
    uint64_t id_begin;
    uint32_t num_ids;
  };
  std::vector<Raw> raws;
  std::vector<int64_t> ids;
  static constexpr std::string_view kFields[] = {"timestamp", "input_length", "output_length",
                                                 "hash_ids"};
  absl::Status read = detail::ForEachLine(in, [&](uint64_t line, std::string_view text) {
    absl::StatusOr<nlohmann::json> json = detail::ParseLine(line, text, kFields);
    if (!json.ok()) return json.status();
    const nlohmann::json* ts = detail::Find(*json, "timestamp");
    if (ts == nullptr) return detail::LineError(line, "missing field \"timestamp\"");
    absl::StatusOr<double> timestamp_ms = detail::FieldMs(*ts, "timestamp", line);
    if (!timestamp_ms.ok()) return timestamp_ms.status();
    const double arrival = *timestamp_ms * 1e-3;
    absl::StatusOr<uint64_t> input = detail::FieldUint(*json, "input_length", line, kMaxTurnTokens);
    if (!input.ok()) return input.status();
    absl::StatusOr<uint64_t> output = detail::FieldUint(*json, "output_length", line, kMaxTurnTokens);
    if (!output.ok()) return output.status();
    absl::StatusOr<std::vector<int64_t>> hash_ids =
        detail::FieldIds(*json, "hash_ids", line, /*required=*/true);
    if (!hash_ids.ok()) return hash_ids.status();
    const uint64_t expected = (*input + block - 1) / block;
    if (hash_ids->size() != expected) {
      return detail::LineError(
          line, absl::StrCat("\"hash_ids\" has ", hash_ids->size(), " ids but input_length ",
                             *input, " needs ", expected, " blocks of ", block,
                             " tokens (is the block size right?)"));
    }
    if (!raws.empty() && arrival < raws.back().arrival_s) {
      return detail::LineError(line, "timestamps must not decrease");
    }
    if (line > UINT32_MAX) return detail::LineError(line, "too many lines");
    raws.push_back(Raw{static_cast<uint32_t>(line), arrival, *input, *output, ids.size(),
                       static_cast<uint32_t>(hash_ids->size())});
    ids.insert(ids.end(), hash_ids->begin(), hash_ids->end());
    return absl::OkStatus();
  });
  if (!read.ok()) return read;
  if (raws.empty()) return absl::InvalidArgumentError("mooncake trace: no requests");

  // Rebuild sessions. Prefixes are keyed by the chained hash of all their
  // ids, so a match at position i is a match of ids 0..i (checked id by id
  // too, against hash collisions), never of one id that happens to sit at
  // the right index. `ends_with[h]`: the latest request whose ids are the
  // prefix hashed h; `ends_before_partial[h]`: the latest one whose last
  // block is partial and whose ids but the last are that prefix.
  absl::flat_hash_map<BlockHash, uint32_t> ends_with, ends_before_partial;
  // Distinct next ids seen after each prefix, up to hub_fanout of them.
  absl::flat_hash_map<BlockHash, std::vector<int64_t>> children;
  std::vector<uint32_t> predecessor(raws.size(), UINT32_MAX);
  std::vector<uint32_t> matched_blocks(raws.size(), 0);
  std::vector<bool> has_successor(raws.size(), false);
  std::vector<BlockHash> prefix;  // prefix[i]: hash of the current request's ids 0..i
  const size_t fanout = std::max<uint32_t>(options.hub_fanout, 1);
  for (uint32_t r = 0; r < raws.size(); ++r) {
    const Raw& raw = raws[r];
    const int64_t* x = ids.data() + raw.id_begin;
    prefix.clear();
    for (uint32_t j = 0; j < raw.num_ids; ++j) {
      prefix.push_back(ChainTraceId(j == 0 ? kChainRootHash : prefix.back(),
                                    static_cast<uint64_t>(x[j])));
    }
    // Whether request `c` has exactly `num_ids` ids and its first i + 1 are x's.
    const auto shares = [&](uint32_t c, uint32_t num_ids, size_t i) {
      return raws[c].num_ids == num_ids && std::equal(x, x + i + 1, ids.data() + raws[c].id_begin);
    };
    for (int64_t i = static_cast<int64_t>(raw.num_ids) - 1; i >= 0; --i) {
      const BlockHash h = prefix[static_cast<size_t>(i)];
      auto kids = children.find(h);
      if (kids != children.end() && kids->second.size() >= fanout) break;  // a hub
      const auto n = static_cast<uint32_t>(i);
      uint32_t candidate = UINT32_MAX;
      if (auto it = ends_with.find(h); it != ends_with.end() && shares(it->second, n + 1, n)) {
        candidate = it->second;
      } else if (auto jt = ends_before_partial.find(h);
                 jt != ends_before_partial.end() && shares(jt->second, n + 2, n)) {
        candidate = jt->second;
      }
      if (candidate == UINT32_MAX) continue;
      if (!has_successor[candidate]) {
        predecessor[r] = candidate;
        has_successor[candidate] = true;
        // Reusable blocks: the shared ids that were full blocks of the predecessor.
        matched_blocks[r] =
            std::min<uint32_t>(n + 1, static_cast<uint32_t>(raws[candidate].input / block));
      }
      break;
    }
    for (uint32_t j = 0; j + 1 < raw.num_ids; ++j) {
      std::vector<int64_t>& next = children[prefix[j]];
      if (next.size() < fanout && std::find(next.begin(), next.end(), x[j + 1]) == next.end()) {
        next.push_back(x[j + 1]);
      }
    }
    if (raw.num_ids > 0) {
      ends_with[prefix[raw.num_ids - 1]] = r;
      if (raw.input % block != 0 && raw.num_ids >= 2) {
        ends_before_partial[prefix[raw.num_ids - 2]] = r;
      }
    }
  }

  // Sessions in order of their first request; turns grouped by session.
  std::vector<uint32_t> session_of(raws.size());
  std::vector<uint32_t> turn_of(raws.size());
  std::vector<std::vector<uint32_t>> members;
  for (uint32_t r = 0; r < raws.size(); ++r) {
    if (predecessor[r] == UINT32_MAX) {
      session_of[r] = static_cast<uint32_t>(members.size());
      turn_of[r] = 0;
      members.emplace_back();
    } else {
      session_of[r] = session_of[predecessor[r]];
      turn_of[r] = turn_of[predecessor[r]] + 1;
    }
    members[session_of[r]].push_back(r);
  }

  Trace trace;
  trace.description = std::move(description);
  trace.format = TraceFormat::kMooncake;
  trace.block_tokens = options.block_tokens;
  trace.sessions.reserve(members.size());
  trace.turns.reserve(raws.size());
  for (uint32_t s = 0; s < members.size(); ++s) {
    TraceSession session;
    session.name = absl::StrCat("line", raws[members[s].front()].line);
    session.first_turn = static_cast<uint32_t>(trace.turns.size());
    session.num_turns = static_cast<uint32_t>(members[s].size());
    trace.sessions.push_back(std::move(session));
    double previous_arrival = 0;
    for (uint32_t k = 0; k < members[s].size(); ++k) {
      const Raw& raw = raws[members[s][k]];
      TraceTurn t;
      t.session = s;
      t.turn = k;
      t.line = raw.line;
      t.segment = s;
      t.arrival_s = raw.arrival_s;
      t.delay_s = k == 0 ? 0.0 : std::max(0.0, raw.arrival_s - previous_arrival);
      previous_arrival = raw.arrival_s;
      t.input_tokens = raw.input;
      t.output_tokens = raw.output;
      t.input_blocks = static_cast<uint32_t>(raw.input / block);
      t.prefix_blocks = k == 0 ? 0 : std::min(matched_blocks[members[s][k]], t.input_blocks);
      t.reusable_tokens = uint64_t{t.prefix_blocks} * block;
      t.hash_begin = trace.hashes.size();
      BlockHash parent = kChainRootHash;
      for (uint32_t j = 0; j < t.input_blocks; ++j) {
        parent = ChainTraceId(parent, static_cast<uint64_t>(ids[raw.id_begin + j]));
        trace.hashes.push_back(parent);
      }
      trace.turns.push_back(t);
    }
  }
  if (absl::Status s = trace.Validate(); !s.ok()) return s;
  return trace;
}

// Parses the multi-turn JSONL form (session_id, timestamp/delay, new tokens only).
inline absl::StatusOr<Trace> ParseMultiturnTrace(std::istream& in, const TraceOptions& options,
                                                 std::string description = "multiturn") {
  if (options.block_tokens == 0) {
    return absl::InvalidArgumentError("TraceOptions.block_tokens must be >= 1");
  }
  const uint64_t block = options.block_tokens;
  struct Building {
    std::string name;   // the id as written
    std::string label;  // for messages: "7" for a string id, 7 for a number
    std::vector<TraceTurn> turns;
    std::vector<BlockHash> chain;
    // The tokens after the last full block of `chain`: the known pieces, and
    // whether any of them is unknown (output, or input without hash_ids).
    std::vector<detail::BlockPiece> tail;
    uint64_t tail_tokens = 0;
    bool tail_unknown = false;
    uint64_t context = 0;    // tokens of prompt + output so far
    double arrival_ms = 0;   // nominal arrival of the latest turn
  };
  std::vector<Building> sessions;
  // Keyed by the id's type and text, so 7 and "7" are different sessions.
  absl::flat_hash_map<std::string, uint32_t> by_key;

  // Appends `tokens` tokens to the session; `ids` (ceil(tokens / block) of
  // them, in blocks starting at the first of these tokens) describes them,
  // or nullptr when nothing does. Each block the tokens complete is chained:
  // one whole described block keeps its id, a block made of several
  // described pieces gets an id derived from them (MixedBlockId), and a block
  // holding any undescribed token one unique to the session
  // (SyntheticBlockId).
  auto append = [block](Building& b, uint64_t tokens, const std::vector<int64_t>* ids,
                        uint32_t segment) {
    for (uint64_t done = 0; done < tokens;) {
      const uint64_t offset = done % block;  // within the line's own block
      const uint64_t take = std::min({tokens - done, block - offset, block - b.tail_tokens});
      if (ids != nullptr) {
        const auto piece_id = static_cast<uint64_t>((*ids)[done / block]);
        b.tail.push_back(detail::BlockPiece{piece_id, offset, take});
      } else {
        b.tail_unknown = true;
      }
      b.tail_tokens += take;
      done += take;
      if (b.tail_tokens < block) continue;
      const uint64_t j = b.chain.size();
      uint64_t id = 0;
      if (b.tail_unknown) {
        id = SyntheticBlockId(segment, j);
      } else if (b.tail.size() == 1) {  // one whole block of a line: offset 0, `block` tokens
        id = b.tail.front().id;
      } else {
        id = detail::MixedBlockId(b.tail);
      }
      b.chain.push_back(ChainTraceId(b.chain.empty() ? kChainRootHash : b.chain.back(), id));
      b.tail.clear();
      b.tail_tokens = 0;
      b.tail_unknown = false;
    }
  };

  static constexpr std::string_view kFields[] = {"session_id", "input_length", "output_length",
                                                 "hash_ids",   "timestamp",    "delay"};
  uint32_t order = 0;
  absl::Status read = detail::ForEachLine(in, [&](uint64_t line, std::string_view text) {
    absl::StatusOr<nlohmann::json> json = detail::ParseLine(line, text, kFields);
    if (!json.ok()) return json.status();
    const nlohmann::json* sid = detail::Find(*json, "session_id");
    if (sid == nullptr) return detail::LineError(line, "missing field \"session_id\"");
    std::string name;
    if (sid->is_string()) {
      name = sid->get<std::string>();
    } else if (sid->is_number_unsigned()) {
      name = absl::StrCat(sid->get<uint64_t>());
    } else if (sid->is_number_integer()) {
      name = absl::StrCat(sid->get<int64_t>());
    } else {
      return detail::LineError(line, "field \"session_id\" must be a string or an integer");
    }
    const bool numeric = !sid->is_string();
    absl::StatusOr<uint64_t> input = detail::FieldUint(*json, "input_length", line, kMaxTurnTokens);
    if (!input.ok()) return input.status();
    absl::StatusOr<uint64_t> output = detail::FieldUint(*json, "output_length", line, kMaxTurnTokens);
    if (!output.ok()) return output.status();
    absl::StatusOr<std::vector<int64_t>> ids =
        detail::FieldIds(*json, "hash_ids", line, /*required=*/false);
    if (!ids.ok()) return ids.status();
    const bool has_ids = detail::Find(*json, "hash_ids") != nullptr;
    if (line > UINT32_MAX) return detail::LineError(line, "too many lines");

    auto [it, inserted] = by_key.try_emplace(absl::StrCat(numeric ? "n:" : "s:", name),
                                             static_cast<uint32_t>(sessions.size()));
    if (inserted) {
      sessions.emplace_back();
      sessions.back().label = numeric ? name : absl::StrCat("\"", name, "\"");
      sessions.back().name = std::move(name);
    }
    const uint32_t s = it->second;
    Building& b = sessions[s];
    const std::string& label = b.label;
    TraceTurn t;
    t.session = s;
    t.turn = static_cast<uint32_t>(b.turns.size());
    t.line = static_cast<uint32_t>(line);
    t.segment = s;
    t.output_tokens = *output;
    // A line's ids describe its input_length tokens in blocks from the first
    // of them: the whole prompt on a first turn, the new tokens on a later one.
    if (const uint64_t expected = (*input + block - 1) / block;
        has_ids && ids->size() != expected) {
      return detail::LineError(
          line, absl::StrCat("\"hash_ids\" has ", ids->size(), " ids but input_length ", *input,
                             " needs ", expected, " blocks of ", block, " tokens",
                             t.turn == 0 ? " (is the block size right?)"
                                         : " (a later turn lists only its new tokens' ids)"));
    }
    const nlohmann::json* ts = detail::Find(*json, "timestamp");
    const nlohmann::json* delay = detail::Find(*json, "delay");
    double arrival_ms = 0;
    if (t.turn == 0) {
      if (ts == nullptr) {
        return detail::LineError(line, absl::StrCat("the first turn of session ", label,
                                                    " needs a \"timestamp\""));
      }
      absl::StatusOr<double> timestamp_ms = detail::FieldMs(*ts, "timestamp", line);
      if (!timestamp_ms.ok()) return timestamp_ms.status();
      arrival_ms = *timestamp_ms;
      t.arrival_s = *timestamp_ms * 1e-3;
    } else {
      const TraceTurn& prev = b.turns.back();
      if (delay != nullptr) {
        absl::StatusOr<double> d = detail::FieldMs(*delay, "delay", line);
        if (!d.ok()) return d.status();
        arrival_ms = b.arrival_ms + *d;
        if (!(arrival_ms <= kMaxTraceTimeMs)) {
          return detail::LineError(
              line, absl::StrCat("field \"delay\" takes session ", label, " to ", arrival_ms,
                                 " ms, past the limit of ", kMaxTraceTimeMs, " ms"));
        }
        t.delay_s = *d * 1e-3;
      } else if (ts != nullptr) {
        absl::StatusOr<double> timestamp_ms = detail::FieldMs(*ts, "timestamp", line);
        if (!timestamp_ms.ok()) return timestamp_ms.status();
        if (*timestamp_ms < b.arrival_ms) {
          return detail::LineError(
              line, absl::StrCat("field \"timestamp\" is ", *timestamp_ms,
                                 " ms, before the previous turn of session ", label, " (line ",
                                 prev.line, ", at ", b.arrival_ms, " ms)"));
        }
        arrival_ms = *timestamp_ms;
        // Not negative in milliseconds; max() only absorbs rounding in seconds.
        t.delay_s = std::max(0.0, *timestamp_ms * 1e-3 - prev.arrival_s);
      } else {
        return detail::LineError(line, absl::StrCat("a later turn of session ", label,
                                                    " needs a \"delay\""));
      }
      t.arrival_s = prev.arrival_s + t.delay_s;
    }
    // The prompt: everything the session has seen, then the new tokens.
    t.reusable_tokens = b.context;
    t.input_tokens = b.context + *input;
    if (t.input_tokens + *output > kMaxSessionContextTokens) {
      return detail::LineError(line, absl::StrCat("session ", label, " grows past ",
                                                  kMaxSessionContextTokens, " tokens"));
    }
    t.prefix_blocks = static_cast<uint32_t>(b.context / block);
    t.input_blocks = static_cast<uint32_t>(t.input_tokens / block);
    append(b, *input, has_ids ? &*ids : nullptr, s);
    append(b, *output, nullptr, s);
    t.output_blocks = static_cast<uint32_t>((t.input_tokens + *output) / block) - t.input_blocks;
    b.context = t.input_tokens + *output;
    b.arrival_ms = arrival_ms;
    b.turns.push_back(t);
    ++order;
    return absl::OkStatus();
  });
  if (!read.ok()) return read;
  if (order == 0) return absl::InvalidArgumentError("multiturn trace: no requests");

  Trace trace;
  trace.description = std::move(description);
  trace.format = TraceFormat::kMultiturn;
  trace.block_tokens = options.block_tokens;
  for (Building& b : sessions) {
    const uint64_t begin = trace.hashes.size();
    trace.hashes.insert(trace.hashes.end(), b.chain.begin(), b.chain.end());
    TraceSession session;
    session.name = std::move(b.name);
    session.first_turn = static_cast<uint32_t>(trace.turns.size());
    session.num_turns = static_cast<uint32_t>(b.turns.size());
    trace.sessions.push_back(std::move(session));
    for (TraceTurn& t : b.turns) {
      t.hash_begin = begin;
      trace.turns.push_back(t);
    }
  }
  if (absl::Status s = trace.Validate(); !s.ok()) return s;
  return trace;
}

// Opens `path` and parses it; errors are prefixed with the path.
inline absl::StatusOr<Trace> LoadTraceFile(const std::string& path, TraceFormat format,
                                           const TraceOptions& options = {}) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the trace"));
  absl::StatusOr<Trace> trace;
  switch (format) {
    case TraceFormat::kMooncake:
      trace = ParseMooncakeTrace(in, options, path);
      break;
    case TraceFormat::kMultiturn:
      trace = ParseMultiturnTrace(in, options, path);
      break;
    case TraceFormat::kSynthetic:
      return absl::InvalidArgumentError("LoadTraceFile: synthetic traces are generated, not loaded");
  }
  if (!trace.ok()) {
    return absl::Status(trace.status().code(),
                        absl::StrCat(path, ": ", trace.status().message()));
  }
  return trace;
}

}  // namespace kvc_router::sim
