#!/usr/bin/env bash
# kvc_router: the full test run (what CI runs through .ci/run).
#
#   a. release build (RelWithDebInfo, -Werror, tests+examples+benchmarks+sim+engine) + ctest
#      (every label, the engine adapters' "engine", "python" and "e2e" included)
#   b. ASan+UBSan build (Debug + -O1, -Werror) + ctest without the "packaging" label
#      (the Python publisher and loopback e2e tests then drive sanitized binaries)
#   c. TSan build of kvc_router_thread_tests, run directly; with the engine targets,
#      also kvc-gateway + kvc-worker-emulator and both loopback e2e scenarios on them
#   d. benchmark smoke run (kvc_router_benchmarks and kvc_sim_benchmarks)
#   e. fuzzing: scripts/fuzz.sh (6 libFuzzer targets, clang, 20 s each;
#      skipped with a message when clang cannot build them)
# and finally prints "N passed, 0 failed" (N = ctest tests passed in stage a).
#
# Environment:
#   KVC_ROUTER_JOBS=2             build/test parallelism
#   KVC_ROUTER_CXX=g++            compiler for stages a and b
#   KVC_ROUTER_TSAN_CXX=<c++>     force the TSan compiler (default: clang++ if it
#                                 passes a probe, else g++)
#   KVC_ROUTER_SKIP_ASAN=1        skip stage b
#   KVC_ROUTER_SKIP_TSAN=1        skip stage c
#   KVC_ROUTER_SKIP_DEPS=1        do not run scripts/install_deps.sh
#   KVC_ROUTER_SKIP_FUZZ=1        skip stage e
#   KVC_ROUTER_FUZZ_SECONDS=20    seconds per fuzz target
# Build trees: build/release, build/asan, build/tsan, build/fuzz (re-used on later runs).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
"./scripts/install_deps.sh"
# shellcheck source=scripts/common.sh
source "./scripts/common.sh"
cd "${KVC_ROOT}"

STAGE="setup"
on_exit() {
  local rc=$?
  if [[ ${rc} -ne 0 ]]; then
    echo "test.sh: FAILED during stage: ${STAGE} (exit ${rc})" >&2
  fi
}
trap on_exit EXIT

# ---------------------------------------------------------------------------
# a. release
# ---------------------------------------------------------------------------
STAGE="release build"
kvc_log "release: configure + build (build/release, ${KVC_GENERATOR}, -j${KVC_JOBS})"
# shellcheck disable=SC2119  # no extra cmake args
kvc_configure_release
cmake --build build/release --parallel "${KVC_JOBS}"

STAGE="release ctest"
kvc_log "release: ctest"
release_log="build/release/ctest-release.log"
set +e
ctest --test-dir build/release --output-on-failure -j"${KVC_JOBS}" 2>&1 | tee "${release_log}"
release_rc=${PIPESTATUS[0]}
set -e

# "100% tests passed, 0 tests failed out of 57"
summary="$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "${release_log}" | tail -n 1 || true)"
if [[ -z "${summary}" ]]; then
  echo "test.sh: could not find the ctest summary line (no tests registered?)" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
release_failed="$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"${summary}")"
release_total="$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"${summary}")"
release_passed=$((release_total - release_failed))
if [[ ${release_rc} -ne 0 || ${release_failed} -ne 0 ]]; then
  echo "test.sh: release ctest failed" >&2
  echo "${release_passed} passed, $((release_failed > 0 ? release_failed : 1)) failed"
  exit 1
fi

# Sanitizer runs use fewer property-test scenarios (default run: 10000).
export KVC_ROUTER_PROPERTY_SCENARIOS=2000

