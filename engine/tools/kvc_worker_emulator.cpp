// kvc-worker-emulator: a prefill or decode worker without a GPU, so a
// gateway can be tested end to end (docs/integration.md). A decode worker
// runs kvc_router's AdmissionController and a KV pool behind HTTP (the
// routes of kvc_engine/http_transport.hpp), takes its timing from the
// simulator's cost model (scaled by --time-scale) and publishes its KV
// events in vLLM's wire format (PUB + replay ROUTER). A prefill worker only
// answers /prefill. An instance (--role instance) is a colocated engine
// like SGLang with its radix cache, for gateways running the affinity
// policies (`kvc-gateway --policy ear`): no admission RPC; /generate
// serves from whatever the session left in the pool and keeps its context
// afterwards, evicting the least recently used idle sessions past
// --capacity-tokens; with "stream": true it answers as server-sent events,
// the first token when the prefill is done, the others as decoding goes
// ({"token_ids": [...]} events) and the whole answer at the end
// (--prefill-scale stretches the prefill alone); /migrate_kv pulls a
// session's KV from another instance (a stand-in for a KV connector), and
// /close_session drops it.
//
//   kvc-worker-emulator --role decode --port 30001 --capacity-tokens 20000
//       --block-size 16 --kv-events tcp://127.0.0.1:5557 --kv-replay tcp://127.0.0.1:5558
//
// Its KV pool keeps whole sessions (the tokens of their last context) and,
// like vLLM's prefix cache, names each full block by a chained hash of its
// own (XXH3 with a per-process random root, unrelated to the router's
// hashes); blocks shared by sessions are stored once. Admission evicts
// least recently used idle sessions when a request would not fit; each
// eviction publishes BlockRemoved for the blocks no session holds anymore.
// Replies carry deterministic output text, so a test can check them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvc_engine/event_publisher.hpp"
#include "kvc_engine/http_transport.hpp"
#include "kvc_router/admit.hpp"
#include "kvc_router/detail/xxhash.hpp"
#include "kvc_sim/cost_model.hpp"

namespace {

using namespace kvc_router;
using nlohmann::json;

bool Tokens(const json& body, std::vector<TokenId>& out) {
  if (!body.contains("token_ids")) return true;
  if (!body["token_ids"].is_array()) return false;
  for (const json& t : body["token_ids"]) {
    if (!t.is_number_unsigned() || t.get<uint64_t>() > UINT32_MAX) return false;
    out.push_back(static_cast<TokenId>(t.get<uint64_t>()));
  }
  return true;
}

// An optional unsigned field in 0..max (absent: `fallback`); for anything
// else the error names the field and the value it got.
absl::StatusOr<uint64_t> Unsigned(const json& body, const char* key, uint64_t fallback,
                                  uint64_t max) {
  if (!body.contains(key)) return fallback;
  if (!body[key].is_number_unsigned() || body[key].get<uint64_t>() > max) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an integer in 0..",
                                                   max, ", got ", body[key].dump()));
  }
  return body[key].get<uint64_t>();
}

class Worker {
 public:
  Worker(AdmissionController admit, sim::CostModel cost, double time_scale, uint32_t block_size,
         std::unique_ptr<engine::KvEventPublisher> publisher, bool cache_role,
         uint64_t cache_capacity_tokens, double prefill_scale)
      : cache_role_(cache_role),
        cache_capacity_tokens_(cache_capacity_tokens),
        admit_(std::move(admit)),
        cost_(cost),
        time_scale_(time_scale),
        prefill_scale_(prefill_scale),
        block_size_(block_size),
        root_(std::random_device{}() | (uint64_t{std::random_device{}()} << 32)),
        publisher_(std::move(publisher)) {}

  json Admit(const AdmitQuery& query) {
    absl::MutexLock lock(&mu_);
    ++admissions_;
    absl::StatusOr<AdmitResult> first = admit_.Evaluate(query);
    if (first.ok() && !first->admitted &&
        first->reason != RejectReason::kRealLargeAppend) {
      // Make room the way a cache does before it says no.
      const uint64_t need = query.input_tokens;
      for (SessionId evicted : admit_.EvictLeastRecentlyUsedExcept(need, query.session)) {
        ++evictions_;
        DropSessionKvLocked(evicted);
      }
    }
    absl::StatusOr<AdmitResult> result = admit_.Admit(query);
    if (!result.ok()) return json{{"error", std::string(result.status().message())}};
    if (!result->admitted) ++rejections_;
    return engine::AdmitResultToJson(*result);
  }

