// kvc_engine/http_transport.hpp
//
// A WorkerTransport (kvc_router/concepts.hpp) over HTTP/JSON with
// cpp-httplib, for decode and prefill workers that expose the KVC seed's
// admission RPC and a few generate calls (the worker emulator,
// engine/tools/kvc_worker_emulator.cpp, implements them; a patched SGLang
// scheduler answers the first):
//
//   POST {decode}/admit_direct_append
//        {"session_id", "turn", "append_tokens", "input_tokens"}
//     -> {"can_admit": bool, "mode": "direct"|"seed"|"reseed",
//         "reason": "real-large-append"|..., "room_tokens"?: n}
//   POST {decode}/generate     {"session_id", "turn", "mode", ...payload}
//        mode "direct": append-prefill and decode on the worker holding the KV;
//        mode "decode": decode after the KV arrived from a prefill worker;
//        mode "fallback": plain P/D, no residency kept.
//   POST {prefill}/prefill     {"session_id", "turn", ...payload}
//   POST {decode}/receive_kv   {"session_id", "turn", "prefill", ...payload}
//
// Colocated instances (the affinity policies, `ear`; give their URLs as
// `decode_urls`) keep each session's KV in their own cache; a gateway calls
//   POST {instance}/generate      {"session_id", "turn", "mode": "cache", ...payload}
//   POST {target}/migrate_kv      {"session_id", "from": "{source URL}"}
//        the target pulls the session's KV from the source (the emulator's
//        stand-in for a KV connector such as Mooncake's transfer engine);
//   POST {instance}/close_session {"session_id"}   (SGLang's route of that name)
// An instance that joins at runtime gets the next id from `AddDecodeUrl`.
//
// `...payload` is what the caller attaches to the request with `Attach`
// (prompt token ids, max_tokens, sampling settings): the router's Request
// carries only hashes and counts. The JSON answer of the last generate call
// is handed back through the same attachment.
//
// First token: an attachment made with an `on_first_token` callback asks
// the generate call to stream ("stream": true) and reads the answer as
// server-sent events (any of the SSE format's line endings), a JSON object
// in each event's data, `[DONE]` allowed last: the callback runs once, on
// the first event (the prefill is done then; a LoadLedger ticket's
// FirstToken belongs there), and the answer is the last event carrying
// "output_token_ids". A worker that ignores "stream" and answers plain JSON
// still works: the callback then runs when it arrives. An exception thrown
// by the callback ends the call and reaches the caller unchanged.
//
// Tokens as they come: an attachment made with `StreamCallbacks::on_tokens`
// also streams, and hands the callback each event's "token_ids" (the new
// tokens, in order) as it arrives, so a gateway can relay text to its client
// while the instance still decodes. The deliveries add up to the answer's
// "output_token_ids": tokens the events did not carry are delivered once
// the answer arrives (all of them, in one delivery, from a worker that
// answers plain JSON), and events that disagree with the answer make the
// call worker-unavailable.
//
// Errors: a connection failure, a timeout or an HTTP status other than 200
// on the admission RPC is returned as UnavailableError("worker-unavailable:
// ..."), which Dispatch counts as a `worker-unavailable` rejection; a bad
// answer (not JSON, unknown mode or reason) is also worker-unavailable. A
// generate call that fails returns UnavailableError too, so the gateway can
// report it; the router releases what it took either way. `NoAnswer(status)`
// tells the failures where the worker never answered (connection refused or
// reset, timeout: what a circuit breaker counts, LoadLedger's among them)
// from answers that were refused or malformed. Thread-safe: every call uses
// its own connection.
//
//   auto transport = kvc_router::engine::HttpWorkerTransport::Create(
//       {.decode_urls = {"http://10.0.0.7:30001"}, .prefill_urls = {"http://10.0.0.6:30000"}});
//   auto attachment = (*transport)->Attach(session, {{"token_ids", tokens}, {"max_tokens", 64}});
//   absl::StatusOr<Decision> decision = kvc_router::Dispatch(*state, request, **transport);
//   nlohmann::json answer = attachment.response();
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvc_router/concepts.hpp"
#include "kvc_router/config.hpp"
#include "kvc_router/types.hpp"

