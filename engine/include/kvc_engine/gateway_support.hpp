// kvc_engine/gateway_support.hpp
//
// Pieces of an OpenAI-style gateway in front of kvc_router, used by the
// example gateway (engine/tools/kvc_gateway.cpp) and reusable by others:
//
//  * `Tokenizer`: the gateway hashes token ids, so it needs the engines'
//    tokenizer. `ByteTokenizer` (one token per byte) keeps the example
//    self-contained; plug in a real one by implementing `Encode`/`Decode`
//    (e.g. over the Hugging Face `tokenizers` C bindings or SentencePiece)
//    - the router only requires that the gateway and the engines cut the
//    same text into the same ids.
//  * `RenderChat`: a deterministic chat template over OpenAI `messages` (and
//    `tools`: text parts, tool calls and tool results as agents send them),
//    so turn t+1's prompt starts with turn t's prompt plus its answer (what
//    makes the prefix reusable). Real deployments use the model's template.
//    `FinishReason`: "stop" or "length" for an answer.
//  * `CompletionEventStream`: a completion relayed to a "stream": true client
//    in OpenAI's server-sent-event format as the tokens come;
//    `CompleteUtf8Prefix`: how much of its decoded bytes can go out now, when
//    a token may end inside a character.
//  * `ConversationTable`: the per-session conversations a gateway keeps,
//    bounded by count and idle time.
//  * `GatewayMetrics`: counters and a histogram in the Prometheus text
//    exposition format (decisions by mode, rejections by reason, admission
//    attempts and their latency, requests, in-flight per worker).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "kvc_router/types.hpp"

namespace kvc_router::engine {

// Decode must be deterministic, and the decode of a token sequence must
// extend the decode of its prefixes once they end in a whole character
// (what streaming relies on: CompletionEventStream).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<TokenId> Encode(std::string_view text) const = 0;
  virtual std::string Decode(std::span<const TokenId> tokens) const = 0;
};

// The length of the longest prefix of `bytes` that does not end inside a
// UTF-8 sequence: a gateway relaying decoded tokens as they stream holds the
// rest back until the next token completes it. Bytes that cannot start or
// continue a sequence count as whole (the JSON writer replaces them).
inline size_t CompleteUtf8Prefix(std::string_view bytes) {
  const size_t n = bytes.size();
  // A sequence is at most 4 bytes: its lead byte is at most 3 back.
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    if (c >= 0xF8) return n;           // no sequence starts with it
    const size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return length > back ? n - back : n;
  }
  return n;
}

