// Fuzz target: sequences of AdmissionController calls (Algorithm 2's
// bookkeeping) with arbitrary configurations and queries. Invariants after
// every call: an invalid configuration is refused; a refused call changes
// nothing; the pool never holds more than K_d and an admission never leaves
// it above rho*K_d (no silent overload); used tokens equal the sum of the
// resident sessions' tokens; a session with running requests is never
// evicted.
#include <cstdint>
#include <cstring>
#include <map>

#include "fuzz_input.hpp"
#include "kvc_router/admit.hpp"

namespace {

using kvc_router::AdmissionConfig;
using kvc_router::AdmissionController;

double HighWater(kvc_fuzz::FuzzInput& in) {
  switch (in.U8() % 4) {
    case 0: {
      uint64_t bits = in.U64();
      double value;
      std::memcpy(&value, &bits, sizeof(value));
      return value;  // NaN, infinities, negatives, subnormals...
    }
    case 1:
      return 1.0;
    default:
      return (1 + in.U8() % 100) / 100.0;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvc_fuzz::FuzzInput in(data, size);
  AdmissionConfig config;
  config.capacity_tokens = in.U8() % 4 == 0 ? in.U64() : in.U16();
  config.high_water = HighWater(in);
  config.max_direct_append_tokens = in.Tokens();
  config.accounting = in.U8() % 2 == 0 ? kvc_router::CapacityAccounting::kConservative
                                       : kvc_router::CapacityAccounting::kIncremental;
  auto created = AdmissionController::Create(config);
  FUZZ_CHECK(created.ok() == config.Validate().ok());
  if (!created.ok()) return 0;
  AdmissionController& admission = *created;
  FUZZ_CHECK(admission.budget_tokens() <= config.capacity_tokens);
  std::map<kvc_router::SessionId, uint32_t> running;  // the model: running requests
  while (!in.empty()) {
    const uint64_t used_before = admission.used_tokens();
    const size_t sessions_before = admission.num_sessions();
    const kvc_router::SessionId session = in.U8() % 8;
    switch (in.U8() % 6) {
      case 0:
      case 1: {
        kvc_router::AdmitQuery query{session, in.U8() % 3u, in.Tokens(), in.Tokens()};
        auto result = admission.Admit(query);
        if (!result.ok()) {
          FUZZ_CHECK(query.input_tokens < query.append_tokens);
          FUZZ_CHECK(admission.used_tokens() == used_before);
          FUZZ_CHECK(admission.num_sessions() == sessions_before);
          break;
        }
        if (result->admitted) {
          FUZZ_CHECK(admission.used_tokens() <= admission.budget_tokens());
          FUZZ_CHECK(result->mode != kvc_router::DecisionMode::kFallback);
          ++running[session];
        } else {
          FUZZ_CHECK(result->reason != kvc_router::RejectReason::kNone);
          FUZZ_CHECK(admission.used_tokens() == used_before);
        }
        break;
      }
      case 2: {
        const auto status = admission.OnRequestFinished(session);
        FUZZ_CHECK(status.ok() == (running[session] > 0));
        if (status.ok()) --running[session];
        break;
      }
      case 3: {
        const auto status = admission.AddTokens(session, in.Tokens());
        if (!status.ok()) FUZZ_CHECK(admission.used_tokens() == used_before);
        break;
      }
      case 4: {
        const auto status = admission.ReleaseSession(session);
        FUZZ_CHECK(status.ok() == (sessions_before > admission.num_sessions()));
        if (status.ok()) running.erase(session);
        break;
      }
      default: {
        for (kvc_router::SessionId evicted : admission.EvictLeastRecentlyUsed(in.Tokens())) {
          FUZZ_CHECK(running[evicted] == 0);
          FUZZ_CHECK(!admission.IsResident(evicted));
        }
        break;
      }
    }
    FUZZ_CHECK(admission.used_tokens() <= config.capacity_tokens);
    uint64_t sum = 0;
    for (kvc_router::SessionId s = 0; s < 8; ++s) sum += admission.resident_tokens(s);
    FUZZ_CHECK(sum == admission.used_tokens());
    uint64_t busy = 0;  // tokens of sessions with a running request
    for (const auto& [s, n] : running) {
      if (n > 0) FUZZ_CHECK(admission.IsResident(s));
      if (n > 0) busy += admission.resident_tokens(s);
    }
    const uint64_t budget = admission.budget_tokens();
    FUZZ_CHECK(admission.room_tokens() == (busy >= budget ? 0 : budget - busy));
  }
  return 0;
}
