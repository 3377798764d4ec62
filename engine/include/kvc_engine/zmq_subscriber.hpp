// kvc_engine/zmq_subscriber.hpp
//
// Feeds a KvEventIndex from engines' KV-event publishers over ZMQ, the way
// vLLM (`--kv-events-config`) and SGLang publish them:
//   * a PUB socket sends three frames per message: topic, the batch's
//     sequence number (8 bytes, big-endian), the msgpack EventBatch
//     (event_decoder.hpp);
//   * an optional ROUTER socket replays missed batches: a client sends the
//     first missing sequence number (8 bytes, big-endian) and receives
//     (sequence, payload) pairs for everything still buffered from there,
//     then (-1, empty).
// Each source is one publisher (one engine process or data-parallel rank:
// vLLM offsets the port by the rank); every (source, data-parallel rank)
// maps to one WorkerId. A batch without a rank is rank 0.
//
// Gaps. KvEventIndex holds back batches that arrive after a gap. The
// subscriber then asks the source's replay socket for the missing range and
// applies what comes back; when the replay cannot fill the gap (no replay
// socket, timeout, the publisher's buffer no longer has those batches, or a
// replayed batch is malformed) it abandons the gap, which clears that
// worker's residency, counts it in `stats().abandoned_gaps` and logs why in
// `stats().last_error`.
//
// A frame that is not three parts, a sequence frame that is not 8 bytes, or
// a payload the decoder refuses is counted as a decode error, with the
// decoder's message in last_error; nothing of it is applied.
//
// Threading: the sockets belong to the thread that polls them: either call
// `PollOnce` yourself or `Start()` a background thread (then do not call
// PollOnce). `stats()` may be read from any thread. The sink is called from
// the polling thread; `SinkFor(RoutingState&)` applies under the state's lock.
//
//   std::vector<kvc_router::engine::EventSource> sources = {
//       {.endpoint = "tcp://10.0.0.5:5557", .replay_endpoint = "tcp://10.0.0.5:5558",
//        .ranks = {{0, /*worker=*/0}}}};
//   auto subscriber = kvc_router::engine::KvEventSubscriber::Create(
//       sources, kvc_router::engine::SinkFor(*routing_state));
//   (*subscriber)->Start();
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvc_engine/event_decoder.hpp"
#include "kvc_router/index/kv_event_index.hpp"
#include "kvc_router/routing_state.hpp"

#include <zmq.hpp>

namespace kvc_router::engine {

struct EventSource {
  // PUB endpoint to connect to, e.g. "tcp://10.0.0.5:5557".
  std::string endpoint;
  // ROUTER replay endpoint, e.g. "tcp://10.0.0.5:5558"; "" = none.
  std::string replay_endpoint;
  // Topic prefix to subscribe to ("" = every message).
  std::string topic;
  // data-parallel rank -> worker.
  std::vector<std::pair<int64_t, WorkerId>> ranks = {{0, 0}};
};

// Where decoded batches go.
struct EventSink {
  std::function<absl::StatusOr<KvEventIndex::ApplyReport>(const KvEventBatch&)> apply;
  std::function<absl::StatusOr<KvEventIndex::ApplyReport>(WorkerId)> abandon_gap;
};

// A sink that applies to the index inside a RoutingState, under its lock.
template <class State>
EventSink SinkFor(State& state) {
  return EventSink{
      [&state](const KvEventBatch& batch) {
        return state.WithIndex([&](KvEventIndex& index) { return index.Apply(batch); });
      },
      [&state](WorkerId worker) {
        return state.WithIndex([&](KvEventIndex& index) { return index.AbandonGap(worker); });
      }};
}

// A sink for a bare index guarded by `mu`.
inline EventSink SinkFor(KvEventIndex& index, absl::Mutex& mu) {
  return EventSink{[&index, &mu](const KvEventBatch& batch) {
                     absl::MutexLock lock(&mu);
                     return index.Apply(batch);
                   },
                   [&index, &mu](WorkerId worker) {
                     absl::MutexLock lock(&mu);
                     return index.AbandonGap(worker);
                   }};
}

struct SubscriberStats {
  uint64_t messages = 0;           // PUB messages received
  uint64_t batches_applied = 0;    // batches applied (live, replayed or released from hold)
  uint64_t batches_held = 0;       // batches held back behind a gap on arrival
  uint64_t decode_errors = 0;      // malformed frames or payloads, refused
  uint64_t apply_errors = 0;       // batches the index refused (other than duplicates)
  uint64_t duplicates = 0;         // batches already applied (e.g. replayed twice)
  uint64_t unknown_ranks = 0;      // batches from a rank with no worker
  uint64_t replay_requests = 0;
  uint64_t replayed_batches = 0;   // batches received from replay sockets
  uint64_t abandoned_gaps = 0;     // gaps the replay could not fill: residency cleared
  std::string last_error;
};

class KvEventSubscriber {
 public:
  struct Options {
    // How long a replay may take before the gap is abandoned.
    std::chrono::milliseconds replay_timeout{2000};
  };