// `value` as JSON text for a client: bytes that are not UTF-8 (a tokenizer
// may decode any) are replaced, never thrown on.
inline std::string DumpForClient(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One token per byte (ids 0..255).
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<TokenId> Encode(std::string_view text) const override {
    std::vector<TokenId> out;
    out.reserve(text.size());
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::string Decode(std::span<const TokenId> tokens) const override {
    std::string out;
    out.reserve(tokens.size());
    for (TokenId t : tokens) out.push_back(static_cast<char>(t & 0xff));
    return out;
  }
};

// OpenAI's finish_reason for an answer of `output_tokens` under a limit of
// `max_tokens`: "length" when it used them all, else "stop" (it ended on
// its own).
inline const char* FinishReason(size_t output_tokens, uint32_t max_tokens) {
  return output_tokens >= max_tokens ? "length" : "stop";
}

// One completion answered as OpenAI's server-sent events ("stream": true),
// written through `write` as the tokens come:
//   data: {"id", "object", "model", "choices": [{"index": 0, "text" | "delta", "finish_reason": null}]}
//   ... one chunk per batch of tokens that completes at least one character
//   data: {... "finish_reason": "stop" | "length"}], "usage", plus the fields of `extra`}
//   data: [DONE]
// `object` is "text_completion" (completions) or "chat.completion.chunk"
// (chat, whose first delta carries "role": "assistant"). A failure is
//   data: {"error": {"message", "code", "retry_after_s"?}}  then  data: [DONE]
// Text goes out the way incremental detokenizers (vLLM's, TGI's) do it:
// the tokens not sent yet are decoded after the last batch that was sent,
// and the new text goes out only when it extends that batch's text and ends
// in a whole character (not inside a UTF-8 sequence, not in the U+FFFD a
// tokenizer renders a partial character as). Otherwise the tokens wait for
// the next batch, or for Done, which sends what is left. So a tokenizer
// that renders a token by its neighbour (a leading space) or decodes byte
// tokens streams the text it decodes whole. After Done or Fail the stream
// is over and further calls write nothing; once `write` returns false (the
// client went away) nothing more is written either, and `connected()` says
// so. While the turn waits to start, KeepAlive sends comments (": ...")
// that clients skip.
class CompletionEventStream {
 public:
  struct Shape {
    std::string id;     // "cmpl-..." or "chatcmpl-..."
    bool chat = false;  // chat.completion.chunk with deltas, else text_completion
    std::string model;
    // The request's max_tokens: a shorter answer finished with "stop"
    // (FinishReason); 0 reports "length" always.
    uint32_t max_tokens = 0;
  };

  CompletionEventStream(Shape shape, const Tokenizer& tokenizer,
                        std::function<bool(std::string_view)> write)
      : shape_(std::move(shape)), tokenizer_(tokenizer), write_(std::move(write)) {}

  // New tokens of the answer, in order.
  void Tokens(std::span<const TokenId> tokens) {
    if (finished_ || tokens.empty()) return;
    relayed_ += tokens.size();
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    SendDecoded(/*at_end=*/false);
  }

  // The whole answer: `output` is every token (those never passed to Tokens
  // are sent now), `usage` OpenAI's usage object, `extra` more fields for
  // the last chunk.
  void Done(std::span<const TokenId> output, nlohmann::json usage, nlohmann::json extra) {
    if (finished_) return;
    if (relayed_ < output.size()) Tokens(output.subspan(relayed_));
    SendDecoded(/*at_end=*/true);
    if (!sent_text_) Text(std::string());
    nlohmann::json end = {{"index", 0},
                          {"finish_reason", FinishReason(output.size(), shape_.max_tokens)}};
    if (shape_.chat) {
      end["delta"] = nlohmann::json::object();
    } else {
      end["text"] = "";
    }
    nlohmann::json last = Chunk(std::move(end));
    last["usage"] = std::move(usage);
    if (extra.is_object()) {
      for (auto& [key, value] : extra.items()) last[key] = std::move(value);
    }
    Event(last);
    Raw("data: [DONE]\n\n");
    finished_ = true;
  }

  // The turn failed after the stream began; `retry`: the client may try
  // again in a second (what a JSON answer's Retry-After says).
  void Fail(int status, std::string_view message, bool retry) {
    if (finished_) return;
    nlohmann::json error = {{"message", std::string(message)}, {"code", status}};
    if (retry) error["retry_after_s"] = 1;
    Event(nlohmann::json{{"error", std::move(error)}});
    Raw("data: [DONE]\n\n");
    finished_ = true;
  }

  // An SSE comment (clients skip it) while the answer has not begun: keeps
  // an idle connection alive and tells whether the client is still there
  // (false once a write failed; a client that just left may take one more
  // comment to notice).
  bool KeepAlive(std::string_view note) {
    if (!finished_) Raw(": " + std::string(note) + "\n\n");
    return connected_;
  }

  bool connected() const { return connected_; }
  bool finished() const { return finished_; }

 private:
  // Sends the text of the tokens after read_offset_, decoded after those
  // from prefix_offset_ (the batch sent last), when it is whole or `at_end`.
  void SendDecoded(bool at_end) {
    const std::span<const TokenId> all(tokens_);
    const std::string before = tokenizer_.Decode(all.subspan(0, read_offset_));
    const std::string after = tokenizer_.Decode(all);
    const bool extends = after.size() > before.size() && after.compare(0, before.size(), before) == 0;
    const bool whole = CompleteUtf8Prefix(after) == after.size() &&
                       !(after.size() >= 3 && after.compare(after.size() - 3, 3, "\xEF\xBF\xBD") == 0);
    // At the end what is left goes out as it is (by length, should the
    // last tokens have rewritten the text before them).
    if (!(extends && whole) && !(at_end && after.size() > before.size())) return;
    Text(after.substr(before.size()));
    // The batch just sent is the next one's context.
    tokens_.erase(tokens_.begin(), tokens_.begin() + static_cast<std::ptrdiff_t>(read_offset_));
    read_offset_ = tokens_.size();
  }

  nlohmann::json Chunk(nlohmann::json choice) const {
    return {{"id", shape_.id},
            {"object", shape_.chat ? "chat.completion.chunk" : "text_completion"},
            {"model", shape_.model},
            {"choices", nlohmann::json::array({std::move(choice)})}};
  }
  void Text(std::string text) {
    nlohmann::json choice = {{"index", 0}, {"finish_reason", nullptr}};
    if (shape_.chat) {
      choice["delta"] = {{"content", std::move(text)}};
      if (!sent_text_) choice["delta"]["role"] = "assistant";
    } else {
      choice["text"] = std::move(text);
    }
    sent_text_ = true;
    Event(Chunk(std::move(choice)));
  }
  void Event(const nlohmann::json& event) {
    Raw(absl::StrCat("data: ", DumpForClient(event), "\n\n"));
  }
  void Raw(std::string_view bytes) {
    if (connected_) connected_ = write_(bytes);
  }

  Shape shape_;
  const Tokenizer& tokenizer_;
  std::function<bool(std::string_view)> write_;
  // The batch sent last (tokens_[0, read_offset_)), then tokens not sent yet.
  std::vector<TokenId> tokens_;
  size_t read_offset_ = 0;
  size_t relayed_ = 0;
  bool sent_text_ = false;
  bool connected_ = true;
  bool finished_ = false;
};


// The text of a message's "content" as chat clients send it: a string,
// null or absent (an assistant message that only calls tools), or an array
// of parts of which only {"type": "text", "text": ...} carry text here.
inline absl::StatusOr<std::string> ChatContentText(const nlohmann::json& message, size_t index) {
  const auto it = message.find("content");
  if (it == message.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "messages[", index, "].content must be a string, null or an array of parts, got ",
        it->type_name()));
  }
  std::string text;
  for (size_t j = 0; j < it->size(); ++j) {
    const nlohmann::json& part = (*it)[j];
    const auto type = part.is_object() ? part.find("type") : part.end();
    if (type == part.end() || !type->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", index, "].content[", j, "] needs a string \"type\""));
    }
    if (*type != "text") {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", index, "].content[", j, "]: only \"text\" parts are supported, got \"",
          type->get<std::string>(), "\""));
    }
    const auto part_text = part.find("text");
    if (part_text == part.end() || !part_text->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", index, "].content[", j, "] needs a string \"text\""));
    }
    text += part_text->get<std::string>();
  }
  return text;
}

