// kvc-gateway: an example OpenAI-style gateway that routes with kvc_router
// over HTTP (docs/integration.md). Two kinds of clusters:
//
// --policy kvc (the default): the KVC-Router across prefill and decode
// workers that answer the admission RPC, optionally fed by their KV events.
//   kvc-gateway --port 8000 --block-tokens 16
//       --prefill http://127.0.0.1:30000
//       --decode http://127.0.0.1:30001 --decode http://127.0.0.1:30002
//       --kv-events tcp://127.0.0.1:5557,tcp://127.0.0.1:5558
//       --kv-events tcp://127.0.0.1:5559,tcp://127.0.0.1:5560
// The n-th --kv-events (PUB endpoint, optional replay endpoint) belongs to
// the n-th --decode worker; with events on, the router's index holds what
// the engines report (placements are not learned optimistically).
//
// --policy ear (recommended; also unified, sticky, lmetric, load-only):
// colocated instances that keep each session's KV in their own cache, as
// SGLang's radix cache does. Loads come from a LoadLedger of what this
// gateway sent; a new session's first turn waits up to its arrival window
// (2% of its estimated prefill) for shorter first turns arriving with it,
// which go first, then in a FIFO queue while ear holds it (load control);
// a placement that moves a session first asks the target
// to pull the session's KV from its old instance (/migrate_kv). An
// instance that stops answering (3 calls with no answer within 10 s) is
// left alone for 5 s, then probed with one turn: while its breaker is open
// no turn goes there and the sessions bound to it are placed anew.
//   kvc-gateway --port 8000 --policy ear --kv-capacity-tokens 362000
//       --instance http://127.0.0.1:30001 --instance http://127.0.0.1:30002
//
// Endpoints:
//   POST /v1/completions       {"prompt", "max_tokens"?, "session_id"?, "model"?}
//   POST /v1/chat/completions  {"messages", "max_tokens"?, "session_id"?, "model"?}
//        Both also take "stream": true (server-sent events in OpenAI's chunk
//        format: the text as the worker streams it, in one chunk from a
//        worker that answers in one piece; a failure after the headers as an
//        error event).
//        The session comes from the X-Session-Id header, else the body's
//        "session_id" (or "user"); without one each request is its own
//        session. A "model" listed with --lora salts the hash chain, so
//        adapters never share cached blocks. The answer's "kvc" object
//        says how the turn was routed.
//   DELETE /v1/sessions/{id}   the session is over: the gateway forgets it;
//        under an affinity policy the policy frees its memory (held first
//        turns may go in) and the instances that served it get /close_session.
//   POST /admin/instances/{id}/drain | resume
//        nothing new goes to the instance (the decode worker under kvc, for
//        good) until resumed; what runs there finishes; sessions bound there
//        are placed anew on their next turn.
//   POST /admin/instances      {"url"}: under an affinity policy a new
//        instance joins (the answer gives its id); kvc refuses (409).
//   GET  /metrics              Prometheus text format
//   GET  /debug/index          kvc: the router's residency per decode worker;
//                              affinity: loads, live contexts, the queue (JSON)
//   GET  /health
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "kvc_engine/gateway_support.hpp"
#include "kvc_engine/http_transport.hpp"
#include "kvc_engine/zmq_subscriber.hpp"
#include "kvc_router/kvc_router.hpp"
#include "kvc_router/policy/affinity_policies.hpp"
#include "kvc_router/policy/load_ledger.hpp"

namespace {

using namespace kvc_router;
using nlohmann::json;

struct SessionState {
  absl::Mutex mu;
  // Set by DELETE under `mu`: a request that locks a closed state starts
  // over with a fresh one.
  bool closed = false;
  // Set by DELETE before it waits for `mu`: a first turn still waiting in
  // the load-control queue gives up instead of being placed.
  std::atomic<bool> cancel{false};
  std::optional<SessionHasher> hasher;
  BlockHash root = kChainRootHash;
  std::vector<TokenId> context;  // prompt + answer of the last turn
  std::vector<WorkerId> served;  // instances that ran its turns (to close it there)
};

// One completion request, parsed.
struct Turn {
  bool chat = false;
  std::vector<TokenId> tokens;
  uint32_t max_tokens = 0;
  std::string model;
  BlockHash root = kChainRootHash;
  std::string session_key;
  SessionId session = 0;
  bool anonymous = false;  // no session given: the request is its own session
  bool stream = false;     // answer as server-sent events (OpenAI "stream": true)
};

// Where a turn's answer goes. Serve calls Fail or Done once; Tokens relays
// the answer's tokens as the instance streams them.
class Reply {
 public:
  virtual ~Reply() = default;
  // `retry`: the gateway is busy, the client may try again in a second.
  virtual void Fail(int status, const std::string& message, bool retry = false) = 0;
  virtual void Tokens(std::span<const TokenId> tokens) = 0;
  // The whole answer (`output`, every token) and how it was routed (`kvc`).
  virtual void Done(const std::vector<TokenId>& output, json kvc) = 0;
  // Whether Tokens is worth calling before Done.
  virtual bool streams() const = 0;
  // The turn waits (in the load-control queue); false once the client is
  // known to be gone, so the turn need not wait any longer.
  virtual bool StillWaiting() = 0;

 protected:
  static json Usage(const Turn& turn, size_t completion_tokens) {
    return {{"prompt_tokens", turn.tokens.size()},
            {"completion_tokens", completion_tokens},
            {"total_tokens", turn.tokens.size() + completion_tokens}};
  }
};

// The OpenAI-style JSON answer, in one piece.
class JsonReply final : public Reply {
 public:
  JsonReply(const Turn& turn, std::string id, const engine::Tokenizer& tokenizer,
            httplib::Response& res)
      : turn_(turn), id_(std::move(id)), tokenizer_(tokenizer), res_(res) {}

  void Fail(int status, const std::string& message, bool retry) override {
    if (retry) res_.set_header("Retry-After", "1");
    res_.status = status;
    res_.set_content(engine::DumpForClient(json{{"error", {{"message", message}}}}), "application/json");
  }
  void Tokens(std::span<const TokenId>) override {}
  // Nothing can reach the client before the answer.
  bool StillWaiting() override { return true; }
  void Done(const std::vector<TokenId>& output, json kvc) override {
    const std::string completion = tokenizer_.Decode(output);
    json choice = {{"index", 0}, {"finish_reason", engine::FinishReason(output.size(), turn_.max_tokens)}};
    if (turn_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", completion}};
    } else {
      choice["text"] = completion;
    }
    kvc["session"] = turn_.session_key;
    res_.set_header("X-KVC-Mode", kvc["mode"].get<std::string>());
    res_.set_header("X-KVC-Decode-Worker", std::to_string(kvc["decode_worker"].get<WorkerId>()));
    json out = {{"id", id_},
                {"object", turn_.chat ? "chat.completion" : "text_completion"},
                {"model", turn_.model},
                {"choices", json::array({choice})},
                {"usage", Usage(turn_, output.size())},
                {"kvc", std::move(kvc)}};
    res_.set_content(engine::DumpForClient(out), "application/json");
  }
  bool streams() const override { return false; }

 private:
  const Turn& turn_;
  const std::string id_;
  const engine::Tokenizer& tokenizer_;
  httplib::Response& res_;
};

// "stream": true: the answer as OpenAI's server-sent events while the
// instance produces it (engine::CompletionEventStream). A client that goes
// away stops the writing, not the turn: its context is still learned.
class StreamReply final : public Reply {
 public:
  StreamReply(const Turn& turn, std::string id, const engine::Tokenizer& tokenizer,
              httplib::DataSink& sink)
      : turn_(turn),
        events_({.id = std::move(id), .chat = turn.chat, .model = turn.model,
                 .max_tokens = turn.max_tokens},
                tokenizer,
                [&sink](std::string_view bytes) { return sink.write(bytes.data(), bytes.size()); }) {}

