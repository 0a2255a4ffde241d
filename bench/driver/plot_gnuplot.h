/*
 * plot_gnuplot.h — running gnuplot for `braid-bench plot`: whether it is installed, which PNG
 * terminal it has, quoting text into a script, and running a script (popen).
 * Called by: plot.c, plot_occupancy.c. Thread-safety: none needed (one command).
 */
#ifndef BRAID_BENCH_DRIVER_PLOT_GNUPLOT_H
#define BRAID_BENCH_DRIVER_PLOT_GNUPLOT_H

#include <stdbool.h>

#include "strbuf.h"

bool plot_gnuplot_installed(void);
/* Runs a script; true when gnuplot exited 0. quiet discards its messages. */
bool plot_gnuplot_run(const char *script, bool quiet);
/* "pngcairo" when this gnuplot has it, else "png". */
const char *plot_gnuplot_png_terminal(void);
/* text as a gnuplot single-quoted string (a quote is written twice). */
void plot_gnuplot_quote(StrBuf *s, const char *text);

#endif
