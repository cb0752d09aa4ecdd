set terminal pngcairo size 1000,560 font ',11'
set output 'time-vs-rtt.png'
set title 'Time to bring project-edit up to date over cable, by round-trip time'
set xlabel 'round trip (ms)'
set ylabel 'seconds'
set grid
set key top left
plot for [i=2:6] 'time-vs-rtt.dat' using 1:i with linespoints lw 2 title columnheader(i)
