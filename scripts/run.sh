#!/usr/bin/env bash
# kvc_router: build and run the main job (examples/minimal_gateway).
#
#   ./scripts/run.sh [args passed to minimal_gateway...]
#
# Dependency installation, CMake and build output go to stderr, so stdout
# carries only the program's own output. Uses the same build/release
# configuration as scripts/test.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
"./scripts/install_deps.sh" >&2
# shellcheck source=scripts/common.sh
source "./scripts/common.sh"
cd "${KVC_ROOT}"

kvc_log "configure + build minimal_gateway (build/release)"
# shellcheck disable=SC2119  # no extra cmake args
kvc_configure_release >&2
cmake --build build/release --parallel "${KVC_JOBS}" --target minimal_gateway >&2

kvc_log "running minimal_gateway $*"
exec build/release/examples/minimal_gateway "$@"