  void Fail(int status, const std::string& message, bool retry) override {
    events_.Fail(status, message, retry);
  }
  void Tokens(std::span<const TokenId> tokens) override { events_.Tokens(tokens); }
  void Done(const std::vector<TokenId>& output, json kvc) override {
    kvc["session"] = turn_.session_key;
    events_.Done(output, Usage(turn_, output.size()), json{{"kvc", std::move(kvc)}});
  }
  bool streams() const override { return true; }
  // A comment event: keeps the connection busy and finds out a client that left.
  bool StillWaiting() override { return events_.KeepAlive("waiting in the load-control queue"); }
  bool client_connected() const { return events_.connected(); }

 private:
  const Turn& turn_;
  engine::CompletionEventStream events_;
};

// What both gateways share: parsing, sessions, hashing, the answer.
class GatewayBase {
 public:
  GatewayBase(std::unique_ptr<engine::HttpWorkerTransport> transport,
              std::unique_ptr<engine::Tokenizer> tokenizer,
              absl::flat_hash_set<std::string> loras, uint32_t block_tokens,
              uint32_t default_max_tokens)
      : transport_(std::move(transport)),
        tokenizer_(std::move(tokenizer)),
        loras_(std::move(loras)),
        block_tokens_(block_tokens),
        default_max_tokens_(default_max_tokens) {}
  virtual ~GatewayBase() = default;

  // POST /v1/completions and /v1/chat/completions. A streamed turn runs
  // inside the response's content provider, which httplib calls on this
  // server thread once the status line and headers are out: its text goes
  // to the client as the instance produces it, and a failure after that
  // point is an error event rather than an HTTP status.
  void Handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    absl::StatusOr<Turn> turn = Parse(req, chat);
    if (!turn.ok()) return Fail(res, 400, std::string(turn.status().message()));
    std::string id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", request_ids_++);
    if (!turn->stream) {
      JsonReply reply(*turn, std::move(id), *tokenizer_, res);
      return Run(*turn, reply);
    }
    res.set_header("Cache-Control", "no-cache");
    auto parsed = std::make_shared<const Turn>(std::move(*turn));
    auto ran = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream", [this, parsed, ran, id](size_t, httplib::DataSink& sink) {
          // The provider is called until done(); the turn runs once. httplib
          // does not catch what a provider throws (the server would stop), so
          // nothing escapes: what the turn took is released by then (RAII)
          // and the client learns why it ended.
          if (std::exchange(*ran, true)) return false;
          try {
            StreamReply reply(*parsed, id, *tokenizer_, sink);
            try {
              Run(*parsed, reply);
            } catch (const std::exception& e) {
              reply.Fail(500, absl::StrCat("the gateway failed: ", e.what()), /*retry=*/false);
            } catch (...) {
              reply.Fail(500, "the gateway failed", /*retry=*/false);
            }
            if (!reply.client_connected()) return false;
            sink.done();
            return true;
          } catch (...) {
            return false;
          }
        });
  }

  // Locks the turn's session, starts its chain over unless the prompt
  // continues the conversation, and serves it.
  void Run(const Turn& turn, Reply& reply) {
    std::shared_ptr<SessionState> s;
    while (true) {
      s = conversations_->FindOrCreate(turn.session);
      s->mu.Lock();
      if (!s->closed) break;
      s->mu.Unlock();  // closed or forgotten meanwhile: the table holds a fresh state now
    }
    absl::Cleanup unlock_session = [&s] { s->mu.Unlock(); };
    const bool continues = s->hasher.has_value() && s->root == turn.root &&
                           turn.tokens.size() >= s->context.size() &&
                           std::equal(s->context.begin(), s->context.end(), turn.tokens.begin());
    if (!continues) {
      // A new conversation (or one that diverged): a fresh chain.
      s->hasher = *SessionHasher::Create(turn.session, block_tokens_, turn.root);
      s->root = turn.root;
      s->context.clear();
    }
    Serve(turn, *s, reply);
    if (turn.anonymous) {
      // A request without a session is a session of one turn: over now.
      json ignored;
      CloseSession(turn.session, *s, ignored);
    }
    if (turn.anonymous || (!s->hasher.has_value() && s->served.empty())) {
      // Over, or nothing ran for it (refused, cancelled, failed first):
      // forget it rather than keep a state per session id ever seen.
      s->closed = true;
      conversations_->Erase(turn.session, s);
    }
  }

  // Prometheus lines: the sessions the gateway keeps a conversation for.
  std::string SessionsGauge() const {
    return absl::StrCat(
        "# HELP kvc_gateway_sessions Sessions the gateway keeps a conversation for.\n"
        "# TYPE kvc_gateway_sessions gauge\n"
        "kvc_gateway_sessions ",
        conversations_->size(),
        "\n"
        "# HELP kvc_gateway_sessions_forgotten_total Conversations forgotten for idleness "
        "(--session-ttl) or the bound (--max-sessions); their next turn hashes its prompt "
        "whole.\n"
        "# TYPE kvc_gateway_sessions_forgotten_total counter\n"
        "kvc_gateway_sessions_forgotten_total ",
        conversations_->forgotten(), "\n");
  }

  // Bounds the conversations kept (before serving).
  absl::Status LimitConversations(engine::ConversationTable<SessionState>::Options options) {
    auto table = engine::ConversationTable<SessionState>::Create(options);
    if (!table.ok()) return table.status();
    conversations_ = *std::move(table);
    return absl::OkStatus();
  }

  // DELETE /v1/sessions/{id}: the client says the session is over.
  void Close(const std::string& session_key, httplib::Response& res) {
    const SessionId session = XXH3_64bits_withSeed(session_key.data(), session_key.size(), 0);
    std::shared_ptr<SessionState> s = conversations_->Find(session);
    json out = {{"session", session_key}, {"closed", true}};
    if (s == nullptr) {
      // No conversation (never seen, or forgotten for idleness): the policy
      // may still hold the session.
      if (!CloseForgotten(session, out)) {
        return Fail(res, 404, absl::StrCat("no session \"", session_key, "\""));
      }
      return res.set_content(out.dump(), "application/json");
    }
    s->cancel = true;
    CancelWaiting();
    absl::MutexLock session_lock(&s->mu);  // after its turn in flight, if any
    if (s->closed) {
      // Closed meanwhile: by another DELETE, its only turn was cancelled, or
      // the conversation was forgotten (then the policy may still hold it).
      if (!CloseForgotten(session, out)) out["instances_closed"] = json::array();
      return res.set_content(out.dump(), "application/json");
    }
    s->closed = true;
    CloseSession(session, *s, out);
    conversations_->Erase(session, s);
    res.set_content(out.dump(), "application/json");
  }

  virtual std::string Metrics() const = 0;
  virtual json DebugIndex() const = 0;

 protected:
  // Routes and runs one turn of `s` (whose lock is held) and answers it.
  virtual void Serve(const Turn& turn, SessionState& s, Reply& reply) = 0;
  // The policy's and the workers' share of closing a session.
  virtual void CloseSession(SessionId session, SessionState& s, json& out) = 0;
  // Wakes turns waiting for placement so they see a session's `cancel`.
  virtual void CancelWaiting() {}
  // Closes a session the gateway keeps no conversation for; false when the
  // policy does not know it either.
  virtual bool CloseForgotten(SessionId session, json& out) {
    (void)session;
    (void)out;
    return false;
  }
  // POST /admin/instances/{id}/drain (true) or /resume (false).
  virtual absl::Status SetDrained(WorkerId instance, bool drained) = 0;
  // POST /admin/instances {"url"}: a new instance's id.
  virtual absl::StatusOr<WorkerId> AddInstance(const std::string& url) = 0;

 public:
  // The admin endpoint: JSON {"instance", "drained"}, or the refusal.
  void Drain(const std::string& id, bool drained, httplib::Response& res) {
    WorkerId instance = 0;
    if (!absl::SimpleAtoi(id, &instance)) {
      return Fail(res, 400, absl::StrCat("instance \"", id, "\" is not a number"));
    }
    const absl::Status status = SetDrained(instance, drained);
    if (!status.ok()) {
      // No such instance: 404; one the state refuses (the last active worker,
      // a kvc worker to resume): 409.
      const bool unknown = absl::IsInvalidArgument(status) || absl::IsNotFound(status);
      return Fail(res, unknown ? 404 : 409, std::string(status.message()));
    }
    res.set_content(json{{"instance", instance}, {"drained", drained}}.dump(), "application/json");
  }

  // The admin endpoint: JSON {"instance", "url"}, or the refusal.
  void Join(const std::string& body, httplib::Response& res) {
    const json request = json::parse(body, nullptr, false);
    if (!request.is_object() || !request.contains("url") || !request["url"].is_string()) {
      return Fail(res, 400, "the body must be a JSON object with a string \"url\"");
    }
    const std::string url = request["url"].get<std::string>();
    const absl::StatusOr<WorkerId> added = AddInstance(url);
    if (!added.ok()) {
      // A bad URL: 400; nothing answering there: 502; a policy that cannot
      // grow, a URL already in, or no slot left: 409.
      const absl::Status& status = added.status();
      const int code = absl::IsInvalidArgument(status)      ? 400
                       : absl::IsUnavailable(status)        ? 502
                       : absl::IsFailedPrecondition(status) ||
                               absl::IsAlreadyExists(status) ||
                               absl::IsResourceExhausted(status)
                           ? 409
                           : 500;
      return Fail(res, code, std::string(status.message()));
    }
    res.set_content(json{{"instance", *added}, {"url", url}}.dump(), "application/json");
  }

 protected:

  static void Fail(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(json{{"error", {{"message", message}}}}.dump(), "application/json");
  }

  // The transport's token callback for a client that streams; none else.
  static std::function<void(std::span<const TokenId>)> RelayTo(Reply& reply) {
    if (!reply.streams()) return nullptr;
    return [&reply](std::span<const TokenId> tokens) { reply.Tokens(tokens); };
  }

  // The answer's tokens (none when it has none), read as the transport
  // reads a streamed answer's: ids that are not token ids fail the turn,
  // streamed or not, rather than teach the session a context nobody saw.
  static absl::StatusOr<std::vector<TokenId>> OutputOf(const json& answer) {
    if (!answer.is_object() || !answer.contains("output_token_ids")) {
      return std::vector<TokenId>{};
    }
    std::optional<std::vector<TokenId>> ids =
        engine::HttpWorkerTransport::TokenIds(answer["output_token_ids"]);
    if (!ids.has_value()) {
      return absl::UnavailableError(
          "worker-unavailable: the answer's output_token_ids are not token ids");
    }
    return *std::move(ids);
  }

  std::unique_ptr<engine::HttpWorkerTransport> transport_;
  engine::GatewayMetrics metrics_;

 private:
  absl::StatusOr<Turn> Parse(const httplib::Request& req, bool chat) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      return absl::InvalidArgumentError("the body must be a JSON object");
    }
    Turn turn;
    turn.chat = chat;
    std::string text;
    std::optional<std::vector<TokenId>> prompt_ids;  // a prompt given as token ids
    if (chat) {
      absl::StatusOr<std::string> rendered =
          engine::RenderChat(body.value("messages", json()), body.value("tools", json()));
      if (!rendered.ok()) return rendered.status();
      text = *rendered;
    } else {
      // OpenAI's forms: a string, an array of one string, token ids, or an
      // array of one array of token ids. A batch is one turn per prompt,
      // which a session cannot be.
      json prompt = body.value("prompt", json());
      if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
        prompt = json(prompt[0]);
      }
      if (prompt.is_string()) {
        text = prompt.get<std::string>();
      } else if (prompt.is_array() && prompt.size() > 1 &&
                 (prompt[0].is_string() || prompt[0].is_array())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"prompt\" holds ", prompt.size(),
            " prompts; send one per request (each is a turn of its own session)"));
      } else if (prompt.is_array() && !prompt.empty()) {
        prompt_ids = engine::HttpWorkerTransport::TokenIds(prompt);
        if (!prompt_ids.has_value()) {
          return absl::InvalidArgumentError(
              "\"prompt\" as token ids must hold only integers in 0..4294967295");
        }
      } else {
        return absl::InvalidArgumentError(
            "\"prompt\" must be a string, an array of one string, or token ids");
      }
    }
    // Chat clients now send max_completion_tokens (OpenAI's newer name); it wins.
    const char* limit_field =
        chat && body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()
            ? "max_completion_tokens"
            : "max_tokens";
    const json max_tokens_json = body.value(limit_field, json(default_max_tokens_));
    if (!max_tokens_json.is_number_unsigned() || max_tokens_json.get<uint64_t>() == 0 ||
        max_tokens_json.get<uint64_t>() > 65536) {
      return absl::InvalidArgumentError(absl::StrCat("\"", limit_field, "\" must be in 1..65536, got ",
                                                     max_tokens_json.dump()));
    }
    turn.max_tokens = max_tokens_json.get<uint32_t>();
    if (body.contains("stream") && !body["stream"].is_boolean() && !body["stream"].is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"stream\" must be true or false, got ", body["stream"].dump()));
    }
    turn.stream = body.contains("stream") && body["stream"].is_boolean() &&
                  body["stream"].get<bool>();
    if (body.contains("model") && !body["model"].is_string()) {
      return absl::InvalidArgumentError("\"model\" must be a string");
    }
    turn.model = body.value("model", std::string());
    turn.root = loras_.contains(turn.model) ? ChainRootFor(turn.model) : kChainRootHash;
    turn.session_key = req.get_header_value("X-Session-Id");
    if (turn.session_key.empty() && body.contains("session_id")) {
      turn.session_key = body["session_id"].is_string() ? body["session_id"].get<std::string>()
                                                        : body["session_id"].dump();
    }
    if (turn.session_key.empty() && body.contains("user") && body["user"].is_string()) {
      turn.session_key = body["user"].get<std::string>();
    }
    if (turn.session_key.empty()) {
      turn.anonymous = true;
      turn.session_key = absl::StrCat("anonymous-", next_anonymous_++);
    }
    turn.session = XXH3_64bits_withSeed(turn.session_key.data(), turn.session_key.size(), 0);
    turn.tokens = prompt_ids.has_value() ? *std::move(prompt_ids) : tokenizer_->Encode(text);
    return turn;
  }

  std::unique_ptr<engine::Tokenizer> tokenizer_;
  absl::flat_hash_set<std::string> loras_;
  uint32_t block_tokens_;
  uint32_t default_max_tokens_;
  // The default options are valid, so the default table always exists.
  std::unique_ptr<engine::ConversationTable<SessionState>> conversations_ =
      *engine::ConversationTable<SessionState>::Create({});
  std::atomic<uint64_t> next_anonymous_{0};
  std::atomic<uint64_t> request_ids_{0};
};

