#!/usr/bin/env bash
# kvc_router: the full benchmark suite with repetitions, its JSON, and the
# plots of docs/performance.md.
#
#   ./scripts/bench.sh [extra Google Benchmark flags...]
#
# Writes build/bench/benchmarks.json (medians of 5 repetitions) and
# docs/img/route_vs_workers.png, docs/img/route_vs_blocks.png.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
"./scripts/install_deps.sh" >&2
# shellcheck source=scripts/common.sh
source "./scripts/common.sh"
cd "${KVC_ROOT}"

kvc_configure_release >&2
cmake --build build/release --parallel "${KVC_JOBS}" --target kvc_router_benchmarks >&2
mkdir -p build/bench
build/release/benchmarks/kvc_router_benchmarks \
  --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.2 \
  --benchmark_out=build/bench/benchmarks.json --benchmark_out_format=json "$@"
python3 scripts/plot_benchmarks.py build/bench/benchmarks.json docs/img
