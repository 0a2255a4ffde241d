/*
 * bench_metrics.h — per-request timings and the serving metrics every braid-bench mode reports,
 * computed and named as `vllm bench serve` does, so figures compare with other tools'.
 *
 * Per request (a BenchSample), every time counts from that request's own send: TTFT (first text
 * chunk), ITL (the gaps between consecutive text chunks), E2EL (the whole answer) and TPOT
 * ((E2EL - TTFT) / (output tokens - 1), 0 for a single token). Over a run (BenchMetrics): mean,
 * median, standard deviation and p50/p90/p99 of each; throughputs over the run's duration; and
 * goodput under an SLO: successful requests per second that meet every SLO given (TTFT, ITL as the
 * request's TPOT — vLLM's "tpot" goodput key — and E2EL), as vLLM's calculate_metrics counts it.
 * The JSON writer produces the shape of `vllm bench serve --save-result` (see the .c for the source).
 * Called by: replay.c, run_report.c, compare.c. Thread-safety: stateless; any thread.
 * Memory: a BenchSample owns its itls_s (bench_sample_free); metrics hold no pointers.
 */
#ifndef BRAID_BENCH_DRIVER_BENCH_METRICS_H
#define BRAID_BENCH_DRIVER_BENCH_METRICS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "http_client.h"

typedef struct {
    bool ok;                 /* the request succeeded */
    double ttft_s, e2el_s;   /* from the request's own send; ttft_s 0 when no text came */
    double tpot_s;           /* (e2el - ttft) / (output_tokens - 1); 0 when output_tokens <= 1 */
    int input_tokens, output_tokens, cached_tokens; /* 0 when unknown or failed */
    double *itls_s;          /* (n_itls) gaps between consecutive text chunks; owned */
    int n_itls;
    int retries, connection_retries;
    char error[200];         /* "" when ok */
} BenchSample;

/* Service level objectives, in ms; 0 for "none". Goodput is reported when any is set. */
typedef struct {
    double ttft_ms, itl_ms, e2el_ms;
} BenchSlo;

typedef struct {
    double mean, median, std, p50, p90, p99; /* ms */
} BenchDist;

typedef struct {
    int completed, failed, good;
    int retries, connection_retries;         /* 429s waited out; resends after a dead reused connection */
    double duration_s;
    long long total_input, total_output, total_cached;
    double request_throughput, output_throughput, total_token_throughput;
    bool has_goodput;
    double request_goodput;                  /* good / duration_s, when has_goodput */
    BenchDist ttft, tpot, itl, e2el;
} BenchMetrics;

/* Fills s from one finished request. Returns 0, or -1 when out of memory (s then has no ITLs). */
int bench_sample_from_result(const HttpResult *r, BenchSample *s);
void bench_sample_free(BenchSample *s);
/* Whether a successful sample meets every SLO that is set. */
bool bench_sample_meets(const BenchSample *s, const BenchSlo *slo);

/* samples: n requests of one run that lasted duration_s; slo may be NULL. */
BenchMetrics bench_metrics_compute(const BenchSample *samples, int n, double duration_s, const BenchSlo *slo);

/* Three lines "[tag] ..." on f: counts and throughputs; TTFT/ITL/E2EL mean, p50, p90, p99; goodput. */
void bench_metrics_print(FILE *f, const char *tag, const BenchMetrics *m);

/* Identity of the run for the JSON: what vLLM records besides the metrics. */
typedef struct {
    const char *backend;     /* "braid-bench" */
    const char *base_url, *model;
    int max_concurrency;
    int num_prompts;
} BenchRunInfo;

/* The run as `vllm bench serve` writes it (new reference). NULL when out of memory. */
json_t *bench_metrics_vllm_json(const BenchRunInfo *info, const BenchMetrics *m, const BenchSample *samples, int n,
                                const BenchSlo *slo);
/* Writes that JSON to path. Returns 0, or -1 with err set. */
int bench_metrics_write_vllm_json(const char *path, const BenchRunInfo *info, const BenchMetrics *m, const BenchSample *samples,
                                  int n, const BenchSlo *slo, BraidError *err);

/* Parses --slo-ttft-ms / --slo-itl-ms / --slo-e2el-ms values; see bench_args.h for the messages.
 * Returns 0, or -1 after printing what is wrong. */
int bench_slo_parse(const char *cmd, const char *flag, const char *text, BenchSlo *slo);

#endif
