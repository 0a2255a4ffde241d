/*
 * sim_tenants.h — replays a trace through one instance's live scheduler (worker/scheduler.h)
 * step by step, with continuous batching, to compare how tenants share the instance: first come,
 * first served against weighted fair sharing (worker/sched_fair.h, the same code `braid serve
 * --fair-share` runs), with no model.
 *
 * Requests arrive at their trace times (open loop). Each step is planned by sched_plan exactly as
 * the worker plans it (decodes, chunked prefills under --max-batch-tokens, admission; with fair
 * sharing the tenants' parts and the shared step size) and costs, in modeled time,
 *     step_s + prefill_s_per_token x prefill tokens + decode_s_per_token x decoding sequences,
 * the shape of a CPU forward: a fixed part (streaming the weights) and a part per token. Prompt
 * token ids come from the trace's "tokens" when present, else from its block hashes (so equal
 * prefixes share cached blocks as live) with a tail unique to the request. A request's weight is
 * the trace line's "weight" (default 1). The scheduler's service decay (SCHED_FAIR_HALF_LIFE_S)
 * does not run here: the replay hands the scheduler a clock that stands still, so shares are
 * cumulative over the trace. Deterministic: the same trace and config give the same figures.
 *
 * Per tenant it reports the median and p99 latency (arrival to last token) and median TTFT; for
 * the whole replay, completion tokens per modeled second from the first arrival to the last finish.
 */
#ifndef BRAID_SIM_SIM_TENANTS_H
#define BRAID_SIM_SIM_TENANTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "sim/trace.h"

typedef struct {
    int kv_tokens;               /* the instance's device cache in tokens */
    int max_batch_tokens, max_running;
    bool fair_share;
    int fair_step_tokens;        /* 0 = SCHED_FAIR_DEFAULT_STEP_TOKENS */
    double step_s, prefill_s_per_token, decode_s_per_token;
    const char *only_tenant;     /* replay only this tenant's requests (its "alone" figures); NULL = all */
} SimTenantsConfig;

typedef struct {
    char *tenant;
    int requests;
    uint64_t completion_tokens;
    double median_latency_s, p99_latency_s, median_ttft_s;
} SimTenantStats;

typedef struct {
    SimTenantStats *tenants;     /* in order of first appearance */
    int n_tenants;
    int requests, refused;       /* refused: larger than the whole cache */
    uint64_t completion_tokens, steps;
    double makespan_s, tokens_per_s;
} SimTenantsResult;

/* Defaults: 512-token steps, 64 running, and the 2-core CPU's costs (8 ms a step, 2.5 ms a prompt
 * token, 0.7 ms a decoding sequence: bench/RESULTS.md, decode parts and prefill). */
SimTenantsConfig sim_tenants_config_default(void);
/* Fills result (release it with sim_tenants_result_free, also after an error). */
int sim_tenants_run(const Trace *trace, const SimTenantsConfig *cfg, SimTenantsResult *result, BraidError *err);
/* The tenant's figures in r, or NULL. */
const SimTenantStats *sim_tenants_find(const SimTenantsResult *r, const char *tenant);
void sim_tenants_result_free(SimTenantsResult *result);

#endif