  // Append-prefill (direct) or decode after a transfer; returns the reply.
  json Generate(SessionId session, uint32_t turn, const std::string& mode,
                const std::vector<TokenId>& context, uint32_t max_tokens) {
    uint64_t cached = 0;
    uint64_t batch = 0;
    {
      absl::MutexLock lock(&mu_);
      if (mode == "direct") {
        auto it = kv_.find(session);
        if (it != kv_.end()) cached = CommonPrefix(it->second.tokens, context);
      } else {
        cached = context.size();  // the KV arrived with receive_kv (or fallback's prefill)
      }
      batch = ++running_;
    }
    const uint64_t fresh = context.size() - std::min<uint64_t>(cached, context.size());
    double seconds = fresh > 0 ? cost_.PrefillSeconds(fresh, cached) : 0.0;
    for (uint32_t i = 0; i < max_tokens; ++i) {
      seconds += cost_.DecodeStepSeconds(batch, context.size() + i);
    }
    Sleep(seconds);
    std::vector<TokenId> output = Answer(session, turn, max_tokens);
    const std::string text(output.begin(), output.end());
    absl::MutexLock lock(&mu_);
    --running_;
    ++generated_;
    if (mode != "fallback") {
      std::vector<TokenId> full = context;
      full.insert(full.end(), output.begin(), output.end());
      if (admit_.IsResident(session)) {
        const uint64_t before = admit_.resident_tokens(session);
        if (full.size() > before) (void)admit_.AddTokens(session, full.size() - before);
        (void)admit_.OnRequestFinished(session);
        SetSessionKvLocked(session, std::move(full));
      }
    }
    return json{{"text", text},
                {"output_token_ids", output},
                {"cached_tokens", cached},
                {"prefill_tokens", fresh},
                {"seconds", seconds}};
  }

