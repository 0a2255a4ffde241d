/*
 * wl_rng.h — the workload generators' seeded random numbers: splitmix64, one generator per
 * workflow (seeded from the run seed and the workflow index) or per shared text (seeded from a
 * name), so what a workflow draws never depends on how the caller interleaves workflows.
 *
 * Value type, no allocation; a WlRng belongs to one owner and is not thread-safe.
 */
#ifndef BRAID_BENCH_WORKLOADS_WL_RNG_H
#define BRAID_BENCH_WORKLOADS_WL_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t state;
} WlRng;

/* A generator for stream `stream` of run seed `seed` (e.g. the workflow index). */
WlRng wl_rng_stream(uint64_t seed, uint64_t stream);
/* A generator seeded from text, for shared content that must be identical across runs and seeds. */
WlRng wl_rng_named(const char *name);
/* A generator derived from two names: wl_rng_named(a) mixed with b. */
WlRng wl_rng_named2(const char *a, const char *b);

uint64_t wl_rng_next(WlRng *r);
/* Uniform in [0, 1). */
double wl_rng_uniform(WlRng *r);
/* Uniform integer in [lo, hi] (inclusive); lo when hi <= lo. */
int wl_rng_range(WlRng *r, int lo, int hi);
/* True with probability p. */
int wl_rng_chance(WlRng *r, double p);
/* Index in [0, n) with probability proportional to 1 / (index + 1)^s (Zipf popularity). */
int wl_rng_zipf(WlRng *r, int n, double s);
/* Index in [0, n) drawn from weights (need not sum to 1; non-negative, at least one positive). */
int wl_rng_weighted(WlRng *r, const double *weights, int n);
/* One element of a string table. */
const char *wl_rng_pick(WlRng *r, const char *const *items, int n);
/* Fisher–Yates shuffle of an int array. */
void wl_rng_shuffle(WlRng *r, int *items, int n);

#endif
