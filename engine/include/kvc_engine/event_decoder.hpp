// kvc_engine/event_decoder.hpp
//
// Decodes the msgpack payload of one KV-event message, as vLLM and SGLang
// publish it, into the router's KvEvent vocabulary (kvc_router/index/
// kv_event_index.hpp). Part of the engine adapter target
// (kvc_router::engine); the header-only router never includes msgpack.
//
// The payload is an EventBatch: [ts, events, data_parallel_rank?] encoded as
// an array (SGLang, older vLLM) or as a map {"ts", "events",
// "data_parallel_rank"} (current vLLM). Each event is a tagged union, either
// an array whose first element is the tag or a map with a "type" key:
//   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//    lora_id, medium, lora_name, extra_keys, group_idx, ...]
//   ["BlockRemoved", block_hashes, medium, group_idx, ...]
//   ["AllBlocksCleared"]
// Fields an older engine does not send take their defaults; fields a newer
// one appends are ignored. Block hashes are integers (SGLang sends a signed
// int64, vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES an unsigned one) or
// bytes (vLLM's default: a 32-byte sha256 digest); both are folded to 64 bits
// as vLLM does it, the big-endian value of the bytes modulo 2^64 (their last
// eight bytes), and a negative int64 keeps its two's-complement bits.
// Events of a KV-cache group other than 0 (hybrid models) are skipped and
// counted: only the full-attention group names reusable prefixes.
//
// Anything else is refused with an InvalidArgument naming what was wrong and
// where (event index, field): truncated or trailing bytes, an unknown event
// tag, a hash of the wrong type, a token id outside 0..2^32-1, a block size
// of 0 or past kMaxBlockTokens, sizes past the limits below.
//
//   absl::StatusOr<kvc_router::engine::DecodedEventBatch> batch =
//       kvc_router::engine::DecodeEventBatch(payload);
//   if (!batch.ok()) { log(batch.status()); return; }   // nothing applied
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_router/config.hpp"
#include "kvc_router/index/kv_event_index.hpp"
#include "kvc_router/types.hpp"

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

namespace kvc_router::engine {

// Limits on one payload: a batch is what one scheduler step changed.
inline constexpr size_t kMaxEventPayloadBytes = size_t{64} << 20;
inline constexpr size_t kMaxEventsPerBatch = size_t{1} << 20;
inline constexpr size_t kMaxArrayElements = size_t{1} << 24;

struct DecodedEventBatch {
  double timestamp = 0.0;
  // The publisher's data-parallel rank, when it said.
  std::optional<int64_t> data_parallel_rank;
  std::vector<KvEvent> events;
  // Events of KV-cache groups other than 0, skipped.
  size_t skipped_group_events = 0;
};

namespace decoder_detail {

using Object = msgpack::object;

inline const char* TypeName(const Object& o) {
  switch (o.type) {
    case msgpack::type::NIL: return "nil";
    case msgpack::type::BOOLEAN: return "bool";
    case msgpack::type::POSITIVE_INTEGER: return "int";
    case msgpack::type::NEGATIVE_INTEGER: return "negative int";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return "float";
    case msgpack::type::STR: return "str";
    case msgpack::type::BIN: return "bytes";
    case msgpack::type::ARRAY: return "array";
    case msgpack::type::MAP: return "map";
    case msgpack::type::EXT: return "ext";
  }
  return "unknown";
}

inline absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("KV event payload: ", where, ": ", what));
}

inline bool IsNil(const Object* o) { return o == nullptr || o->type == msgpack::type::NIL; }

inline std::string_view Str(const Object& o) { return {o.via.str.ptr, o.via.str.size}; }

inline absl::StatusOr<BlockHash> FoldHash(const Object& o, const std::string& where) {
  switch (o.type) {
    case msgpack::type::POSITIVE_INTEGER:
      return BlockHash{o.via.u64};
    case msgpack::type::NEGATIVE_INTEGER:
      return static_cast<BlockHash>(o.via.i64);
    case msgpack::type::BIN: {
      if (o.via.bin.size == 0) return Bad(where, "empty bytes block hash");
      BlockHash value = 0;
      for (uint32_t i = 0; i < o.via.bin.size; ++i) {
        value = (value << 8) | static_cast<uint8_t>(o.via.bin.ptr[i]);
      }
      return value;
    }
    default:
      return Bad(where, absl::StrCat("block hash is ", TypeName(o), ", expected int or bytes"));
  }
}

