/*
 * plot_occupancy.h — `braid-bench plot --occupancy [LABEL=]LOG... --out occ.png`: KV pool
 * occupancy over time from `--occupancy-log` files (braid serve / braid batch; JSONL samples
 * {t, instance, tier, total, free, cached, in_use}, worker/occupancy_log.h).
 * One panel per tier present (device, host): the blocks in use by running requests (in_use) and
 * the blocks used at all (in_use + cached, i.e. total - free) as step lines over seconds since the
 * input's first sample, one pair per input and instance, with the pool size as a dashed line.
 * Called by: plot.c. Data files go to the caller's temporary directory and are removed here.
 */
#ifndef BRAID_BENCH_DRIVER_PLOT_OCCUPANCY_H
#define BRAID_BENCH_DRIVER_PLOT_OCCUPANCY_H

#include "common/error.h"

/* Draws paths[0..n) (legend labels[0..n)) into out. 0, or -1 with err set. */
int plot_occupancy_draw(char *const *paths, char *const *labels, int n, const char *out, const char *title, const char *tmp,
                        BraidError *err);

#endif
