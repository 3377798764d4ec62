#!/usr/bin/env bash
# kvc_router: the main job. Builds kvc-replay and replays, under every
# registered policy (KVC v2, v1 and colocated; vanilla P/D; SGLang's P/D as
# deployed today; SGLang's cache-aware data parallelism), each on the
# topology it is defined for, on eight H100s (4P+4D or 8 colocated, profile
# h100-8b) with 32 sessions active at a time, as benchmark clients replay
# multi-turn datasets:
#   1. the claude-code preset: 1,000 synthetic coding-agent sessions shaped
#      like a public Claude Code session profile (contexts of ~50k-200k tokens);
#   2. the bundled Mooncake conversation trace (data/traces/mooncake/).
# Prints one comparison table per workload and writes JSON, CSV and a plot
# (TTFT CDF and mode shares) to build/replay/, and each run's hit-rate bound
# (docs/simulator.md, "Hit-rate bound").
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
replay=(build/release/sim/tools/kvc-replay --profile h100-8b --concurrency 32 --policies all
  --hit-bound true)

kvc_log "replay 1/2: claude-code preset (1,000 sessions, 32 at a time)"
"${replay[@]}" --synthetic --preset claude-code \
  --json "${out}/claude-code.json" --csv "${out}/claude-code.csv" --plot "${out}/claude-code.png"

kvc_log "replay 2/2: Mooncake conversation trace (data/traces/mooncake), 32 sessions at a time"
"${replay[@]}" --trace data/traces/mooncake/conversation_trace.jsonl --format mooncake \
  --json "${out}/mooncake.json" --csv "${out}/mooncake.csv" --plot "${out}/mooncake.png"

kvc_log "results: ${out}/{claude-code,mooncake}.{json,csv,png}"
