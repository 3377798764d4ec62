#include "kvc_engine/http_transport.hpp"

#include <catch2/catch.hpp>
#include <atomic>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kvc_engine/gateway_support.hpp"
#include "kvc_router/dispatch.hpp"
#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/routing_state.hpp"
#include "test_support.hpp"

namespace kvc_router::engine {
namespace {

// A decode worker whose admission answer the test chooses.
class FakeWorker {
 public:
  explicit FakeWorker(std::string answer, int delay_ms = 0) : answer_(std::move(answer)) {
    server_.Post("/admit_direct_append", [this, delay_ms](const httplib::Request& req,
                                                         httplib::Response& res) {
      last_body_ = req.body;
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      res.set_content(answer_, "application/json");
    });
    server_.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) {
      last_body_ = req.body;
      last_path_ = req.path;
      res.set_content(R"({"text":"hi","output_token_ids":[104,105]})", "application/json");
    });
    for (const char* path : {"/migrate_kv", "/close_session"}) {
      server_.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
        last_body_ = req.body;
        last_path_ = req.path;
        res.set_content(R"({"ok":true,"moved_tokens":48})", "application/json");
      });
    }
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeWorker() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  nlohmann::json last_body() const { return nlohmann::json::parse(last_body_); }
  const std::string& last_path() const { return last_path_; }

 private:
  std::string answer_;
  std::string last_body_;
  std::string last_path_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// An instance that answers /generate as server-sent events: `head` first,
