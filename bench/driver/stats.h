/*
 * stats.h — mean and percentiles of a set of samples, for the driver's summaries.
 * Stateless; any thread. The input array is not modified (percentiles sort a copy).
 */
#ifndef BRAID_BENCH_DRIVER_STATS_H
#define BRAID_BENCH_DRIVER_STATS_H

/* 0 for an empty set. */
double stats_mean(const double *x, int n);
/* The p-th percentile (p in [0, 100]) by linear interpolation between order statistics; 0 for an
 * empty set or when out of memory. */
double stats_percentile(const double *x, int n, double p);

#endif
