#!/usr/bin/env bash
# Install kvc_router's build/test dependencies on Debian 12 (bookworm).
#
# Idempotent: packages are checked with dpkg-query first; apt-get update and
# apt-get install run only when something is missing, and only for what is
# missing. Works as root, or as a normal user with sudo.
#
# Environment:
#   KVC_ROUTER_SKIP_DEPS=1   do nothing (e.g. on a non-Debian dev machine with
#                            the dependencies installed by other means)
set -euo pipefail

PACKAGES=(
  build-essential   # gcc/g++ 12, make, libc6-dev
  cmake
  ninja-build
  pkg-config
  libabsl-dev       # Abseil 20220623 (CMake package "absl")
  libxxhash-dev     # xxhash.h, used header-only (XXH_INLINE_ALL)
  catch2            # Catch2 2.13 (CMake package "Catch2", <catch2/catch.hpp>)
  libbenchmark-dev  # Google Benchmark 1.7.1 (CMake package "benchmark")
  nlohmann-json3-dev  # simulator only: JSON traces and reports (nlohmann_json 3.11.2)
  libcli11-dev      # simulator only: kvc-replay's flags (CLI11 2.1.2)
  python3
  gnuplot-nox
  clang             # test.sh: libFuzzer targets (fuzz/, scripts/fuzz.sh) and the TSan build
  libclang-rt-14-dev  # clang 14's libFuzzer and sanitizer runtimes
  # engine adapters (engine/, docs/integration.md): KV events, HTTP, tests
  libmsgpack-cxx-dev  # msgpack-cxx 4.1: vLLM/SGLang KV-event payloads
  cppzmq-dev          # cppzmq 4.9 (zmq.hpp): KV-event SUB/replay sockets
  libzmq3-dev         # libzmq 4.3
  libcpp-httplib-dev  # cpp-httplib 0.11: HTTP worker transport, emulator, gateway
  python3-zmq         # Python publisher tests in vLLM's wire format
  python3-msgpack
)

log() { printf 'install_deps: %s\n' "$*" >&2; }

if [[ "${KVC_ROUTER_SKIP_DEPS:-0}" == "1" ]]; then
  log "KVC_ROUTER_SKIP_DEPS=1, skipping dependency installation"
  exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
  log "dpkg-query not found: not a Debian-based system; install these yourself:"
  log "  ${PACKAGES[*]}"
  log "(set KVC_ROUTER_SKIP_DEPS=1 to silence this)"
  exit 0
fi

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! is_installed "${pkg}"; then
    missing+=("${pkg}")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  log "all ${#PACKAGES[@]} required packages are already installed"
  exit 0
fi

log "missing packages: ${missing[*]}"

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    log "ERROR: not running as root and sudo is not available."
    log "Run as root: apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
    exit 1
  fi
fi

# `sudo` may reset the environment, so pass DEBIAN_FRONTEND through env(1).
APT=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)

"${APT[@]}" update
"${APT[@]}" install -y --no-install-recommends "${missing[@]}"

# Verify.
still_missing=()
for pkg in "${missing[@]}"; do
  if ! is_installed "${pkg}"; then
    still_missing+=("${pkg}")
  fi
done
if [[ ${#still_missing[@]} -ne 0 ]]; then
  log "ERROR: failed to install: ${still_missing[*]}"
  exit 1
fi
log "installed: ${missing[*]}"