// A deterministic chat template: the request's "tools" (if any) as
// "<|tools|>" + their JSON + "\n", then "<|role|>content\n" per message (an
// assistant message's "tool_calls" follow its content as "<|tool_calls|>" +
// their JSON; a tool result is "<|tool|>" + its content), then
// "<|assistant|>" to prompt the answer. An assistant message renders as the
// answer it was plus "\n", so a conversation's next prompt extends the
// previous prompt and answer, tool definitions included, which is what
// coding agents' long shared prefixes need. JSON is dumped with sorted keys,
// so the same tools give the same text whatever order the client wrote.
inline absl::StatusOr<std::string> RenderChat(const nlohmann::json& messages,
                                              const nlohmann::json& tools = nullptr) {
  if (!messages.is_array() || messages.empty()) {
    return absl::InvalidArgumentError("\"messages\" must be a non-empty array");
  }
  std::string out;
  if (!tools.is_null()) {
    if (!tools.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"tools\" must be an array, got ", tools.type_name()));
    }
    if (!tools.empty()) absl::StrAppend(&out, "<|tools|>", tools.dump(), "\n");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "] needs a string \"role\""));
    }
    absl::StatusOr<std::string> content = ChatContentText(m, i);
    if (!content.ok()) return content.status();
    absl::StrAppend(&out, "<|", m["role"].get<std::string>(), "|>", *content);
    if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!calls->is_array()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "messages[", i, "].tool_calls must be an array, got ", calls->type_name()));
      }
      absl::StrAppend(&out, "<|tool_calls|>", calls->dump());
    }
    out += "\n";
  }
  // The answer follows the assistant tag directly; RenderChat of the next
  // turn renders it as "<|assistant|>" + answer + "\n".
  out += "<|assistant|>";
  return out;
}

