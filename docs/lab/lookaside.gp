set terminal pngcairo size 1000,560 font ',11'
set output 'lookaside.png'
set multiplot layout 2,2 title "The lookaside paper's Figure 5: time with a stick, relative to none"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set yrange [0:1.6]
set grid ytics
set xtics rotate by -30
set key top left
set title '100 Mb/s'
set ylabel 'time / no lookaside'
plot 'lookaside.dat' index 0 using 2:xtic(1) title 'chunks', '' index 0 using 3 title 'whole files', 1 notitle lc rgb 'black'
set title '10 Mb/s'
set ylabel ''
plot 'lookaside.dat' index 1 using 2:xtic(1) title 'chunks', '' index 1 using 3 title 'whole files', 1 notitle lc rgb 'black'
set title '1 Mb/s'
set ylabel ''
plot 'lookaside.dat' index 2 using 2:xtic(1) title 'chunks', '' index 2 using 3 title 'whole files', 1 notitle lc rgb 'black'
set title '100 kb/s'
set ylabel ''
plot 'lookaside.dat' index 3 using 2:xtic(1) title 'chunks', '' index 3 using 3 title 'whole files', 1 notitle lc rgb 'black'
unset multiplot