// --policy kvc: the KVC-Router over prefill and decode workers that answer
// the admission RPC.
class KvcGateway final : public GatewayBase {
 public:
  KvcGateway(std::unique_ptr<RoutingState<KvEventIndex>> state,
             std::unique_ptr<engine::HttpWorkerTransport> transport,
             std::unique_ptr<engine::Tokenizer> tokenizer, absl::flat_hash_set<std::string> loras,
             uint32_t default_max_tokens)
      : GatewayBase(std::move(transport), std::move(tokenizer), std::move(loras),
                    state->config().block_tokens, default_max_tokens),
        state_(std::move(state)) {}

  void set_subscriber(std::unique_ptr<engine::KvEventSubscriber> subscriber) {
    subscriber_ = std::move(subscriber);
  }

 protected:
  // RoutingState drains a decode worker for good: its sessions move on
  // their next turn and nothing new goes there; it has no way back.
  absl::Status SetDrained(WorkerId worker, bool drained) override {
    if (!drained) {
      return absl::FailedPreconditionError(
          "kvc: a drained decode worker cannot be resumed (RoutingState drains for good); "
          "restart the gateway to bring it back");
    }
    return state_->DrainDecodeWorker(worker);
  }
  // Its decode workers come with their KV-event streams, fixed at start.
  absl::StatusOr<WorkerId> AddInstance(const std::string&) override {
    return absl::FailedPreconditionError(
        "kvc: decode workers are fixed at start (each with its KV-event stream); instances "
        "join at runtime under the affinity policies");
  }