namespace kvc_router::engine {

// "direct" -> kDirect, ...; nullopt for anything else.
inline std::optional<DecisionMode> ParseDecisionMode(std::string_view name) {
  for (DecisionMode mode : {DecisionMode::kDirect, DecisionMode::kSeed, DecisionMode::kReseed,
                            DecisionMode::kFallback}) {
    if (DecisionModeName(mode) == name) return mode;
  }
  return std::nullopt;
}
inline std::optional<RejectReason> ParseRejectReason(std::string_view name) {
  for (int r = 0; r < kNumRejectReasons; ++r) {
    const auto reason = static_cast<RejectReason>(r);
    if (RejectReasonName(reason) == name) return reason;
  }
  return std::nullopt;
}

// The admission RPC bodies, shared by the transport and the emulator.
inline nlohmann::json AdmitQueryToJson(const AdmitQuery& query) {
  return {{"session_id", query.session},
          {"turn", query.turn},
          {"append_tokens", query.append_tokens},
          {"input_tokens", query.input_tokens}};
}
inline absl::StatusOr<AdmitQuery> AdmitQueryFromJson(const nlohmann::json& body) {
  if (!body.is_object()) return absl::InvalidArgumentError("admission query: not a JSON object");
  for (const char* key : {"session_id", "turn", "append_tokens", "input_tokens"}) {
    if (!body.contains(key) || !body[key].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat("admission query: \"", key, "\" must be a non-negative integer"));
    }
  }
  AdmitQuery query;
  query.session = body["session_id"].get<uint64_t>();
  query.turn = static_cast<uint32_t>(body["turn"].get<uint64_t>());
  query.append_tokens = body["append_tokens"].get<uint64_t>();
  query.input_tokens = body["input_tokens"].get<uint64_t>();
  return query;
}
inline nlohmann::json AdmitResultToJson(const AdmitResult& result) {
  nlohmann::json out = {{"can_admit", result.admitted}};
  if (result.admitted) {
    out["mode"] = std::string(DecisionModeName(result.mode));
  } else {
    out["reason"] = std::string(RejectReasonName(result.reason));
  }
  if (result.room_tokens != kUnknownRoomTokens) out["room_tokens"] = result.room_tokens;
  return out;
}
inline absl::StatusOr<AdmitResult> AdmitResultFromJson(const nlohmann::json& body) {
  if (!body.is_object() || !body.contains("can_admit") || !body["can_admit"].is_boolean()) {
    return absl::InvalidArgumentError("admission answer: no boolean \"can_admit\"");
  }
  AdmitResult result;
  result.admitted = body["can_admit"].get<bool>();
  if (result.admitted) {
    const std::string mode = body.value("mode", std::string());
    std::optional<DecisionMode> parsed = ParseDecisionMode(mode);
    if (!parsed.has_value() || *parsed == DecisionMode::kFallback) {
      return absl::InvalidArgumentError(
          absl::StrCat("admission answer: mode \"", mode, "\" is not direct, seed or reseed"));
    }
    result.mode = *parsed;
  } else {
    const std::string reason = body.value("reason", std::string());
    std::optional<RejectReason> parsed = ParseRejectReason(reason);
    if (!parsed.has_value() || *parsed == RejectReason::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat("admission answer: unknown rejection reason \"", reason, "\""));
    }
    result.mode = DecisionMode::kFallback;
    result.reason = *parsed;
  }
  if (body.contains("room_tokens") && body["room_tokens"].is_number_unsigned()) {
    result.room_tokens = body["room_tokens"].get<uint64_t>();
  }
  return result;
}

class HttpWorkerTransport {
 public:
  struct Options {
    std::vector<std::string> decode_urls;   // "http://host:port", index = WorkerId
    std::vector<std::string> prefill_urls;  // may be empty (colocated)
    std::chrono::milliseconds connect_timeout{1000};
    std::chrono::milliseconds admit_timeout{2000};
    std::chrono::milliseconds generate_timeout{120000};
  };

  // What a streamed generate call reports while it runs, on the calling
  // thread; either may be empty (both empty: the call does not stream).
  struct StreamCallbacks {
    std::function<void()> on_first_token;                    // once, at the first event
    std::function<void(std::span<const TokenId>)> on_tokens;  // each batch of new tokens
  };

