// kvc-gateway: an example OpenAI-style gateway that routes with kvc_router
// across prefill and decode workers over HTTP (docs/integration.md).
//
//   kvc-gateway --port 8000 --block-tokens 16
//       --prefill http://127.0.0.1:30000
//       --decode http://127.0.0.1:30001 --decode http://127.0.0.1:30002
//       --kv-events tcp://127.0.0.1:5557,tcp://127.0.0.1:5558
//       --kv-events tcp://127.0.0.1:5559,tcp://127.0.0.1:5560
//
// Endpoints:
//   POST /v1/completions       {"prompt", "max_tokens"?, "session_id"?, "model"?}
//   POST /v1/chat/completions  {"messages", "max_tokens"?, "session_id"?, "model"?}
//        The session comes from the X-Session-Id header, else the body's
//        "session_id" (or "user"); without one each request is its own
//        session. A "model" listed with --lora salts the hash chain, so
//        adapters never share cached blocks.
//   GET  /metrics              Prometheus text format
//   GET  /debug/index          the router's residency per decode worker (JSON)
//   GET  /health
// The n-th --kv-events (PUB endpoint, optional replay endpoint) belongs to
// the n-th --decode worker; with events on, the router's index holds what
// the engines report (placements are not learned optimistically).
#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "kvc_engine/gateway_support.hpp"
#include "kvc_engine/http_transport.hpp"
#include "kvc_engine/zmq_subscriber.hpp"
#include "kvc_router/kvc_router.hpp"

namespace {

using namespace kvc_router;
using nlohmann::json;

struct SessionState {
  absl::Mutex mu;
  std::optional<SessionHasher> hasher;
  BlockHash root = kChainRootHash;
  std::vector<TokenId> context;  // prompt + answer of the last turn
};

class Gateway {
 public:
  Gateway(std::unique_ptr<RoutingState<KvEventIndex>> state,
          std::unique_ptr<engine::HttpWorkerTransport> transport,
          std::unique_ptr<engine::Tokenizer> tokenizer, absl::flat_hash_set<std::string> loras,
          uint32_t default_max_tokens)
      : state_(std::move(state)),
        transport_(std::move(transport)),
        tokenizer_(std::move(tokenizer)),
        loras_(std::move(loras)),
        default_max_tokens_(default_max_tokens) {}

  void set_subscriber(std::unique_ptr<engine::KvEventSubscriber> subscriber) {
    subscriber_ = std::move(subscriber);
  }

