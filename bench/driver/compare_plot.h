/*
 * compare_plot.h — the chart of `braid-bench compare`: per metric, each server's ratio to the first
 * server (median over the rounds) as a bar with its min-max spread as an error bar, and a line at 1.
 * Called by: compare.c. Thread-safety: none needed (one command). Needs gnuplot on PATH.
 */
#ifndef BRAID_BENCH_DRIVER_COMPARE_PLOT_H
#define BRAID_BENCH_DRIVER_COMPARE_PLOT_H

#include "common/error.h"

typedef struct {
    double median, min, max; /* NAN when the first server's figure was 0 */
} CompareRatio;

/* ratios: (n_servers, n_metrics), server 0 (the reference) included; labels name the servers and
 * metrics. Writes a PNG to out. Returns 0, or -1 with err set. */
int compare_plot_write(const char *out, const char *title, const char *const *server_labels, int n_servers,
                       const char *const *metric_labels, int n_metrics, const CompareRatio *ratios, BraidError *err);

#endif