 public:
  std::string Metrics() const override {
    std::vector<uint64_t> inflight;
    for (WorkerId d = 0; d < state_->num_decode_workers(); ++d) {
      inflight.push_back(state_->inflight(d));
    }
    std::string extra;
    extra += "# HELP kvc_index_blocks Blocks each decode worker holds per its KV events.\n";
    extra += "# TYPE kvc_index_blocks gauge\n";
    state_->ReadIndex([&](const KvEventIndex& index) {
      for (WorkerId d = 0; d < index.num_workers(); ++d) {
        absl::StrAppend(&extra, "kvc_index_blocks{worker=\"", d, "\"} ", index.event_blocks(d),
                        "\n");
      }
      extra += "# HELP kvc_kv_event_abandoned_gaps_total Event gaps the replay could not fill.\n";
      extra += "# TYPE kvc_kv_event_abandoned_gaps_total counter\n";
      for (WorkerId d = 0; d < index.num_workers(); ++d) {
        absl::StrAppend(&extra, "kvc_kv_event_abandoned_gaps_total{worker=\"", d, "\"} ",
                        index.abandoned_gaps(d), "\n");
      }
      return 0;
    });
    if (subscriber_ != nullptr) {
      const engine::SubscriberStats stats = subscriber_->stats();
      extra += "# HELP kvc_kv_event_batches_total KV-event batches applied to the index.\n";
      extra += "# TYPE kvc_kv_event_batches_total counter\n";
      absl::StrAppend(&extra, "kvc_kv_event_batches_total ", stats.batches_applied, "\n");
      extra += "# HELP kvc_kv_event_errors_total KV-event messages refused (malformed).\n";
      extra += "# TYPE kvc_kv_event_errors_total counter\n";
      absl::StrAppend(&extra, "kvc_kv_event_errors_total ", stats.decode_errors + stats.apply_errors,
                      "\n");
    }
    return metrics_.Render(inflight, extra + SessionsGauge());
  }

  json DebugIndex() const override {
    json workers = json::array();
    state_->ReadIndex([&](const KvEventIndex& index) {
      for (WorkerId d = 0; d < index.num_workers(); ++d) {
        workers.push_back({{"blocks", index.event_blocks(d)},
                           {"next_sequence", index.next_sequence(d)},
                           {"held_batches", index.held_batches(d)},
                           {"orphan_blocks", index.orphan_blocks(d)},
                           {"unknown_removals", index.unknown_removals(d)},
                           {"abandoned_gaps", index.abandoned_gaps(d)}});
      }
      return 0;
    });
    json out = {{"workers", workers}};
    if (subscriber_ != nullptr) {
      const engine::SubscriberStats stats = subscriber_->stats();
      out["events"] = {{"batches_applied", stats.batches_applied},
                       {"decode_errors", stats.decode_errors},
                       {"replay_requests", stats.replay_requests},
                       {"abandoned_gaps", stats.abandoned_gaps},
                       {"last_error", stats.last_error}};
    }
    return out;
  }

 protected:
  void Serve(const Turn& turn, SessionState& s, Reply& reply) override {
    const std::span<const TokenId> fresh =
        std::span<const TokenId>(turn.tokens).subspan(s.context.size());
    const Request request = s.hasher->BeginTurn(fresh);

    absl::StatusOr<DispatchOp<KvEventIndex>> op = StartDispatch(*state_, request);
    if (!op.ok()) {
      s.hasher.reset();  // the chain advanced for a turn that never ran
      return reply.Fail(400, std::string(op.status().message()));
    }
    while (op->awaiting_admit()) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<AdmitResult> answer = transport_->Admit(op->admit_target(), op->admit_query());
      metrics_.AdmissionAttempt(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      const AdmitResult result =
          answer.ok() ? *answer : AdmitResult::Rejected(RejectReason::kWorkerUnavailable);
      if (!result.admitted) metrics_.Rejection(result.reason);
      if (absl::Status fed = op->OnAdmitResult(result); !fed.ok()) {
        metrics_.Request(false);
        s.hasher.reset();
        return reply.Fail(502, std::string(fed.message()));
      }
    }
    const Decision decision = op->decision();
    metrics_.Decision(decision.mode);
    engine::HttpWorkerTransport::Attachment attachment = transport_->Attach(
        turn.session, json{{"token_ids", turn.tokens}, {"max_tokens", turn.max_tokens}},
        engine::HttpWorkerTransport::StreamCallbacks{.on_tokens = RelayTo(reply)});
    const absl::Status ran = RunDecision(*transport_, decision, request);
    (void)op->Complete();
    absl::StatusOr<std::vector<TokenId>> answered =
        ran.ok() ? OutputOf(attachment.response()) : ran;
    if (!answered.ok()) {
      metrics_.Request(false);
      s.hasher.reset();  // what the workers hold is unknown now
      return reply.Fail(502, std::string(answered.status().message()));
    }
    const std::vector<TokenId> output = *std::move(answered);
    s.hasher->AppendContext(output);
    s.context = turn.tokens;
    s.context.insert(s.context.end(), output.begin(), output.end());
    metrics_.Request(true);
    reply.Done(output, {{"policy", "kvc"},
                        {"turn", request.turn},
                        {"mode", std::string(DecisionModeName(decision.mode))},
                        {"decode_worker", decision.decode},
                        {"prefill_worker",
                         decision.prefill == kNoWorker ? json(nullptr) : json(decision.prefill)},
                        {"attempts", op->attempts()},
                        {"prefix_blocks", request.prefix_hashes.size()}});
  }

  // The decode worker keeps the session's KV until its own LRU evicts it;
  // the gateway forgets the conversation.
  void CloseSession(SessionId, SessionState&, json&) override {}

 private:
  std::unique_ptr<RoutingState<KvEventIndex>> state_;
  std::unique_ptr<engine::KvEventSubscriber> subscriber_;
};

// --policy ear (or another affinity rule): colocated instances that keep
// each session's KV in their own cache, loads from a LoadLedger of what
// this gateway sent, first turns queued while the policy holds them (load
// control), sessions moved with their KV when the placement says so.
class AffinityGateway final : public GatewayBase {
 public:
  AffinityGateway(std::unique_ptr<policy::AffinityPolicy> policy,
                  std::unique_ptr<policy::LoadLedger> ledger,
                  std::unique_ptr<engine::HttpWorkerTransport> transport,
                  std::unique_ptr<engine::Tokenizer> tokenizer,
                  absl::flat_hash_set<std::string> loras, uint32_t block_tokens,
                  uint32_t default_max_tokens, size_t max_queued)
      : GatewayBase(std::move(transport), std::move(tokenizer), std::move(loras), block_tokens,
                    default_max_tokens),
        policy_(std::move(policy)),
        ledger_(std::move(ledger)),
        max_queued_(max_queued) {}

