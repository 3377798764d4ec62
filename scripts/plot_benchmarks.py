#!/usr/bin/env python3
"""Turns kvc_router_benchmarks JSON into the tables and plots of docs/performance.md.

    plot_benchmarks.py BENCHMARKS.json OUT_DIR

Reads the median aggregates, prints a Markdown table of every benchmark with the
ratio of BM_RouteNaive to BM_Route, and draws two PNGs with gnuplot (Debian's
gnuplot-nox): Route latency against |D| (one line per prefix length) and against
prefix length (one line per |D|).
"""
import json
import os
import subprocess
import sys
import tempfile


def medians(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        name = b.get("run_name", b["name"])
        out[name] = b
    return data.get("context", {}), out


def ns(b):
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
    return b["real_time"] * scale


def route_grid(results, prefix):
    grid = {}
    for name, b in results.items():
        parts = name.split("/")
        if parts[0] != prefix or len(parts) != 3:
            continue
        grid[(int(parts[1]), int(parts[2]))] = ns(b)
    return grid


def fmt_time(t):
    if t >= 1e6:
        return f"{t / 1e6:.2f} ms"
    if t >= 1e3:
        return f"{t / 1e3:.2f} µs"
    return f"{t:.0f} ns"


def plot(grid, out_dir):
    workers = sorted({d for d, _ in grid})
    blocks = sorted({n for _, n in grid})
    with tempfile.TemporaryDirectory() as tmp:
        by_workers = os.path.join(tmp, "by_workers.dat")
        with open(by_workers, "w", encoding="utf-8") as f:
            for d in workers:
                f.write(str(d) + " " + " ".join(str(grid.get((d, n), "NaN")) for n in blocks) + "\n")
        by_blocks = os.path.join(tmp, "by_blocks.dat")
        with open(by_blocks, "w", encoding="utf-8") as f:
            for n in blocks:
                f.write(str(n) + " " + " ".join(str(grid.get((d, n), "NaN")) for d in workers) + "\n")
        lines_w = ", ".join(
            f"'{by_workers}' using 1:{i + 2} with linespoints title '{n} blocks'"
            for i, n in enumerate(blocks))
        lines_b = ", ".join(
            f"'{by_blocks}' using 1:{i + 2} with linespoints title '|D| = {d}'"
            for i, d in enumerate(workers))
        script = f"""
set terminal pngcairo size 900,560 noenhanced
set logscale xy 2
set grid
set key left top
set ylabel 'Route latency, median (ns)'
set output '{os.path.join(out_dir, "route_vs_workers.png")}'
set title 'BM_Route: latency against decode workers'
set xlabel 'decode workers |D|'
plot {lines_w}
set output '{os.path.join(out_dir, "route_vs_blocks.png")}'
set title 'BM_Route: latency against prefix length'
set xlabel 'prefix length (blocks)'
plot {lines_b}
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    context, results = medians(sys.argv[1])
    os.makedirs(sys.argv[2], exist_ok=True)
    print(f"Machine: {context.get('num_cpus')} CPUs at {context.get('mhz_per_cpu')} MHz, "
          f"{context.get('date', '')}\n")
    print("| benchmark | median | items/s or bytes/s | counters |")
    print("|---|---|---|---|")
    def order(item):
        parts = item[0].split("/")
        return [parts[0]] + [int(p) if p.isdigit() else 0 for p in parts[1:]]

    for name, b in sorted(results.items(), key=order):
        rate = ""
        if "bytes_per_second" in b:
            rate = f"{b['bytes_per_second'] / 1e9:.2f} GB/s"
        elif "items_per_second" in b:
            rate = f"{b['items_per_second'] / 1e6:.1f} M/s"
        counters = ", ".join(
            f"{k}={b[k]:.1f}" for k in ("bytes_per_entry",) if k in b)
        print(f"| {name} | {fmt_time(ns(b))} | {rate} | {counters} |")
    fast = route_grid(results, "BM_Route")
    for baseline in ("BM_RouteNaive", "BM_RouteHashSet"):
        slow = route_grid(results, baseline)
        if not slow:
            continue
        blocks = sorted({n for _, n in slow})
        print(f"\n| {baseline} / BM_Route | " + " | ".join(f"{n} blocks" for n in blocks) + " |")
        print("|---|" + "---|" * len(blocks))
        for d in sorted({d for d, _ in slow}):
            row = []
            for n in blocks:
                if (d, n) in slow and (d, n) in fast:
                    row.append(f"{slow[(d, n)] / fast[(d, n)]:.0f}x")
                else:
                    row.append("")
            print(f"| D={d} | " + " | ".join(row) + " |")
    if fast:
        plot(fast, sys.argv[2])


if __name__ == "__main__":
    main()
