/* sim_percentile.h — the nearest-rank quantile the cluster replays report latencies with.
 *
 * Contract: sim_percentile(v, n, q) sorts v[0..n) in place (n > 0) and returns the value at rank
 * ceil(q·n) clamped to [1, n]; q in [0, 1]. Both cluster replays (fifo and batching) use it, so their
 * p50/p99 figures mean the same thing. */
#ifndef BRAID_SIM_PERCENTILE_H
#define BRAID_SIM_PERCENTILE_H

#include <math.h>
#include <stdlib.h>

static inline int sim_compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline double sim_percentile(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, sim_compare_double);
    int k = (int)ceil(q * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

#endif