  static absl::StatusOr<std::unique_ptr<KvEventSubscriber>> Create(std::vector<EventSource> sources,
                                                                   EventSink sink) {
    return Create(std::move(sources), std::move(sink), Options());
  }
  static absl::StatusOr<std::unique_ptr<KvEventSubscriber>> Create(std::vector<EventSource> sources,
                                                                   EventSink sink,
                                                                   Options options) {
    if (sources.empty()) return absl::InvalidArgumentError("KvEventSubscriber: no sources");
    if (!sink.apply || !sink.abandon_gap) {
      return absl::InvalidArgumentError("KvEventSubscriber: the sink is incomplete");
    }
    for (size_t i = 0; i < sources.size(); ++i) {
      if (sources[i].endpoint.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("KvEventSubscriber: source ", i, " has no endpoint"));
      }
      if (sources[i].ranks.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "KvEventSubscriber: source ", i, " (", sources[i].endpoint, ") maps no rank to a worker"));
      }
    }
    std::unique_ptr<KvEventSubscriber> subscriber(
        new KvEventSubscriber(std::move(sources), std::move(sink), options));
    try {
      for (Source& source : subscriber->sources_) {
        source.sub = zmq::socket_t(subscriber->context_, zmq::socket_type::sub);
        source.sub.set(zmq::sockopt::linger, 0);
        source.sub.set(zmq::sockopt::subscribe, source.config.topic);
        source.sub.connect(source.config.endpoint);
      }
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvEventSubscriber: cannot connect: ", e.what()));
    }
    return subscriber;
  }

  ~KvEventSubscriber() { Stop(); }
  KvEventSubscriber(const KvEventSubscriber&) = delete;
  KvEventSubscriber& operator=(const KvEventSubscriber&) = delete;

  // Handles the messages that arrive within `timeout` (at least one wait).
  // Returns how many messages were handled.
  size_t PollOnce(std::chrono::milliseconds timeout) {
    std::vector<zmq::pollitem_t> items;
    for (Source& source : sources_) {
      items.push_back({source.sub.handle(), 0, ZMQ_POLLIN, 0});
    }
    size_t handled = 0;
    try {
      if (zmq::poll(items, timeout) <= 0) return 0;
      for (size_t i = 0; i < items.size(); ++i) {
        if ((items[i].revents & ZMQ_POLLIN) == 0) continue;
        // Drain what is queued on this socket.
        while (true) {
          std::vector<zmq::message_t> frames;
          if (!RecvMultipart(sources_[i].sub, frames, /*wait=*/false)) break;
          HandleLive(sources_[i], frames);
          ++handled;
        }
      }
    } catch (const zmq::error_t& e) {
      Error(absl::StrCat("zmq: ", e.what()));
    }
    return handled;
  }

  // Polls on a background thread until Stop().
  void Start() {
    if (thread_.joinable()) return;
    stop_ = false;
    thread_ = std::thread([this] {
      while (!stop_) PollOnce(std::chrono::milliseconds(50));
    });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  SubscriberStats stats() const {
    absl::MutexLock lock(&stats_mu_);
    return stats_;
  }

 private:
  struct Source {
    EventSource config;
    zmq::socket_t sub;
    zmq::socket_t replay;
  };

  KvEventSubscriber(std::vector<EventSource> sources, EventSink sink, Options options)
      : sink_(std::move(sink)), options_(options) {
    for (EventSource& s : sources) sources_.push_back(Source{std::move(s), {}, {}});
  }

  static bool RecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>& frames,
                            bool wait) {
    frames.clear();
    while (true) {
      zmq::message_t frame;
      const auto got =
          socket.recv(frame, wait || !frames.empty() ? zmq::recv_flags::none
                                                     : zmq::recv_flags::dontwait);
      if (!got) return false;
      const bool more = frame.more();
      frames.push_back(std::move(frame));
      if (!more) return true;
    }
  }

  static std::optional<uint64_t> Sequence(const zmq::message_t& frame) {
    if (frame.size() != 8) return std::nullopt;
    const auto* bytes = static_cast<const uint8_t*>(frame.data());
    uint64_t value = 0;
    for (int i = 0; i < 8; ++i) value = (value << 8) | bytes[i];
    return value;
  }

  template <class Fn>
  void Update(Fn&& fn) {
    absl::MutexLock lock(&stats_mu_);
    fn(stats_);
  }
  void Error(std::string message) {
    Update([&](SubscriberStats& s) { s.last_error = std::move(message); });
  }

  void HandleLive(Source& source, const std::vector<zmq::message_t>& frames) {
    Update([](SubscriberStats& s) { ++s.messages; });
    if (frames.size() != 3) {
      Update([&](SubscriberStats& s) {
        ++s.decode_errors;
        s.last_error = absl::StrCat(source.config.endpoint, ": message of ", frames.size(),
                                    " frames refused; expected topic, sequence, payload");
      });
      return;
    }
    const std::optional<uint64_t> sequence = Sequence(frames[1]);
    if (!sequence.has_value()) {
      Update([&](SubscriberStats& s) {
        ++s.decode_errors;
        s.last_error = absl::StrCat(source.config.endpoint, ": sequence frame of ",
                                    frames[1].size(), " bytes refused; expected 8 (big-endian)");
      });
      return;
    }
    std::optional<KvEventIndex::ApplyReport> report = Handle(source, *sequence, frames[2], false);
    if (report.has_value() && report->gap_batches > 0) Recover(source, *report);
  }

  // Decodes and applies one batch. Returns the index's report when applied
  // or held back.
  std::optional<KvEventIndex::ApplyReport> Handle(Source& source, uint64_t sequence,
                                                  const zmq::message_t& payload, bool replayed) {
    absl::StatusOr<DecodedEventBatch> decoded = DecodeEventBatch(std::span<const uint8_t>(
        static_cast<const uint8_t*>(payload.data()), payload.size()));
    if (!decoded.ok()) {
      Update([&](SubscriberStats& s) {
        ++s.decode_errors;
        s.last_error = absl::StrCat(source.config.endpoint, " batch ", sequence, ": ",
                                    decoded.status().message());
      });
      return std::nullopt;
    }
    const int64_t rank = decoded->data_parallel_rank.value_or(0);
    std::optional<WorkerId> worker;
    for (const auto& [r, w] : source.config.ranks) {
      if (r == rank) worker = w;
    }
    if (!worker.has_value()) {
      Update([&](SubscriberStats& s) {
        ++s.unknown_ranks;
        s.last_error = absl::StrCat(source.config.endpoint, " batch ", sequence,
                                    ": data-parallel rank ", rank, " maps to no worker");
      });
      return std::nullopt;
    }
    KvEventBatch batch;
    batch.worker = *worker;
    batch.sequence = sequence;
    batch.timestamp = decoded->timestamp;
    batch.events = std::move(decoded->events);
    absl::StatusOr<KvEventIndex::ApplyReport> applied = sink_.apply(batch);
    if (!applied.ok()) {
      const bool duplicate = applied.status().code() == absl::StatusCode::kFailedPrecondition;
      Update([&](SubscriberStats& s) {
        ++(duplicate ? s.duplicates : s.apply_errors);
        if (!duplicate) {
          s.last_error = absl::StrCat(source.config.endpoint, " batch ", sequence, ": ",
                                      applied.status().message());
        }
      });
      return std::nullopt;
    }
    Update([&](SubscriberStats& s) {
      s.batches_applied += applied->applied_batches;
      s.batches_held += (applied->held_back && !replayed) ? 1 : 0;
      s.abandoned_gaps += applied->residency_cleared ? 1 : 0;
    });
    last_worker_ = *worker;
    return *applied;
  }

  // Asks the replay socket for the gap; abandons it when that fails.
  void Recover(Source& source, KvEventIndex::ApplyReport report) {
    const WorkerId worker = last_worker_;
    std::string why;
    if (source.config.replay_endpoint.empty()) {
      why = "no replay endpoint";
    } else {
      Update([](SubscriberStats& s) { ++s.replay_requests; });
      why = Replay(source, report);
    }
    if (why.empty()) return;
    absl::StatusOr<KvEventIndex::ApplyReport> abandoned = sink_.abandon_gap(worker);
    Update([&](SubscriberStats& s) {
      s.last_error = absl::StrCat(source.config.endpoint, ": gap of ", report.gap_batches,
                                  " batches from ", report.gap_from, " abandoned (", why,
                                  "); worker ", worker, "'s residency cleared");
      if (abandoned.ok()) {
        ++s.abandoned_gaps;
        s.batches_applied += abandoned->applied_batches;
      }
    });
  }

  // Returns "" when the gap was filled, else why not.
  std::string Replay(Source& source, KvEventIndex::ApplyReport& report) {
    try {
      if (source.replay.handle() == nullptr) {
        source.replay = zmq::socket_t(context_, zmq::socket_type::dealer);
        source.replay.set(zmq::sockopt::linger, 0);
        source.replay.set(zmq::sockopt::rcvtimeo, static_cast<int>(options_.replay_timeout.count()));
        source.replay.connect(source.config.replay_endpoint);
      }
      uint8_t start[8];
      for (int i = 0; i < 8; ++i) start[i] = static_cast<uint8_t>(report.gap_from >> (56 - 8 * i));
      source.replay.send(zmq::message_t(), zmq::send_flags::sndmore);
      source.replay.send(zmq::buffer(start, sizeof(start)), zmq::send_flags::none);
      bool first = true;
      bool lost = false;
      while (true) {
        std::vector<zmq::message_t> frames;
        if (!RecvMultipart(source.replay, frames, /*wait=*/true)) {
          // Timed out: drop the socket so late answers are not mistaken.
          source.replay = zmq::socket_t();
          return "replay timed out";
        }
        // DEALER sees [empty, sequence, payload].
        if (frames.size() != 3 || frames[1].size() != 8) {
          source.replay = zmq::socket_t();
          return absl::StrCat("malformed replay answer of ", frames.size(), " frames");
        }
        const uint64_t sequence = *Sequence(frames[1]);
        if (sequence == ~uint64_t{0}) break;  // end marker (-1)
        Update([](SubscriberStats& s) { ++s.replayed_batches; });
        // The publisher's buffer starts after the gap: the batches in
        // between are gone.
        if (first && sequence > report.gap_from) lost = true;
        first = false;
        if (sequence < report.gap_from) continue;
        std::optional<KvEventIndex::ApplyReport> applied =
            Handle(source, sequence, frames[2], /*replayed=*/true);
        if (applied.has_value() && !applied->held_back) report = *applied;
      }
      if (lost) return "the publisher no longer buffers the missing batches";
      if (report.gap_batches > 0) return "the replay did not fill the gap";
      return "";
    } catch (const zmq::error_t& e) {
      source.replay = zmq::socket_t();
      return absl::StrCat("replay failed: ", e.what());
    }
  }

  zmq::context_t context_;
  std::vector<Source> sources_;
  EventSink sink_;
  Options options_;
  WorkerId last_worker_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable absl::Mutex stats_mu_;
  SubscriberStats stats_;
};

}  // namespace kvc_router::engine
