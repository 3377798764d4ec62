// kvc_router/concepts.hpp
//
// The two extension points of the library, as C++20 concepts that check what
// the library calls and nothing more.
//
// `CacheIndex` is the router's picture of which KV blocks each decode worker
// holds (the seed's resident[d]). The library ships a naive reference index,
// an estimate learned from placements, and more in index/; a gateway may plug
// in its own (for example one fed by its workers' telemetry).
//
// `WorkerTransport` is the caller's I/O: the admission RPC to a decode worker
// and the steps that run a request. Route and the dispatch state machine never
// do I/O themselves ("decide, don't send"); only the blocking `Dispatch` calls
// a transport, and a transport may throw or fail without leaking router state.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvc_router/types.hpp"

namespace kvc_router {

// An index over the decode workers 0..num_workers()-1.
//  - Overlap(prefix, out): for every worker d writes into out[d] how many
//    blocks of `prefix` the index believes d holds; out.size() == num_workers().
//  - Learn(d, s, hashes): session s was placed on d and d now holds `hashes`
//    (the session's chained prefix).
//  - ForgetSession(d, s): d dropped session s (eviction, release).
template <class Index>
concept CacheIndex =
    requires(Index& index, const Index& const_index, WorkerId worker,
             SessionId session, std::span<const BlockHash> hashes,
             std::span<uint32_t> overlaps) {
      { const_index.num_workers() } -> std::convertible_to<std::size_t>;
      { const_index.Overlap(hashes, overlaps) } -> std::same_as<void>;
      index.Learn(worker, session, hashes);
      index.ForgetSession(worker, session);
    };

// A CacheIndex whose set of workers can change at runtime (elastic
// membership, RoutingState::AddDecodeWorker / RemoveDecodeWorker):
//  - ResizeWorkers(n): grow to n workers (never shrinks), keeping everything.
//  - ForgetWorker(d): drop everything d holds (it left; its slot may be reused).
template <class Index>
concept ElasticCacheIndex =
    CacheIndex<Index> && requires(Index& index, WorkerId worker, uint32_t num_workers) {
      index.ResizeWorkers(num_workers);
      index.ForgetWorker(worker);
    };

// The caller's RPC and KV-transfer backend.
//  - Admit(d, query): Algorithm 2 on decode worker d. A non-OK status means the
//    RPC got no answer; the router counts it as a `worker-unavailable` rejection.
//  - RunDirect(d, r): append-prefill and decode on d, whose KV holds the prefix.
//  - Prefill(p, r), TransferKv(p, d, r), Decode(d, r): the Seed/Reseed path.
//  - RunFallback(p, d, r): plain P/D disaggregation of r on p and d.
// Any step may return an error or throw; the router releases what it took.
template <class Transport>
concept WorkerTransport =
    requires(Transport& transport, WorkerId decode, WorkerId prefill,
             const AdmitQuery& query, const Request& request) {
      { transport.Admit(decode, query) } -> std::same_as<absl::StatusOr<AdmitResult>>;
      { transport.RunDirect(decode, request) } -> std::same_as<absl::Status>;
      { transport.Prefill(prefill, request) } -> std::same_as<absl::Status>;
      { transport.TransferKv(prefill, decode, request) } -> std::same_as<absl::Status>;
      { transport.Decode(decode, request) } -> std::same_as<absl::Status>;
      { transport.RunFallback(prefill, decode, request) } -> std::same_as<absl::Status>;
    };

}  // namespace kvc_router