  // Instance role: one turn served from the session's cached context, in
  // two steps so that it can be streamed: BeginCached takes the request in
  // (and prices its prefill and decode), FinishCached answers it and keeps
  // the context. Every begun turn must be finished exactly once.
  struct CachedTurn {
    SessionId session = 0;
    uint32_t turn = 0;
    std::vector<TokenId> context;
    std::vector<TokenId> output;
    uint64_t cached = 0, fresh = 0;
    double prefill_s = 0, decode_s = 0;  // cost-model seconds, before --time-scale
  };
  CachedTurn BeginCached(SessionId session, uint32_t turn, std::vector<TokenId> context,
                         uint32_t max_tokens) {
    CachedTurn t{.session = session, .turn = turn, .context = std::move(context)};
    uint64_t batch = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = kv_.find(session);
      if (it != kv_.end()) t.cached = CommonPrefix(it->second.tokens, t.context);
      ++busy_[session];
      batch = ++running_;
    }
    t.fresh = t.context.size() - t.cached;
    t.prefill_s = t.fresh > 0 ? prefill_scale_ * cost_.PrefillSeconds(t.fresh, t.cached) : 0.0;
    for (uint32_t i = 0; i < max_tokens; ++i) {
      t.decode_s += cost_.DecodeStepSeconds(batch, t.context.size() + i);
    }
    t.output = Answer(session, turn, max_tokens);
    return t;
  }
  json FinishCached(const CachedTurn& t) {
    std::vector<TokenId> full = t.context;
    full.insert(full.end(), t.output.begin(), t.output.end());
    absl::MutexLock lock(&mu_);
    --running_;
    ++generated_;
    if (--busy_[t.session] == 0) busy_.erase(t.session);
    KeepCachedLocked(t.session, std::move(full));
    return json{{"text", std::string(t.output.begin(), t.output.end())},
                {"output_token_ids", t.output},
                {"cached_tokens", t.cached},
                {"prefill_tokens", t.fresh},
                {"seconds", t.prefill_s + t.decode_s}};
  }
  json GenerateCached(SessionId session, uint32_t turn, const std::vector<TokenId>& context,
                      uint32_t max_tokens) {
    const CachedTurn t = BeginCached(session, turn, context, max_tokens);
    Sleep(t.prefill_s + t.decode_s);
    return FinishCached(t);
  }

  void Sleep(double seconds) const {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds * time_scale_));
  }

  // Instance role: what this instance holds of `session` (its tokens), for
  // another instance pulling it; the local copy becomes the first thing
  // evicted, as after an engine's KV send.
  json ExportKv(SessionId session) {
    absl::MutexLock lock(&mu_);
    auto it = kv_.find(session);
    if (it == kv_.end()) return json{{"token_ids", json::array()}};
    last_use_[session] = 0;
    ++migrations_out_;
    return json{{"token_ids", it->second.tokens}};
  }

  // Instance role: pulls `session`'s KV from the instance at `source`.
  json MigrateIn(SessionId session, const std::string& source) {
    httplib::Client client(source);
    client.set_connection_timeout(std::chrono::seconds(2));
    client.set_read_timeout(std::chrono::seconds(30));
    httplib::Result result =
        client.Post("/export_kv", json{{"session_id", session}}.dump(), "application/json");
    if (!result || result->status != 200) {
      return json{{"error", "the source instance did not answer /export_kv"}};
    }
    const json body = json::parse(result->body, nullptr, false);
    std::vector<TokenId> tokens;
    if (body.is_discarded() || !Tokens(body, tokens)) {
      return json{{"error", "the source instance sent no token_ids"}};
    }
    if (!tokens.empty()) Sleep(cost_.TransferSeconds(tokens.size()));
    absl::MutexLock lock(&mu_);
    ++migrations_in_;
    const uint64_t size = tokens.size();
    const bool kept = !tokens.empty() && KeepCachedLocked(session, std::move(tokens));
    return json{{"ok", true}, {"moved_tokens", kept ? size : 0}};
  }

  json CloseSession(SessionId session) {
    absl::MutexLock lock(&mu_);
    const bool held = kv_.contains(session);
    if (held) {
      cached_tokens_ -= kv_[session].tokens.size();
      DropSessionKvLocked(session);
      last_use_.erase(session);
    }
    return json{{"ok", true}, {"dropped", held}};
  }

  json ReceiveKv(SessionId session, const std::vector<TokenId>& context) {
    Sleep(cost_.TransferSeconds(context.size()));
    absl::MutexLock lock(&mu_);
    if (admit_.IsResident(session)) SetSessionKvLocked(session, context);
    return json{{"ok", true}};
  }

  json Prefill(const std::vector<TokenId>& context) {
    const double seconds = cost_.PrefillSeconds(context.size(), 0);
    Sleep(seconds);
    absl::MutexLock lock(&mu_);
    ++prefills_;
    return json{{"ok", true}, {"seconds", seconds}};
  }

  json Stats() {
    absl::MutexLock lock(&mu_);
    if (cache_role_) {
      return json{{"sessions", kv_.size()},
                  {"used_tokens", cached_tokens_},
                  {"capacity_tokens", cache_capacity_tokens_},
                  {"resident_blocks", block_refs_.size()},
                  {"evictions", evictions_},
                  {"generated", generated_},
                  {"migrations_in", migrations_in_},
                  {"migrations_out", migrations_out_},
                  {"published_batches", publisher_ ? publisher_->published() : 0}};
    }
    return json{{"sessions", admit_.num_sessions()},
                {"used_tokens", admit_.used_tokens()},
                {"budget_tokens", admit_.budget_tokens()},
                {"resident_blocks", block_refs_.size()},
                {"evictions", evictions_},
                {"admissions", admissions_},
                {"rejections", rejections_},
                {"generated", generated_},
                {"prefills", prefills_},
                {"published_batches", publisher_ ? publisher_->published() : 0}};
  }

 private:
  struct SessionKv {
    std::vector<TokenId> tokens;
    std::vector<BlockHash> blocks;  // engine hashes of its full blocks
  };

  // Keeps `tokens` as `session`'s context, evicting least recently used
  // idle sessions while the pool would pass its capacity. A context that
  // cannot fit beside the sessions in use is not kept (and evicts nobody).
  // Returns whether it was kept.
  bool KeepCachedLocked(SessionId session, std::vector<TokenId> tokens) {
    auto held = kv_.find(session);
    const uint64_t before = held != kv_.end() ? held->second.tokens.size() : 0;
    const uint64_t capacity = cache_capacity_tokens_;
    uint64_t pinned = 0;  // contexts of other sessions with requests running
    for (const auto& [other, requests] : busy_) {
      auto it = kv_.find(other);
      if (other != session && it != kv_.end()) pinned += it->second.tokens.size();
    }
    if (pinned + tokens.size() > capacity) {
      if (held != kv_.end()) {
        cached_tokens_ -= before;
        DropSessionKvLocked(session);
        last_use_.erase(session);
      }
      return false;
    }
    while (cached_tokens_ - before + tokens.size() > capacity) {
      SessionId victim = 0;
      uint64_t oldest = UINT64_MAX;
      for (const auto& [other, used] : last_use_) {
        if (other != session && !busy_.contains(other) && used < oldest) {
          oldest = used;
          victim = other;
        }
      }
      if (oldest == UINT64_MAX) break;
      cached_tokens_ -= kv_[victim].tokens.size();
      DropSessionKvLocked(victim);
      last_use_.erase(victim);
      ++evictions_;
    }
    cached_tokens_ += tokens.size() - before;
    last_use_[session] = ++use_clock_;
    SetSessionKvLocked(session, std::move(tokens));
    return true;
  }

  static std::vector<TokenId> Answer(SessionId session, uint32_t turn, uint32_t max_tokens) {
    std::string text = "[s" + std::to_string(session) + " t" + std::to_string(turn) + "]";
    while (text.size() < max_tokens) text += " ok";
    text.resize(max_tokens);
    return std::vector<TokenId>(text.begin(), text.end());
  }

  static uint64_t CommonPrefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
    uint64_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
  }

  std::vector<BlockHash> EngineBlocks(const std::vector<TokenId>& tokens) const {
    std::vector<BlockHash> out;
    BlockHash parent = root_;
    for (size_t i = 0; i + block_size_ <= tokens.size(); i += block_size_) {
      parent = XXH3_64bits_withSeed(tokens.data() + i, block_size_ * sizeof(TokenId), parent);
      out.push_back(parent);
    }
    return out;
  }

  void SetSessionKvLocked(SessionId session, std::vector<TokenId> tokens) {
    SessionKv next{std::move(tokens), {}};
    next.blocks = EngineBlocks(next.tokens);
    std::vector<KvEvent> events;
    // New blocks: runs of blocks nobody held, each stored with its parent.
    BlockStoredEvent run;
    auto flush = [&] {
      if (!run.block_hashes.empty()) events.emplace_back(std::move(run));
      run = BlockStoredEvent{};
    };
    for (size_t i = 0; i < next.blocks.size(); ++i) {
      if (block_refs_[next.blocks[i]]++ == 0) {
        if (run.block_hashes.empty()) {
          if (i > 0) run.parent_block_hash = next.blocks[i - 1];
          run.block_size = block_size_;
          run.medium = "GPU";
        }
        run.block_hashes.push_back(next.blocks[i]);
        run.token_ids.insert(run.token_ids.end(), next.tokens.begin() + i * block_size_,
                             next.tokens.begin() + (i + 1) * block_size_);
      } else {
        flush();
      }
    }
    flush();
    auto it = kv_.find(session);
    if (it != kv_.end()) {
      AppendRemovals(it->second.blocks, events);
      it->second = std::move(next);
    } else {
      kv_.emplace(session, std::move(next));
    }
    Publish(std::move(events));
  }

  void DropSessionKvLocked(SessionId session) {
    auto it = kv_.find(session);
    if (it == kv_.end()) return;
    std::vector<KvEvent> events;
    AppendRemovals(it->second.blocks, events);
    kv_.erase(it);
    Publish(std::move(events));
  }

  // Releases `blocks` (a session's old chain); those no session holds any
  // more are removed, leaves first.
  void AppendRemovals(const std::vector<BlockHash>& blocks, std::vector<KvEvent>& events) {
    BlockRemovedEvent removed;
    removed.medium = "GPU";
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
      auto ref = block_refs_.find(*b);
      if (ref != block_refs_.end() && --ref->second == 0) {
        block_refs_.erase(ref);
        removed.block_hashes.push_back(*b);
      }
    }
    if (!removed.block_hashes.empty()) events.emplace_back(std::move(removed));
  }

  void Publish(std::vector<KvEvent> events) {
    if (publisher_ == nullptr || events.empty()) return;
    publisher_->Publish(events, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  }

  const bool cache_role_;
  const uint64_t cache_capacity_tokens_;  // instance role: K_d
  absl::Mutex mu_;
  AdmissionController admit_;  // decode role: Algorithm 2 and its pool
  sim::CostModel cost_;
  double time_scale_;
  const double prefill_scale_;  // instance role: multiplies prefill time only
  uint32_t block_size_;
  BlockHash root_;
  std::unique_ptr<engine::KvEventPublisher> publisher_;
  absl::flat_hash_map<SessionId, SessionKv> kv_;
  absl::flat_hash_map<BlockHash, uint32_t> block_refs_;
  // Instance role: the pool's size in tokens (a context per session, shared
  // blocks counted once per session), each session's last use (0 = sent
  // away: evicted first) and requests in flight.
  uint64_t cached_tokens_ = 0;
  uint64_t use_clock_ = 0;
  absl::flat_hash_map<SessionId, uint64_t> last_use_;
  absl::flat_hash_map<SessionId, uint32_t> busy_;
  uint64_t migrations_in_ = 0, migrations_out_ = 0;
  uint64_t running_ = 0;
  uint64_t evictions_ = 0, admissions_ = 0, rejections_ = 0, generated_ = 0, prefills_ = 0;
};

