/*
 * plot_data.h — the series `braid-bench plot` draws, read from one run directory.
 *
 * hit rate over time: from DIR/requests.jsonl, successful requests taken in completion order
 *   (t_send_s + latency_ms), the cumulative token-level hit rate (sum cached / sum prompt tokens, %)
 *   at each completion, in seconds from the start of the run;
 * latency CDF: the sorted end-to-end latencies (s) with their cumulative fractions, per workflow
 *   from DIR/workflows.jsonl, or per request (latency_ms of successful requests) when asked or when
 *   the directory has no workflows.jsonl.
 * A `braid sim --timeline` file instead of a directory gives both series from its request rows, in
 * trace order: the cumulative hit rate at each request's arrival time t (the trace's clock), and
 * the CDF of the requests' modeled latency_s.
 * Called by: plot.c. Thread-safety: none needed. Memory: plot_series_free releases a series.
 */
#ifndef BRAID_BENCH_DRIVER_PLOT_DATA_H
#define BRAID_BENCH_DRIVER_PLOT_DATA_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

#include "common/error.h"

typedef struct {
    double *x, *y;
    int n;
} PlotSeries;

int plot_read_hit_rate(const char *dir, PlotSeries *out, BraidError *err);
/* *per_request tells which latencies were used; want_per_request asks for request latencies. */
int plot_read_latency_cdf(const char *dir, bool want_per_request, PlotSeries *out, bool *per_request, BraidError *err);
/* Both series from a braid sim --timeline file. Returns 0, or -1 with err set. */
int plot_read_timeline(const char *path, PlotSeries *hit, PlotSeries *cdf, BraidError *err);
/* Calls on_line for each JSON object line of path (blank lines skipped); on_line returns nonzero
 * when out of memory. Returns 0, or -1 with err set (unreadable file, a line that is no object). */
int plot_for_each_json_line(const char *path, int (*on_line)(const json_t *o, void *ctx), void *ctx, BraidError *err);
/* "x y" lines. Returns 0 or -1. */
int plot_series_write(const PlotSeries *s, FILE *f);
void plot_series_free(PlotSeries *s);

#endif
