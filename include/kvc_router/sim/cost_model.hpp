// kvc_router/sim/cost_model.hpp
//
// How long simulated work takes. Three formulas, each with constants that
// are plain fields (kvc-replay flags), documented with their sources in
// docs/simulator.md:
//
//   prefill(n new tokens after c cached ones)
//       = prefill_overhead_s + prefill_per_token_s * n
//         + prefill_attention_s * n * (c + n / 2)
//     (each new token attends to the cached context and, on average, to
//     half of the new tokens: the quadratic attention term);
//   decode step (batch B, total context C tokens)
//       = decode_step_base_s + decode_step_per_request_s * B
//         + decode_step_per_context_token_s * C;
//   KV transfer of t tokens
//       = transfer_setup_s + t * kv_bytes_per_token / transfer_bytes_per_s.
//
// The defaults describe an 8B-class model (36 layers, 8 KV heads of 128,
// bf16: 147,456 bytes of KV per token) on one H100-class GPU, chosen so that
// the seed's reported regime comes out: a Reseed of a 25k-40k-token context
// costs 3-7 s over TCP (re-prefill 1.5-3 s plus transfer 1.5-4 s), and the
// transfer drops to ~0.2 s over 200 Gb/s RDMA (`Rdma()`).
//
//   kvc_router::sim::CostModel cost = kvc_router::sim::CostModel::Tcp();
//   double seconds = cost.PrefillSeconds(/*new_tokens=*/30000, /*cached_tokens=*/0);
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvc_router::sim {

struct CostModel {
  // Prefill.
  double prefill_overhead_s = 0.020;
  double prefill_per_token_s = 40e-6;
  double prefill_attention_s = 1.5e-9;
  // Decode.
  double decode_step_base_s = 0.007;
  double decode_step_per_request_s = 0.0001;
  double decode_step_per_context_token_s = 4.4e-8;
  // KV transfer (P -> D, or between instances).
  uint64_t kv_bytes_per_token = 147456;
  double transfer_setup_s = 0.050;
  double transfer_bytes_per_s = 1.5e9;
  // One admission RPC round trip (router -> decode worker scheduler).
  double admit_rpc_s = 0.001;

  // Mooncake transfer engine over TCP (the seed's evaluation setting).
  static CostModel Tcp() { return CostModel{}; }
  // 200 Gb/s RDMA (the seed's mlx5 NICs), ~22 GB/s effective.
  static CostModel Rdma() {
    CostModel model;
    model.transfer_setup_s = 0.005;
    model.transfer_bytes_per_s = 22e9;
    return model;
  }

  double PrefillSeconds(uint64_t new_tokens, uint64_t cached_tokens) const {
    const double n = static_cast<double>(new_tokens);
    const double c = static_cast<double>(cached_tokens);
    return prefill_overhead_s + prefill_per_token_s * n + prefill_attention_s * n * (c + n / 2);
  }
  double DecodeStepSeconds(uint64_t batch, uint64_t context_tokens) const {
    return decode_step_base_s + decode_step_per_request_s * static_cast<double>(batch) +
           decode_step_per_context_token_s * static_cast<double>(context_tokens);
  }
  double TransferSeconds(uint64_t tokens) const {
    return transfer_setup_s +
           static_cast<double>(tokens) * static_cast<double>(kv_bytes_per_token) /
               transfer_bytes_per_s;
  }

  absl::Status Validate() const {
    const double fields[] = {prefill_overhead_s,       prefill_per_token_s,
                             prefill_attention_s,      decode_step_base_s,
                             decode_step_per_request_s, decode_step_per_context_token_s,
                             transfer_setup_s,         admit_rpc_s};
    for (double v : fields) {
      if (!(v >= 0.0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError("CostModel: every time constant must be finite and >= 0");
      }
    }
    if (!(transfer_bytes_per_s > 0.0) || !std::isfinite(transfer_bytes_per_s)) {
      return absl::InvalidArgumentError("CostModel.transfer_bytes_per_s must be positive");
    }
    return absl::OkStatus();
  }
};

}  // namespace kvc_router::sim