class GatewayMetrics {
 public:
  static constexpr std::array<double, 12> kLatencyBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5};

  void Decision(DecisionMode mode) {
    absl::MutexLock lock(&mu_);
    ++decisions_[static_cast<size_t>(mode)];
  }
  void Rejection(RejectReason reason) {
    absl::MutexLock lock(&mu_);
    ++rejections_[static_cast<size_t>(reason)];
  }
  void AdmissionAttempt(double seconds) {
    absl::MutexLock lock(&mu_);
    ++attempts_;
    latency_sum_ += seconds;
    for (size_t i = 0; i < kLatencyBuckets.size(); ++i) {
      if (seconds <= kLatencyBuckets[i]) ++latency_buckets_[i];
    }
  }
  void Request(bool ok) {
    absl::MutexLock lock(&mu_);
    ++(ok ? requests_ok_ : requests_failed_);
  }

  // The exposition text; `inflight` is RoutingState::inflight per decode
  // worker, `extra` more lines (already formatted) appended at the end.
  std::string Render(std::span<const uint64_t> inflight, std::string_view extra = {}) const {
    absl::MutexLock lock(&mu_);
    std::string out;
    out += "# HELP kvc_decisions_total Requests placed, by decision mode.\n";
    out += "# TYPE kvc_decisions_total counter\n";
    for (int m = 0; m < kNumDecisionModes; ++m) {
      absl::StrAppend(&out, "kvc_decisions_total{mode=\"",
                      std::string(DecisionModeName(static_cast<DecisionMode>(m))), "\"} ", decisions_[m], "\n");
    }
    out += "# HELP kvc_admission_rejections_total Admission answers that refused, by reason.\n";
    out += "# TYPE kvc_admission_rejections_total counter\n";
    for (int r = 1; r < kNumRejectReasons; ++r) {
      absl::StrAppend(&out, "kvc_admission_rejections_total{reason=\"",
                      std::string(RejectReasonName(static_cast<RejectReason>(r))), "\"} ", rejections_[r],
                      "\n");
    }
    out += "# HELP kvc_admission_attempts_total Admission RPCs sent to decode workers.\n";
    out += "# TYPE kvc_admission_attempts_total counter\n";
    absl::StrAppend(&out, "kvc_admission_attempts_total ", attempts_, "\n");
    out += "# HELP kvc_admission_latency_seconds Admission RPC round trip.\n";
    out += "# TYPE kvc_admission_latency_seconds histogram\n";
    for (size_t i = 0; i < kLatencyBuckets.size(); ++i) {
      absl::StrAppend(&out, "kvc_admission_latency_seconds_bucket{le=\"",
                      absl::StrFormat("%g", kLatencyBuckets[i]), "\"} ", latency_buckets_[i],
                      "\n");
    }
    absl::StrAppend(&out, "kvc_admission_latency_seconds_bucket{le=\"+Inf\"} ", attempts_, "\n");
    absl::StrAppend(&out, "kvc_admission_latency_seconds_sum ",
                    absl::StrFormat("%.9g", latency_sum_), "\n");
    absl::StrAppend(&out, "kvc_admission_latency_seconds_count ", attempts_, "\n");
    out += "# HELP kvc_requests_total Gateway requests finished, by status.\n";
    out += "# TYPE kvc_requests_total counter\n";
    absl::StrAppend(&out, "kvc_requests_total{status=\"ok\"} ", requests_ok_, "\n");
    absl::StrAppend(&out, "kvc_requests_total{status=\"error\"} ", requests_failed_, "\n");
    out += "# HELP kvc_inflight_requests Requests placed and not completed, per decode worker.\n";
    out += "# TYPE kvc_inflight_requests gauge\n";
    for (size_t d = 0; d < inflight.size(); ++d) {
      absl::StrAppend(&out, "kvc_inflight_requests{worker=\"", d, "\"} ", inflight[d], "\n");
    }
    out.append(extra.data(), extra.size());
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::array<uint64_t, kNumDecisionModes> decisions_{};
  std::array<uint64_t, kNumRejectReasons> rejections_{};
  std::array<uint64_t, kLatencyBuckets.size()> latency_buckets_{};
  uint64_t attempts_ = 0;
  double latency_sum_ = 0.0;
  uint64_t requests_ok_ = 0;
  uint64_t requests_failed_ = 0;
};

