/*
 * simulator.h — replays a trace through the real cache code (src/cache: block pool, radix tree,
 * eviction policies) with no model, in arrival order, one request at a time.
 *
 * Each request matches its cached prefix (block hashes stand in for tokens; never the whole
 * prompt), takes blocks for the rest of its prompt and its output (evicting per policy when
 * short), then leaves its full prompt blocks in the cache. A cost model turns computed and cached
 * tokens into modeled time. Policies: "lru", and "belady", the offline bound, which evicts the
 * leaf whose next use lies farthest in the future (known from the trace).
 *
 * Per workflow, the modeled latency is the model time on its critical path: its requests grouped
 * into stages by arrival time (a fan-out's calls arrive together), each stage as long as its
 * longest request. Tool and client time between stages is not modeled. Requests without a
 * workflow count as one-request workflows.
 */
#ifndef BRAID_SIM_SIMULATOR_H
#define BRAID_SIM_SIMULATOR_H

#include <stdint.h>

#include "common/error.h"
#include "sim/trace.h"

typedef struct {
    int kv_tokens;            /* cache capacity in tokens */
    const char *policy;       /* "lru" or "belady" */
    double prefill_s_per_token, decode_s_per_token;
} SimConfig;

typedef struct {
    char *agent;
    int requests;
    double mean_ttft_s;
} SimAgentStats;

typedef struct {
    int requests, too_large;  /* too_large: needed more blocks than the whole cache */
    uint64_t prompt_tokens, cached_tokens, evicted_blocks;
    double modeled_latency_s; /* sum over requests */
    double mean_ttft_s;
    double hit_rate;          /* cached prompt tokens / prompt tokens */
    int workflows, workflow_ends;
    double mean_workflow_latency_s;
    SimAgentStats *agents;    /* in order of first appearance */
    int n_agents;
} SimResult;

SimConfig sim_config_default(void);
/* Fills result (release it with sim_result_free, also after an error). */
int sim_run(const Trace *trace, const SimConfig *cfg, SimResult *result, BraidError *err);
void sim_result_free(SimResult *result);

#endif
