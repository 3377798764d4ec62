#include "kvc_router/concepts.hpp"

#include <catch2/catch.hpp>
#include <span>

#include "kvc_router/index/estimate_index.hpp"
#include "kvc_router/index/naive_index.hpp"
#include "kvc_router/testing/scripted_transport.hpp"

namespace kvc_router {
namespace {

// A minimal index that fits: exactly the members the library calls.
struct MinimalIndex {
  size_t num_workers() const { return 1; }
  void Overlap(std::span<const BlockHash>, std::span<uint32_t> out) const { out[0] = 0; }
  void Learn(WorkerId, SessionId, std::span<const BlockHash>) {}
  void ForgetSession(WorkerId, SessionId) {}
};
struct IndexWithoutForget {
  size_t num_workers() const { return 1; }
  void Overlap(std::span<const BlockHash>, std::span<uint32_t>) const {}
  void Learn(WorkerId, SessionId, std::span<const BlockHash>) {}
};
// Overlap must be callable on a const index: routing only reads.
struct IndexWithMutatingOverlap {
  size_t num_workers() const { return 1; }
  void Overlap(std::span<const BlockHash>, std::span<uint32_t>) {}
  void Learn(WorkerId, SessionId, std::span<const BlockHash>) {}
  void ForgetSession(WorkerId, SessionId) {}
};
struct IndexReturningOverlap {
  size_t num_workers() const { return 1; }
  int Overlap(std::span<const BlockHash>, std::span<uint32_t>) const { return 0; }
  void Learn(WorkerId, SessionId, std::span<const BlockHash>) {}
  void ForgetSession(WorkerId, SessionId) {}
};

struct MinimalTransport {
  absl::StatusOr<AdmitResult> Admit(WorkerId, const AdmitQuery&) { return AdmitResult{}; }
  absl::Status RunDirect(WorkerId, const Request&) { return absl::OkStatus(); }
  absl::Status Prefill(WorkerId, const Request&) { return absl::OkStatus(); }
  absl::Status TransferKv(WorkerId, WorkerId, const Request&) { return absl::OkStatus(); }
  absl::Status Decode(WorkerId, const Request&) { return absl::OkStatus(); }
  absl::Status RunFallback(WorkerId, WorkerId, const Request&) { return absl::OkStatus(); }
};
// Admission must be able to report an RPC failure, so a bare AdmitResult is not enough.
struct TransportWithBareAdmit : MinimalTransport {
  AdmitResult Admit(WorkerId, const AdmitQuery&) { return AdmitResult{}; }
};
struct TransportWithoutFallback {
  absl::StatusOr<AdmitResult> Admit(WorkerId, const AdmitQuery&) { return AdmitResult{}; }
  absl::Status RunDirect(WorkerId, const Request&) { return absl::OkStatus(); }
  absl::Status Prefill(WorkerId, const Request&) { return absl::OkStatus(); }
  absl::Status TransferKv(WorkerId, WorkerId, const Request&) { return absl::OkStatus(); }
  absl::Status Decode(WorkerId, const Request&) { return absl::OkStatus(); }
};
struct TransportWithVoidSteps : MinimalTransport {
  void Decode(WorkerId, const Request&) {}
};

TEST_CASE("shipped indexes and test doubles satisfy the concepts", "[concepts]") {
  STATIC_REQUIRE(CacheIndex<NaiveIndex>);
  STATIC_REQUIRE(CacheIndex<EstimateIndex>);
  STATIC_REQUIRE(CacheIndex<MinimalIndex>);
  STATIC_REQUIRE(WorkerTransport<testing::ScriptedTransport>);
  STATIC_REQUIRE(WorkerTransport<MinimalTransport>);
}

TEST_CASE("types that miss a member or get a signature wrong do not", "[concepts]") {
  STATIC_REQUIRE(!CacheIndex<IndexWithoutForget>);
  STATIC_REQUIRE(!CacheIndex<IndexWithMutatingOverlap>);
  STATIC_REQUIRE(!CacheIndex<IndexReturningOverlap>);
  STATIC_REQUIRE(!CacheIndex<int>);
  STATIC_REQUIRE(!WorkerTransport<TransportWithBareAdmit>);
  STATIC_REQUIRE(!WorkerTransport<TransportWithoutFallback>);
  STATIC_REQUIRE(!WorkerTransport<TransportWithVoidSteps>);
  STATIC_REQUIRE(!WorkerTransport<NaiveIndex>);
}

}  // namespace
}  // namespace kvc_router
