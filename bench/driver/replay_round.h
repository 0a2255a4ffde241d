/*
 * replay_round.h — one round of a `braid batch` input file against one server: C client threads,
 * each with its own connection (HttpClient), take requests from one shared queue in input order;
 * all start at one instant t0 (the clients connect first, so set-up is not timed).
 * Called by: replay.c (rounds against one server) and compare.c (rounds against each server).
 * Thread-safety: one round at a time per BatchInput (the clients add the stream fields to its
 * request bodies). Memory: results[i] is filled for entry i; the caller frees each with
 * http_result_free.
 */
#ifndef BRAID_BENCH_DRIVER_REPLAY_ROUND_H
#define BRAID_BENCH_DRIVER_REPLAY_ROUND_H

#include "batch_input.h"
#include "bench_metrics.h"
#include "common/error.h"
#include "http_client.h"

typedef struct {
    const char *url;
    int concurrency;   /* client threads */
    int max_retries;   /* 429s to wait out per request */
} ReplayTarget;

/* Runs every request of in once; *t0 gets the common start. Returns 0, or -1 with err set when
 * not every client thread could start (the results then hold what the others did). */
int replay_round_run(const BatchInput *in, const ReplayTarget *target, HttpResult *results, double *t0, BraidError *err);

/* From t0 to the last answer that came (a request that never reached the server does not count). */
double replay_round_duration(const HttpResult *results, int n, double t0);

/* samples[i] from results[i] (bench_sample_free each). Returns 0, or -1 when out of memory. */
int replay_round_samples(const HttpResult *results, int n, BenchSample *samples);

#endif