inline absl::StatusOr<int64_t> Int(const Object& o, const std::string& where) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<uint64_t>(INT64_MAX)) return Bad(where, "integer out of range");
    return static_cast<int64_t>(o.via.u64);
  }
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  return Bad(where, absl::StrCat("is ", TypeName(o), ", expected int"));
}

inline absl::Status Hashes(const Object& o, const std::string& where, std::vector<BlockHash>& out) {
  if (o.type != msgpack::type::ARRAY) {
    return Bad(where, absl::StrCat("block_hashes is ", TypeName(o), ", expected array"));
  }
  out.reserve(o.via.array.size);
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    absl::StatusOr<BlockHash> h = FoldHash(o.via.array.ptr[i], where);
    if (!h.ok()) return h.status();
    out.push_back(*h);
  }
  return absl::OkStatus();
}

inline absl::Status OptionalStr(const Object* o, const std::string& where, std::string& out) {
  if (IsNil(o)) return absl::OkStatus();
  if (o->type != msgpack::type::STR) {
    return Bad(where, absl::StrCat("is ", TypeName(*o), ", expected str or nil"));
  }
  out.assign(Str(*o));
  return absl::OkStatus();
}

// An event's fields by name, whichever encoding it came in. Positional
// fields follow the field order of the engines' event classes.
struct Fields {
  static constexpr size_t kMax = 10;
  const Object* at[kMax] = {};
};

inline bool IsMap(const Object& o) { return o.type == msgpack::type::MAP; }

// Fills `fields` from an array event (after its tag) or a map event, by the
// names in `names` (positional order). Unknown names and extra positions are
// ignored.
inline void Collect(const Object& event, std::span<const std::string_view> names, Fields& fields) {
  if (IsMap(event)) {
    for (uint32_t i = 0; i < event.via.map.size; ++i) {
      const auto& kv = event.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) continue;
      for (size_t f = 0; f < names.size() && f < Fields::kMax; ++f) {
        if (Str(kv.key) == names[f]) fields.at[f] = &kv.val;
      }
    }
    return;
  }
  for (uint32_t i = 1; i < event.via.array.size && i - 1 < names.size() && i - 1 < Fields::kMax;
       ++i) {
    fields.at[i - 1] = &event.via.array.ptr[i];
  }
}

inline constexpr std::string_view kStoredNames[] = {
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
    "medium",       "lora_name",         "extra_keys", "group_idx"};
inline constexpr std::string_view kRemovedNames[] = {"block_hashes", "medium", "group_idx"};

// True when the event belongs to a KV-cache group other than 0.
inline absl::StatusOr<bool> OtherGroup(const Object* group, const std::string& where) {
  if (IsNil(group)) return false;
  absl::StatusOr<int64_t> g = Int(*group, absl::StrCat(where, " group_idx"));
  if (!g.ok()) return g.status();
  return *g != 0;
}

