/*
 * workload.h — seeded generators of agentic workflows (bench/workloads/README.md describes each).
 *
 * A workload is a set of workflows. Each workflow advances in stages: workload_next_stage() gives
 * the agent calls of the next stage (one call for a sequential step, N for a map-reduce fan-out),
 * the caller runs them (live through the HTTP API, or dry with synthetic outputs), then hands the
 * outputs back with workload_deliver(); the workflow appends them (and any tool output) to its
 * history and picks its next stage. Branching depends on hidden per-workflow state that the prompt
 * text reveals (task difficulty, tester reports), so a predictor reading the prompts can beat one
 * that only counts transitions, but not perfectly.
 *
 * An agent call's prompt = the agent's shared system prompt and tool descriptions (global, shared
 * across workflows) + the workflow's accumulated history (private) + the agent's instruction; a
 * request that continues an agent's turn (a tool result handed back, an agent loop's next step)
 * starts with the previous request's whole prompt and output instead.
 *
 * Deterministic: the same name, params and delivered outputs give the same calls. Workflows are
 * independent; the caller may advance them in any interleaving. Not thread-safe: one caller thread
 * (or the caller's lock) per Workload.
 */
#ifndef BRAID_BENCH_WORKLOADS_WORKLOAD_H
#define BRAID_BENCH_WORKLOADS_WORKLOAD_H

#include <stdint.h>

#include "common/error.h"

typedef struct Workload Workload;

typedef struct {
    int n_workflows;
    uint64_t seed;
    int context_tokens;  /* react-lora / mapreduce-lora: shared static context size (approx. tokens; 0 = 4096) */
    int fanout;          /* mapreduce-lora: map agents per workflow (0 = 4) */
    double scale;        /* multiplies prompt-part and output sizes, context_tokens included (1.0 = the
                          * defaults, also when 0; small values for tests) */
    int noise_free;      /* 1: codegen and factcheck without their noise — every difficulty label true, no
                          * flaky test, no double-check, no give-up — so the agent sequence follows the
                          * state the prompts state; 0 (default): with it. The same random draws are
                          * made either way: a noise-free workflow is its noisy twin with the noisy
                          * branches not taken. The other workloads have no such noise. */
} WorkloadParams;

typedef struct {
    char workflow[64];   /* workflow id, unique within the workload */
    char agent[32];
    char tenant[32];     /* "" when the workload has one tenant */
    char adapter[32];    /* "" for the base model; LoRA workloads name one per agent */
    char *prompt;        /* owned by the workload; valid until the next call for this workflow */
    int max_tokens;
    double delay_s;      /* tool latency to wait before sending this call */
    int expected_output_tokens; /* realistic output length, for dry runs with synthetic outputs */
} AgentCall;

/* Names of the workloads, NULL-terminated: codegen, factcheck, pipeline, react-lora,
 * mapreduce-lora, edit-replay, cross-tenant, templates. */
const char *const *workload_names(void);
/* A one-line description of a workload for help texts; NULL for an unknown name. */
const char *workload_summary(const char *name);

/* Returns NULL with err set for an unknown name or bad params. */
Workload *workload_create(const char *name, const WorkloadParams *params, BraidError *err);
int workload_count(const Workload *w);

/* The calls of workflow i's next stage, at most max_calls (the stage's width is never more than
 * WORKLOAD_MAX_FANOUT). Returns how many, 0 when the workflow has ended, -1 with err set on error.
 * Asked again before its outputs are delivered, it returns the same stage. */
#define WORKLOAD_MAX_FANOUT 64
int workload_next_stage(Workload *w, int i, AgentCall *calls, int max_calls, BraidError *err);

/* The outputs of the stage just returned for workflow i, in call order (n must equal its width; a
 * NULL output, e.g. a failed call, counts as empty). Returns 0 or -1. */
int workload_deliver(Workload *w, int i, const char *const *outputs, int n, BraidError *err);

void workload_free(Workload *w);

#endif
