# plot_replay.gnuplot: draws a kvc-replay comparison (kvc-replay --plot PATH.png
# runs it on the data files sim/include/kvc_sim/report.hpp's WritePlotData
# writes). Left: TTFT CDF per policy (log time axis). Right: share of
# Direct / Seed / Reseed / Fallback per policy (of the requests served).
#
# Variables (pass with gnuplot -e "..."):
#   datadir    directory holding ttft_cdf.dat and modes.dat (written by kvc-replay)
#   outfile    PNG to write
#   policies   space-separated policy names, in the data files' order
#   plottitle  title line
#
# By hand: gnuplot -e "datadir='d'; outfile='o.png'; policies='kvc pd'; plottitle='t'" \
#              scripts/plot_replay.gnuplot
if (!exists("datadir")) datadir = "."
if (!exists("outfile")) outfile = "replay.png"
if (!exists("policies")) policies = ""
if (!exists("plottitle")) plottitle = "kvc-replay"

set terminal pngcairo size 1400,560 enhanced font "DejaVu Sans,11"
set output outfile
set multiplot layout 1,2 title plottitle font ",13" noenhanced

# --- TTFT CDF ---------------------------------------------------------------
set title "TTFT distribution"
set logscale x 10
set xlabel "time to first token (s)"
set ylabel "fraction of requests"
set yrange [0:1]
set grid xtics mxtics ytics
set key bottom right
set format x "10^{%T}"
# Distinct, print-safe line colours for up to eight policies (kvc-replay
# --policies all runs six), cycling after that.
array colours[8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"]
do for [i=1:8] { set linetype i linecolor rgb colours[i] }
set linetype cycle 8
n = words(policies)
plot for [i=1:n] datadir."/ttft_cdf.dat" index (i-1) using 1:2 with lines linewidth 2 title word(policies, i)

# --- mode shares --------------------------------------------------------------
unset logscale x
set format x "%g"
set title "how requests were served"
set xlabel ""
set ylabel "share of requests (%)"
set yrange [0:100]
set grid noxtics ytics
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.6
set key outside right top vertical
plot datadir."/modes.dat" using 2:xtic(1) title "direct" linecolor rgb "#2e7d32", \
     ''                   using 3 title "seed" linecolor rgb "#1565c0", \
     ''                   using 4 title "reseed" linecolor rgb "#ef6c00", \
     ''                   using 5 title "fallback" linecolor rgb "#c62828"

unset multiplot
