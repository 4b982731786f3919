# busbw against message size on simulated hosts: each of our algorithms, Gloo and PyTorch gloo.
# bench/cluster_summary.py writes the data (one column per line, NaN where one did not run);
# bench/compare_cluster.sh runs:
# gnuplot -e "datafile='2x2-1gbit.dat'; outfile='2x2-1gbit.svg'; heading='2 hosts x 2 ranks, 1gbit'" bench/plot_cluster.gp
set terminal svg size 820,500 dynamic noenhanced font "sans,12" background rgb "white"
set output outfile
set title sprintf("All-reduce bus bandwidth across simulated hosts, float32 sum: %s", heading)
set xlabel "message size (bytes)"
set ylabel "busbw (GB/s)"
set logscale x 2
set logscale y 10
set format x "%.0b%B"
set key top left
set grid
set datafile missing "NaN"
stats datafile skip 1 nooutput
plot for [c=2:STATS_columns] datafile using 1:c with linespoints lw 2 title columnheader(c)
