#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kvc_engine/event_publisher.hpp"
#include "kvc_engine/zmq_subscriber.hpp"
#include "kvc_router/block_hash.hpp"

namespace kvc_router::engine {
namespace {

// A loopback port for this test process (PUB at p, replay at p + 1).
int TestPort(int slot) {
  return 20000 + static_cast<int>((::getpid() * 7 + slot * 2) % 20000);
}

std::string Tcp(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

BlockStoredEvent Stored(std::vector<BlockHash> engine, std::optional<BlockHash> parent,
                        std::vector<TokenId> tokens) {
  BlockStoredEvent e;
  e.block_hashes = std::move(engine);
  e.parent_block_hash = parent;
  e.token_ids = std::move(tokens);
  e.block_size = 2;
  return e;
}

// Polls until `done` or 5 s.
template <class Fn>
bool PollUntil(KvEventSubscriber& subscriber, Fn done) {
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(5)) return false;
    subscriber.PollOnce(std::chrono::milliseconds(20));
  }
  return true;
}

TEST_CASE("a dropped batch is replayed and everything is applied in order",
          "[engine][zmq]") {
  const int port = TestPort(1);
  auto publisher = KvEventPublisher::Create(
      {.endpoint = Tcp(port), .replay_endpoint = Tcp(port + 1), .topic = "kv"});
  REQUIRE(publisher.ok());
  KvEventIndex index(1, {.learn_placements = false, .block_tokens = 2});
  absl::Mutex mu;
  auto subscriber = KvEventSubscriber::Create(
      {{.endpoint = Tcp(port), .replay_endpoint = Tcp(port + 1), .topic = "kv"}},
      SinkFor(index, mu));
  REQUIRE(subscriber.ok());
  // Let the subscription reach the publisher (PUB drops until then).
  for (int i = 0; i < 10; ++i) (*subscriber)->PollOnce(std::chrono::milliseconds(20));

  const std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6};
  (*publisher)->DropForTesting(1);
  (*publisher)->Publish({Stored({100}, std::nullopt, {1, 2})}, 1.0);
  (*publisher)->Publish({Stored({101}, 100, {3, 4})}, 2.0);  // lost on the PUB socket
  (*publisher)->Publish({Stored({102}, 101, {5, 6})}, 3.0);
  REQUIRE(PollUntil(**subscriber, [&] { return (*subscriber)->stats().batches_applied >= 3; }));
  const SubscriberStats stats = (*subscriber)->stats();
  CHECK(stats.replay_requests == 1);
  CHECK(stats.batches_held == 1);
  CHECK(stats.abandoned_gaps == 0);
  CHECK(stats.decode_errors == 0);
  absl::MutexLock lock(&mu);
  std::vector<uint32_t> overlap(1);
  index.Overlap(ChainedBlockHashes(tokens, 2), overlap);
  CHECK(overlap[0] == 3);
  CHECK(index.orphan_blocks(0) == 0);
  CHECK(index.next_sequence(0) == 3);
}

TEST_CASE("without a replay socket a gap clears the worker and is reported", "[engine][zmq]") {
  const int port = TestPort(2);
  auto publisher = KvEventPublisher::Create({.endpoint = Tcp(port)});
  REQUIRE(publisher.ok());
  KvEventIndex index(1, {.learn_placements = false, .block_tokens = 2});
  absl::Mutex mu;
  auto subscriber = KvEventSubscriber::Create({{.endpoint = Tcp(port)}}, SinkFor(index, mu));
  REQUIRE(subscriber.ok());
  for (int i = 0; i < 10; ++i) (*subscriber)->PollOnce(std::chrono::milliseconds(20));
  (*publisher)->DropForTesting(1);
  (*publisher)->Publish({Stored({100}, std::nullopt, {1, 2})}, 1.0);
  (*publisher)->Publish({BlockRemovedEvent{{100}, ""}}, 2.0);  // lost: the index cannot know
  (*publisher)->Publish({Stored({200}, std::nullopt, {7, 8})}, 3.0);
  REQUIRE(PollUntil(**subscriber, [&] { return (*subscriber)->stats().abandoned_gaps >= 1; }));
  const SubscriberStats stats = (*subscriber)->stats();
  INFO(stats.last_error << " applied=" << stats.batches_applied << " held=" << stats.batches_held << " msgs=" << stats.messages);
  CHECK(stats.last_error.find("no replay endpoint") != std::string::npos);
  CHECK(stats.last_error.find("residency cleared") != std::string::npos);
  absl::MutexLock lock(&mu);
  CHECK_FALSE(index.Contains(0, ChainedBlockHashes(std::vector<TokenId>{1, 2}, 2)[0]));
  CHECK(index.Contains(0, ChainedBlockHashes(std::vector<TokenId>{7, 8}, 2)[0]));
  CHECK(index.abandoned_gaps(0) == 1);
}

TEST_CASE("subscriber configuration is validated", "[engine][zmq]") {
  KvEventIndex index(1);
  absl::Mutex mu;
  CHECK(KvEventSubscriber::Create({}, SinkFor(index, mu)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(KvEventSubscriber::Create({{.endpoint = ""}}, SinkFor(index, mu)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(KvEventSubscriber::Create({{.endpoint = "tcp://127.0.0.1:1", .ranks = {}}},
                                  SinkFor(index, mu))
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(KvEventSubscriber::Create({{.endpoint = "nonsense"}}, SinkFor(index, mu)).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvc_router::engine
