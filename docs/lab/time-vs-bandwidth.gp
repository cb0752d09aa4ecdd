set terminal pngcairo size 1000,560 font ',11'
set output 'time-vs-bandwidth.png'
set title 'Time to bring project-edit up to date, by downstream bandwidth'
set logscale xy
set xlabel 'Mbit/s down'
set ylabel 'seconds (log)'
set grid
set key top right
plot for [i=2:6] 'time-vs-bandwidth.dat' using 1:i with linespoints lw 2 title columnheader(i)
