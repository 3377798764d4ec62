// kvc_engine/event_publisher.hpp
//
// Publishes KV events in vLLM's wire format, for the worker emulator
// (engine/tools/kvc_worker_emulator.cpp) and for tests: a PUB socket sends
// (topic, 8-byte big-endian sequence number, msgpack EventBatch) and a ROUTER
// socket answers replay requests from a ring buffer of the last
// `buffer_steps` batches, ending each answer with sequence -1 and an empty
// payload. Batches are encoded as current vLLM does (maps with a "type" tag
// for events, block hashes as 32-byte bytes whose last eight bytes, big-
// endian, are the 64-bit hash) or, with Encoding::kArray, as SGLang and older
// vLLM do (arrays, the tag first, integer hashes).
//
// `Publish` is thread-safe and does not block on the network: a background
// thread owns both sockets, sends queued batches and serves replays.
// `DropForTesting(sequence)` skips sending that batch on the PUB socket (it
// still enters the replay buffer), so a gap can be produced on demand.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvc_router/index/kv_event_index.hpp"

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>
#include <zmq.hpp>

namespace kvc_router::engine {

enum class EventEncoding : uint8_t {
  kMap,    // current vLLM
  kArray,  // SGLang, vLLM before the map form
};

namespace publisher_detail {

template <class Packer>
void PackHash(Packer& pk, BlockHash hash, EventEncoding encoding) {
  if (encoding == EventEncoding::kArray) {
    pk.pack_uint64(hash);
    return;
  }
  // 32 bytes like a sha256 digest; vLLM's 64-bit fold keeps the last eight.
  char bytes[32];
  for (int i = 0; i < 24; ++i) bytes[i] = static_cast<char>((hash >> ((i % 8) * 8)) ^ (0x5a + i));
  for (int i = 0; i < 8; ++i) bytes[24 + i] = static_cast<char>(hash >> (56 - 8 * i));
  pk.pack_bin(32);
  pk.pack_bin_body(bytes, 32);
}

template <class Packer>
void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

template <class Packer>
void PackOptionalStr(Packer& pk, std::string_view s) {
  if (s.empty()) {
    pk.pack_nil();
  } else {
    PackStr(pk, s);
  }
}

template <class Packer>
void PackEvent(Packer& pk, const KvEvent& event, EventEncoding encoding) {
  const bool map = encoding == EventEncoding::kMap;
  if (const auto* stored = std::get_if<BlockStoredEvent>(&event)) {
    if (map) {
      pk.pack_map(8);
      PackStr(pk, "type");
    } else {
      pk.pack_array(8);
    }
    PackStr(pk, "BlockStored");
    if (map) PackStr(pk, "block_hashes");
    pk.pack_array(static_cast<uint32_t>(stored->block_hashes.size()));
    for (BlockHash h : stored->block_hashes) PackHash(pk, h, encoding);
    if (map) PackStr(pk, "parent_block_hash");
    if (stored->parent_block_hash.has_value()) {
      PackHash(pk, *stored->parent_block_hash, encoding);
    } else {
      pk.pack_nil();
    }
    if (map) PackStr(pk, "token_ids");
    pk.pack_array(static_cast<uint32_t>(stored->token_ids.size()));
    for (TokenId t : stored->token_ids) pk.pack_uint32(t);
    if (map) PackStr(pk, "block_size");
    pk.pack_uint32(stored->block_size);
    if (map) PackStr(pk, "lora_id");
    if (stored->lora_id.has_value()) {
      pk.pack_int64(*stored->lora_id);
    } else {
      pk.pack_nil();
    }
    if (map) PackStr(pk, "medium");
    PackOptionalStr(pk, stored->medium);
    if (map) PackStr(pk, "lora_name");
    PackOptionalStr(pk, stored->lora_name);
  } else if (const auto* removed = std::get_if<BlockRemovedEvent>(&event)) {
    if (map) {
      pk.pack_map(3);
      PackStr(pk, "type");
    } else {
      pk.pack_array(3);
    }
    PackStr(pk, "BlockRemoved");
    if (map) PackStr(pk, "block_hashes");
    pk.pack_array(static_cast<uint32_t>(removed->block_hashes.size()));
    for (BlockHash h : removed->block_hashes) PackHash(pk, h, encoding);
    if (map) PackStr(pk, "medium");
    PackOptionalStr(pk, removed->medium);
  } else {
    if (map) {
      pk.pack_map(1);
      PackStr(pk, "type");
    } else {
      pk.pack_array(1);
    }
    PackStr(pk, "AllBlocksCleared");
  }
}

}  // namespace publisher_detail

// One EventBatch payload.
inline std::string EncodeEventBatch(const std::vector<KvEvent>& events, double timestamp,
                                    int64_t data_parallel_rank, EventEncoding encoding) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  if (encoding == EventEncoding::kMap) {
    pk.pack_map(3);
    publisher_detail::PackStr(pk, "ts");
  } else {
    pk.pack_array(3);
  }
  pk.pack_double(timestamp);
  if (encoding == EventEncoding::kMap) publisher_detail::PackStr(pk, "events");
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) publisher_detail::PackEvent(pk, e, encoding);
  if (encoding == EventEncoding::kMap) publisher_detail::PackStr(pk, "data_parallel_rank");
  pk.pack_int64(data_parallel_rank);
  return std::string(buffer.data(), buffer.size());
}

