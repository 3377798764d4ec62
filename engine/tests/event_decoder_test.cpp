#include "kvc_engine/event_decoder.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kvc_engine/event_publisher.hpp"
#include "kvc_router/detail/splitmix.hpp"
#include "test_support.hpp"

namespace kvc_router::engine {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void Str(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

absl::StatusOr<DecodedEventBatch> Decode(const msgpack::sbuffer& buffer) {
  return DecodeEventBatch(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(buffer.data()), buffer.size()));
}

TEST_CASE("array batches with tagged array events decode; extra fields are ignored",
          "[engine][decoder]") {
  msgpack::sbuffer buffer;
  Packer pk(buffer);
  pk.pack_array(4);  // ts, events, dp rank, and a field from the future
  pk.pack_double(12.5);
  pk.pack_array(4);
  // SGLang's BlockStored: five fields, signed int64 hashes.
  pk.pack_array(6);
  Str(pk, "BlockStored");
  pk.pack_array(2);
  pk.pack_int64(-5);
  pk.pack_int64(7);
  pk.pack_nil();
  pk.pack_array(4);
  for (uint32_t t : {1u, 2u, 3u, 4u}) pk.pack_uint32(t);
  pk.pack_uint32(2);
  pk.pack_nil();
  // A newer vLLM BlockStored with trailing fields nobody knows yet.
  pk.pack_array(12);
  Str(pk, "BlockStored");
  pk.pack_array(1);
  pk.pack_uint64(0xFFFFFFFFFFFFFFF0ULL);
  pk.pack_int64(7);
  pk.pack_array(2);
  pk.pack_uint32(9);
  pk.pack_uint32(10);
  pk.pack_uint32(2);
  pk.pack_int64(3);
  Str(pk, "CPU");
  Str(pk, "my-lora");
  pk.pack_nil();     // extra_keys
  pk.pack_int64(0);  // group_idx
  Str(pk, "full_attention");
  pk.pack_true();
  pk.pack_array(3);
  Str(pk, "BlockRemoved");
  pk.pack_array(1);
  pk.pack_int64(-5);
  Str(pk, "GPU");
  pk.pack_array(1);
  Str(pk, "AllBlocksCleared");
  pk.pack_int64(2);
  Str(pk, "unknown trailing batch field");

  auto batch = Decode(buffer);
  REQUIRE(batch.ok());
  CHECK(batch->timestamp == 12.5);
  CHECK(batch->data_parallel_rank == 2);
  REQUIRE(batch->events.size() == 4);
  const auto& a = std::get<BlockStoredEvent>(batch->events[0]);
  CHECK(a.block_hashes == std::vector<BlockHash>{static_cast<BlockHash>(-5), 7});
  CHECK_FALSE(a.parent_block_hash.has_value());
  CHECK(a.token_ids == std::vector<TokenId>{1, 2, 3, 4});
  CHECK(a.block_size == 2);
  CHECK(a.medium.empty());
  const auto& b = std::get<BlockStoredEvent>(batch->events[1]);
  CHECK(b.block_hashes == std::vector<BlockHash>{0xFFFFFFFFFFFFFFF0ULL});
  CHECK(b.parent_block_hash == BlockHash{7});
  CHECK(b.lora_id == 3);
  CHECK(b.medium == "CPU");
  CHECK(b.lora_name == "my-lora");
  CHECK(std::get<BlockRemovedEvent>(batch->events[2]).medium == "GPU");
  CHECK(std::holds_alternative<AllBlocksClearedEvent>(batch->events[3]));
}

TEST_CASE("map batches with type-tagged map events decode; bytes hashes fold like vLLM",
          "[engine][decoder]") {
  msgpack::sbuffer buffer;
  Packer pk(buffer);
  pk.pack_map(3);
  Str(pk, "ts");
  pk.pack_uint64(100);
  Str(pk, "events");
  pk.pack_array(2);
  pk.pack_map(6);
  Str(pk, "type");
  Str(pk, "BlockStored");
  Str(pk, "block_size");
  pk.pack_uint32(1);
  Str(pk, "token_ids");
  pk.pack_array(1);
  pk.pack_uint32(77);
  Str(pk, "block_hashes");
  pk.pack_array(1);
  // 32 bytes 0x00..0x1f: int.from_bytes(big) & (2^64-1) is 0x18191a1b1c1d1e1f.
  char digest[32];
  for (int i = 0; i < 32; ++i) digest[i] = static_cast<char>(i);
  pk.pack_bin(32);
  pk.pack_bin_body(digest, 32);
  Str(pk, "parent_block_hash");
  pk.pack_bin(3);
  pk.pack_bin_body("\x01\x02\x03", 3);
  Str(pk, "some_new_field");
  pk.pack_map(0);
  pk.pack_map(3);
  Str(pk, "type");
  Str(pk, "BlockStored");
  Str(pk, "group_idx");
  pk.pack_uint32(1);  // a sliding-window group: skipped
  Str(pk, "block_hashes");
  pk.pack_array(0);
  Str(pk, "data_parallel_rank");
  pk.pack_nil();
  auto batch = Decode(buffer);
  REQUIRE(batch.ok());
  CHECK(batch->timestamp == 100.0);
  CHECK_FALSE(batch->data_parallel_rank.has_value());
  CHECK(batch->skipped_group_events == 1);
  REQUIRE(batch->events.size() == 1);
  const auto& stored = std::get<BlockStoredEvent>(batch->events[0]);
  CHECK(stored.block_hashes == std::vector<BlockHash>{0x18191a1b1c1d1e1fULL});
  CHECK(stored.parent_block_hash == BlockHash{0x010203});
  CHECK(stored.token_ids == std::vector<TokenId>{77});
}

TEST_CASE("the publisher's payloads decode to what was published", "[engine][decoder]") {
  BlockStoredEvent stored;
  stored.block_hashes = {0x1122334455667788ULL, 42};
  stored.parent_block_hash = 0x99;
  stored.token_ids = {5, 6, 7, 8};
  stored.block_size = 2;
  stored.lora_name = "a";
  stored.medium = "GPU";
  const std::vector<KvEvent> events = {stored, BlockRemovedEvent{{42}, "CPU"},
                                       AllBlocksClearedEvent{}};
  for (EventEncoding encoding : {EventEncoding::kMap, EventEncoding::kArray}) {
    const std::string payload = EncodeEventBatch(events, 3.25, 1, encoding);
    auto batch = DecodeEventBatch(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
    REQUIRE(batch.ok());
    CHECK(batch->data_parallel_rank == 1);
    REQUIRE(batch->events.size() == 3);
    const auto& got = std::get<BlockStoredEvent>(batch->events[0]);
    CHECK(got.block_hashes == stored.block_hashes);
    CHECK(got.parent_block_hash == stored.parent_block_hash);
    CHECK(got.token_ids == stored.token_ids);
    CHECK(got.lora_name == "a");
    CHECK(std::get<BlockRemovedEvent>(batch->events[1]).medium == "CPU");
  }
}

TEST_CASE("malformed payloads are refused with a message naming the problem",
          "[engine][decoder]") {
  auto refused = [](const std::string& bytes) {
    auto batch = DecodeEventBatch(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    REQUIRE_FALSE(batch.ok());
    CHECK(batch.status().code() == absl::StatusCode::kInvalidArgument);
    return test::Message(batch.status());
  };
  CHECK(refused("").find("empty payload") != std::string::npos);
  CHECK(refused("\x92\xcb").find("truncated") != std::string::npos);
  CHECK(refused("\xc1").find("malformed") != std::string::npos);
  CHECK(refused(std::string("\x92\x01\x90\x01", 4)).find("trailing") != std::string::npos);
  CHECK(refused("\x05").find("expected an array or map") != std::string::npos);
  // A few bytes that claim millions of elements are refused at the header,
  // before msgpack allocates room for them (array32 of 2^24 - 1, map32 of 2^20).
  CHECK(refused(std::string("\xdd\x00\xff\xff\xff", 5)).find("array size overflow") !=
        std::string::npos);
  CHECK(refused(std::string("\xdf\x00\x10\x00\x00", 5)).find("map size overflow") !=
        std::string::npos);

  auto one_event = [](auto&& pack_event) {
    msgpack::sbuffer buffer;
    Packer pk(buffer);
    pk.pack_array(2);
    pk.pack_double(1.0);
    pk.pack_array(1);
    pack_event(pk);
    return std::string(buffer.data(), buffer.size());
  };
  CHECK(refused(one_event([](Packer& pk) {
          pk.pack_array(1);
          Str(pk, "BlockEvicted");
        })).find("unknown event type \"BlockEvicted\"") != std::string::npos);
  CHECK(refused(one_event([](Packer& pk) {
          pk.pack_array(5);
          Str(pk, "BlockStored");
          pk.pack_array(1);
          Str(pk, "not a hash");
          pk.pack_nil();
          pk.pack_array(0);
          pk.pack_uint32(16);
        })).find("block hash is str") != std::string::npos);
  CHECK(refused(one_event([](Packer& pk) {
          pk.pack_array(5);
          Str(pk, "BlockStored");
          pk.pack_array(1);
          pk.pack_uint32(1);
          pk.pack_nil();
          pk.pack_array(1);
          pk.pack_int64(-3);
          pk.pack_uint32(16);
        })).find("token_ids[0]") != std::string::npos);
  CHECK(refused(one_event([](Packer& pk) {
          pk.pack_array(5);
          Str(pk, "BlockStored");
          pk.pack_array(1);
          pk.pack_uint32(1);
          pk.pack_nil();
          pk.pack_array(0);
          pk.pack_uint32(0);
        })).find("block_size 0") != std::string::npos);
  CHECK(refused(one_event([](Packer& pk) {
          pk.pack_array(2);
          Str(pk, "BlockStored");
          pk.pack_array(0);
        })).find("lacks") != std::string::npos);
  CHECK(refused(one_event([](Packer& pk) { pk.pack_uint32(3); }))
            .find("event 0") != std::string::npos);
}

// Fuzz-style property: mutated payloads (bit flips, truncation, spliced
// bytes) never crash the decoder; it answers OK or InvalidArgument, and what
// it accepts the index either applies or refuses with a status.
TEST_CASE("mutated payloads are decoded or refused, never crash", "[engine][decoder][property]") {
  const uint64_t seed = GENERATE(take(300, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  kvc_router::detail::SplitMix64 rng(seed);
  BlockStoredEvent stored;
  stored.block_hashes = {rng.Next(), rng.Next()};
  stored.parent_block_hash = rng.Next();
  for (int i = 0; i < 32; ++i) stored.token_ids.push_back(static_cast<TokenId>(rng.Next() % 1000));
  stored.block_size = 16;
  stored.lora_name = rng.Next() % 2 ? "a" : "";
  const std::vector<KvEvent> events = {stored, BlockRemovedEvent{{rng.Next()}, "GPU"},
                                       AllBlocksClearedEvent{}};
  std::string payload = EncodeEventBatch(
      events, 1.0, 0, rng.Next() % 2 ? EventEncoding::kMap : EventEncoding::kArray);
  const int mutations = 1 + static_cast<int>(rng.Next() % 4);
  for (int m = 0; m < mutations && !payload.empty(); ++m) {
    const size_t at = rng.Next() % payload.size();
    switch (rng.Next() % 4) {
      case 0: payload[at] = static_cast<char>(payload[at] ^ (1 << (rng.Next() % 8))); break;
      case 1: payload.resize(at); break;
      case 2: payload.insert(at, 1, static_cast<char>(rng.Next())); break;
      default: payload[at] = static_cast<char>(rng.Next()); break;
    }
  }
  auto batch = DecodeEventBatch(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  if (!batch.ok()) {
    CHECK(batch.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  KvEventIndex index(1, {.block_tokens = 16});
  KvEventBatch apply;
  apply.events = batch->events;
  auto applied = index.Apply(apply);
  if (!applied.ok()) CHECK(index.entries() == 0);
}

}  // namespace
}  // namespace kvc_router::engine