# ---------------------------------------------------------------------------
# b. ASan + UBSan
# ---------------------------------------------------------------------------
if [[ "${KVC_ROUTER_SKIP_ASAN:-0}" != "1" ]]; then
  STAGE="asan build"
  kvc_log "asan+ubsan: configure + build (build/asan)"
  # Debug keeps assert()s; -O1 keeps the sanitized tests reasonably fast.
  kvc_configure build/asan "${KVC_DEFAULT_CXX}" \
    -DCMAKE_BUILD_TYPE=Debug \
    "-DCMAKE_CXX_FLAGS_DEBUG=-g -O1" \
    -DKVC_ROUTER_SANITIZE=asan \
    -DKVC_ROUTER_WERROR=ON \
    -DKVC_ROUTER_BUILD_BENCHMARKS=OFF
  cmake --build build/asan --parallel "${KVC_JOBS}"

  STAGE="asan ctest"
  kvc_log "asan+ubsan: ctest -LE packaging"
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    ctest --test-dir build/asan --output-on-failure -j"${KVC_JOBS}" -LE packaging
else
  kvc_log "asan+ubsan: skipped (KVC_ROUTER_SKIP_ASAN=1)"
fi

# ---------------------------------------------------------------------------
# c. TSan: only kvc_router_thread_tests
# ---------------------------------------------------------------------------
# Probe: can <cxx> build the TSan target's sources as C++20 against this
# libstdc++, and link/run a TSan binary? (clang 14 + libstdc++ 12 cannot
# compile std::views pipelines, for example.)
tsan_probe() {
  local cxx="$1" dir
  dir="$(mktemp -d)"
  cat >"${dir}/probe.cpp" <<'EOF'
#include <ranges>
#include <thread>
#include <vector>
int main() {
  std::vector<int> v{1, 2, 3};
  int s = 0;
  for (int x : v | std::views::filter([](int i) { return i > 1; })) s += x;
  std::thread t([&] { s += 1; });
  t.join();
  return s == 6 ? 0 : 1;
}
EOF
  local ok=1
  "${cxx}" -std=c++20 -fsanitize=thread "${dir}/probe.cpp" -o "${dir}/probe" >/dev/null 2>&1 \
    && "${dir}/probe" >/dev/null 2>&1 || ok=0
  if [[ ${ok} -eq 1 && -f tests/thread_stress_test.cpp ]]; then
    "${cxx}" -std=c++20 -fsyntax-only -Iinclude tests/thread_stress_test.cpp >/dev/null 2>&1 || ok=0
  fi
  rm -rf "${dir}"
  [[ ${ok} -eq 1 ]]
}

if [[ "${KVC_ROUTER_SKIP_TSAN:-0}" == "1" ]]; then
  kvc_log "tsan: skipped (KVC_ROUTER_SKIP_TSAN=1)"
elif [[ ! -f tests/thread_stress_test.cpp ]]; then
  kvc_log "tsan: skipped (tests/thread_stress_test.cpp does not exist yet)"