class KvEventPublisher {
 public:
  struct Options {
    std::string endpoint;         // PUB, bound: "tcp://127.0.0.1:5557"
    std::string replay_endpoint;  // ROUTER, bound; "" = no replay
    std::string topic;
    int64_t data_parallel_rank = 0;
    size_t buffer_steps = 10000;
    EventEncoding encoding = EventEncoding::kMap;
  };

  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Create(Options options) {
    if (options.endpoint.empty()) return absl::InvalidArgumentError("KvEventPublisher: no endpoint");
    if (options.buffer_steps == 0) {
      return absl::InvalidArgumentError("KvEventPublisher: buffer_steps must be >= 1");
    }
    std::unique_ptr<KvEventPublisher> publisher(new KvEventPublisher(std::move(options)));
    try {
      publisher->pub_ = zmq::socket_t(publisher->context_, zmq::socket_type::pub);
      publisher->pub_.set(zmq::sockopt::linger, 0);
      publisher->pub_.bind(publisher->options_.endpoint);
      if (!publisher->options_.replay_endpoint.empty()) {
        publisher->replay_ = zmq::socket_t(publisher->context_, zmq::socket_type::router);
        publisher->replay_.set(zmq::sockopt::linger, 0);
        publisher->replay_.bind(publisher->options_.replay_endpoint);
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(absl::StrCat("KvEventPublisher: cannot bind ",
                                                 publisher->options_.endpoint, ": ", e.what()));
    }
    publisher->thread_ = std::thread([p = publisher.get()] { p->Run(); });
    return publisher;
  }

  ~KvEventPublisher() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues one batch; returns its sequence number.
  uint64_t Publish(const std::vector<KvEvent>& events, double timestamp) {
    std::string payload =
        EncodeEventBatch(events, timestamp, options_.data_parallel_rank, options_.encoding);
    absl::MutexLock lock(&mu_);
    const uint64_t sequence = next_sequence_++;
    queue_.emplace_back(sequence, std::move(payload));
    return sequence;
  }

  void DropForTesting(uint64_t sequence) {
    absl::MutexLock lock(&mu_);
    drop_.push_back(sequence);
  }
  uint64_t published() const {
    absl::MutexLock lock(&mu_);
    return next_sequence_;
  }

 private:
  explicit KvEventPublisher(Options options) : options_(std::move(options)) {}

  static zmq::const_buffer Seq(const uint8_t (&bytes)[8]) { return zmq::buffer(bytes, 8); }
  static void Encode(uint64_t value, uint8_t (&bytes)[8]) {
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(value >> (56 - 8 * i));
  }

  void Run() {
    while (!stop_) {
      std::deque<std::pair<uint64_t, std::string>> ready;
      std::vector<uint64_t> drop;
      {
        absl::MutexLock lock(&mu_);
        ready.swap(queue_);
        drop = drop_;
      }
      try {
        for (auto& [sequence, payload] : ready) {
          if (std::find(drop.begin(), drop.end(), sequence) == drop.end()) {
            uint8_t seq[8];
            Encode(sequence, seq);
            pub_.send(zmq::buffer(options_.topic), zmq::send_flags::sndmore);
            pub_.send(Seq(seq), zmq::send_flags::sndmore);
            pub_.send(zmq::buffer(payload), zmq::send_flags::none);
          }
          buffer_.emplace_back(sequence, std::move(payload));
          if (buffer_.size() > options_.buffer_steps) buffer_.pop_front();
        }
        if (replay_.handle() != nullptr) {
          zmq::pollitem_t item{replay_.handle(), 0, ZMQ_POLLIN, 0};
          if (zmq::poll(&item, 1, std::chrono::milliseconds(5)) > 0) ServeReplay();
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      } catch (const zmq::error_t&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }

  void ServeReplay() {
    std::vector<zmq::message_t> frames;
    while (true) {
      zmq::message_t frame;
      if (!replay_.recv(frame, zmq::recv_flags::dontwait)) break;
      const bool more = frame.more();
      frames.push_back(std::move(frame));
      if (!more) break;
    }
    if (frames.size() != 3 || frames[2].size() != 8) return;  // not a replay request
    uint64_t start = 0;
    const auto* bytes = static_cast<const uint8_t*>(frames[2].data());
    for (int i = 0; i < 8; ++i) start = (start << 8) | bytes[i];
    const std::string identity(static_cast<const char*>(frames[0].data()), frames[0].size());
    for (const auto& [sequence, payload] : buffer_) {
      if (sequence < start) continue;
      uint8_t seq[8];
      Encode(sequence, seq);
      replay_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
      replay_.send(zmq::message_t(), zmq::send_flags::sndmore);
      replay_.send(Seq(seq), zmq::send_flags::sndmore);
      replay_.send(zmq::buffer(payload), zmq::send_flags::none);
    }
    uint8_t end[8];
    Encode(~uint64_t{0}, end);
    replay_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    replay_.send(zmq::message_t(), zmq::send_flags::sndmore);
    replay_.send(Seq(end), zmq::send_flags::sndmore);
    replay_.send(zmq::message_t(), zmq::send_flags::none);
  }

  Options options_;
  zmq::context_t context_;
  zmq::socket_t pub_;
  zmq::socket_t replay_;
  mutable absl::Mutex mu_;
  uint64_t next_sequence_ = 0;
  std::deque<std::pair<uint64_t, std::string>> queue_;
  std::deque<std::pair<uint64_t, std::string>> buffer_;  // publisher thread only
  std::vector<uint64_t> drop_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvc_router::engine