inline absl::Status DecodeEvent(const Object& event, size_t index, DecodedEventBatch& out) {
  const std::string where = absl::StrCat("event ", index);
  std::string_view tag;
  if (event.type == msgpack::type::ARRAY) {
    if (event.via.array.size == 0 || event.via.array.ptr[0].type != msgpack::type::STR) {
      return Bad(where, "array event without a tag string first");
    }
    tag = Str(event.via.array.ptr[0]);
  } else if (IsMap(event)) {
    for (uint32_t i = 0; i < event.via.map.size; ++i) {
      const auto& kv = event.via.map.ptr[i];
      if (kv.key.type == msgpack::type::STR && Str(kv.key) == "type" &&
          kv.val.type == msgpack::type::STR) {
        tag = Str(kv.val);
      }
    }
    if (tag.empty()) return Bad(where, "map event without a \"type\" tag");
  } else {
    return Bad(where, absl::StrCat("is ", TypeName(event), ", expected a tagged array or map"));
  }

  if (tag == "BlockStored") {
    Fields f;
    Collect(event, kStoredNames, f);
    absl::StatusOr<bool> other = OtherGroup(f.at[8], where);
    if (!other.ok()) return other.status();
    if (*other) {
      ++out.skipped_group_events;
      return absl::OkStatus();
    }
    if (f.at[0] == nullptr || f.at[2] == nullptr || f.at[3] == nullptr) {
      return Bad(where, "BlockStored lacks block_hashes, token_ids or block_size");
    }
    BlockStoredEvent stored;
    if (absl::Status s = Hashes(*f.at[0], where, stored.block_hashes); !s.ok()) return s;
    if (!IsNil(f.at[1])) {
      absl::StatusOr<BlockHash> parent = FoldHash(*f.at[1], absl::StrCat(where, " parent"));
      if (!parent.ok()) return parent.status();
      stored.parent_block_hash = *parent;
    }
    const Object& tokens = *f.at[2];
    if (tokens.type != msgpack::type::ARRAY) {
      return Bad(where, absl::StrCat("token_ids is ", TypeName(tokens), ", expected array"));
    }
    stored.token_ids.reserve(tokens.via.array.size);
    for (uint32_t i = 0; i < tokens.via.array.size; ++i) {
      const Object& t = tokens.via.array.ptr[i];
      if (t.type != msgpack::type::POSITIVE_INTEGER || t.via.u64 > UINT32_MAX) {
        return Bad(where, absl::StrCat("token_ids[", i, "] is not a token id (0..2^32-1)"));
      }
      stored.token_ids.push_back(static_cast<TokenId>(t.via.u64));
    }
    absl::StatusOr<int64_t> block = Int(*f.at[3], absl::StrCat(where, " block_size"));
    if (!block.ok()) return block.status();
    if (*block <= 0 || *block > int64_t{kMaxBlockTokens}) {
      return Bad(where, absl::StrCat("block_size ", *block, " is outside 1..", kMaxBlockTokens));
    }
    stored.block_size = static_cast<uint32_t>(*block);
    if (!IsNil(f.at[4])) {
      absl::StatusOr<int64_t> lora = Int(*f.at[4], absl::StrCat(where, " lora_id"));
      if (!lora.ok()) return lora.status();
      stored.lora_id = *lora;
    }
    if (absl::Status s = OptionalStr(f.at[5], absl::StrCat(where, " medium"), stored.medium);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            OptionalStr(f.at[6], absl::StrCat(where, " lora_name"), stored.lora_name);
        !s.ok()) {
      return s;
    }
    out.events.emplace_back(std::move(stored));
    return absl::OkStatus();
  }
  if (tag == "BlockRemoved") {
    Fields f;
    Collect(event, kRemovedNames, f);
    absl::StatusOr<bool> other = OtherGroup(f.at[2], where);
    if (!other.ok()) return other.status();
    if (*other) {
      ++out.skipped_group_events;
      return absl::OkStatus();
    }
    if (f.at[0] == nullptr) return Bad(where, "BlockRemoved lacks block_hashes");
    BlockRemovedEvent removed;
    if (absl::Status s = Hashes(*f.at[0], where, removed.block_hashes); !s.ok()) return s;
    if (absl::Status s = OptionalStr(f.at[1], absl::StrCat(where, " medium"), removed.medium);
        !s.ok()) {
      return s;
    }
    out.events.emplace_back(std::move(removed));
    return absl::OkStatus();
  }
  if (tag == "AllBlocksCleared") {
    out.events.emplace_back(AllBlocksClearedEvent{});
    return absl::OkStatus();
  }
  return Bad(where, absl::StrCat("unknown event type \"", absl::string_view(tag.data(), tag.size()),
                                 "\""));
}

