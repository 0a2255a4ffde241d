/*
 * run_driver.h — drives a workload's workflows against a live server for `braid-bench run`.
 *
 * At most `concurrency` workflows are active at once: one slot thread per active workflow takes
 * the next workflow, asks the workload for its next stage, runs the stage's calls concurrently
 * (one thread and connection each, e.g. a map-reduce fan-out), delivers the outputs and repeats
 * until the workflow ends, then POSTs /v1/workflows/{id}/end (an optional capability: after a 404
 * or 405, warned about once on stderr, no more are sent and none counts as an error). Each call first waits its delay_s
 * (tool latency), then goes to /v1/completions with prompt, max_tokens (capped when asked),
 * temperature 0 and the Braid labels workflow_id, agent, tenant and adapter (non-empty ones only:
 * the server refuses an empty label; tenant and adapter are part of its cache key; the server
 * accepts any adapter name as a label). A call that fails is recorded
 * and its output delivered as "", so one error does not stop the workflow. The workload is not
 * thread-safe: every workload call happens under one lock. The calling thread shows progress.
 * Called by: run.c. Memory: the outcome's records belong to the caller (run_records_free).
 */
#ifndef BRAID_BENCH_DRIVER_RUN_DRIVER_H
#define BRAID_BENCH_DRIVER_RUN_DRIVER_H

#include "common/error.h"
#include "prompt_trace.h"
#include "run_records.h"
#include "workload.h"

typedef struct {
    const char *url;
    int max_retries;       /* 429s to wait out per call */
    int concurrency;       /* most workflows active at once */
    int max_tokens_cap;    /* > 0: no call asks for more tokens than this (quick tests); 0: the workload's */
    bool fixed_output;     /* each call asks for its expected output length with ignore_eos (timing runs) */
    Workload *workload;    /* borrowed; used only under the driver's lock */
    PromptTrace *trace;    /* borrowed; NULL for no trace */
} RunDriverConfig;

typedef struct {
    RunRecords records;
    double wall_s;             /* from the start to the last workflow's end */
    int workflow_end_errors;   /* POST /v1/workflows/{id}/end that failed (404/405 excepted) */
    bool workflow_end_unsupported; /* the server answered 404/405 to a workflow end: none sent after that */
    int trace_errors;          /* trace lines that could not be written */
    int token_mismatches;      /* requests whose traced prompt length differs from the server's usage */
    char first_note[320];      /* the first of those problems, to show the user */
} RunOutcome;

/* Runs every workflow. Returns 0, or -1 with err set when the workload failed (the outcome then
 * holds what ran before). */
int run_driver_execute(const RunDriverConfig *cfg, RunOutcome *out, BraidError *err);

#endif
