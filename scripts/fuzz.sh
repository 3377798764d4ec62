#!/usr/bin/env bash
# kvc_router: build the libFuzzer targets in fuzz/ with clang++ and run each
# for a bounded time (the fuzzing stage of scripts/test.sh).
#
#   ./scripts/fuzz.sh            # every target, KVC_ROUTER_FUZZ_SECONDS each
#   ./scripts/fuzz.sh dispatch   # one target
#
# Environment:
#   KVC_ROUTER_FUZZ_SECONDS=20    seconds per target (7 targets: about 2.5 minutes
#                                 of fuzzing, plus the build)
#   KVC_ROUTER_FUZZ_CXX=clang++   the clang to use
#   KVC_ROUTER_JOBS=2             build parallelism
# Seed corpora are read from fuzz/corpus/<target>/ (never written); what the
# fuzzer finds goes to build/fuzz/work/<target>/, crashes to
# build/fuzz/artifacts/. Reproduce a crash with
#   build/fuzz/fuzz/kvc_fuzz_<target> build/fuzz/artifacts/<file>
# Exits 0 with a message (and fuzzes nothing) when clang cannot build
# libFuzzer targets against this machine's libstdc++.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/common.sh
source "./scripts/common.sh"
cd "${KVC_ROOT}"

seconds="${KVC_ROUTER_FUZZ_SECONDS:-20}"
fuzz_cxx="$(kvc_resolve_cxx "${KVC_ROUTER_FUZZ_CXX:-clang++}")"
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(admission dispatch hasher kv_event policy trace event_decoder)
fi

# Probe: can this clang link a libFuzzer+ASan+UBSan binary as C++20 and
# compile one of our targets against this libstdc++?
fuzz_probe() {
  local cxx="$1" dir ok=1
  dir="$(mktemp -d)"
  cat >"${dir}/probe.cpp" <<'PROBE'
#include <cstddef>
#include <cstdint>
#include <vector>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> v(data, data + size);
  return v.size() == 12345 ? 1 : 0;
}
PROBE
  "${cxx}" -std=c++20 -fsanitize=fuzzer,address,undefined "${dir}/probe.cpp" \
    -o "${dir}/probe" >/dev/null 2>&1 || ok=0
  if [[ ${ok} -eq 1 ]]; then
    "${cxx}" -std=c++20 -fsyntax-only -Iinclude -Ifuzz fuzz/dispatch_fuzzer.cpp \
      >/dev/null 2>&1 || ok=0
  fi
  rm -rf "${dir}"
  [[ ${ok} -eq 1 ]]
}

if [[ -z "${fuzz_cxx}" ]]; then
  kvc_log "fuzz: skipped: no clang++ found (libFuzzer needs clang; apt-get install -y clang)"
  exit 0
fi
if ! fuzz_probe "${fuzz_cxx}"; then
  kvc_log "fuzz: skipped: ${fuzz_cxx} cannot build libFuzzer targets against this libstdc++"
  exit 0
fi

kvc_log "fuzz: configure + build (build/fuzz, ${fuzz_cxx})"
kvc_configure "${KVC_ROOT}/build/fuzz" "${fuzz_cxx}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVC_ROUTER_WERROR=ON \
  -DKVC_ROUTER_BUILD_FUZZERS=ON \
  -DKVC_ROUTER_BUILD_TESTS=OFF \
  -DKVC_ROUTER_BUILD_BENCHMARKS=OFF \
  -DKVC_ROUTER_BUILD_EXAMPLES=OFF \
  -DKVC_ROUTER_BUILD_SIM=ON >/dev/null
# event_decoder exists only where the engine adapters' packages are installed.
available="$(cmake --build build/fuzz --target help)"
kept=()
for t in "${targets[@]}"; do
  # Ninja lists "name: phony", Makefiles "... name".
  if grep -Eq "(^|[ .])kvc_fuzz_${t}(:|$)" <<<"${available}"; then
    kept+=("${t}")
  else
    kvc_log "fuzz: ${t} skipped: no target kvc_fuzz_${t} in this configuration"
  fi
done
targets=("${kept[@]}")
build_targets=()
for t in "${targets[@]}"; do build_targets+=("kvc_fuzz_${t}"); done
cmake --build build/fuzz --parallel "${KVC_JOBS}" --target "${build_targets[@]}"

mkdir -p build/fuzz/artifacts
for t in "${targets[@]}"; do
  mkdir -p "build/fuzz/work/${t}"
  kvc_log "fuzz: ${t} for ${seconds} s (seed corpus fuzz/corpus/${t})"
  log="build/fuzz/${t}.log"
  if ! "build/fuzz/fuzz/kvc_fuzz_${t}" -max_total_time="${seconds}" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="build/fuzz/artifacts/${t}-" \
        "build/fuzz/work/${t}" "fuzz/corpus/${t}" >"${log}" 2>&1; then
    tail -n 40 "${log}" >&2
    echo "fuzz.sh: ${t} found a failing input (build/fuzz/artifacts/${t}-*)" >&2
    exit 1
  fi
  grep -E "^Done|stat::number_of_executed_units" "${log}" >&2 || true
done
kvc_log "fuzz: ${#targets[@]} targets ran ${seconds} s each without a failure"