void Reply(httplib::Response& res, const json& body, int status = 200) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

// Parses the body; on error answers 400 and returns a discarded value.
json Body(const httplib::Request& req, httplib::Response& res) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    Reply(res, json{{"error", "the body must be a JSON object"}}, 400);
    return json(json::value_t::discarded);
  }
  return body;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvc-worker-emulator: a GPU-less prefill, decode or colocated worker for gateway tests"};
  std::string role = "decode";
  std::string host = "127.0.0.1";
  int port = 0;
  AdmissionConfig admission;
  uint32_t block_size = 16;
  double time_scale = 0.01;
  double prefill_scale = 1.0;
  std::string events_endpoint, replay_endpoint, topic;
  size_t buffer_steps = 10000;
  app.add_option("--role", role, "decode, prefill or instance (colocated, cache-keeping)")
      ->check(CLI::IsMember({"decode", "prefill", "instance"}))
      ->capture_default_str();
  app.add_option("--host", host, "address to listen on")->capture_default_str();
  app.add_option("--port", port, "HTTP port")->required();
  app.add_option("--capacity-tokens", admission.capacity_tokens, "K_d: KV pool in tokens")
      ->capture_default_str();
  app.add_option("--high-water", admission.high_water, "rho")->capture_default_str();
  app.add_option("--max-direct-append", admission.max_direct_append_tokens, "tau_append")
      ->capture_default_str();
  app.add_option("--block-size", block_size, "engine KV block size (tokens)")->capture_default_str();
  app.add_option("--time-scale", time_scale, "multiplies every cost-model duration")
      ->capture_default_str();
  app.add_option("--prefill-scale", prefill_scale,
                 "instance role: multiplies prefill time only (a slower GPU's prefill, or a "
                 "window a test can observe)")
      ->capture_default_str();
  app.add_option("--kv-events", events_endpoint, "PUB endpoint to bind (vLLM wire format)");
  app.add_option("--kv-replay", replay_endpoint, "ROUTER replay endpoint to bind");
  app.add_option("--kv-topic", topic, "topic frame of every event message");
  app.add_option("--kv-buffer-steps", buffer_steps, "batches kept for replay")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<AdmissionController> admit = AdmissionController::Create(admission);
  if (!admit.ok()) {
    std::cerr << "kvc-worker-emulator: " << admit.status().message() << "\n";
    return 2;
  }
  if (block_size == 0 || !(time_scale >= 0) || !(prefill_scale >= 0) ||
      !std::isfinite(time_scale) || !std::isfinite(prefill_scale)) {
    std::cerr << "kvc-worker-emulator: --block-size must be >= 1, --time-scale and "
                 "--prefill-scale finite and >= 0\n";
    return 2;
  }
  std::unique_ptr<engine::KvEventPublisher> publisher;
  if (!events_endpoint.empty()) {
    auto created = engine::KvEventPublisher::Create({.endpoint = events_endpoint,
                                                     .replay_endpoint = replay_endpoint,
                                                     .topic = topic,
                                                     .buffer_steps = buffer_steps});
    if (!created.ok()) {
      std::cerr << "kvc-worker-emulator: " << created.status().message() << "\n";
      return 2;
    }
    publisher = std::move(*created);
  }
  Worker worker(std::move(*admit), sim::CostModel::LoopbackTcp(), time_scale, block_size,
                std::move(publisher), role == "instance", admission.capacity_tokens,
                prefill_scale);

  httplib::Server server;
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    Reply(res, json{{"ok", true}});
  });
  server.Get("/stats", [&](const httplib::Request&, httplib::Response& res) {
    json stats = worker.Stats();
    stats["role"] = role;
    Reply(res, stats);
  });
  server.Post("/prefill", [&](const httplib::Request& req, httplib::Response& res) {
    json body = Body(req, res);
    if (body.is_discarded()) return;
    std::vector<TokenId> tokens;
    if (!Tokens(body, tokens)) return Reply(res, json{{"error", "bad token_ids"}}, 400);
    Reply(res, worker.Prefill(tokens));
  });
  // Reads a body with a session_id (and token_ids, if any); false after
  // answering 400.
  auto session_body = [](const httplib::Request& req, httplib::Response& res, json& body,
                         std::vector<TokenId>& tokens) {
    body = Body(req, res);
    if (body.is_discarded()) return false;
    if (!Tokens(body, tokens) || !body.value("session_id", json()).is_number_unsigned()) {
      Reply(res, json{{"error", "need session_id and token_ids"}}, 400);
      return false;
    }
    return true;
  };
  // "turn" and "max_tokens" of a generate call.
  auto turn_fields = [](const json& body, httplib::Response& res, uint32_t& turn,
                        uint32_t& max_tokens) {
    const absl::StatusOr<uint64_t> t = Unsigned(body, "turn", 0, UINT32_MAX);
    const absl::StatusOr<uint64_t> m = Unsigned(body, "max_tokens", 16, 65536);
    for (const absl::Status& status : {t.status(), m.status()}) {
      if (!status.ok()) {
        Reply(res, json{{"error", std::string(status.message())}}, 400);
        return false;
      }
    }
    turn = static_cast<uint32_t>(*t);
    max_tokens = static_cast<uint32_t>(*m);
    return true;
  };
  if (role == "instance") {
    server.Post("/generate", [&](const httplib::Request& req, httplib::Response& res) {
      json body;
      std::vector<TokenId> tokens;
      uint32_t turn = 0, max_tokens = 0;
      if (!session_body(req, res, body, tokens) || !turn_fields(body, res, turn, max_tokens)) return;
      const json stream = body.value("stream", json(false));
      if (!stream.is_boolean()) {
        return Reply(res, json{{"error", "\"stream\" must be true or false, got " + stream.dump()}},
                     400);
      }
      const SessionId session = body["session_id"].get<uint64_t>();
      if (!stream.get<bool>()) {
        return Reply(res, worker.GenerateCached(session, turn, tokens, max_tokens));
      }
      // Streamed: the first token once the prefill is done, the answer once
      // decoding is; the turn is finished exactly once, also when the client
      // goes away mid-stream (the releaser runs either way).
      auto turn_state = std::make_shared<Worker::CachedTurn>(
          worker.BeginCached(session, turn, std::move(tokens), max_tokens));
      auto finished = std::make_shared<bool>(false);
      res.set_chunked_content_provider(
          "text/event-stream",
          [&worker, turn_state, finished](size_t, httplib::DataSink& sink) {
            const Worker::CachedTurn& t = *turn_state;
            worker.Sleep(t.prefill_s);
            // The first token, then the rest as decoding goes, in at most
            // kMaxTokenEvents events (a token each for short answers).
            constexpr size_t kMaxTokenEvents = 32;
            const size_t rest = t.output.empty() ? 0 : t.output.size() - 1;
            const size_t per_event = std::max<size_t>(1, (rest + kMaxTokenEvents - 1) / kMaxTokenEvents);
            const size_t events = rest == 0 ? 0 : (rest + per_event - 1) / per_event;
            auto send_tokens = [&sink](std::span<const TokenId> tokens) {
              const std::string event =
                  "data: " +
                  json{{"token_ids", std::vector<TokenId>(tokens.begin(), tokens.end())}}.dump() +
                  "\n\n";
              return sink.write(event.data(), event.size());
            };
            const std::span<const TokenId> output(t.output);
            if (!send_tokens(output.first(t.output.empty() ? 0 : 1))) return false;
            for (size_t e = 0; e < events; ++e) {
              worker.Sleep(t.decode_s / static_cast<double>(events));
              const size_t from = 1 + e * per_event;
              if (!send_tokens(output.subspan(from, std::min(per_event, t.output.size() - from)))) {
                return false;
              }
            }
            if (events == 0) worker.Sleep(t.decode_s);
            *finished = true;
            const std::string tail =
                "data: " + worker.FinishCached(t).dump() + "\n\ndata: [DONE]\n\n";
            if (!sink.write(tail.data(), tail.size())) return false;
            sink.done();
            return true;
          },
          [&worker, turn_state, finished](bool) {
            if (!std::exchange(*finished, true)) (void)worker.FinishCached(*turn_state);
          });
    });
    server.Post("/export_kv", [&](const httplib::Request& req, httplib::Response& res) {
      json body;
      std::vector<TokenId> tokens;
      if (!session_body(req, res, body, tokens)) return;
      Reply(res, worker.ExportKv(body["session_id"].get<uint64_t>()));
    });
    server.Post("/migrate_kv", [&](const httplib::Request& req, httplib::Response& res) {
      json body;
      std::vector<TokenId> tokens;
      if (!session_body(req, res, body, tokens)) return;
      const json from = body.value("from", json());
      const std::string source = from.is_string() ? from.get<std::string>() : std::string();
      if (source.rfind("http://", 0) != 0) {
        return Reply(res, json{{"error", "\"from\" must be the source instance's http:// URL"}},
                     400);
      }
      json answer = worker.MigrateIn(body["session_id"].get<uint64_t>(), source);
      Reply(res, answer, answer.contains("error") ? 502 : 200);
    });
    server.Post("/close_session", [&](const httplib::Request& req, httplib::Response& res) {
      json body;
      std::vector<TokenId> tokens;
      if (!session_body(req, res, body, tokens)) return;
      Reply(res, worker.CloseSession(body["session_id"].get<uint64_t>()));
    });
  }
  if (role == "decode") {
    server.Post("/admit_direct_append", [&](const httplib::Request& req, httplib::Response& res) {
      json body = Body(req, res);
      if (body.is_discarded()) return;
      absl::StatusOr<AdmitQuery> query = engine::AdmitQueryFromJson(body);
      if (!query.ok()) return Reply(res, json{{"error", std::string(query.status().message())}}, 400);
      json answer = worker.Admit(*query);
      Reply(res, answer, answer.contains("error") ? 400 : 200);
    });
    server.Post("/generate", [&](const httplib::Request& req, httplib::Response& res) {
      json body;
      std::vector<TokenId> tokens;
      uint32_t turn = 0, max_tokens = 0;
      if (!session_body(req, res, body, tokens) || !turn_fields(body, res, turn, max_tokens)) return;
      const json mode = body.value("mode", json("direct"));
      if (!mode.is_string()) return Reply(res, json{{"error", "mode must be a string"}}, 400);
      Reply(res, worker.Generate(body["session_id"].get<uint64_t>(), turn, mode.get<std::string>(),
                                 tokens, max_tokens));
    });
    server.Post("/receive_kv", [&](const httplib::Request& req, httplib::Response& res) {
      json body = Body(req, res);
      if (body.is_discarded()) return;
      std::vector<TokenId> tokens;
      if (!Tokens(body, tokens) || !body.value("session_id", json()).is_number_unsigned()) {
        return Reply(res, json{{"error", "need session_id and token_ids"}}, 400);
      }
      Reply(res, worker.ReceiveKv(body["session_id"].get<uint64_t>(), tokens));
    });
  }
  if (!server.bind_to_port(host, port)) {
    std::cerr << "kvc-worker-emulator: cannot listen on " << host << ":" << port << "\n";
    return 2;
  }
  std::cout << "kvc-worker-emulator: " << role << " listening on " << host << ":" << port
            << std::endl;
  server.listen_after_bind();
  return 0;
}
