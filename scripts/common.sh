# shellcheck shell=bash disable=SC2034
# Shared helpers for scripts/test.sh and scripts/run.sh. Source, don't execute.
#
# Environment overrides:
#   KVC_ROUTER_JOBS  build/test parallelism (default 2)
#   KVC_ROUTER_CXX   C++ compiler for the release and ASan builds (default g++)

KVC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KVC_JOBS="${KVC_ROUTER_JOBS:-2}"

if command -v ninja >/dev/null 2>&1; then
  KVC_GENERATOR="Ninja"
else
  KVC_GENERATOR="Unix Makefiles"
fi

kvc_log() { printf '\n==> %s\n' "$*" >&2; }

# kvc_resolve_cxx <name-or-path>: absolute path of a compiler, or empty.
kvc_resolve_cxx() {
  local p
  p="$(command -v "$1" 2>/dev/null || true)"
  printf '%s' "${p}"
}

KVC_DEFAULT_CXX="$(kvc_resolve_cxx "${KVC_ROUTER_CXX:-g++}")"
if [[ -z "${KVC_DEFAULT_CXX}" ]]; then
  echo "error: C++ compiler '${KVC_ROUTER_CXX:-g++}' not found" >&2
  exit 1
fi

# kvc_configure <build-dir> <cxx-path> [cmake args...]
# Configures (or re-configures) <build-dir>. A build dir created with another
# generator or compiler is wiped first, so re-running never trips over a stale
# CMakeCache.txt.
kvc_configure() {
  local dir="$1" cxx="$2"
  shift 2
  local cache="${dir}/CMakeCache.txt"
  if [[ -f "${cache}" ]]; then
    local cached_gen cached_cxx
    cached_gen="$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "${cache}")"
    cached_cxx="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "${cache}")"
    if [[ "${cached_gen}" != "${KVC_GENERATOR}" || "${cached_cxx}" != "${cxx}" ]]; then
      kvc_log "wiping ${dir} (was: '${cached_gen}' / '${cached_cxx}')"
      rm -rf "${dir}"
    fi
  fi
  cmake -S "${KVC_ROOT}" -B "${dir}" -G "${KVC_GENERATOR}" \
    -DCMAKE_CXX_COMPILER="${cxx}" "$@"
}

# The release configuration shared by test.sh and run.sh (same flags, so the
# two scripts never force each other to reconfigure).
kvc_configure_release() {
  kvc_configure "${KVC_ROOT}/build/release" "${KVC_DEFAULT_CXX}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKVC_ROUTER_WERROR=ON \
    "$@"
}
