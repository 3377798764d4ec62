// kvc_sim/cost_model.hpp
//
// How long simulated work takes. Three formulas, each with constants that
// are plain fields (kvc-replay flags), documented with their sources in
// docs/simulator.md; hardware profiles (profiles.hpp) set them together:
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
// A prefill runs in chunks of `chunked_prefill_tokens` that share the GPU
// with running decodes (gpu_timeline.hpp).
//
// The defaults describe an 8B-class model (36 layers, 8 KV heads of 128,
// bf16: 147,456 bytes of KV per token) on one H100-class GPU with 200 Gb/s
// RDMA between GPUs. `LoopbackTcp()` is the KVC seed's measured transfer
// over TCP on one host: a Reseed of a 25k-40k-token context then costs 3-7 s
// (re-prefill 1.5-3 s plus transfer 1.5-4 s), as the seed reports.
//
//   kvc_router::sim::CostModel cost;   // H100, 8B model, RDMA
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
  // Prefill chunk size, tokens (SGLang's chunked_prefill_size).
  uint64_t chunked_prefill_tokens = 8192;
  // KV transfer (P -> D, or between instances): 200 Gb/s RDMA, ~22 GB/s
  // effective.
  uint64_t kv_bytes_per_token = 147456;
  double transfer_setup_s = 0.005;
  double transfer_bytes_per_s = 22e9;
  // One admission RPC round trip (router -> decode worker scheduler).
  double admit_rpc_s = 0.001;

  // The KVC seed's transfer: Mooncake's transfer engine over TCP on
  // loopback, 1.5 GB/s with 50 ms setup. A loopback figure, about 6x below
  // a real 100 Gb/s NIC.
  static CostModel LoopbackTcp() {
    CostModel model;
    model.transfer_setup_s = 0.050;
    model.transfer_bytes_per_s = 1.5e9;
    return model;
  }
  // 200 Gb/s RDMA (the default).
  static CostModel Rdma() { return CostModel{}; }

  uint32_t PrefillChunks(uint64_t new_tokens) const {
    if (new_tokens == 0) return 1;
    return static_cast<uint32_t>((new_tokens + chunked_prefill_tokens - 1) / chunked_prefill_tokens);
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
    if (chunked_prefill_tokens == 0) {
      return absl::InvalidArgumentError("CostModel.chunked_prefill_tokens must be >= 1");
    }
    if (!(transfer_bytes_per_s > 0.0) || !std::isfinite(transfer_bytes_per_s)) {
      return absl::InvalidArgumentError("CostModel.transfer_bytes_per_s must be positive");
    }
    return absl::OkStatus();
  }
};

}  // namespace kvc_router::sim
