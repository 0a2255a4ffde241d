/*
 * plot.h — `braid-bench plot [LABEL=]INPUT... --out chart.png`: one PNG comparing several inputs —
 * `braid-bench run` directories and `braid sim --timeline` files, mixed as given: the cumulative
 * token-level cache hit rate over time, and the CDF of end-to-end latency (per workflow, or per
 * request; modeled for a timeline), one line per input labelled LABEL or with its name.
 * With --occupancy the inputs are pool-occupancy logs instead, drawn per tier (plot_occupancy.h).
 * Drawn by gnuplot (popen), with the pngcairo terminal when it exists, else png; a missing gnuplot
 * is reported clearly. Intermediate data files live in a temporary directory removed afterwards.
 * Called by: bench_main.c. Returns the exit status (0, 1 runtime failure, 2 usage error).
 */
#ifndef BRAID_BENCH_DRIVER_PLOT_H
#define BRAID_BENCH_DRIVER_PLOT_H

int plot_main(int argc, char **argv);

#endif