  // What a caller attaches to one session's request: extra body fields in,
  // the last generate answer out. Detaches when destroyed.
  class Attachment {
   public:
    Attachment(Attachment&& other) noexcept
        : transport_(std::exchange(other.transport_, nullptr)),
          session_(other.session_),
          slot_(std::move(other.slot_)) {}
    Attachment& operator=(Attachment&&) = delete;
    Attachment(const Attachment&) = delete;
    ~Attachment() {
      if (transport_ != nullptr) transport_->Detach(session_, slot_);
    }
    nlohmann::json response() const {
      absl::MutexLock lock(&slot_->mu);
      return slot_->response;
    }

   private:
    friend class HttpWorkerTransport;
    struct Slot {
      nlohmann::json payload;
      StreamCallbacks stream;  // both empty: no streaming
      mutable absl::Mutex mu;
      nlohmann::json response;
    };
    Attachment(HttpWorkerTransport* transport, SessionId session, std::shared_ptr<Slot> slot)
        : transport_(transport), session_(session), slot_(std::move(slot)) {}
    HttpWorkerTransport* transport_;
    SessionId session_;
    std::shared_ptr<Slot> slot_;
  };

  static absl::StatusOr<std::unique_ptr<HttpWorkerTransport>> Create(Options options) {
    if (options.decode_urls.empty()) {
      return absl::InvalidArgumentError("HttpWorkerTransport: no decode worker URLs");
    }
    for (const auto* urls : {&options.decode_urls, &options.prefill_urls}) {
      for (const std::string& url : *urls) {
        if (absl::Status valid = CheckUrl(url); !valid.ok()) return valid;
      }
    }
    return std::unique_ptr<HttpWorkerTransport>(new HttpWorkerTransport(std::move(options)));
  }

  // Attaches `payload` (a JSON object) to the generate calls of `session`'s
  // request until the returned attachment is destroyed. One request per
  // session at a time: a second Attach for the session takes over its
  // generate calls (a gateway serialises each session's turns anyway).
  // With `on_first_token`, the generate call streams and the callback runs
  // once, on the calling thread, when the first token arrives (see the top).
  Attachment Attach(SessionId session, nlohmann::json payload,
                    std::function<void()> on_first_token = nullptr) {
    return Attach(session, std::move(payload), StreamCallbacks{std::move(on_first_token), nullptr});
  }
  // The same, with the tokens of the answer handed over as they arrive.
  Attachment Attach(SessionId session, nlohmann::json payload, StreamCallbacks stream) {
    auto slot = std::make_shared<Attachment::Slot>();
    slot->payload = std::move(payload);
    slot->stream = std::move(stream);
    absl::MutexLock lock(&mu_);
    slots_[session] = slot;
    return Attachment(this, session, std::move(slot));
  }

  // Whether a call failed because the worker never answered: no
  // connection, a reset or a timeout (a status this transport returned,
  // marked so), rather than an HTTP error or an answer it could not use.
  static bool NoAnswer(const absl::Status& status) {
    return status.GetPayload(kNoAnswerPayload).has_value();
  }

