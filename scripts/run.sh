#!/usr/bin/env bash
# kvc_router: the main job. Builds kvc-replay and replays, under every
# routing policy (KVC v2 and v1, vanilla P/D, SGLang-style cache-aware DP,
# colocated KVC):
#   1. the built-in synthetic agentic workload (52 sessions, ~4,450 requests);
#   2. the bundled Mooncake conversation trace.
# Prints one comparison table per workload and writes JSON, CSV and a plot
# (TTFT CDF and mode shares) to build/replay/.
#
#   ./scripts/run.sh
#
# Dependency installation, CMake and build output go to stderr, so stdout
# carries only the tables. Uses the same build/release configuration as
# scripts/test.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
"./scripts/install_deps.sh" >&2
# shellcheck source=scripts/common.sh
source "./scripts/common.sh"
cd "${KVC_ROOT}"

kvc_log "configure + build kvc-replay (build/release)"
kvc_configure_release >&2
cmake --build build/release --parallel "${KVC_JOBS}" --target kvc-replay >&2

out=build/replay
mkdir -p "${out}"
policies=kvc,kvc-v1,pd,dp,kvc-colo

kvc_log "replay 1/2: synthetic agentic workload"
build/release/tools/kvc-replay --synthetic --policies "${policies}" \
  --json "${out}/synthetic.json" --csv "${out}/synthetic.csv" --plot "${out}/synthetic.png"

kvc_log "replay 2/2: Mooncake conversation trace (data/traces/mooncake)"
build/release/tools/kvc-replay \
  --trace data/traces/mooncake/conversation_trace.jsonl --format mooncake \
  --prefill-workers 4 --decode-workers 4 --transfer rdma --kv-capacity 200000 \
  --policies "${policies}" \
  --json "${out}/mooncake.json" --csv "${out}/mooncake.csv" --plot "${out}/mooncake.png"

kvc_log "results: ${out}/{synthetic,mooncake}.{json,csv,png}"