  std::string Metrics() const override {
    std::vector<uint64_t> inflight;
    std::string extra;
    extra += "# HELP kvc_pending_prefill_tokens Prefill tokens sent and not yet answered, per "
             "instance.\n";
    extra += "# TYPE kvc_pending_prefill_tokens gauge\n";
    for (WorkerId d = 0; d < ledger_->num_instances(); ++d) {
      const policy::InstanceLoad load = ledger_->instance_load(d);
      inflight.push_back(load.running_requests);
      absl::StrAppend(&extra, "kvc_pending_prefill_tokens{worker=\"", d, "\"} ",
                      load.pending_prefill_tokens, "\n");
    }
    extra += "# HELP kvc_instance_routable Whether new turns may go to the instance (0 while its "
             "circuit breaker is open after it stopped answering, or while it is drained).\n";
    extra += "# TYPE kvc_instance_routable gauge\n";
    for (WorkerId d = 0; d < ledger_->num_instances(); ++d) {
      absl::StrAppend(&extra, "kvc_instance_routable{worker=\"", d, "\"} ",
                      ledger_->routable(d) ? 1 : 0, "\n");
    }
    extra += "# HELP kvc_instance_breaker_openings_total Times the instance's circuit breaker "
             "opened.\n";
    extra += "# TYPE kvc_instance_breaker_openings_total counter\n";
    for (WorkerId d = 0; d < ledger_->num_instances(); ++d) {
      absl::StrAppend(&extra, "kvc_instance_breaker_openings_total{worker=\"", d, "\"} ",
                      ledger_->instance_breaker_openings(d), "\n");
    }
    std::lock_guard<std::mutex> lock(policy_mu_);
    extra += "# HELP kvc_session_migrations_total Session KV moves: ok, empty (the source held "
             "nothing or the target kept nothing), error.\n";
    extra += "# TYPE kvc_session_migrations_total counter\n";
    absl::StrAppend(&extra, "kvc_session_migrations_total{status=\"ok\"} ", migrations_ok_, "\n");
    absl::StrAppend(&extra, "kvc_session_migrations_total{status=\"empty\"} ", migrations_empty_,
                    "\n");
    absl::StrAppend(&extra, "kvc_session_migrations_total{status=\"error\"} ", migrations_failed_,
                    "\n");
    extra += "# HELP kvc_held_first_turns_total First turns that waited in the load-control "
             "queue.\n";
    extra += "# TYPE kvc_held_first_turns_total counter\n";
    absl::StrAppend(&extra, "kvc_held_first_turns_total ", held_turns_, "\n");
    extra += "# HELP kvc_hold_wait_seconds_total Time first turns spent in that queue.\n";
    extra += "# TYPE kvc_hold_wait_seconds_total counter\n";
    absl::StrAppend(&extra, "kvc_hold_wait_seconds_total ", absl::StrFormat("%.6f", hold_wait_s_),
                    "\n");
    extra += "# HELP kvc_hold_queue_length First turns waiting in that queue now.\n";
    extra += "# TYPE kvc_hold_queue_length gauge\n";
    absl::StrAppend(&extra, "kvc_hold_queue_length ", queue_.size(), "\n");
    extra += "# HELP kvc_arrival_window_length First turns in their arrival windows now.\n";
    extra += "# TYPE kvc_arrival_window_length gauge\n";
    absl::StrAppend(&extra, "kvc_arrival_window_length ", windows_.size(), "\n");
    extra += "# HELP kvc_arrival_window_first_turns_total First turns that waited their arrival "
             "window for shorter first turns arriving with them.\n";
    extra += "# TYPE kvc_arrival_window_first_turns_total counter\n";
    absl::StrAppend(&extra, "kvc_arrival_window_first_turns_total ", window_turns_, "\n");
    extra += "# HELP kvc_arrival_window_wait_seconds_total Time first turns spent in their "
             "arrival windows.\n";
    extra += "# TYPE kvc_arrival_window_wait_seconds_total counter\n";
    absl::StrAppend(&extra, "kvc_arrival_window_wait_seconds_total ",
                    absl::StrFormat("%.6f", window_wait_s_), "\n");
    extra += "# HELP kvc_live_context_tokens Context tokens of the sessions the policy counts "
             "as live.\n";
    extra += "# TYPE kvc_live_context_tokens gauge\n";
    absl::StrAppend(&extra, "kvc_live_context_tokens ", policy_->live_context_tokens(), "\n");
    return metrics_.Render(inflight, extra + SessionsGauge());
  }

  json DebugIndex() const override {
    json instances = json::array();
    std::lock_guard<std::mutex> lock(policy_mu_);
    for (WorkerId d = 0; d < ledger_->num_instances(); ++d) {
      const policy::InstanceLoad load = ledger_->instance_load(d);
      instances.push_back({{"running_requests", load.running_requests},
                           {"pending_prefill_tokens", load.pending_prefill_tokens},
                           {"committed_tokens", policy_->committed_tokens(d)},
                           {"breaker", std::string(BreakerStateName(ledger_->instance_breaker(d)))}});
    }
    return json{{"policy", std::string(policy_->name())},
                {"instances", instances},
                {"live_context_tokens", policy_->live_context_tokens()},
                {"return_rate", policy_->return_rate()},
                {"hold_queue_length", queue_.size()}};
  }

 protected:
  void Serve(const Turn& turn, SessionState& s, Reply& reply) override {
    const std::span<const TokenId> fresh =
        std::span<const TokenId>(turn.tokens).subspan(s.context.size());
    const uint64_t previous_context = s.context.size();
    policy::PolicyRequest request;
    request.request = s.hasher->BeginTurn(fresh);
    request.input_tokens = s.hasher->total_tokens();
    const std::vector<BlockHash> input_hashes(s.hasher->hashes().begin(),
                                              s.hasher->hashes().end());
    request.input_hashes = input_hashes;

    double held_s = 0;
    absl::StatusOr<policy::Placement> placement;
    std::optional<policy::LoadLedger::Ticket> ticket;
    {
      std::unique_lock<std::mutex> lock(policy_mu_);
      request.id = next_request_id_++;
      // Only a session the policy has not placed yet queues: a bound
      // session's fresh chain (after an error or a rewritten prompt) is a
      // running session and never waits behind new ones.
      if (request.request.turn == 0 && policy_->binding(turn.session) == kNoWorker) {
        absl::StatusOr<double> waited = WaitForRoom(lock, request, s.cancel, reply);
        if (!waited.ok()) {
          lock.unlock();
          s.hasher.reset();  // nothing was sent: the next request starts the chain again
          metrics_.Request(false);
          return reply.Fail(absl::IsCancelled(waited.status()) ? 409 : 503,
                            std::string(waited.status().message()),
                            /*retry=*/absl::IsResourceExhausted(waited.status()));
        }
        held_s = *waited;
      }
      placement = policy_->Place(request, *ledger_);
      if (placement.ok()) {
        absl::StatusOr<policy::LoadLedger::Ticket> booked = ledger_->Start(
            *placement, request.input_tokens -
                            std::min(request.input_tokens, placement->estimated_hit_tokens));
        if (!booked.ok()) {
          policy_->OnFinished(request, *placement, *ledger_);
          placement = booked.status();
        } else {
          ticket.emplace(std::move(*booked));
        }
      }
      queue_cv_.notify_all();  // the next first turn in the queue may go now
    }
    if (!placement.ok()) {
      metrics_.Request(false);
      s.hasher.reset();
      // Unavailable: no instance is routable (breakers open, or drained),
      // which passes; else the gateway's own configuration is at fault.
      const bool passes = absl::IsUnavailable(placement.status());
      return reply.Fail(passes ? 503 : 500, std::string(placement.status().message()),
                        /*retry=*/passes);
    }
    // OnFinished exactly once per placed turn, also when the transport
    // throws (the ticket gives its load back by itself).
    bool reported = false;
    auto report_finished = [&] {
      if (std::exchange(reported, true)) return;
      std::lock_guard<std::mutex> lock(policy_mu_);
      policy_->OnFinished(request, *placement, *ledger_);
      queue_cv_.notify_all();
    };
    absl::Cleanup report_on_unwind = [&] { report_finished(); };
    const WorkerId instance = placement->instance;
    bool moved = false;
    if (placement->migrate_from != kNoWorker) {
      // The session's KV goes first. What the move kept replaces the
      // policy's estimate in the ledger: if it failed or brought nothing the
      // instance prefills the whole input (booked whole: an over-count when
      // the target still holds part of it), and the placements that follow
      // must see that work.
      absl::StatusOr<uint64_t> kept =
          transport_->MoveSessionKv(placement->migrate_from, instance, turn.session);
      // The move is a call to the target (it pulls from the source), so it
      // feeds the target's breaker as the turn's own call does. A target
      // that never answered it would not answer the turn either: the client
      // retries instead of waiting out a second timeout, and the breaker
      // counts one failure for the turn.
      ReportCall(instance, kept.status());
      if (engine::HttpWorkerTransport::NoAnswer(kept.status())) {
        {
          std::lock_guard<std::mutex> lock(policy_mu_);
          ++migrations_failed_;
        }
        report_finished();  // no context learned
        metrics_.Request(false);
        s.hasher.reset();  // what the instances hold is unknown now
        return reply.Fail(503, std::string(kept.status().message()), /*retry=*/true);
      }
      moved = kept.ok() && *kept > 0;
      const uint64_t held = kept.ok() ? std::min(request.input_tokens, *kept) : 0;
      // Cannot fail: the prefill is still pending and no larger than booked input.
      ticket->Rebook(request.input_tokens - held).IgnoreError();
      std::lock_guard<std::mutex> lock(policy_mu_);
      ++(moved ? migrations_ok_ : kept.ok() ? migrations_empty_ : migrations_failed_);
    }
    const uint64_t prefill_booked = ticket->prefill_tokens();
    // The instance streams: its prefill stops counting as pending at the
    // first token, as ear's placement and hot trigger assume (an instance
    // that answers in one piece releases it at the answer).
    engine::HttpWorkerTransport::Attachment attachment = transport_->Attach(
        turn.session, json{{"token_ids", turn.tokens}, {"max_tokens", turn.max_tokens}},
        {.on_first_token = [&ticket] { ticket->FirstToken(); }, .on_tokens = RelayTo(reply)});
    const absl::Status ran = transport_->RunOnInstance(instance, request.request);
    ticket->Finish();
    ReportCall(instance, ran);
    if (std::find(s.served.begin(), s.served.end(), instance) == s.served.end()) {
      s.served.push_back(instance);
    }
    const json answer = attachment.response();
    absl::StatusOr<std::vector<TokenId>> answered = ran.ok() ? OutputOf(answer) : ran;
    if (!answered.ok()) {
      report_finished();  // no context learned
      metrics_.Request(false);
      s.hasher.reset();  // what the instance holds is unknown now
      return reply.Fail(502, std::string(answered.status().message()));
    }
    const std::vector<TokenId> output = *std::move(answered);
    s.hasher->AppendContext(output);
    request.context_hashes = s.hasher->hashes();
    report_finished();
    s.context = turn.tokens;
    s.context.insert(s.context.end(), output.begin(), output.end());
    // The mode from what the instance reports it held (as the simulator
    // classifies): Direct when all of the previous context was cached.
    DecisionMode mode = placement->mode;
    if (request.request.turn > 0 && answer.contains("cached_tokens") &&
        answer["cached_tokens"].is_number_unsigned()) {
      mode = answer["cached_tokens"].get<uint64_t>() >= previous_context ? DecisionMode::kDirect
                                                                          : DecisionMode::kReseed;
    }
    metrics_.Decision(mode);
    metrics_.Request(true);
    json kvc = {{"policy", std::string(policy_->name())},
                {"turn", request.request.turn},
                {"mode", std::string(DecisionModeName(mode))},
                {"decode_worker", instance},
                {"prefill_worker", nullptr},
                {"migrated_from", placement->migrate_from == kNoWorker
                                      ? json(nullptr)
                                      : json(placement->migrate_from)},
                {"migrated", moved},
                {"prefill_booked_tokens", prefill_booked},
                {"held_s", held_s},
                {"prefix_blocks", request.request.prefix_hashes.size()}};
    if (answer.contains("cached_tokens")) kvc["cached_tokens"] = answer["cached_tokens"];
    reply.Done(output, std::move(kvc));
  }