  // The token ids in `value` (an array of unsigned integers that fit a
  // TokenId), or nullopt: how every answer's token arrays are read.
  static std::optional<std::vector<TokenId>> TokenIds(const nlohmann::json& value) {
    if (!value.is_array()) return std::nullopt;
    std::vector<TokenId> ids;
    ids.reserve(value.size());
    for (const nlohmann::json& id : value) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() > std::numeric_limits<TokenId>::max()) {
        return std::nullopt;
      }
      ids.push_back(id.get<TokenId>());
    }
    return ids;
  }

  // A decode worker or colocated instance joins at runtime: its id (the
  // next one) for a valid URL; InvalidArgument naming the URL otherwise.
  // Calls to the existing workers may run meanwhile.
  absl::StatusOr<WorkerId> AddDecodeUrl(std::string url) {
    if (absl::Status valid = CheckUrl(url); !valid.ok()) return valid;
    absl::MutexLock lock(&urls_mu_);
    if (decode_urls_.size() >= kMaxWorkers) {
      return absl::ResourceExhaustedError(
          absl::StrCat("HttpWorkerTransport: all ", kMaxWorkers, " decode worker slots are taken"));
    }
    decode_urls_.push_back(std::move(url));
    return static_cast<WorkerId>(decode_urls_.size() - 1);
  }
  // InvalidArgument naming `url` unless it is one this transport can call.
  static absl::Status CheckUrl(const std::string& url) {
    if (url.rfind("http://", 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("HttpWorkerTransport: worker URL \"", url, "\" must start with http://"));
    }
    return absl::OkStatus();
  }
  size_t num_decode_urls() const {
    absl::MutexLock lock(&urls_mu_);
    return decode_urls_.size();
  }
  // A copy of every decode worker's URL, index = WorkerId.
  std::vector<std::string> decode_urls() const {
    absl::MutexLock lock(&urls_mu_);
    return decode_urls_;
  }

  absl::StatusOr<AdmitResult> Admit(WorkerId decode, const AdmitQuery& query) {
    absl::StatusOr<std::string> url = DecodeUrl(decode);
    if (!url.ok()) return url.status();
    absl::StatusOr<nlohmann::json> answer =
        Post(*url, "/admit_direct_append", AdmitQueryToJson(query), options_.admit_timeout);
    if (!answer.ok()) return answer.status();
    absl::StatusOr<AdmitResult> result = AdmitResultFromJson(*answer);
    if (!result.ok()) {
      return absl::UnavailableError(
          absl::StrCat("worker-unavailable: ", *url, ": ", result.status().message()));
    }
    return result;
  }

  absl::Status RunDirect(WorkerId decode, const Request& request) {
    return Generate(decode, request, "direct");
  }
  absl::Status Prefill(WorkerId prefill, const Request& request) {
    if (prefill >= options_.prefill_urls.size()) return Unknown("prefill", prefill);
    return Call(options_.prefill_urls[prefill], "/prefill", request, {}, false);
  }
  absl::Status TransferKv(WorkerId prefill, WorkerId decode, const Request& request) {
    absl::StatusOr<std::string> url = DecodeUrl(decode);
    if (!url.ok()) return url.status();
    nlohmann::json extra = {
        {"prefill", prefill < options_.prefill_urls.size() ? options_.prefill_urls[prefill] : ""}};
    return Call(*url, "/receive_kv", request, std::move(extra), false);
  }
  absl::Status Decode(WorkerId decode, const Request& request) {
    return Generate(decode, request, "decode");
  }
  // Colocated: the turn on `instance`, served from what its cache holds.
  absl::Status RunOnInstance(WorkerId instance, const Request& request) {
    return Generate(instance, request, "cache");
  }
  // Colocated: `to` pulls `session`'s KV from `from` before the turn is
  // sent. Returns the tokens the target reports it kept ("moved_tokens";
  // 0 when the source held nothing or the target could not keep it).
  absl::StatusOr<uint64_t> MoveSessionKv(WorkerId from, WorkerId to, SessionId session) {
    absl::StatusOr<std::string> source = DecodeUrl(from);
    if (!source.ok()) return source.status();
    absl::StatusOr<std::string> target = DecodeUrl(to);
    if (!target.ok()) return target.status();
    absl::StatusOr<nlohmann::json> answer =
        Post(*target, "/migrate_kv", {{"session_id", session}, {"from", *source}},
             options_.generate_timeout);
    if (!answer.ok()) return answer.status();
    const nlohmann::json moved =
        answer->is_object() ? answer->value("moved_tokens", nlohmann::json()) : nlohmann::json();
    return moved.is_number_unsigned() ? moved.get<uint64_t>() : 0;
  }
  // Colocated: tells `instance` the session is over, so its KV goes first.
  absl::Status CloseSession(WorkerId instance, SessionId session) {
    absl::StatusOr<std::string> url = DecodeUrl(instance);
    if (!url.ok()) return url.status();
    return Post(*url, "/close_session", {{"session_id", session}}, options_.admit_timeout)
        .status();
  }

  absl::Status RunFallback(WorkerId prefill, WorkerId decode, const Request& request) {
    if (prefill != kNoWorker) {
      if (absl::Status s = Prefill(prefill, request); !s.ok()) return s;
    }
    return Generate(decode, request, "fallback");
  }

 private:
  // The payload that marks a status as NoAnswer (its value: httplib's error).
  static constexpr const char* kNoAnswerPayload = "kvc_router/worker-no-answer";

  explicit HttpWorkerTransport(Options options)
      : options_(std::move(options)), decode_urls_(options_.decode_urls) {}

  static absl::Status Unknown(const char* pool, WorkerId worker) {
    return absl::InvalidArgumentError(
        absl::StrCat("HttpWorkerTransport: unknown ", pool, " worker ", worker));
  }

  // Only the slot this attachment made: a later Attach for the session
  // replaced it, and that one stays.
  void Detach(SessionId session, const std::shared_ptr<Attachment::Slot>& slot) {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(session);
    if (it != slots_.end() && it->second == slot) slots_.erase(it);
  }
  std::shared_ptr<Attachment::Slot> SlotOf(SessionId session) {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(session);
    return it == slots_.end() ? nullptr : it->second;
  }

  absl::Status Generate(WorkerId decode, const Request& request, const char* mode) {
    absl::StatusOr<std::string> url = DecodeUrl(decode);
    if (!url.ok()) return url.status();
    return Call(*url, "/generate", request, {{"mode", mode}}, true);
  }

  // A copy: AddDecodeUrl may grow the list while a call uses it.
  absl::StatusOr<std::string> DecodeUrl(WorkerId decode) const {
    absl::MutexLock lock(&urls_mu_);
    if (decode >= decode_urls_.size()) return Unknown("decode", decode);
    return decode_urls_[decode];
  }


  absl::Status Call(const std::string& url, const char* path, const Request& request,
                    nlohmann::json extra, bool keep_response) {
    std::shared_ptr<Attachment::Slot> slot = SlotOf(request.session);
    nlohmann::json body = slot != nullptr && slot->payload.is_object() ? slot->payload
                                                                       : nlohmann::json::object();
    body["session_id"] = request.session;
    body["turn"] = request.turn;
    for (auto& [key, value] : extra.items()) body[key] = value;
    const bool stream = keep_response && slot != nullptr &&
                        (slot->stream.on_first_token != nullptr || slot->stream.on_tokens != nullptr);
    if (stream) body["stream"] = true;
    absl::StatusOr<nlohmann::json> answer =
        stream ? PostStreaming(url, path, body, slot->stream)
               : Post(url, path, body, options_.generate_timeout);
    if (!answer.ok()) return answer.status();
    if (keep_response && slot != nullptr) {
      absl::MutexLock lock(&slot->mu);
      slot->response = std::move(*answer);
    }
    return absl::OkStatus();
  }

  std::unique_ptr<httplib::Client> ClientFor(const std::string& url,
                                             std::chrono::milliseconds timeout) const {
    auto client = std::make_unique<httplib::Client>(url);
    client->set_connection_timeout(options_.connect_timeout);
    client->set_read_timeout(timeout);
    client->set_write_timeout(timeout);
    return client;
  }

  // OK when the worker answered 200; else worker-unavailable, naming the
  // call, and the connection error or the status and the start of `body`.
  static absl::Status Answered(const httplib::Result& result, const std::string& url,
                               const char* path, const std::string& body) {
    if (!result) {
      absl::Status none = absl::UnavailableError(absl::StrCat(
          "worker-unavailable: POST ", url, path, ": ", httplib::to_string(result.error())));
      none.SetPayload(kNoAnswerPayload, absl::Cord(httplib::to_string(result.error())));
      return none;
    }
    if (result->status != 200) {
      return absl::UnavailableError(absl::StrCat("worker-unavailable: POST ", url, path,
                                                 ": HTTP ", result->status, " ",
                                                 body.substr(0, 200)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<nlohmann::json> Post(const std::string& url, const char* path,
                                      const nlohmann::json& body,
                                      std::chrono::milliseconds timeout) const {
    std::unique_ptr<httplib::Client> client = ClientFor(url, timeout);
    httplib::Result result = client->Post(path, body.dump(), "application/json");
    const std::string no_body;
    if (absl::Status s = Answered(result, url, path, result ? result->body : no_body); !s.ok()) {
      return s;
    }
    nlohmann::json answer = nlohmann::json::parse(result->body, nullptr, false);
    if (answer.is_discarded()) {
      return absl::UnavailableError(
          absl::StrCat("worker-unavailable: POST ", url, path, ": the answer is not JSON"));
    }
    return answer;
  }

  // Server-sent events as the SSE format defines them: lines end in \n,
  // \r\n or \r; a blank line ends an event; its `data:` lines (one optional
  // space after the colon) are joined with \n; comments and other fields
  // are skipped. Each event's data goes to `on_data`; Feed returns false
  // once `on_data` does.
  class EventStreamReader {
   public:
    explicit EventStreamReader(std::function<bool(const std::string&)> on_data)
        : on_data_(std::move(on_data)) {}
    bool Feed(const char* bytes, size_t length) {
      pending_.append(bytes, length);
      return Lines(/*at_end=*/false);
    }
    // The stream ended: a last line or event without its terminator counts.
    bool Finish() { return Lines(/*at_end=*/true) && Dispatch(); }
    bool saw_event_stream() const { return saw_field_; }

   private:
    bool Lines(bool at_end) {
      size_t start = 0;
      while (true) {
        const size_t end = pending_.find_first_of("\r\n", start);
        if (end == std::string::npos) break;
        // A \r last in the buffer may be the first half of \r\n.
        if (pending_[end] == '\r' && end + 1 == pending_.size() && !at_end) break;
        const std::string line = pending_.substr(start, end - start);
        start = end + (pending_[end] == '\r' && end + 1 < pending_.size() &&
                               pending_[end + 1] == '\n'
                           ? 2
                           : 1);
        if (!Line(line)) return false;
      }
      pending_.erase(0, start);
      if (at_end && !pending_.empty()) {
        const std::string line = std::move(pending_);
        pending_.clear();
        return Line(line);
      }
      return true;
    }
    bool Line(const std::string& line) {
      if (line.empty()) return Dispatch();
      if (line[0] == ':') return true;  // a comment
      const size_t colon = line.find(':');
      const std::string field = line.substr(0, colon);
      if (field != "data" && field != "event" && field != "id" && field != "retry") return true;
      saw_field_ = true;
      if (field != "data") return true;
      std::string value = colon == std::string::npos ? std::string() : line.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.erase(0, 1);
      if (has_data_) data_ += '\n';
      data_ += value;
      has_data_ = true;
      return true;
    }
    bool Dispatch() {
      if (!has_data_) return true;
      has_data_ = false;
      return on_data_(std::exchange(data_, std::string()));
    }

    std::function<bool(const std::string&)> on_data_;
    std::string pending_, data_;
    bool has_data_ = false, saw_field_ = false;
  };

  // A generate call answered as server-sent events: `on_first_token` runs
  // on the first event, `on_tokens` on each event's "token_ids"; the answer
  // is the last event with "output_token_ids". A plain JSON answer (a
  // worker that does not stream) is taken as is. An exception from a
  // callback ends the call and reaches the caller.
  absl::StatusOr<nlohmann::json> PostStreaming(const std::string& url, const char* path,
                                               const nlohmann::json& body,
                                               const StreamCallbacks& callbacks) const {
    std::unique_ptr<httplib::Client> client = ClientFor(url, options_.generate_timeout);
    std::string whole;  // the body as received: a plain answer, or an error's text
    nlohmann::json answer;
    std::vector<TokenId> delivered;
    bool signalled = false;
    std::string malformed;  // why reading stopped at a bad event, with its start
    std::exception_ptr thrown;
    // Runs a callback; false (and `thrown` set) when it throws.
    auto guarded = [&](const auto& call) {
      try {
        call();
      } catch (...) {
        thrown = std::current_exception();
        return false;
      }
      return true;
    };
    auto signal = [&] {
      if (std::exchange(signalled, true) || callbacks.on_first_token == nullptr) return true;
      return guarded(callbacks.on_first_token);
    };
    // Tokens are checked and handed over only for a caller that takes them.
    const bool relay = callbacks.on_tokens != nullptr;
    auto deliver = [&](std::span<const TokenId> tokens) {
      if (!relay || tokens.empty()) return true;
      delivered.insert(delivered.end(), tokens.begin(), tokens.end());
      return guarded([&] { callbacks.on_tokens(tokens); });
    };
    // What the events did not carry of the answer's tokens; nullopt when
    // they carried something else or the answer's ids are not token ids.
    auto rest_of = [&](const nlohmann::json& final_answer)
        -> std::optional<std::vector<TokenId>> {
      if (!relay) return std::vector<TokenId>{};
      std::optional<std::vector<TokenId>> output =
          TokenIds(final_answer.value("output_token_ids", nlohmann::json::array()));
      if (!output.has_value()) return std::nullopt;
      if (delivered.size() > output->size() ||
          !std::equal(delivered.begin(), delivered.end(), output->begin())) {
        return std::nullopt;
      }
      return std::vector<TokenId>(output->begin() + static_cast<std::ptrdiff_t>(delivered.size()),
                                  output->end());
    };
    EventStreamReader reader([&](const std::string& data) {
      if (data == "[DONE]") return true;
      nlohmann::json event = nlohmann::json::parse(data, nullptr, false);
      if (event.is_discarded()) {
        malformed = absl::StrCat("an event is not JSON: ", data.substr(0, 80));
        return false;  // stop reading: nothing after it is relayed
      }
      if (!signal()) return false;
      if (!event.is_object()) return true;
      if (relay && event.contains("token_ids")) {
        const std::optional<std::vector<TokenId>> tokens = TokenIds(event["token_ids"]);
        if (!tokens.has_value()) {
          malformed = absl::StrCat("an event's token_ids are not token ids: ",
                                   event["token_ids"].dump().substr(0, 80));
          return false;
        }
        if (!deliver(*tokens)) return false;
      }
      if (event.contains("output_token_ids")) answer = std::move(event);
      return true;
    });
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", "text/event-stream");
    req.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
      whole.append(data, length);
      return reader.Feed(data, length);
    };
    httplib::Result result = client->send(req);
    if (thrown) std::rethrow_exception(thrown);
    auto unavailable = [&](const std::string& why) {
      return absl::UnavailableError(absl::StrCat("worker-unavailable: POST ", url, path, ": ", why));
    };
    // The reading stopped at a bad event (unless the status said more).
    if (!malformed.empty() && (!result || result->status == 200)) return unavailable(malformed);
    if (absl::Status s = Answered(result, url, path, whole); !s.ok()) return s;
    reader.Finish();
    if (thrown) std::rethrow_exception(thrown);
    if (!reader.saw_event_stream()) {  // not a stream: plain JSON
      nlohmann::json plain = nlohmann::json::parse(whole, nullptr, false);
      if (!plain.is_discarded() && plain.is_object()) {
        const std::optional<std::vector<TokenId>> rest = rest_of(plain);
        if (signal() && rest.has_value()) deliver(*rest);
        if (thrown) std::rethrow_exception(thrown);
        if (!rest.has_value()) return unavailable("the answer's output_token_ids are not token ids");
        return plain;
      }
    }
    if (!malformed.empty()) return unavailable(malformed);
    if (answer.is_null()) return unavailable("the stream ended without an answer");
    const std::optional<std::vector<TokenId>> rest = rest_of(answer);
    if (!rest.has_value()) {
      return unavailable(
          "the answer's output_token_ids are not token ids or disagree with the streamed token_ids");
    }
    deliver(*rest);
    if (thrown) std::rethrow_exception(thrown);
    return answer;
  }

  Options options_;  // its decode_urls: those at Create; decode_urls_ has all
  mutable absl::Mutex urls_mu_;
  std::vector<std::string> decode_urls_ ABSL_GUARDED_BY(urls_mu_);
  absl::Mutex mu_;
  absl::flat_hash_map<SessionId, std::shared_ptr<Attachment::Slot>> slots_ ABSL_GUARDED_BY(mu_);
};

static_assert(WorkerTransport<HttpWorkerTransport>);

}  // namespace kvc_router::engine
