// kvc_sim/profiles.hpp
//
// Hardware profiles: one name sets a worker's KV pool K_d, the cost model and
// the host tier together, so that they describe the same machine. kvc-replay
// applies `--profile NAME` first and single flags after it, so any constant
// can still be overridden. docs/simulator.md gives every constant's source.
//
//   h100-8b          an 8B GQA model (Qwen3-8B shape) on one H100 80 GB per
//                    worker, K_d from SGLang's pool formula, 200 Gb/s RDMA;
//   h100-8b-hicache  the same with a host-memory tier per worker;
//   kvc-seed         the KVC seed's testbed: K_d = 92,104 and its transfer
//                    measured over TCP on loopback (labelled as loopback);
//   h20-ear          the EAR report's testbed: H20 96 GB, 8 x TP1, about
//                    38 GiB of KV per instance, a 30B-A3B-class MoE model.
//
//   absl::StatusOr<kvc_router::sim::HardwareProfile> p = kvc_router::sim::FindProfile("h100-8b");
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvc_sim/cost_model.hpp"
#include "kvc_sim/page_cache.hpp"

namespace kvc_router::sim {

// SGLang's KV pool size (ModelRunner.profile_max_num_token): the memory the
// static fraction leaves after the weights and other start-up allocations,
// divided by one token's KV cell (2 * layers * kv_heads * head_dim * bytes).
inline uint64_t SglangKvPoolTokens(double gpu_bytes, double mem_fraction_static,
                                   double weight_bytes, double other_bytes,
                                   uint64_t kv_bytes_per_token) {
  const double rest = gpu_bytes * mem_fraction_static - weight_bytes - other_bytes;
  if (!(rest > 0) || kv_bytes_per_token == 0) return 0;
  return static_cast<uint64_t>(std::floor(rest / static_cast<double>(kv_bytes_per_token)));
}

struct HardwareProfile {
  std::string name;
  std::string description;
  // K_d: tokens of KV per decode worker / instance (and per prefill worker).
  uint64_t kv_capacity_tokens = 0;
  CostModel cost;
  HostTierConfig host_tier;
  // How the KV link is described in reports ("rdma-200g", "tcp-loopback", ...).
  std::string link;
};

namespace profile_detail {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kMiB = 1024.0 * 1024.0;

inline HardwareProfile H100With8B() {
  HardwareProfile p;
  p.name = "h100-8b";
  p.description = "8B GQA model (Qwen3-8B: 36 layers, 8 KV heads x 128, bf16) on H100 80 GB, RDMA 200 Gb/s";
  p.cost = CostModel{};  // the defaults describe this machine
  // 81,559 MiB reported by an H100 SXM; mem_fraction_static 0.835 (SGLang's
  // default for this class at TP1); 8.19e9 bf16 parameters; 1.5 GiB for
  // CUDA graphs and activations.
  p.kv_capacity_tokens = SglangKvPoolTokens(81559 * kMiB, 0.835, 8.19e9 * 2, 1.5 * kGiB,
                                            p.cost.kv_bytes_per_token);
  p.link = "rdma-200g";
  return p;
}

inline HardwareProfile H100With8BHiCache() {
  HardwareProfile p = H100With8B();
  p.name = "h100-8b-hicache";
  p.description = "h100-8b plus a 256 GB host-memory KV tier per worker reloading at 25 GB/s";
  p.host_tier.capacity_tokens = static_cast<uint64_t>(256e9 / static_cast<double>(p.cost.kv_bytes_per_token));
  p.host_tier.reload_bytes_per_s = 25e9;
  return p;
}

inline HardwareProfile KvcSeed() {
  HardwareProfile p;
  p.name = "kvc-seed";
  p.description = "the KVC seed's testbed: K_d 92,104 (SGLang at 0.835), Mooncake over TCP loopback";
  p.cost = CostModel::LoopbackTcp();
  p.kv_capacity_tokens = 92104;
  p.link = "tcp-loopback";
  return p;
}

inline HardwareProfile H20Ear() {
  HardwareProfile p;
  p.name = "h20-ear";
  p.description = "the EAR report's testbed: H20 96 GB, 8 x TP1, ~38 GiB KV per instance, 30B-A3B-class MoE";
  CostModel& c = p.cost;
  // 98,304 bytes of KV per token (48 layers, 4 KV heads x 128, bf16): the
  // report's 33.6k tokens -> 3.3 GB.
  c.kv_bytes_per_token = 98304;
  // 3B active parameters per token at ~40% of the H20's 148 dense BF16
  // TFLOPS; attention over 48 layers x 32 query heads.
  c.prefill_per_token_s = 100e-6;
  c.prefill_attention_s = 1.3e-8;
  c.prefill_overhead_s = 0.030;
  // Decode reads the weights (~61 GB) and each token's KV at 4.0 TB/s.
  c.decode_step_base_s = 0.015;
  c.decode_step_per_request_s = 0.0001;
  c.decode_step_per_context_token_s = 98304.0 / 4.0e12;
  p.kv_capacity_tokens = static_cast<uint64_t>(38 * kGiB / 98304.0);
  p.link = "rdma-200g";
  return p;
}

}  // namespace profile_detail

inline const std::vector<HardwareProfile>& HardwareProfiles() {
  static const std::vector<HardwareProfile> kProfiles = {
      profile_detail::H100With8B(), profile_detail::H100With8BHiCache(), profile_detail::KvcSeed(),
      profile_detail::H20Ear()};
  return kProfiles;
}

inline absl::StatusOr<HardwareProfile> FindProfile(std::string_view name) {
  std::string known;
  for (const HardwareProfile& p : HardwareProfiles()) {
    if (p.name == name) return p;
    absl::StrAppend(&known, known.empty() ? "" : ", ", p.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown profile \"", std::string(name), "\" (known: ", known, ")"));
}

}  // namespace kvc_router::sim