  void CancelWaiting() override {
    std::lock_guard<std::mutex> lock(policy_mu_);
    queue_cv_.notify_all();
  }

  bool CloseForgotten(SessionId session, json& out) override {
    WorkerId bound = kNoWorker;
    {
      std::lock_guard<std::mutex> lock(policy_mu_);
      bound = policy_->binding(session);
      if (bound == kNoWorker) return false;
      policy_->OnSessionClosed(session);
      queue_cv_.notify_all();
    }
    json closed = json::array();
    if (transport_->CloseSession(bound, session).ok()) closed.push_back(bound);
    out["instances_closed"] = closed;
    return true;
  }

  absl::Status SetDrained(WorkerId instance, bool drained) override {
    absl::Status status = ledger_->SetDrained(instance, drained);
    std::lock_guard<std::mutex> lock(policy_mu_);
    queue_cv_.notify_all();  // a held first turn sees the change at once
    return status;
  }

  // A new instance must answer GET /health first (a mistyped URL would
  // otherwise look idle and draw every new session) and must not be in
  // already (a retried POST would split one engine's load over two ids).
  // The transport, the ledger and the policy then grow together, under the
  // policy's lock so that no Place sees them disagree; the URL is checked
  // and the slot counted first, so none of them refuses after another grew.
  absl::StatusOr<WorkerId> AddInstance(const std::string& url) override {
    if (absl::Status valid = engine::HttpWorkerTransport::CheckUrl(url); !valid.ok()) {
      return valid;
    }
    httplib::Client probe(url);
    probe.set_connection_timeout(std::chrono::seconds(2));
    probe.set_read_timeout(std::chrono::seconds(2));
    const httplib::Result health = probe.Get("/health");
    if (!health || health->status != 200) {
      return absl::UnavailableError(absl::StrCat(
          "instance ", url, " does not answer GET /health",
          health ? absl::StrCat(" with 200 (HTTP ", health->status, ")")
                 : absl::StrCat(" (", httplib::to_string(health.error()), ")")));
    }
    std::lock_guard<std::mutex> lock(policy_mu_);
    const std::vector<std::string> known = transport_->decode_urls();
    if (auto it = std::find(known.begin(), known.end(), url); it != known.end()) {
      return absl::AlreadyExistsError(
          absl::StrCat(url, " is instance ", it - known.begin(), " already"));
    }
    if (ledger_->num_instances() >= kMaxWorkers) {
      return absl::ResourceExhaustedError(absl::StrCat("all ", kMaxWorkers, " instances exist"));
    }
    const absl::StatusOr<WorkerId> on_transport = transport_->AddDecodeUrl(url);
    if (!on_transport.ok()) return on_transport.status();
    const absl::StatusOr<WorkerId> on_ledger = ledger_->AddInstance();
    if (!on_ledger.ok()) return on_ledger.status();
    const absl::StatusOr<WorkerId> on_policy = policy_->AddInstance();
    if (!on_policy.ok()) return on_policy.status();
    if (*on_transport != *on_ledger || *on_ledger != *on_policy) {
      return absl::InternalError("the transport, ledger and policy disagree on the new id");
    }
    queue_cv_.notify_all();  // a held first turn may fit now
    return *on_policy;
  }

  void CloseSession(SessionId session, SessionState& s, json& out) override {
    {
      std::lock_guard<std::mutex> lock(policy_mu_);
      policy_->OnSessionClosed(session);
      queue_cv_.notify_all();
    }
    json closed = json::array();
    for (WorkerId instance : s.served) {
      if (transport_->CloseSession(instance, session).ok()) closed.push_back(instance);
    }
    out["instances_closed"] = closed;
  }

 private:
  // Feeds `instance`'s circuit breaker with one call's outcome: only a call
  // it never answered counts against it (an HTTP error or a bad answer
  // proves it alive).
  void ReportCall(WorkerId instance, const absl::Status& outcome) {
    if (engine::HttpWorkerTransport::NoAnswer(outcome)) {
      ledger_->ReportUnavailable(instance);
    } else {
      ledger_->ReportAnswered(instance);
    }
  }

