/*
 * run_report.h — the outputs of `braid-bench run` after the workflows have finished.
 *
 * Writes into the run directory:
 *   requests.jsonl   one line per request, in send order: workflow, agent, t_send_s (from the
 *                    start), ttft_ms and latency_ms (from the send; ttft_ms null when no text came),
 *                    prompt_tokens, cached_tokens, completion_tokens, status, retries (+ error);
 *   workflows.jsonl  one line per workflow: workflow, t_start_s, t_end_s, latency_s, requests, errors;
 *   summary.json     the figures of the summary table, plus the run's parameters;
 * and prints the summary table on stderr: workflows, requests, errors, mean end-to-end workflow
 * latency, mean TTFT per agent, token-level hit rate (cached / prompt tokens of successful
 * requests), generated tok/s and req/s over the wall time, wall time; and the per-request timings
 * from each request's own send (TTFT, TPOT, ITL, E2EL: mean and p50/p90/p99) with goodput under
 * the SLOs given (bench_metrics.h), which also go into summary.json ("metrics"); result_json, when
 * set, gets the run in `vllm bench serve`'s JSON shape.
 * Called by: run.c. Thread-safety: none needed (after the run).
 */
#ifndef BRAID_BENCH_DRIVER_RUN_REPORT_H
#define BRAID_BENCH_DRIVER_RUN_REPORT_H

#include "bench_metrics.h"
#include "common/error.h"
#include "run_driver.h"
#include "workload.h"

typedef struct {
    const char *workload, *url, *model, *dir;
    WorkloadParams params;
    int concurrency, block_size, max_tokens_cap;
    BenchSlo slo;              /* goodput SLOs; zeros for none */
    const char *result_json;   /* NULL for none */
} RunReportContext;

/* Sorts the outcome's request records by send time. Returns 0, or -1 with err set naming the file
 * that could not be written. */
int run_report_write(const RunReportContext *ctx, RunOutcome *outcome, BraidError *err);

/* The summary table, on stderr. */
void run_report_print(const RunReportContext *ctx, const RunOutcome *outcome);

#endif