// then (with `wait`, after the client saw its first token or 5 s) `tail`;
// records whether the first token was seen before the tail went out.
class StreamingWorker {
 public:
  StreamingWorker(std::string head, std::string tail, int status = 200, bool wait = true)
      : head_(std::move(head)), tail_(std::move(tail)) {
    server_.Post("/generate", [this, status, wait](const httplib::Request& req,
                                                   httplib::Response& res) {
      last_body_ = req.body;
      res.status = status;
      res.set_chunked_content_provider(
          "text/event-stream", [this, wait](size_t, httplib::DataSink& sink) {
            // A few bytes per write: events arrive split across reads.
            for (size_t at = 0; at < head_.size(); at += 3) {
              if (!sink.write(head_.data() + at, std::min<size_t>(3, head_.size() - at))) {
                return false;
              }
            }
            for (int i = 0; wait && i < 500 && !first_token_seen.load(); ++i) {
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
            seen_before_tail = first_token_seen.load();
            if (!tail_.empty() && !sink.write(tail_.data(), tail_.size())) return false;
            sink.done();
            return true;
          });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~StreamingWorker() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  nlohmann::json last_body() const { return nlohmann::json::parse(last_body_); }

  std::atomic<bool> first_token_seen{false};
  std::atomic<bool> seen_before_tail{false};

 private:
  std::string head_, tail_, last_body_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// A port nothing listens on.
std::string DeadUrl() {
  httplib::Server probe;
  const int port = probe.bind_to_any_port("127.0.0.1");
  return "http://127.0.0.1:" + std::to_string(port);  // closed when probe goes
}

TEST_CASE("the admission RPC round-trips as JSON", "[engine][http]") {
  FakeWorker direct(R"({"can_admit": true, "mode": "direct", "room_tokens": 500})");
  FakeWorker refuses(R"({"can_admit": false, "reason": "no-d-capacity"})");
  auto transport = HttpWorkerTransport::Create({.decode_urls = {direct.url(), refuses.url()}});
  REQUIRE(transport.ok());
  const AdmitQuery query{.session = 7, .turn = 2, .append_tokens = 30, .input_tokens = 1000};
  auto yes = (*transport)->Admit(0, query);
  REQUIRE(yes.ok());
  CHECK(yes->admitted);
  CHECK(yes->mode == DecisionMode::kDirect);
  CHECK(yes->room_tokens == 500);
  CHECK(direct.last_body() == AdmitQueryToJson(query));
  auto no = (*transport)->Admit(1, query);
  REQUIRE(no.ok());
  CHECK_FALSE(no->admitted);
  CHECK(no->reason == RejectReason::kNoDCapacity);
  CHECK((*transport)->Admit(2, query).status().code() == absl::StatusCode::kInvalidArgument);
  // The emulator's side of the same bodies.
  auto parsed = AdmitQueryFromJson(AdmitQueryToJson(query));
  REQUIRE(parsed.ok());
  CHECK(parsed->input_tokens == 1000);
  CHECK_FALSE(AdmitQueryFromJson(nlohmann::json{{"session_id", -1}}).ok());
  auto result = AdmitResultFromJson(AdmitResultToJson(AdmitResult::Admitted(DecisionMode::kReseed)));
  REQUIRE(result.ok());
  CHECK(result->mode == DecisionMode::kReseed);
}

TEST_CASE("colocated instances: a cached turn, a KV move and a close reach the right worker",
          "[engine][http]") {
  FakeWorker source(R"({"can_admit": false, "reason": "no-d-capacity"})");
  FakeWorker target(R"({"can_admit": false, "reason": "no-d-capacity"})");
  // DeadUrl's port may still accept connections nobody answers: short
  // timeouts make that unavailable rather than a two-minute wait.
  auto transport =
      HttpWorkerTransport::Create({.decode_urls = {source.url(), target.url(), DeadUrl()},
                                   .admit_timeout = std::chrono::milliseconds(300),
                                   .generate_timeout = std::chrono::milliseconds(1000)});
  REQUIRE(transport.ok());
  Request request;
  request.session = 9;
  request.turn = 3;
  auto attachment = (*transport)->Attach(9, {{"token_ids", {5, 6}}, {"max_tokens", 4}});
  REQUIRE((*transport)->RunOnInstance(1, request).ok());
  CHECK(target.last_path() == "/generate");
  CHECK(target.last_body() == nlohmann::json{{"session_id", 9},
                                             {"turn", 3},
                                             {"mode", "cache"},
                                             {"token_ids", {5, 6}},
                                             {"max_tokens", 4}});
  CHECK(attachment.response()["text"] == "hi");

  // The target pulls from the source: the request goes to the target.
  absl::StatusOr<uint64_t> moved = (*transport)->MoveSessionKv(0, 1, 9);
  REQUIRE(moved.ok());
  CHECK(*moved == 48);
  CHECK(target.last_path() == "/migrate_kv");
  CHECK(target.last_body() == nlohmann::json{{"session_id", 9}, {"from", source.url()}});
  REQUIRE((*transport)->CloseSession(0, 9).ok());
  CHECK(source.last_path() == "/close_session");
  CHECK(source.last_body() == nlohmann::json{{"session_id", 9}});

  // Unknown ids are the caller's error; a dead worker is unavailable.
  CHECK((*transport)->MoveSessionKv(3, 1, 9).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK((*transport)->MoveSessionKv(0, 3, 9).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK((*transport)->CloseSession(3, 9).code() == absl::StatusCode::kInvalidArgument);
  CHECK((*transport)->RunOnInstance(3, request).code() == absl::StatusCode::kInvalidArgument);
  CHECK((*transport)->MoveSessionKv(0, 2, 9).status().code() == absl::StatusCode::kUnavailable);
  CHECK((*transport)->CloseSession(2, 9).code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("an instance added at runtime gets the next id and its calls; a bad URL is refused",
          "[engine][http]") {
  FakeWorker first(R"({"can_admit": false, "reason": "no-d-capacity"})");
  FakeWorker joined(R"({"can_admit": false, "reason": "no-d-capacity"})");
  auto transport = HttpWorkerTransport::Create({.decode_urls = {first.url()}});
  REQUIRE(transport.ok());
  Request request;
  request.session = 4;
  CHECK((*transport)->RunOnInstance(1, request).code() == absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<WorkerId> bad = (*transport)->AddDecodeUrl("10.0.0.9:30001");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(bad.status().message(), "10.0.0.9:30001"));
  CHECK((*transport)->num_decode_urls() == 1);
  const absl::StatusOr<WorkerId> id = (*transport)->AddDecodeUrl(joined.url());
  REQUIRE(id.ok());
  CHECK(*id == 1);
  CHECK((*transport)->num_decode_urls() == 2);
  auto attachment = (*transport)->Attach(4, {{"token_ids", {1}}});
  REQUIRE((*transport)->RunOnInstance(1, request).ok());
  CHECK(joined.last_path() == "/generate");
  // A KV move between an old and a new instance names both.
  REQUIRE((*transport)->MoveSessionKv(0, 1, 4).ok());
  CHECK(joined.last_body() == nlohmann::json{{"session_id", 4}, {"from", first.url()}});
}

TEST_CASE("a streamed turn signals its first token once, before the answer arrives",
          "[engine][http]") {
  StreamingWorker worker(R"(data: {"token_ids":[104]})" "\n\n",
                         R"(data: {"text":"hi","output_token_ids":[104,105]})" "\n\n"
                         "data: [DONE]\n\n");
  auto transport = HttpWorkerTransport::Create({.decode_urls = {worker.url()}});
  REQUIRE(transport.ok());
  Request request;
  request.session = 4;
  request.turn = 1;
  int calls = 0;
  auto attachment = (*transport)->Attach(4, {{"token_ids", {5, 6}}, {"max_tokens", 2}}, [&] {
    ++calls;
    worker.first_token_seen = true;
  });
  REQUIRE((*transport)->RunOnInstance(0, request).ok());
  CHECK(calls == 1);
  CHECK(worker.seen_before_tail.load());
  CHECK(worker.last_body()["stream"] == true);
  CHECK(worker.last_body()["mode"] == "cache");
  CHECK(attachment.response()["output_token_ids"] == nlohmann::json{104, 105});
}

TEST_CASE("a streamed turn in the SSE format's other spellings", "[engine][http]") {
  // \r\n line ends, no space after "data:", an event name, an id, a
  // comment, a data field split over two lines, and a last event without
  // its blank line before the stream ends.
  StreamingWorker worker(": keep-alive\r\nevent: token\r\nid: 1\r\ndata:{\"token_ids\":\r\n"
                         "data: [104]}\r\n\r\n",
                         "data: {\"text\":\"hi\",\"output_token_ids\":[104,105]}");
  auto transport = HttpWorkerTransport::Create({.decode_urls = {worker.url()}});
  REQUIRE(transport.ok());
  Request request;
  request.session = 5;
  int calls = 0;
  auto attachment = (*transport)->Attach(5, {{"token_ids", {5}}}, [&] {
    ++calls;
    worker.first_token_seen = true;
  });
  const absl::Status s = (*transport)->RunOnInstance(0, request);
  REQUIRE(s.ok());
  CHECK(calls == 1);
  CHECK(worker.seen_before_tail.load());
  CHECK(attachment.response()["output_token_ids"] == nlohmann::json{104, 105});
}

TEST_CASE("an attachment that ends leaves a later one of the same session attached",
          "[engine][http]") {
  FakeWorker worker(R"({"can_admit": true, "mode": "direct"})");
  auto transport = HttpWorkerTransport::Create({.decode_urls = {worker.url()}});
  REQUIRE(transport.ok());
  Request request;
  request.session = 7;
  std::optional<HttpWorkerTransport::Attachment> first;
  first.emplace((*transport)->Attach(7, {{"max_tokens", 1}}));
  auto second = (*transport)->Attach(7, {{"max_tokens", 2}});
  first.reset();
  REQUIRE((*transport)->RunOnInstance(0, request).ok());
  CHECK(worker.last_body()["max_tokens"] == 2);
  CHECK(second.response()["text"] == "hi");
}

TEST_CASE("a first-token callback that throws ends the call with its exception",
          "[engine][http]") {
  StreamingWorker worker(R"(data: {"token_ids":[104]})" "\n\n",
                         R"(data: {"output_token_ids":[104]})" "\n\n", 200, /*wait=*/false);
  auto transport = HttpWorkerTransport::Create({.decode_urls = {worker.url()}});
  REQUIRE(transport.ok());
  Request request;
  request.session = 6;
  auto attachment = (*transport)->Attach(6, {{"token_ids", {5}}},
                                         [] { throw std::runtime_error("ledger gone"); });
  CHECK_THROWS_WITH((*transport)->RunOnInstance(0, request), "ledger gone");
  CHECK(attachment.response().is_null());
}

TEST_CASE("a streamed turn hands over each event's tokens as they come, adding up to the answer",
          "[engine][http]") {
  // Two token events; the answer holds one token more, which no event carried.
  StreamingWorker worker(R"(data: {"token_ids":[104]})" "\n\n" R"(data: {"token_ids":[105]})" "\n\n",
                         R"(data: {"output_token_ids":[104,105,106]})" "\n\ndata: [DONE]\n\n");
  auto transport = HttpWorkerTransport::Create({.decode_urls = {worker.url()}});
  REQUIRE(transport.ok());
  Request request;
  request.session = 8;
  std::vector<std::vector<TokenId>> deliveries;
  int first_tokens = 0;
  auto attachment = (*transport)->Attach(
      8, {{"token_ids", {5}}},
      {.on_first_token = [&] { ++first_tokens; },
       .on_tokens =
           [&](std::span<const TokenId> tokens) {
             deliveries.emplace_back(tokens.begin(), tokens.end());
             if (deliveries.size() == 2) worker.first_token_seen = true;
           }});
  REQUIRE((*transport)->RunOnInstance(0, request).ok());
  CHECK(worker.last_body()["stream"] == true);
  CHECK(first_tokens == 1);
  // Both events' tokens were handed over before the answer was sent.
  CHECK(worker.seen_before_tail.load());
  CHECK(deliveries == std::vector<std::vector<TokenId>>{{104}, {105}, {106}});
  CHECK(attachment.response()["output_token_ids"] == nlohmann::json{104, 105, 106});
}

TEST_CASE("streamed tokens: a plain answer, tokens that disagree, bad ids, a throwing callback",
          "[engine][http]") {
  Request request;
  request.session = 9;
  std::vector<TokenId> delivered;
  int deliveries = 0;
  auto collect = [&](std::span<const TokenId> tokens) {
    ++deliveries;
    delivered.insert(delivered.end(), tokens.begin(), tokens.end());
  };
  SECTION("a worker that answers plain JSON: its tokens in one delivery") {
    StreamingWorker plain(R"({"output_token_ids":[7,8,9]})", "", 200, /*wait=*/false);
    auto transport = HttpWorkerTransport::Create({.decode_urls = {plain.url()}});
    REQUIRE(transport.ok());
    auto attachment = (*transport)->Attach(9, {{"token_ids", {5}}}, {.on_tokens = collect});
    REQUIRE((*transport)->RunOnInstance(0, request).ok());
    CHECK(deliveries == 1);
    CHECK(delivered == std::vector<TokenId>{7, 8, 9});
    CHECK(plain.last_body()["stream"] == true);
  }
  struct Refused {
    const char* what;
    std::string head, tail;
    const char* message;                  // part of the status message
    std::vector<TokenId> delivered_before;  // what was relayed before the refusal
  };
  const std::vector<Refused> refused = {
      {"events whose tokens are not the answer's", R"(data: {"token_ids":[1]})" "\n\n",
       R"(data: {"output_token_ids":[2,3]})" "\n\n", "disagree", {1}},
      {"token ids that are not unsigned integers (nothing after them relayed)",
       R"(data: {"token_ids":[-1]})" "\n\n" R"(data: {"token_ids":[2]})" "\n\n",
       R"(data: {"output_token_ids":[2]})" "\n\n", "token_ids", {}},
      {"an event that is not JSON (nothing after it relayed)",
       "data: {oops\n\n" R"(data: {"token_ids":[2]})" "\n\n",
       R"(data: {"output_token_ids":[2]})" "\n\n", "not JSON", {}},
      {"a plain answer whose output_token_ids are not token ids", R"({"output_token_ids":[1,-2]})",
       "", "not token ids", {}},
      {"a streamed answer whose output_token_ids are not token ids",
       R"(data: {"token_ids":[1]})" "\n\n", R"(data: {"output_token_ids":"one"})" "\n\n",
       "not token ids", {1}},
  };
  for (const Refused& c : refused) {
    DYNAMIC_SECTION(c.what << ": worker-unavailable") {
      StreamingWorker worker(c.head, c.tail, 200, /*wait=*/false);
      auto transport = HttpWorkerTransport::Create({.decode_urls = {worker.url()}});
      REQUIRE(transport.ok());
      auto attachment = (*transport)->Attach(9, {{"token_ids", {5}}}, {.on_tokens = collect});
      const absl::Status s = (*transport)->RunOnInstance(0, request);
      CHECK(s.code() == absl::StatusCode::kUnavailable);
      CHECK_THAT(std::string(s.message()), Catch::Contains(c.message));
      CHECK(delivered == c.delivered_before);
      CHECK(attachment.response().is_null());
    }
  }
  SECTION("without a token callback the events' tokens are not checked") {
    StreamingWorker liar(R"(data: {"token_ids":[1]})" "\n\n",
                         R"(data: {"output_token_ids":[2,3]})" "\n\n", 200, /*wait=*/false);
    auto transport = HttpWorkerTransport::Create({.decode_urls = {liar.url()}});
    REQUIRE(transport.ok());
    int first_tokens = 0;
    auto attachment = (*transport)->Attach(9, {{"token_ids", {5}}}, [&] { ++first_tokens; });
    REQUIRE((*transport)->RunOnInstance(0, request).ok());
    CHECK(first_tokens == 1);
    CHECK(attachment.response()["output_token_ids"] == nlohmann::json{2, 3});
  }
  SECTION("a token callback that throws ends the call with its exception") {
    StreamingWorker worker(R"(data: {"token_ids":[104]})" "\n\n",
                           R"(data: {"output_token_ids":[104]})" "\n\n", 200, /*wait=*/false);
    auto transport = HttpWorkerTransport::Create({.decode_urls = {worker.url()}});
    REQUIRE(transport.ok());
    auto attachment = (*transport)->Attach(
        9, {{"token_ids", {5}}},
        {.on_tokens = [](std::span<const TokenId>) { throw std::runtime_error("client gone"); }});
    CHECK_THROWS_WITH((*transport)->RunOnInstance(0, request), "client gone");
    CHECK(attachment.response().is_null());
  }
}

TEST_CASE("a streamed turn: plain JSON, a cut stream, a bad event, an error status",
          "[engine][http]") {
  Request request;
  request.session = 4;
  int calls = 0;
  auto count = [&] { ++calls; };
  SECTION("a worker that ignores stream answers plain JSON: the first token is its answer") {
    FakeWorker plain(R"({"can_admit": true, "mode": "direct"})");
    auto transport = HttpWorkerTransport::Create({.decode_urls = {plain.url()}});
    REQUIRE(transport.ok());
    auto attachment = (*transport)->Attach(4, {{"token_ids", {5}}}, count);
    REQUIRE((*transport)->RunOnInstance(0, request).ok());
    CHECK(calls == 1);
    CHECK(attachment.response()["text"] == "hi");
    CHECK(plain.last_body()["stream"] == true);
  }
  SECTION("a stream cut before the answer is unavailable (its first token still counted)") {
    StreamingWorker cut(R"(data: {"token_ids":[104]})" "\n\n", "", 200, /*wait=*/false);
    auto transport = HttpWorkerTransport::Create({.decode_urls = {cut.url()}});
    REQUIRE(transport.ok());
    auto attachment = (*transport)->Attach(4, {{"token_ids", {5}}}, [&] {
      ++calls;
      cut.first_token_seen = true;
    });
    const absl::Status s = (*transport)->RunOnInstance(0, request);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(s.message()), Catch::Contains("ended without an answer"));
    CHECK(calls == 1);
    CHECK(attachment.response().is_null());
  }
  SECTION("an event that is not JSON is unavailable") {
    StreamingWorker bad("data: {oops\n\n", "data: [DONE]\n\n", 200, /*wait=*/false);
    auto transport = HttpWorkerTransport::Create({.decode_urls = {bad.url()}});
    REQUIRE(transport.ok());
    auto attachment = (*transport)->Attach(4, {{"token_ids", {5}}}, count);
    const absl::Status s = (*transport)->RunOnInstance(0, request);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(s.message()), Catch::Contains("not JSON"));
  }
  SECTION("an error status is unavailable and names the status and the body") {
    StreamingWorker failing(R"({"error":"out of memory"})", "", 500, /*wait=*/false);
    auto transport = HttpWorkerTransport::Create({.decode_urls = {failing.url()}});
    REQUIRE(transport.ok());
    auto attachment = (*transport)->Attach(4, {{"token_ids", {5}}}, count);
    const absl::Status s = (*transport)->RunOnInstance(0, request);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(std::string(s.message()), Catch::Contains("HTTP 500"));
    CHECK_THAT(std::string(s.message()), Catch::Contains("out of memory"));
    CHECK_FALSE(HttpWorkerTransport::NoAnswer(s));  // it answered: alive, if unwell
    CHECK(calls == 0);
  }
}

TEST_CASE("no answer, a timeout or a bad answer is worker-unavailable", "[engine][http]") {
  FakeWorker slow(R"({"can_admit": true, "mode": "direct"})", /*delay_ms=*/800);
  FakeWorker garbage("not json");
  FakeWorker bad_mode(R"({"can_admit": true, "mode": "fallback"})");
  auto transport = HttpWorkerTransport::Create(
      {.decode_urls = {DeadUrl(), slow.url(), garbage.url(), bad_mode.url()},
       .admit_timeout = std::chrono::milliseconds(200),
       .generate_timeout = std::chrono::milliseconds(200)});
  REQUIRE(transport.ok());
  const AdmitQuery query{.session = 1, .turn = 0, .append_tokens = 10, .input_tokens = 10};
  for (WorkerId d = 0; d < 4; ++d) {
    INFO("worker " << d);
    auto answer = (*transport)->Admit(d, query);
    CHECK(answer.status().code() == absl::StatusCode::kUnavailable);
    CHECK(test::Message(answer.status()).find("worker-unavailable") != std::string::npos);
    // What a circuit breaker counts: no connection or a timeout, not a bad answer.
    CHECK(HttpWorkerTransport::NoAnswer(answer.status()) == (d <= 1));
  }
  Request request;
  request.session = 1;
  CHECK(HttpWorkerTransport::NoAnswer((*transport)->RunOnInstance(0, request)));
  CHECK_FALSE(HttpWorkerTransport::NoAnswer(absl::UnavailableError("worker-unavailable: x")));
  CHECK_FALSE(HttpWorkerTransport::NoAnswer(absl::OkStatus()));
  CHECK(HttpWorkerTransport::Create({}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(HttpWorkerTransport::Create({.decode_urls = {"ftp://x"}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Dispatch over HTTP counts a dead worker as worker-unavailable and moves on",
          "[engine][http]") {
  FakeWorker alive(R"({"can_admit": true, "mode": "seed"})");
  auto transport = HttpWorkerTransport::Create(
      {.decode_urls = {DeadUrl(), alive.url()}, .prefill_urls = {}});
  REQUIRE(transport.ok());
  RouterConfig config;
  config.num_decode_workers = 2;
  config.num_prefill_workers = 0;
  auto state = RoutingState<EstimateIndex>::Create(config, test::MakeEstimateIndex(config));
  REQUIRE(state.ok());
  const std::vector<BlockHash> prefix;
  Request request;
  request.session = 5;
  request.append_tokens = 40;
  request.prefix_hashes = prefix;
  auto attachment = (*transport)->Attach(5, {{"token_ids", {1, 2, 3}}, {"max_tokens", 2}});
  // Worker 0 is tried first (ties go to the lowest id), refuses to answer.
  auto decision = Dispatch(**state, request, **transport);
  REQUIRE(decision.ok());
  CHECK(decision->decode == 1);
  CHECK(decision->mode == DecisionMode::kSeed);
  CHECK((*state)->rejects(5, 0) == 1);
  CHECK((*state)->inflight(0) == 0);
  CHECK((*state)->inflight(1) == 0);
  // The generate call carried the attached payload and its answer came back.
  CHECK(alive.last_body()["token_ids"] == nlohmann::json({1, 2, 3}));
  CHECK(alive.last_body()["mode"] == "direct");  // no prefill pool: the decode worker prefills
  CHECK(attachment.response()["text"] == "hi");
}

TEST_CASE("gateway metrics render as Prometheus text", "[engine][metrics]") {
  GatewayMetrics metrics;
  metrics.Decision(DecisionMode::kDirect);
  metrics.Decision(DecisionMode::kDirect);
  metrics.Rejection(RejectReason::kWorkerUnavailable);
  metrics.AdmissionAttempt(0.0007);
  metrics.AdmissionAttempt(3.0);
  metrics.Request(true);
  const std::vector<uint64_t> inflight = {0, 2};
  const std::string text = metrics.Render(inflight);
  CHECK(text.find("kvc_decisions_total{mode=\"direct\"} 2\n") != std::string::npos);
  CHECK(text.find("kvc_admission_rejections_total{reason=\"worker-unavailable\"} 1\n") !=
        std::string::npos);
  CHECK(text.find("kvc_admission_latency_seconds_bucket{le=\"0.0005\"} 0\n") != std::string::npos);
  CHECK(text.find("kvc_admission_latency_seconds_bucket{le=\"0.001\"} 1\n") != std::string::npos);
  CHECK(text.find("kvc_admission_latency_seconds_bucket{le=\"2.5\"} 1\n") != std::string::npos);
  CHECK(text.find("kvc_admission_latency_seconds_bucket{le=\"+Inf\"} 2\n") != std::string::npos);
  CHECK(text.find("kvc_admission_latency_seconds_count 2\n") != std::string::npos);
  CHECK(text.find("kvc_inflight_requests{worker=\"1\"} 2\n") != std::string::npos);
  CHECK(text.find("# TYPE kvc_admission_latency_seconds histogram\n") != std::string::npos);
}

TEST_CASE("a streamed answer's bytes go out in whole characters", "[engine][gateway]") {
  CHECK(CompleteUtf8Prefix("") == 0);
  CHECK(CompleteUtf8Prefix("abc") == 3);
  const std::string e_acute = "\xC3\xA9";           // 2 bytes
  const std::string euro = "\xE2\x82\xAC";         // 3 bytes
  const std::string emoji = "\xF0\x9F\x98\x80";   // 4 bytes
  for (const std::string& c : {e_acute, euro, emoji}) {
    INFO("a " << c.size() << "-byte character");
    CHECK(CompleteUtf8Prefix("ab" + c) == 2 + c.size());
    for (size_t cut = 1; cut < c.size(); ++cut) {
      CHECK(CompleteUtf8Prefix("ab" + c.substr(0, cut)) == 2);  // held back until whole
    }
    CHECK(CompleteUtf8Prefix(c + c.substr(0, 1)) == c.size());
  }
  // Bytes that are not UTF-8 are never held back.
  CHECK(CompleteUtf8Prefix("a\xFF") == 2);
  CHECK(CompleteUtf8Prefix("\x80\x80\x80\x80") == 4);
}

// Events a CompletionEventStream wrote, parsed; "[DONE]" as a string.
std::vector<nlohmann::json> ParseEvents(const std::string& written) {
  std::vector<nlohmann::json> events;
  size_t at = 0;
  while (at < written.size()) {
    const size_t end = written.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    const std::string event = written.substr(at, end - at);
    REQUIRE(event.rfind("data: ", 0) == 0);
    const std::string data = event.substr(6);
    events.push_back(data == "[DONE]" ? nlohmann::json("[DONE]") : nlohmann::json::parse(data));
    at = end + 2;
  }
  return events;
}

// A CompletionEventStream writer that appends to `out` and always succeeds.
std::function<bool(std::string_view)> AppendTo(std::string& out) {
  return [&out](std::string_view bytes) {
    out.append(bytes);
    return true;
  };
}

// Words for ids; Decode puts a space between neighbours, so decoding a
// batch on its own would lose the space before it.
class WordTokenizer final : public Tokenizer {
 public:
  std::vector<TokenId> Encode(std::string_view) const override { return {}; }
  std::string Decode(std::span<const TokenId> tokens) const override {
    std::string out;
    for (TokenId t : tokens) absl::StrAppend(&out, out.empty() ? "" : " ", "w", t);
    return out;
  }
};

// Byte tokens, decoded the way Hugging Face tokenizers do: a character cut
// short is rendered as U+FFFD.
class ReplacingByteTokenizer final : public Tokenizer {
 public:
  std::vector<TokenId> Encode(std::string_view) const override { return {}; }
  std::string Decode(std::span<const TokenId> tokens) const override {
    std::string bytes = ByteTokenizer().Decode(tokens);
    const size_t whole = CompleteUtf8Prefix(bytes);
    if (whole < bytes.size()) bytes.replace(whole, std::string::npos, "\xEF\xBF\xBD");
    return bytes;
  }
};

TEST_CASE("a character split over batches streams whole with a tokenizer that renders U+FFFD",
          "[engine][gateway]") {
  ReplacingByteTokenizer tokenizer;
  std::string written;
  CompletionEventStream stream({.id = "cmpl-9", .chat = false, .model = "m"}, tokenizer,
                               AppendTo(written));
  const std::vector<TokenId> output = {'a', 0xE2, 0x82, 0xAC, 'b'};  // "a€b"
  for (size_t i = 0; i < output.size(); ++i) stream.Tokens(std::span(output).subspan(i, 1));
  stream.Done(output, nlohmann::json::object(), nlohmann::json::object());
  std::string text;
  for (const nlohmann::json& e : ParseEvents(written)) {
    if (e.is_object() && e["choices"][0]["finish_reason"].is_null()) {
      text += e["choices"][0]["text"].get<std::string>();
    }
  }
  CHECK(text == "a\xE2\x82\xAC" "b");
  CHECK(text.find("\xEF\xBF\xBD") == std::string::npos);
}

TEST_CASE("a streamed completion: text chunks as tokens come, whole characters, then the end",
          "[engine][gateway]") {
  ByteTokenizer bytes;
  std::string written;
  CompletionEventStream stream({.id = "cmpl-7", .chat = false, .model = "m", .max_tokens = 8},
                               bytes, AppendTo(written));
  const std::vector<TokenId> output = {'h', 'i', 0xC3, 0xA9, '!'};  // "hié!"
  stream.Tokens(std::span(output).first(2));
  CHECK(ParseEvents(written).size() == 1);
  stream.Tokens(std::span(output).subspan(2, 1));  // half of é: held back
  CHECK(ParseEvents(written).size() == 1);
  stream.Tokens(std::span(output).subspan(3, 1));
  // The '!' never came as a batch: Done sends it.
  stream.Done(output, {{"completion_tokens", 5}}, {{"kvc", {{"mode", "direct"}}}});
  const std::vector<nlohmann::json> events = ParseEvents(written);
  REQUIRE(events.size() == 5);
  CHECK(events[0]["choices"][0]["text"] == "hi");
  CHECK(events[1]["choices"][0]["text"] == "\xC3\xA9");
  CHECK(events[2]["choices"][0]["text"] == "!");
  for (int i = 0; i < 3; ++i) {
    CHECK(events[i]["object"] == "text_completion");
    CHECK(events[i]["id"] == "cmpl-7");
    CHECK(events[i]["choices"][0]["finish_reason"].is_null());
  }
  CHECK(events[3]["choices"][0]["finish_reason"] == "stop");  // 5 of 8 tokens: it ended
  CHECK(events[3]["choices"][0]["text"] == "");
  CHECK(events[3]["usage"]["completion_tokens"] == 5);
  CHECK(events[3]["kvc"]["mode"] == "direct");
  CHECK(events[4] == "[DONE]");
  // Over: nothing more is written.
  const size_t size = written.size();
  stream.Fail(502, "late", false);
  stream.Tokens(output);
  CHECK(written.size() == size);
  CHECK(stream.finished());
}

TEST_CASE("a streamed chat: the role once, batches decoded in context, failures as events",
          "[engine][gateway]") {
  WordTokenizer words;
  std::string written;
  bool open = true;
  CompletionEventStream stream({.id = "chatcmpl-1", .chat = true, .model = ""}, words,
                               [&](std::string_view b) {
                                 written.append(b);
                                 return open;
                               });
  const std::vector<TokenId> output = {1, 2, 3, 4, 5, 6, 7};
  for (size_t i = 0; i < output.size(); ++i) stream.Tokens(std::span(output).subspan(i, 1));
  std::vector<nlohmann::json> events = ParseEvents(written);
  REQUIRE(events.size() == output.size());
  std::string text;
  for (const nlohmann::json& e : events) {
    CHECK(e["object"] == "chat.completion.chunk");
    text += e["choices"][0]["delta"]["content"].get<std::string>();
  }
  CHECK(text == words.Decode(output));  // "w1 w2 ... w7": the spaces kept
  CHECK(events[0]["choices"][0]["delta"]["role"] == "assistant");
  CHECK_FALSE(events[1]["choices"][0]["delta"].contains("role"));

  SECTION("a failure ends the stream with an error event") {
    stream.Fail(503, "the load-control queue is full", /*retry=*/true);
    events = ParseEvents(written);
    REQUIRE(events.size() == output.size() + 2);
    const nlohmann::json& error = events[output.size()]["error"];
    CHECK(error["code"] == 503);
    CHECK(error["message"] == "the load-control queue is full");
    CHECK(error["retry_after_s"] == 1);
    CHECK(events.back() == "[DONE]");
    const size_t size = written.size();
    stream.Done(output, nlohmann::json::object(), nlohmann::json::object());
    CHECK(written.size() == size);
  }
  SECTION("a client that goes away gets nothing more") {
    CHECK(stream.KeepAlive("waiting"));
    CHECK(written.substr(written.size() - 11) == ": waiting\n\n");
    open = false;
    stream.Tokens(std::span(output).first(1));  // the write that fails
    CHECK_FALSE(stream.connected());
    const size_t size = written.size();
    stream.Done(output, nlohmann::json::object(), nlohmann::json::object());
    CHECK_FALSE(stream.KeepAlive("waiting"));
    CHECK(written.size() == size);
  }
}

TEST_CASE("a chat answer with no tokens still sends the role, then the end", "[engine][gateway]") {
  ByteTokenizer bytes;
  std::string written;
  CompletionEventStream stream({.id = "chatcmpl-2", .chat = true, .model = "m"}, bytes,
                               AppendTo(written));
  stream.Done({}, {{"completion_tokens", 0}}, nlohmann::json::object());
  const std::vector<nlohmann::json> events = ParseEvents(written);
  REQUIRE(events.size() == 3);
  CHECK(events[0]["choices"][0]["delta"] ==
        nlohmann::json{{"role", "assistant"}, {"content", ""}});
  CHECK(events[1]["choices"][0]["delta"] == nlohmann::json::object());
  CHECK(events[1]["choices"][0]["finish_reason"] == "length");  // no max_tokens given: "length"
  CHECK(events[2] == "[DONE]");
}

TEST_CASE("the byte tokenizer and chat template keep prefixes stable", "[engine][gateway]") {
  ByteTokenizer tokenizer;
  const auto ids = tokenizer.Encode("hé");
  CHECK(ids.size() == 3);
  CHECK(tokenizer.Decode(ids) == "hé");
  nlohmann::json messages = {{{"role", "user"}, {"content", "hi"}}};
  auto first = RenderChat(messages);
  REQUIRE(first.ok());
  messages.push_back({{"role", "assistant"}, {"content", "yo"}});
  messages.push_back({{"role", "user"}, {"content", "next"}});
  auto second = RenderChat(messages);
  REQUIRE(second.ok());
  CHECK(second->rfind(*first + "yo", 0) == 0);  // prompt + answer is a prefix of the next prompt
  CHECK_FALSE(RenderChat(nlohmann::json::array()).ok());
  CHECK_FALSE(RenderChat(nlohmann::json{{{"role", 1}}}).ok());
}

TEST_CASE("the chat template takes what agents send: text parts, tool calls, tool results, tools",
          "[engine][gateway]") {
  const nlohmann::json tools = nlohmann::json::parse(
      R"([{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}])");
  nlohmann::json messages = nlohmann::json::parse(R"([
    {"role": "system", "content": [{"type": "text", "text": "You edit "}, {"type": "text", "text": "code."}]},
    {"role": "user", "content": "fix the bug"}])");
  auto first = RenderChat(messages, tools);
  REQUIRE(first.ok());
  CHECK(*first == "<|tools|>" + tools.dump() + "\n<|system|>You edit code.\n<|user|>fix the bug\n"
                  "<|assistant|>");
  // The same tools written in another key order render the same text.
  const nlohmann::json reordered = nlohmann::json::parse(
      R"([{"function":{"parameters":{"type":"object"},"name":"read_file"},"type":"function"}])");
  CHECK(*RenderChat(messages, reordered) == *first);
  // An answer that called a tool (content null), the tool's result, the next ask.
  messages.push_back(nlohmann::json::parse(R"({"role": "assistant", "content": null,
      "tool_calls": [{"id": "c1", "type": "function",
                      "function": {"name": "read_file", "arguments": "{\"path\":\"a.c\"}"}}]})"));
  messages.push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "int main;"}});
  auto second = RenderChat(messages, tools);
  REQUIRE(second.ok());
  CHECK(second->rfind(*first, 0) == 0);  // the earlier prompt is a prefix
  CHECK(second->find("<|tool_calls|>[{\"function\"") != std::string::npos);
  CHECK(absl::EndsWith(*second, "<|tool|>int main;\n<|assistant|>"));
  // What it cannot render is refused, naming the message and part.
  struct Bad {
    const char* messages;
    const char* names;
  };
  for (const Bad& bad : {
           Bad{R"([{"role": "user", "content": 5}])", "messages[0].content must be"},
           Bad{R"([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])",
               "messages[0].content[0]: only \"text\" parts"},
           Bad{R"([{"role": "user", "content": [{"text": "x"}]}])", "content[0] needs a string \"type\""},
           Bad{R"([{"role": "user", "content": [{"type": "text"}]}])", "content[0] needs a string \"text\""},
           Bad{R"([{"role": "assistant", "content": "", "tool_calls": {}}])", "tool_calls must be an array"},
       }) {
    INFO(bad.messages);
    auto refused = RenderChat(nlohmann::json::parse(bad.messages));
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(std::string(refused.status().message()), Catch::Contains(bad.names));
  }
  auto bad_tools = RenderChat(nlohmann::json::parse(R"([{"role": "user", "content": "x"}])"),
                              nlohmann::json::object());
  REQUIRE_FALSE(bad_tools.ok());
  CHECK_THAT(std::string(bad_tools.status().message()), Catch::Contains("\"tools\" must be an array"));
  CHECK(std::string(FinishReason(3, 4)) == "stop");
  CHECK(std::string(FinishReason(4, 4)) == "length");
}

struct FakeConversation {
  absl::Mutex mu;
  bool closed = false;
};

TEST_CASE("conversations are forgotten when idle past the TTL or beyond the bound, never in use",
          "[engine][gateway]") {
  double now = 0;
  auto created =
      ConversationTable<FakeConversation>::Create({.max_sessions = 10, .ttl_s = 100}, [&now] {
        return now;
      });
  REQUIRE(created.ok());
  ConversationTable<FakeConversation>& table = **created;
  const std::shared_ptr<FakeConversation> a = table.FindOrCreate(1);
  CHECK(table.FindOrCreate(1) == a);
  CHECK(table.Find(1) == a);
  CHECK(table.Find(2) == nullptr);
  now = 50;
  const std::shared_ptr<FakeConversation> b = table.FindOrCreate(2);
  now = 120;  // 1 unused for 120 s, 2 for 70 s
  table.FindOrCreate(3);
  CHECK(table.Find(1) == nullptr);
  CHECK(a->closed);  // a turn that locks it now starts over with a fresh state
  CHECK(table.Find(2) == b);
  CHECK(table.forgotten() == 1);
  // A state a turn holds is not forgotten, however old.
  b->mu.Lock();
  now = 400;
  table.FindOrCreate(4);
  CHECK(table.Find(2) == b);
  CHECK_FALSE(b->closed);
  CHECK(table.Find(3) == nullptr);  // idle since 120
  b->mu.Unlock();
  // Past the bound the least recently used go, down to 90% of it.
  for (SessionId id = 10; id < 20; ++id) {
    now += 1;
    table.FindOrCreate(id);
  }
  // The 11th state (18) went past the bound: 2 (idle past the TTL) and then
  // 4, the least recently used, were forgotten, down to 9; 19 made 10.
  CHECK(table.size() == 10);
  CHECK(table.Find(2) == nullptr);
  CHECK(table.Find(4) == nullptr);
  CHECK(table.forgotten() == 4);
  now += 1;
  table.FindOrCreate(20);  // 11 again: the two least recently used go
  CHECK(table.size() == 9);
  CHECK(table.Find(10) == nullptr);
  CHECK(table.Find(11) == nullptr);
  CHECK(table.Find(12) != nullptr);
  CHECK(table.Find(20) != nullptr);
  CHECK(table.forgotten() == 6);
  // Erase forgets only the state it names, not one created since.
  const std::shared_ptr<FakeConversation> old = table.Find(12);
  table.Erase(12, std::make_shared<FakeConversation>());
  CHECK(table.Find(12) == old);
  table.Erase(12, old);
  CHECK(table.Find(12) == nullptr);
  CHECK(table.forgotten() == 6);
}

TEST_CASE("a conversation table refuses options that bound nothing, naming the option",
          "[engine][gateway]") {
  using Table = ConversationTable<FakeConversation>;
  const auto refused = [](Table::Options options, const char* option) {
    absl::StatusOr<std::unique_ptr<Table>> table = Table::Create(options);
    CHECK(absl::IsInvalidArgument(table.status()));
    CHECK(absl::StrContains(table.status().message(), option));
  };
  refused({.max_sessions = 0, .ttl_s = 100}, "max_sessions");
  refused({.max_sessions = 10, .ttl_s = 0}, "ttl_s");
  refused({.max_sessions = 10, .ttl_s = -1}, "ttl_s");
  refused({.max_sessions = 10, .ttl_s = std::nan("")}, "ttl_s");
  // No TTL at all is a valid choice: only the bound forgets.
  double now = 0;
  auto unlimited = Table::Create({.max_sessions = 2, .ttl_s = HUGE_VAL}, [&now] { return now; });
  REQUIRE(unlimited.ok());
  (*unlimited)->FindOrCreate(1);
  now = 1e12;
  (*unlimited)->FindOrCreate(2);
  CHECK((*unlimited)->Find(1) != nullptr);
  (*unlimited)->FindOrCreate(3);  // past the bound: 1, the least recently used, goes
  CHECK((*unlimited)->Find(1) == nullptr);
  CHECK((*unlimited)->size() == 2);
}

}  // namespace
}  // namespace kvc_router::engine