  // A new session's first turn waits its arrival window for shorter first
  // turns arriving with it (RoutingPolicy::ArrivalWindow), then load
  // control queues it, oldest first, until the policy lets it in; rechecked
  // when a request finishes, a session closes or every kHoldRecheckSeconds.
  // Returns the seconds it waited in load control; Cancelled when its
  // session was closed meanwhile or its client went away (a streamed turn
  // hears of it at the keep-alive it sends each kHoldRecheckSeconds, written
  // outside the lock), ResourceExhausted when the queue is full (each
  // waiting turn holds a server thread).
  absl::StatusOr<double> WaitForRoom(std::unique_lock<std::mutex>& lock,
                                     const policy::PolicyRequest& request,
                                     const std::atomic<bool>& cancel, Reply& reply) {
    if (queue_.size() + windows_.size() >= max_queued_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the load-control queue is full (", queue_.size() + windows_.size(),
          " first turns wait); retry later"));
    }
    const uint64_t position = next_position_++;
    // Leaves the window and the queue on every path (placed, cancelled, or
    // unwinding).
    absl::Cleanup leave = [&] {
      if (!queue_.empty() && queue_.front() == position) queue_front_held_ = false;
      windows_.Remove(position);
      std::erase(queue_, position);
      queue_cv_.notify_all();
    };
    const policy::ArrivalOrder order = policy_->ArrivalWindow(request, *ledger_);
    const double window_start_s = ledger_->now_s();
    if (order.window_s > 0) {
      windows_.Add(position, order, window_start_s);
      while (true) {
        if (cancel) {
          return absl::CancelledError("the session was closed while its first turn waited");
        }
        // Whichever waiting thread wakes first moves every turn whose window
        // ended, with the shorter ones, to the queue in their order.
        EnqueueArrivals(windows_.Release(ledger_->now_s()));
        if (!windows_.contains(position)) break;
        queue_cv_.wait_for(lock, std::chrono::duration<double>(
                                     std::clamp(windows_.next_deadline_s() - ledger_->now_s(), 0.0,
                                                policy::kHoldRecheckSeconds)));
      }
      const double window_waited = ledger_->now_s() - window_start_s;
      if (window_waited > 0) {
        ++window_turns_;
        window_wait_s_ += window_waited;
      }
    } else {
      // A turn that does not wait goes behind the shorter ones still waiting.
      EnqueueArrivals(windows_.Release(window_start_s, order.key));
      queue_.push_back(position);
    }
    // The turn reached the gateway at window_start_s (max_hold_s counts from
    // there); a wait in load control counts from now.
    const double arrived_s = window_start_s;
    const double queued_s = ledger_->now_s();
    // Held by the policy, or behind a turn it held (not merely behind one
    // released from its window a moment earlier).
    bool held = false;
    const auto recheck = std::chrono::duration<double>(policy::kHoldRecheckSeconds);
    auto last_sign = std::chrono::steady_clock::now();
    while (true) {
      if (cancel) {
        return absl::CancelledError("the session was closed while its first turn waited");
      }
      if (queue_.front() == position) {
        const bool was_held = queue_front_held_;
        queue_front_held_ = policy_->HoldNewSession(request, *ledger_, arrived_s);
        if (!queue_front_held_) break;
        // Turns already asleep behind it count as held too.
        if (!was_held) queue_cv_.notify_all();
      }
      held = held || queue_front_held_;
      queue_cv_.wait_for(lock, recheck);
      if (reply.streams() && std::chrono::steady_clock::now() - last_sign >= recheck) {
        last_sign = std::chrono::steady_clock::now();
        bool client_waits = false;
        {
          lock.unlock();  // a slow client must not stall the policy
          // Locked again on every path: `leave` edits the queue under it.
          absl::Cleanup relock = [&lock] { lock.lock(); };
          client_waits = reply.StillWaiting();
        }
        if (!client_waits) {
          return absl::CancelledError("the client went away while its first turn waited");
        }
      }
    }
    const double waited = ledger_->now_s() - queued_s;
    if (held) {
      ++held_turns_;
      hold_wait_s_ += waited;
    }
    return held ? waited : 0.0;
  }

  void EnqueueArrivals(const std::vector<uint64_t>& positions) {
    if (positions.empty()) return;
    queue_.insert(queue_.end(), positions.begin(), positions.end());
    queue_cv_.notify_all();
  }

  // Guards the policy (not thread-safe) and everything below the ledger.
  // std:: primitives rather than absl::CondVar, which the project's TSan
  // build cannot see through (tests/tsan/absl_mutex_tsan_annotations.cpp).
  mutable std::mutex policy_mu_;
  std::condition_variable queue_cv_;  // a turn finished, a session closed
  std::unique_ptr<policy::AffinityPolicy> policy_;
  std::unique_ptr<policy::LoadLedger> ledger_;  // thread-safe on its own
  std::deque<uint64_t> queue_;                  // first turns waiting, oldest first
  // First turns in their arrival windows (RoutingPolicy::ArrivalWindow), by
  // queue position.
  policy::ArrivalWindows windows_;
  bool queue_front_held_ = false;  // the policy holds the turn at the queue's front
  uint64_t window_turns_ = 0;
  double window_wait_s_ = 0;
  uint64_t next_position_ = 0;
  uint64_t next_request_id_ = 0;
  uint64_t held_turns_ = 0;
  double hold_wait_s_ = 0;
  uint64_t migrations_ok_ = 0;
  uint64_t migrations_empty_ = 0;
  uint64_t migrations_failed_ = 0;
  size_t max_queued_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvc-gateway: an OpenAI-style gateway routing with kvc_router"};
  std::string host = "127.0.0.1";
  int port = 0;
  std::string policy_name = "kvc";
  std::vector<std::string> decode_urls, prefill_urls, instance_urls, kv_events, loras;
  RouterConfig config;
  config.block_tokens = 16;
  uint32_t max_tokens = 16;
  policy::AffinityPolicyOptions affinity;
  affinity.rule = policy::AffinityRule::kEar;
  app.add_option("--host", host, "address to listen on")->capture_default_str();
  app.add_option("--port", port, "HTTP port")->required();
  app.add_option("--policy", policy_name,
                 "kvc (prefill + decode workers with the admission RPC) or an affinity policy "
                 "over colocated --instance workers: ear (recommended), unified, sticky, "
                 "lmetric, load-only")
      ->capture_default_str();
  app.add_option("--decode", decode_urls, "kvc: decode worker URL (repeatable; order = worker id)");
  app.add_option("--prefill", prefill_urls, "kvc: prefill worker URL (repeatable)");
  app.add_option("--kv-events", kv_events,
                 "kvc: PUB[,REPLAY] endpoints of the n-th decode worker's KV events (repeatable)");
  app.add_option("--instance", instance_urls,
                 "affinity policies: colocated instance URL (repeatable; order = instance id)");
  app.add_option("--block-tokens", config.block_tokens,
                 "tokens per block: the engines' block size")
      ->capture_default_str();
  app.add_option("--sticky-bonus", config.sticky_bonus, "kvc: alpha")->capture_default_str();
  app.add_option("--reject-threshold", config.reject_threshold, "kvc: tau_reject")
      ->capture_default_str();
  app.add_option("--max-admit-attempts", config.max_admit_attempts, "kvc: epsilon (0 = |D|)")
      ->capture_default_str();
  app.add_option("--kv-capacity-tokens", affinity.kv_capacity_tokens,
                 "affinity: each instance's KV pool in tokens (K_d; 0 = unknown: no memory "
                 "trigger, no load control)")
      ->capture_default_str();
  app.add_option("--hot-prefill-tokens", affinity.hot_prefill_tokens,
                 "ear: T_hot, pending prefill tokens that make an instance hot")
      ->capture_default_str();
  app.add_option("--migration-cooldown", affinity.migration_cooldown_s,
                 "ear: seconds between two moves of one session")
      ->capture_default_str();
  app.add_option("--session-idle", affinity.session_idle_s,
                 "ear: seconds after which an idle session stops counting as live (0 = learned "
                 "from the gaps between turns)")
      ->capture_default_str();
  app.add_option("--hold-new-sessions", affinity.hold_new_sessions,
                 "ear: queue first turns while live contexts fill the KV (load control)")
      ->capture_default_str();
  app.add_option("--hold-memory-fraction", affinity.hold_memory_fraction,
                 "ear: share of the cluster's KV the live contexts may fill")
      ->capture_default_str();
  app.add_option("--max-hold", affinity.max_hold_s, "ear: longest wait of a first turn, seconds")
      ->capture_default_str();
  app.add_option("--arrival-window-fraction", affinity.arrival_window_fraction,
                 "ear: a new session's first turn waits up to this share of its estimated prefill "
                 "time for shorter first turns arriving with it, which go first (0 = off)")
      ->capture_default_str();
  app.add_option("--max-arrival-window", affinity.max_arrival_window_s,
                 "ear: longest such wait, seconds (at most 1: a streamed turn gets no bytes "
                 "meanwhile)")
      ->check(CLI::Range(0.0, policy::kHoldRecheckSeconds))
      ->capture_default_str();
  size_t max_queued = 192;
  app.add_option("--max-queued-sessions", max_queued,
                 "ear: first turns the load-control queue keeps waiting (each holds one of the "
                 "256 server threads); more are answered 503 with Retry-After (streamed: an "
                 "error event)")
      ->check(CLI::Range(size_t{1}, size_t{224}))
      ->capture_default_str();
  HealthConfig breakers;
  uint32_t breaker_cooldown_s = 5;
  app.add_option("--breaker-failures", breakers.failure_threshold,
                 "affinity policies: calls an instance never answers within 10 s that open its "
                 "circuit breaker")
      ->check(CLI::Range(1u, 1000000u))
      ->capture_default_str();
  app.add_option("--breaker-cooldown", breaker_cooldown_s,
                 "affinity policies: seconds an open breaker keeps its instance out before one "
                 "turn probes it")
      ->check(CLI::Range(1u, 86400u))
      ->capture_default_str();
  engine::ConversationTable<SessionState>::Options conversations;
  app.add_option("--max-sessions", conversations.max_sessions,
                 "conversations (hash chain and last prompt + answer) kept for sessions that "
                 "were not closed; beyond it the least recently used are forgotten")
      ->check(CLI::Range(size_t{1}, size_t{100000000}))
      ->capture_default_str();
  app.add_option("--session-ttl", conversations.ttl_s,
                 "seconds after which an unused conversation is forgotten (its next turn "
                 "hashes its prompt whole)")
      ->check(CLI::Range(1.0, 1e9))
      ->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "default max_tokens")->capture_default_str();
  app.add_option("--lora", loras, "a LoRA adapter name requests may ask for as \"model\"");
  CLI11_PARSE(app, argc, argv);
  auto usage_error = [](const std::string& message) {
    std::cerr << "kvc-gateway: " << message << "\n";
    return 2;
  };

  std::unique_ptr<GatewayBase> gateway;
  if (policy_name == "kvc") {
    if (decode_urls.empty()) return usage_error("--policy kvc needs at least one --decode worker");
    if (!instance_urls.empty()) {
      return usage_error("--instance is for the affinity policies (e.g. --policy ear)");
    }
    config.num_decode_workers = static_cast<uint32_t>(decode_urls.size());
    config.num_prefill_workers = static_cast<uint32_t>(prefill_urls.size());
    if (!kv_events.empty() && kv_events.size() != decode_urls.size()) {
      return usage_error(absl::StrCat("give one --kv-events per --decode worker (",
                                      decode_urls.size(), "), got ", kv_events.size()));
    }
    KvEventIndex::Options index_options;
    index_options.block_tokens = config.block_tokens;
    index_options.learn_placements = kv_events.empty();
    absl::StatusOr<KvEventIndex> index =
        KvEventIndex::Create(config.num_decode_workers, index_options);
    if (!index.ok()) return usage_error(std::string(index.status().message()));
    auto state = RoutingState<KvEventIndex>::Create(config, std::move(*index));
    if (!state.ok()) return usage_error(std::string(state.status().message()));
    auto transport = engine::HttpWorkerTransport::Create(
        {.decode_urls = decode_urls, .prefill_urls = prefill_urls});
    if (!transport.ok()) return usage_error(std::string(transport.status().message()));
    RoutingState<KvEventIndex>& routing = **state;
    auto kvc = std::make_unique<KvcGateway>(
        std::move(*state), std::move(*transport), std::make_unique<engine::ByteTokenizer>(),
        absl::flat_hash_set<std::string>(loras.begin(), loras.end()), max_tokens);
    if (!kv_events.empty()) {
      std::vector<engine::EventSource> sources;
      for (size_t d = 0; d < kv_events.size(); ++d) {
        std::vector<std::string> parts = absl::StrSplit(kv_events[d], ',');
        engine::EventSource source;
        source.endpoint = parts[0];
        if (parts.size() > 1) source.replay_endpoint = parts[1];
        source.ranks = {{0, static_cast<WorkerId>(d)}};
        sources.push_back(std::move(source));
      }
      auto subscriber = engine::KvEventSubscriber::Create(sources, engine::SinkFor(routing));
      if (!subscriber.ok()) return usage_error(std::string(subscriber.status().message()));
      (*subscriber)->Start();
      kvc->set_subscriber(std::move(*subscriber));
    }
    gateway = std::move(kvc);
  } else {
    std::optional<policy::AffinityRule> rule;
    for (policy::AffinityRule r :
         {policy::AffinityRule::kLoadOnly, policy::AffinityRule::kLMetric,
          policy::AffinityRule::kSticky, policy::AffinityRule::kUnified,
          policy::AffinityRule::kEar}) {
      if (policy::AffinityRuleName(r) == policy_name) rule = r;
    }
    if (!rule.has_value()) {
      return usage_error(absl::StrCat("unknown --policy \"", policy_name,
                                      "\" (kvc, ear, unified, sticky, lmetric, load-only)"));
    }
    if (instance_urls.empty()) {
      return usage_error(absl::StrCat("--policy ", policy_name, " needs --instance workers"));
    }
    if (!decode_urls.empty() || !prefill_urls.empty() || !kv_events.empty()) {
      return usage_error(absl::StrCat(
          "--policy ", policy_name,
          " runs colocated --instance workers and learns their caches from its own "
          "placements; --decode, --prefill and --kv-events are for --policy kvc"));
    }
    affinity.rule = *rule;
    affinity.instances = static_cast<uint32_t>(instance_urls.size());
    affinity.block_tokens = config.block_tokens;
    auto created = policy::AffinityPolicy::Create(affinity);
    if (!created.ok()) return usage_error(std::string(created.status().message()));
    breakers.open_cooldown = absl::Seconds(breaker_cooldown_s);
    auto ledger = policy::LoadLedger::Create(policy::Topology::kColocated, affinity.instances, 0,
                                             nullptr, breakers);
    if (!ledger.ok()) return usage_error(std::string(ledger.status().message()));
    auto transport = engine::HttpWorkerTransport::Create({.decode_urls = instance_urls});
    if (!transport.ok()) return usage_error(std::string(transport.status().message()));
    gateway = std::make_unique<AffinityGateway>(
        std::move(*created), std::move(*ledger), std::move(*transport),
        std::make_unique<engine::ByteTokenizer>(),
        absl::flat_hash_set<std::string>(loras.begin(), loras.end()), config.block_tokens,
        max_tokens, max_queued);
  }
  if (absl::Status limited = gateway->LimitConversations(conversations); !limited.ok()) {
    return usage_error(std::string(limited.message()));
  }

  httplib::Server server;
  // First turns held by load control wait on a server thread; at most
  // --max-queued-sessions (224 or fewer) wait, so at least 32 threads are
  // left for the requests that free memory (later turns, closes).
  server.new_task_queue = [] { return new httplib::ThreadPool(256); };
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    gateway->Handle(req, res, /*chat=*/false);
  });
  server.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    gateway->Handle(req, res, /*chat=*/true);
  });
  server.Delete(R"(/v1/sessions/(.+))", [&](const httplib::Request& req, httplib::Response& res) {
    gateway->Close(req.matches[1].str(), res);
  });
  server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(gateway->Metrics(), "text/plain; version=0.0.4");
  });
  server.Get("/debug/index", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(gateway->DebugIndex().dump(), "application/json");
  });
  server.Post("/admin/instances", [&](const httplib::Request& req, httplib::Response& res) {
    gateway->Join(req.body, res);
  });
  server.Post(R"(/admin/instances/([^/]+)/(drain|resume))",
              [&](const httplib::Request& req, httplib::Response& res) {
                gateway->Drain(req.matches[1].str(), req.matches[2].str() == "drain", res);
              });
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"ok\":true}", "application/json");
  });
  if (!server.bind_to_port(host, port)) {
    std::cerr << "kvc-gateway: cannot listen on " << host << ":" << port << "\n";
    return 2;
  }
  std::cout << "kvc-gateway: listening on " << host << ":" << port << " (policy " << policy_name
            << ")" << std::endl;
  server.listen_after_bind();
  return 0;
}
