# busbw against message size for tinyddp (shm, tcp) and the peers, one line each.
# gnuplot -e "datafile='plot_w2.dat'; outfile='busbw.svg'; world=2" bench/plot_allreduce.gp
set terminal svg size 900,540 dynamic font "sans,12" background rgb "white"
set output outfile
set title sprintf("All-reduce bus bandwidth, float32 sum, %d ranks on one host", world)
set xlabel "message size (bytes)"
set ylabel "busbw (GB/s)"
set logscale x 2
set logscale y 10
set format x "%.0b%B"
set key top left
set grid
set datafile missing "NaN"
plot datafile using 1:2 with linespoints lw 2 title "tinyddp shm", \
     datafile using 1:3 with linespoints lw 2 title "tinyddp tcp", \
     datafile using 1:4 with linespoints title "Open MPI (shm)", \
     datafile using 1:5 with linespoints title "Gloo (tcp)", \
     datafile using 1:6 with linespoints title "PyTorch gloo"
