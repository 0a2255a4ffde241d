/*
 * run_records.h — what `braid-bench run` measured: one record per request and per workflow, plus
 * the running totals the progress line shows.
 *
 * Owns: the record arrays (grown on append). Times are seconds from the start of the run
 * (t_*_s) or milliseconds from the request's send (ttft_ms, latency_ms).
 * Called by: run_driver.c (appends, under its lock) and run_report.c (reads after the run).
 * Thread-safety: none; the caller serializes appends.
 */
#ifndef BRAID_BENCH_DRIVER_RUN_RECORDS_H
#define BRAID_BENCH_DRIVER_RUN_RECORDS_H

#include <stdbool.h>

#include "bench_metrics.h"

typedef struct {
    char workflow[64], agent[32];
    double t_send_s;
    double ttft_ms;            /* meaningful only when has_ttft (a 200 that streamed some text) */
    bool has_ttft;
    double latency_ms;
    int prompt_tokens, cached_tokens, completion_tokens;
    int status;                /* HTTP status; 0 when the server never answered */
    int retries;               /* 429s waited out */
    int connection_retries;    /* resends after a dead reused connection */
    char error[200];           /* "" for a successful request */
    BenchSample timing;        /* the request's own timings (TTFT, ITLs, E2EL, TPOT); its ITLs are owned */
} RequestRecord;

typedef struct {
    char workflow[64];
    double t_start_s, t_end_s; /* picked up by a slot; last output delivered */
    int requests, errors;
} WorkflowRecord;

typedef struct {
    RequestRecord *requests;
    int n_requests, cap_requests;
    WorkflowRecord *workflows;
    int n_workflows, cap_workflows;
    int errors;                             /* failed requests */
    long long prompt_tokens, cached_tokens; /* over successful requests */
} RunRecords;

/* Return 0, or -1 when out of memory (the record is then lost). A request record's timing.itls_s
 * passes to r (freed by run_records_free, or at once when the record is lost). */
int run_records_add_request(RunRecords *r, const RequestRecord *rec);
int run_records_add_workflow(RunRecords *r, const WorkflowRecord *rec);
void run_records_free(RunRecords *r);

#endif
