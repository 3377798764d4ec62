#!/usr/bin/env bash
# kvc_router: the concurrency sweep behind docs/policies.md. Replays both
# workloads of the main job (scripts/run.sh) under every registered policy at
# 8, 16, 32 and 64 sessions active at a time (profile h100-8b), writes one
# JSON report per point to build/sweep/, prints markdown tables of TTFT p90
# (seconds) / prefix hit rate per policy and concurrency, and plots TTFT p90
# against concurrency per workload, colocated and P/D side by side
# (build/sweep/sweep_<workload>.png, the figures in docs/policies.md).
# Then the burst shape: claude-code sessions that all start at once (32, 64
# and 128 of them, each run to its end with nothing replacing it), at K_d
# 362,272 (the profile's) and 400,000 tokens, seeds 1-3; one table per K_d
# of TTFT p90 / p99 (geometric mean over the seeds) and hit rate (mean).
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
    # One data block per policy for gnuplot: concurrency, TTFT p90, hit rate.
    for topo in ('colocated', 'disaggregated'):
        with open(f'{out}/{workload}-{topo}.dat', 'w') as dat:
            for name in names:
                first = next(p for p in reports[8]['policies'] if p['name'] == name)
                if first['topology'] != topo:
                    continue
                dat.write(f'"{name}"\n')
                for c in (8, 16, 32, 64):
                    p = next(p for p in reports[c]['policies'] if p['name'] == name)
                    dat.write(f"{c} {p['ttft_s']['p90']} {p['hit_rate']}\n")
                dat.write('\n\n')
PY

if command -v gnuplot >/dev/null 2>&1; then
  for workload in claude-code mooncake; do
    gnuplot <<GP
set terminal pngcairo size 1400,560 font ",10"
set output "${out}/sweep_${workload}.png"
set multiplot layout 1,2 title "${workload}: TTFT p90 against sessions active at a time (h100-8b)"
set logscale xy
set xtics (8, 16, 32, 64)
set xrange [6:80]
set xlabel "concurrency"
set ylabel "TTFT p90 (s)"
set key outside right
set grid
set title "8 colocated instances"
plot for [i=0:*] "${out}/${workload}-colocated.dat" index i using 1:2 with linespoints title columnheader(1)
set title "4 prefill + 4 decode workers"
plot for [i=0:*] "${out}/${workload}-disaggregated.dat" index i using 1:2 with linespoints title columnheader(1)
unset multiplot
GP
    kvc_log "plot: ${out}/sweep_${workload}.png"
  done
fi

for kd in 362272 400000; do
  for n in 32 64 128; do
    kvc_log "burst: ${n} claude-code sessions started together, K_d ${kd}"
    for seed in 1 2 3; do
      "${replay[@]}" --synthetic --preset claude-code --seed "${seed}" --sessions "${n}" \
        --requests "$((n * 12))" --session-interarrival 0 --concurrency "${n}" \
        --kv-capacity "${kd}" --json "${out}/burst-${kd}-${n}-${seed}.json"
    done
  done
done

python3 - "${out}" <<'PY'
import json, math, sys
out = sys.argv[1]
def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))
for kd in (362272, 400000):
    runs = {n: [json.load(open(f'{out}/burst-{kd}-{n}-{s}.json')) for s in (1, 2, 3)]
            for n in (32, 64, 128)}
    ideal = {n: sum(r['workload']['ideal_session_hit_rate'] for r in runs[n]) / 3 for n in runs}
    print(f'\n| sessions started together, K_d {kd:,} | 32 | 64 | 128 |\n|---|---|---|---|')
    print('| ideal hit | ' + ' | '.join(f'{ideal[n]:.3f}' for n in (32, 64, 128)) + ' |')
    for name in [p['name'] for p in runs[32][0]['policies']]:
        cells = []
        for n in (32, 64, 128):
            ps = [next(p for p in r['policies'] if p['name'] == name) for r in runs[n]]
            cells.append(f"{geomean([p['ttft_s']['p90'] for p in ps]):.3g} / "
                         f"{geomean([p['ttft_s']['p99'] for p in ps]):.3g} / "
                         f"{sum(p['hit_rate'] for p in ps) / 3:.3f}")
        print(f'| {name} | ' + ' | '.join(cells) + ' |')
PY
