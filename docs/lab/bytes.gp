set terminal pngcairo size 1000,560 font ',11'
set output 'bytes.png'
set title 'Bytes on the wire, both ways, normalized to a whole copy (cable)'
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set yrange [*:2]
set ylabel 'bytes / whole copy (log)'
set xtics rotate by -20
set key top left
set grid ytics
plot for [i=2:7] 'bytes.dat' using i:xtic(1) title columnheader(i)