  void Handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      return Fail(res, 400, "the body must be a JSON object");
    }
    std::string text;
    if (chat) {
      absl::StatusOr<std::string> rendered = engine::RenderChat(body.value("messages", json()));
      if (!rendered.ok()) return Fail(res, 400, std::string(rendered.status().message()));
      text = *rendered;
    } else {
      const json prompt = body.value("prompt", json());
      if (prompt.is_string()) {
        text = prompt.get<std::string>();
      } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_string()) {
        text = prompt[0].get<std::string>();
      } else {
        return Fail(res, 400, "\"prompt\" must be a string");
      }
    }
    const json max_tokens_json = body.value("max_tokens", json(default_max_tokens_));
    if (!max_tokens_json.is_number_unsigned() || max_tokens_json.get<uint64_t>() == 0 ||
        max_tokens_json.get<uint64_t>() > 65536) {
      return Fail(res, 400, "\"max_tokens\" must be in 1..65536");
    }
    const uint32_t max_tokens = max_tokens_json.get<uint32_t>();
    const std::string model = body.value("model", std::string());
    const BlockHash root = loras_.contains(model) ? ChainRootFor(model) : kChainRootHash;

    std::string session_key = req.get_header_value("X-Session-Id");
    if (session_key.empty() && body.contains("session_id")) {
      session_key = body["session_id"].is_string() ? body["session_id"].get<std::string>()
                                                   : body["session_id"].dump();
    }
    if (session_key.empty() && body.contains("user") && body["user"].is_string()) {
      session_key = body["user"].get<std::string>();
    }
    if (session_key.empty()) session_key = absl::StrCat("anonymous-", next_anonymous_++);
    const SessionId session = XXH3_64bits_withSeed(session_key.data(), session_key.size(), 0);

    std::shared_ptr<SessionState> s = SessionOf(session);
    absl::MutexLock session_lock(&s->mu);
    const std::vector<TokenId> tokens = tokenizer_->Encode(text);
    const bool continues = s->hasher.has_value() && s->root == root &&
                           tokens.size() >= s->context.size() &&
                           std::equal(s->context.begin(), s->context.end(), tokens.begin());
    if (!continues) {
      // A new conversation (or one that diverged): a fresh chain.
      s->hasher = *SessionHasher::Create(session, state_->config().block_tokens, root);
      s->root = root;
      s->context.clear();
    }
    const std::span<const TokenId> fresh =
        std::span<const TokenId>(tokens).subspan(s->context.size());
    const Request request = s->hasher->BeginTurn(fresh);

    absl::StatusOr<DispatchOp<KvEventIndex>> op = StartDispatch(*state_, request);
    if (!op.ok()) return Fail(res, 400, std::string(op.status().message()));
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
        return Fail(res, 502, std::string(fed.message()));
      }
    }
    const Decision decision = op->decision();
    metrics_.Decision(decision.mode);
    engine::HttpWorkerTransport::Attachment attachment =
        transport_->Attach(session, json{{"token_ids", tokens}, {"max_tokens", max_tokens}});
    const absl::Status ran = RunDecision(*transport_, decision, request);
    (void)op->Complete();
    if (!ran.ok()) {
      metrics_.Request(false);
      s->hasher.reset();  // what the workers hold is unknown now
      return Fail(res, 502, std::string(ran.message()));
    }
    const json answer = attachment.response();
    std::vector<TokenId> output;
    if (answer.contains("output_token_ids") && answer["output_token_ids"].is_array()) {
      for (const json& t : answer["output_token_ids"]) {
        if (t.is_number_unsigned()) output.push_back(t.get<TokenId>());
      }
    }
    s->hasher->AppendContext(output);
    s->context = tokens;
    s->context.insert(s->context.end(), output.begin(), output.end());
    metrics_.Request(true);

    const std::string completion = tokenizer_->Decode(output);
    json choice = {{"index", 0}, {"finish_reason", "length"}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", completion}};
    } else {
      choice["text"] = completion;
    }
    json out = {
        {"id", absl::StrCat(chat ? "chatcmpl-" : "cmpl-", request_ids_++)},
        {"object", chat ? "chat.completion" : "text_completion"},
        {"model", model},
        {"choices", json::array({choice})},
        {"usage",
         {{"prompt_tokens", tokens.size()},
          {"completion_tokens", output.size()},
          {"total_tokens", tokens.size() + output.size()}}},
        {"kvc",
         {{"session", session_key},
          {"turn", request.turn},
          {"mode", std::string(DecisionModeName(decision.mode))},
          {"decode_worker", decision.decode},
          {"prefill_worker", decision.prefill == kNoWorker ? json(nullptr) : json(decision.prefill)},
          {"attempts", op->attempts()},
          {"prefix_blocks", request.prefix_hashes.size()}}}};
    res.set_header("X-KVC-Mode", std::string(DecisionModeName(decision.mode)));
    res.set_header("X-KVC-Decode-Worker", std::to_string(decision.decode));
    res.set_content(out.dump(), "application/json");
  }

  std::string Metrics() const {
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
    std::vector<uint64_t> values(inflight.begin(), inflight.end());
    return metrics_.Render(values, extra);
  }

  json DebugIndex() const {
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

 private:
  static void Fail(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(json{{"error", {{"message", message}}}}.dump(), "application/json");
  }

  std::shared_ptr<SessionState> SessionOf(SessionId session) {
    absl::MutexLock lock(&sessions_mu_);
    std::shared_ptr<SessionState>& slot = sessions_[session];
    if (slot == nullptr) slot = std::make_shared<SessionState>();
    return slot;
  }

  std::unique_ptr<RoutingState<KvEventIndex>> state_;
  std::unique_ptr<engine::HttpWorkerTransport> transport_;
  std::unique_ptr<engine::Tokenizer> tokenizer_;
  absl::flat_hash_set<std::string> loras_;
  uint32_t default_max_tokens_;
  std::unique_ptr<engine::KvEventSubscriber> subscriber_;
  engine::GatewayMetrics metrics_;
  absl::Mutex sessions_mu_;
  absl::flat_hash_map<SessionId, std::shared_ptr<SessionState>> sessions_;
  std::atomic<uint64_t> next_anonymous_{0};
  std::atomic<uint64_t> request_ids_{0};
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvc-gateway: an OpenAI-style gateway routing with kvc_router"};
  std::string host = "127.0.0.1";
  int port = 0;
  std::vector<std::string> decode_urls, prefill_urls, kv_events, loras;
  RouterConfig config;
  config.block_tokens = 16;
  uint32_t max_tokens = 16;
  app.add_option("--host", host, "address to listen on")->capture_default_str();
  app.add_option("--port", port, "HTTP port")->required();
  app.add_option("--decode", decode_urls, "decode worker URL (repeatable; order = worker id)")
      ->required();
  app.add_option("--prefill", prefill_urls, "prefill worker URL (repeatable)");
  app.add_option("--kv-events", kv_events,
                 "PUB[,REPLAY] endpoints of the n-th decode worker's KV events (repeatable)");
  app.add_option("--block-tokens", config.block_tokens,
                 "tokens per block: the engines' block size")
      ->capture_default_str();
  app.add_option("--sticky-bonus", config.sticky_bonus, "alpha")->capture_default_str();
  app.add_option("--reject-threshold", config.reject_threshold, "tau_reject")->capture_default_str();
  app.add_option("--max-admit-attempts", config.max_admit_attempts, "epsilon (0 = |D|)")
      ->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "default max_tokens")->capture_default_str();
  app.add_option("--lora", loras, "a LoRA adapter name requests may ask for as \"model\"");
  CLI11_PARSE(app, argc, argv);

  config.num_decode_workers = static_cast<uint32_t>(decode_urls.size());
  config.num_prefill_workers = static_cast<uint32_t>(prefill_urls.size());
  if (!kv_events.empty() && kv_events.size() != decode_urls.size()) {
    std::cerr << "kvc-gateway: give one --kv-events per --decode worker (" << decode_urls.size()
              << "), got " << kv_events.size() << "\n";
    return 2;
  }
  KvEventIndex::Options index_options;
  index_options.block_tokens = config.block_tokens;
  index_options.learn_placements = kv_events.empty();
  absl::StatusOr<KvEventIndex> index = KvEventIndex::Create(config.num_decode_workers, index_options);
  if (!index.ok()) {
    std::cerr << "kvc-gateway: " << index.status().message() << "\n";
    return 2;
  }
  auto state = RoutingState<KvEventIndex>::Create(config, std::move(*index));
  if (!state.ok()) {
    std::cerr << "kvc-gateway: " << state.status().message() << "\n";
    return 2;
  }
  auto transport = engine::HttpWorkerTransport::Create(
      {.decode_urls = decode_urls, .prefill_urls = prefill_urls});
  if (!transport.ok()) {
    std::cerr << "kvc-gateway: " << transport.status().message() << "\n";
    return 2;
  }
  RoutingState<KvEventIndex>& routing = **state;
  Gateway gateway(std::move(*state), std::move(*transport),
                  std::make_unique<engine::ByteTokenizer>(),
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
    if (!subscriber.ok()) {
      std::cerr << "kvc-gateway: " << subscriber.status().message() << "\n";
      return 2;
    }
    (*subscriber)->Start();
    gateway.set_subscriber(std::move(*subscriber));
  }

  httplib::Server server;
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    gateway.Handle(req, res, /*chat=*/false);
  });
  server.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    gateway.Handle(req, res, /*chat=*/true);
  });
  server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(gateway.Metrics(), "text/plain; version=0.0.4");
  });
  server.Get("/debug/index", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(gateway.DebugIndex().dump(), "application/json");
  });
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"ok\":true}", "application/json");
  });
  if (!server.bind_to_port(host, port)) {
    std::cerr << "kvc-gateway: cannot listen on " << host << ":" << port << "\n";
    return 2;
  }
  std::cout << "kvc-gateway: listening on " << host << ":" << port << std::endl;
  server.listen_after_bind();
  return 0;
}