else
  STAGE="tsan build"
  if [[ -n "${KVC_ROUTER_TSAN_CXX:-}" ]]; then
    tsan_cxx="$(kvc_resolve_cxx "${KVC_ROUTER_TSAN_CXX}")"
  elif [[ -n "$(kvc_resolve_cxx clang++)" ]] && tsan_probe "$(kvc_resolve_cxx clang++)"; then
    tsan_cxx="$(kvc_resolve_cxx clang++)"
  else
    tsan_cxx="$(kvc_resolve_cxx g++)"
  fi
  if [[ -z "${tsan_cxx}" ]]; then
    echo "test.sh: no usable compiler for the TSan build" >&2
    exit 1
  fi
  kvc_log "tsan: configure + build kvc_router_thread_tests (build/tsan, ${tsan_cxx})"
  kvc_configure build/tsan "${tsan_cxx}" \
    -DCMAKE_BUILD_TYPE=Debug \
    "-DCMAKE_CXX_FLAGS_DEBUG=-g -O1" \
    -DKVC_ROUTER_SANITIZE=tsan \
    -DKVC_ROUTER_WERROR=ON \
    -DKVC_ROUTER_BUILD_BENCHMARKS=OFF \
    -DKVC_ROUTER_BUILD_EXAMPLES=OFF
  cmake --build build/tsan --parallel "${KVC_JOBS}" --target kvc_router_thread_tests

  STAGE="tsan run"
  kvc_log "tsan: build/tsan/tests/kvc_router_thread_tests"
  tsan_log="build/tsan/thread-tests.log"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
  set +e
  build/tsan/tests/kvc_router_thread_tests 2>&1 | tee "${tsan_log}"
  tsan_rc=${PIPESTATUS[0]}
  set -e
  # TSan runtimes of GCC 12 / clang 14 abort on kernels with high mmap ASLR
  # entropy ("unexpected memory mapping"); retry once with ASLR disabled.
  tsan_prefix=()
  if [[ ${tsan_rc} -ne 0 ]] && grep -q "unexpected memory mapping" "${tsan_log}" \
     && command -v setarch >/dev/null 2>&1; then
    kvc_log "tsan: retrying with ASLR disabled (setarch -R)"
    tsan_prefix=(setarch "$(uname -m)" -R)
    set +e
    "${tsan_prefix[@]}" build/tsan/tests/kvc_router_thread_tests
    tsan_rc=$?
    set -e
  fi
  if [[ ${tsan_rc} -ne 0 ]]; then
    echo "test.sh: TSan run failed (exit ${tsan_rc})" >&2
    exit 1
  fi

  # The gateway's threads (policy lock, load-control queue, ledger, KV event
  # subscriber) under TSan, end to end; the e2e script fails on any sanitizer
  # report in the processes' logs. Debian's libzmq (the kvc scenario's KV
  # events) and libcpp-httplib are not instrumented: the calls they make
  # themselves are suppressed (engine/tests/tsan_uninstrumented.supp), ours
  # are still checked.
  if grep -q "^build kvc-gateway: phony" build/tsan/build.ninja 2>/dev/null; then
    STAGE="tsan e2e"
    cmake --build build/tsan --parallel "${KVC_JOBS}" --target kvc-gateway kvc-worker-emulator
    for scenario in ear kvc; do
      kvc_log "tsan: kvc-gateway, ${scenario} scenario end to end"
      TSAN_OPTIONS="${TSAN_OPTIONS}:suppressions=${KVC_ROOT}/engine/tests/tsan_uninstrumented.supp" \
        "${tsan_prefix[@]}" python3 engine/tests/e2e_loopback_test.py --scenario "${scenario}" \
        --emulator build/tsan/engine/tools/kvc-worker-emulator \
        --gateway build/tsan/engine/tools/kvc-gateway
    done
  fi
fi

# ---------------------------------------------------------------------------
# d. benchmark smoke run
# ---------------------------------------------------------------------------
for bench in build/release/benchmarks/kvc_router_benchmarks build/release/sim/kvc_sim_benchmarks; do
  name="$(basename "${bench}")"
  if [[ -x "${bench}" ]]; then
    STAGE="benchmark smoke (${name})"
    kvc_log "benchmarks: ${name} smoke run (--benchmark_min_time=0.001)"
    # Google Benchmark 1.7.1 takes a plain number of seconds here.
    # The bounded-memory soak (benchmarks/soak_benchmark.cpp) runs 10M
    # requests by default; the smoke run scales it down.
    if ! KVC_ROUTER_SOAK_REQUESTS=200000 "${bench}" --benchmark_min_time=0.001 \
          --benchmark_out="build/release/${name}-smoke.json" --benchmark_out_format=json \
          >"build/release/${name}-smoke.txt" 2>&1; then
      tail -n 50 "build/release/${name}-smoke.txt" >&2
      echo "test.sh: benchmark smoke run of ${name} failed" >&2
      exit 1
    fi
    echo "benchmark smoke output: build/release/${name}-smoke.{txt,json}" >&2
  else
    kvc_log "benchmarks: ${name} skipped (not built)"
  fi
done

# ---------------------------------------------------------------------------
# e. fuzzing
# ---------------------------------------------------------------------------
if [[ "${KVC_ROUTER_SKIP_FUZZ:-0}" != "1" ]]; then
  STAGE="fuzz"
  ./scripts/fuzz.sh
else
  kvc_log "fuzz: skipped (KVC_ROUTER_SKIP_FUZZ=1)"
fi

STAGE="done"
echo "${release_passed} passed, 0 failed"