inline absl::StatusOr<DecodedEventBatch> DecodeRoot(const Object& root) {
  const Object* ts = nullptr;
  const Object* events = nullptr;
  const Object* rank = nullptr;
  if (root.type == msgpack::type::ARRAY) {
    if (root.via.array.size < 2) return Bad("batch", "array batch needs [ts, events, ...]");
    ts = &root.via.array.ptr[0];
    events = &root.via.array.ptr[1];
    if (root.via.array.size > 2) rank = &root.via.array.ptr[2];
  } else if (root.type == msgpack::type::MAP) {
    for (uint32_t i = 0; i < root.via.map.size; ++i) {
      const auto& kv = root.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) continue;
      const std::string_view key = Str(kv.key);
      if (key == "ts") ts = &kv.val;
      if (key == "events") events = &kv.val;
      if (key == "data_parallel_rank") rank = &kv.val;
    }
    if (ts == nullptr || events == nullptr) return Bad("batch", "map batch lacks ts or events");
  } else {
    return Bad("batch", absl::StrCat("is ", TypeName(root), ", expected an array or map"));
  }
  DecodedEventBatch out;
  if (ts->type == msgpack::type::FLOAT32 || ts->type == msgpack::type::FLOAT64) {
    out.timestamp = ts->via.f64;
  } else if (ts->type == msgpack::type::POSITIVE_INTEGER) {
    out.timestamp = static_cast<double>(ts->via.u64);
  } else {
    return Bad("batch ts", absl::StrCat("is ", TypeName(*ts), ", expected a number"));
  }
  if (events->type != msgpack::type::ARRAY) {
    return Bad("batch events", absl::StrCat("is ", TypeName(*events), ", expected array"));
  }
  if (events->via.array.size > kMaxEventsPerBatch) {
    return Bad("batch events", absl::StrCat(events->via.array.size, " events, the limit is ",
                                            kMaxEventsPerBatch));
  }
  if (!IsNil(rank)) {
    absl::StatusOr<int64_t> r = Int(*rank, "batch data_parallel_rank");
    if (!r.ok()) return r.status();
    if (*r < 0) return Bad("batch", absl::StrCat("data_parallel_rank ", *r, " is negative"));
    out.data_parallel_rank = *r;
  }
  out.events.reserve(events->via.array.size);
  for (uint32_t i = 0; i < events->via.array.size; ++i) {
    if (absl::Status s = DecodeEvent(events->via.array.ptr[i], i, out); !s.ok()) return s;
  }
  return out;
}

}  // namespace decoder_detail

// Decodes one payload (the third frame of a PUB message, or the second of a
// replay answer). Never throws.
inline absl::StatusOr<DecodedEventBatch> DecodeEventBatch(std::span<const uint8_t> payload) {
  if (payload.empty()) return decoder_detail::Bad("batch", "empty payload");
  if (payload.size() > kMaxEventPayloadBytes) {
    return decoder_detail::Bad(
        "batch", absl::StrCat(payload.size(), " bytes, the limit is ", kMaxEventPayloadBytes));
  }
  // msgpack-cxx allocates an array's or map's elements when it reads the
  // header, before the bytes that fill them: bound each count by what the
  // payload could hold (an element takes at least one byte, a map entry
  // two), so a few bytes that claim millions of elements cannot make it
  // allocate hundreds of megabytes. What stays possible is one such claim
  // per open nesting level, at most 8 (a batch nests 5 deep): about
  // 8 x 24 bytes per payload byte, all of it freed with the payload.
  const size_t bytes = payload.size();
  const msgpack::unpack_limit limit(std::min(kMaxArrayElements, bytes),
                                    std::min(kMaxArrayElements, bytes / 2),
                                    std::min<size_t>(1 << 20, bytes), std::min<size_t>(1 << 20, bytes),
                                    std::min<size_t>(1 << 20, bytes), 8);
  try {
    std::size_t offset = 0;
    msgpack::object_handle handle;
    msgpack::unpack(handle, reinterpret_cast<const char*>(payload.data()), payload.size(), offset,
                    nullptr, nullptr, limit);
    if (offset != payload.size()) {
      return decoder_detail::Bad("batch", absl::StrCat(payload.size() - offset,
                                                       " trailing bytes after the batch"));
    }
    return decoder_detail::DecodeRoot(handle.get());
  } catch (const msgpack::insufficient_bytes&) {
    return decoder_detail::Bad("batch", "truncated msgpack");
  } catch (const std::exception& e) {
    return decoder_detail::Bad("batch", absl::StrCat("malformed msgpack (", e.what(), ")"));
  }
}

}  // namespace kvc_router::engine
