#!/usr/bin/env bash
# kvc_router: the concurrency sweep behind docs/policies.md. Replays both
# workloads of the main job (scripts/run.sh) under every registered policy at
# 8, 16, 32 and 64 sessions active at a time (profile h100-8b), writes one
# JSON report per point to build/sweep/, and prints markdown tables of TTFT
# p90 (seconds) / prefix hit rate per policy and concurrency.
#
#   ./scripts/sweep.sh            # all policies
#   ./scripts/sweep.sh ear,dp     # a subset
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
"./scripts/install_deps.sh" >&2
# shellcheck source=scripts/common.sh
source "./scripts/common.sh"
cd "${KVC_ROOT}"

policies="${1:-all}"
kvc_log "configure + build kvc-replay (build/release)"
kvc_configure_release >&2
cmake --build build/release --parallel "${KVC_JOBS}" --target kvc-replay >&2

out=build/sweep
mkdir -p "${out}"
replay=(build/release/sim/tools/kvc-replay --profile h100-8b --policies "${policies}" --quiet)
for c in 8 16 32 64; do
  kvc_log "claude-code and Mooncake at concurrency ${c}"
  "${replay[@]}" --synthetic --preset claude-code --concurrency "${c}" \
    --json "${out}/claude-code-${c}.json"
  "${replay[@]}" --trace data/traces/mooncake/conversation_trace.jsonl --format mooncake \
    --concurrency "${c}" --json "${out}/mooncake-${c}.json"
done

python3 - "${out}" <<'PY'
import json, sys
out = sys.argv[1]
for workload in ('claude-code', 'mooncake'):
    reports = {c: json.load(open(f'{out}/{workload}-{c}.json')) for c in (8, 16, 32, 64)}
    names = [p['name'] for p in reports[8]['policies']]
    print(f'\n| {workload} | 8 | 16 | 32 | 64 |\n|---|---|---|---|---|')
    for name in names:
        cells = []
        for c in (8, 16, 32, 64):
            p = next(p for p in reports[c]['policies'] if p['name'] == name)
            cells.append(f"{p['ttft_s']['p90']:.3g} / {p['hit_rate']:.2f}")
        print(f'| {name} | ' + ' | '.join(cells) + ' |')
PY