// The conversations a gateway keeps (per session: its hash chain and last
// prompt + answer, so the next turn hashes only what it appends), bounded so
// a gateway whose clients never close their sessions does not grow without
// end. `State` needs an `absl::Mutex mu` (held by a turn while it runs) and a
// `bool closed` (set under `mu` when the table forgets it: whoever locks a
// closed state looks it up again and gets a fresh one). A state not used
// for `ttl_s`, and past `max_sessions` the least recently used ones, are
// forgotten; one whose `mu` is held (a turn running or waiting) never is.
// Forgetting costs that session's next turn a fresh hash chain (a prompt
// hashed whole) and the gateway the list of instances that served it (a
// close then reaches the one the policy has it bound to). Thread-safe.
//
//   auto table = ConversationTable<SessionState>::Create({.max_sessions = 10000, .ttl_s = 3600});
//   std::shared_ptr<SessionState> s = (*table)->FindOrCreate(session);
template <typename State>
class ConversationTable {
 public:
  struct Options {
    size_t max_sessions = 10000;  // at least 1
    double ttl_s = 3600;          // > 0; infinity: never forgotten for idleness
  };
  using Clock = std::function<double()>;  // seconds, monotonic

  // InvalidArgument naming the option when `options` cannot bound anything
  // (no room for the session being created, or a TTL that forgets every
  // state at once or compares false with every age).
  static absl::StatusOr<std::unique_ptr<ConversationTable>> Create(Options options,
                                                                   Clock clock = nullptr) {
    if (options.max_sessions == 0) {
      return absl::InvalidArgumentError(
          "ConversationTable: max_sessions must be at least 1 (the session a turn creates "
          "needs room)");
    }
    if (!(options.ttl_s > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ConversationTable: ttl_s must be positive (infinity keeps idle states), got ",
          options.ttl_s));
    }
    return std::unique_ptr<ConversationTable>(new ConversationTable(options, std::move(clock)));
  }

  std::shared_ptr<State> Find(SessionId session) const {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(session);
    return it == entries_.end() ? nullptr : it->second.state;
  }

  // The session's state, created if it has none; marks it used now.
  std::shared_ptr<State> FindOrCreate(SessionId session) {
    const double now = clock_();
    absl::MutexLock lock(&mu_);
    Entry& entry = entries_[session];
    entry.last_used_s = now;
    if (entry.state != nullptr) return entry.state;
    entry.state = std::make_shared<State>();
    std::shared_ptr<State> created = entry.state;
    if (entries_.size() > options_.max_sessions) {
      // Down to 90% of the bound, so the sort is paid once per many new sessions.
      Forget(session, now, options_.max_sessions - options_.max_sessions / 10);
    } else if (now - last_sweep_s_ >= options_.ttl_s / 8) {
      Forget(session, now, entries_.size());
    }
    return created;
  }

  // Forgets `session` if its state is still `state` (not one created since).
  void Erase(SessionId session, const std::shared_ptr<State>& state) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(session);
    if (it != entries_.end() && it->second.state == state) entries_.erase(it);
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return entries_.size();
  }
  // States forgotten for idleness or the bound (not Erase).
  uint64_t forgotten() const {
    absl::MutexLock lock(&mu_);
    return forgotten_;
  }

 private:
  struct Entry {
    std::shared_ptr<State> state;
    double last_used_s = 0;
  };

  ConversationTable(Options options, Clock clock) : options_(options), clock_(std::move(clock)) {
    if (clock_ == nullptr) {
      const auto start = std::chrono::steady_clock::now();
      clock_ = [start] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      };
    }
  }

  // Forgets idle states past the TTL, then the least recently used beyond
  // `keep`, never `current` nor a state in use.
  void Forget(SessionId current, double now, size_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_sweep_s_ = now;
    std::vector<std::pair<double, SessionId>> by_age;
    by_age.reserve(entries_.size());
    for (const auto& [session, entry] : entries_) {
      if (session != current) by_age.emplace_back(entry.last_used_s, session);
    }
    std::sort(by_age.begin(), by_age.end());
    for (const auto& [last_used_s, session] : by_age) {
      const bool expired = now - last_used_s >= options_.ttl_s;
      if (!expired && entries_.size() <= keep) break;
      auto it = entries_.find(session);
      State& state = *it->second.state;
      if (!state.mu.TryLock()) continue;  // a turn holds it
      state.closed = true;
      state.mu.Unlock();
      entries_.erase(it);
      ++forgotten_;
    }
  }

  const Options options_;
  Clock clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<SessionId, Entry> entries_ ABSL_GUARDED_BY(mu_);
  double last_sweep_s_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t forgotten_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvc_router::engine
