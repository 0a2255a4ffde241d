/*
 * workload_kind.h — internal to bench/workloads: what each workload file implements (a
 * WorkloadKind: shared texts plus a per-workflow state machine) and the small helpers they share.
 * workload.c owns the dispatch, the per-workflow lifecycle and the pending stage; a kind only
 * decides what its workflows say and do.
 *
 * A kind's shared state is built once per Workload and read-only afterwards; its per-workflow state
 * is created when the workflow is first asked for a stage and freed when it ends.
 */
#ifndef BRAID_BENCH_WORKLOADS_WORKLOAD_KIND_H
#define BRAID_BENCH_WORKLOADS_WORKLOAD_KIND_H

#include "agent_profile.h"
#include "history.h"
#include "strbuf.h"
#include "workload.h"
#include "wl_rng.h"

/* Estimated-token cap on a prompt at scale 1: real counts stay under ~6000 tokens, leaving room
 * for the output in the default model's 8192-token context (token_estimate is within ~3%). */
#define WL_PROMPT_CAP_TOKENS 5600
/* The cap never shrinks below this at small scales: labels, headers and tool reports keep their
 * size whatever the scale, and a tiny cap would squeeze them out of the history. */
#define WL_PROMPT_CAP_FLOOR 1200

typedef struct {
    const char *name;
    const char *summary; /* one line for help texts */
    void *(*shared_create)(const WorkloadParams *p, BraidError *err);
    void (*shared_free)(void *shared);
    void *(*flow_create)(const void *shared, const WorkloadParams *p, int index, BraidError *err);
    void (*flow_free)(void *flow);
    /* Fills calls[0..n) (n <= WORKLOAD_MAX_FANOUT; each prompt malloc'd, then owned by workload.c)
     * except the workflow id. Returns n, 0 when the workflow has ended, -1 with err set. */
    int (*flow_next)(const void *shared, void *flow, AgentCall *calls, BraidError *err);
    /* Takes the outputs of the stage flow_next returned last (n of them, NULL read as ""). */
    int (*flow_deliver)(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err);
} WorkloadKind;

extern const WorkloadKind wl_kind_codegen, wl_kind_factcheck, wl_kind_pipeline, wl_kind_react_lora, wl_kind_mapreduce_lora,
    wl_kind_edit_replay, wl_kind_cross_tenant, wl_kind_templates;

/* ---- helpers (wl_common.c) ---- */

/* calloc(1, size), or NULL with err set to "out of memory": a kind's shared or flow state. */
void *wl_alloc_state(size_t size, BraidError *err);

/* The estimated-token cap on a prompt: WL_PROMPT_CAP_TOKENS × scale, at least WL_PROMPT_CAP_FLOOR. */
int wl_prompt_cap(const WorkloadParams *p);
/* tokens * scale, at least 1. */
int wl_scaled(const WorkloadParams *p, int tokens);
/* An output-length limit scaled like the prompt parts, at least 4 tokens. */
int wl_scaled_output(const WorkloadParams *p, int tokens);
/* A realistic output length around mean (0.6–1.4×), within [1, max_tokens]. */
int wl_draw_output_tokens(WlRng *r, int mean, int max_tokens);
/* Fills a call's labels and numbers; takes ownership of prompt. tenant/adapter may be NULL. */
void wl_call_fill(AgentCall *c, const char *agent, const char *tenant, const char *adapter, char *prompt, int max_tokens,
                  double delay_s, int expected_output_tokens);
/* Frees the prompts of calls[0..n) (after an error part-way through a stage). */
void wl_calls_release(AgentCall *calls, int n);
/* The output of call i, "" for NULL. */
const char *wl_output(const char *const *outputs, int i);
/* Checks that a stage of `expected` calls got `n` outputs. */
int wl_check_outputs(const char *workload, int expected, int n, BraidError *err);

/* The agent's name with a capital first letter, as history labels and instruction blocks show it. */
typedef struct {
    char text[32];
} WlLabel;
WlLabel wl_label(const char *agent);
/* Appends the closing instruction block: "### Instruction\n<text>\n\n### <Agent>\n". */
void wl_append_instruction(StrBuf *b, const char *agent, const char *text);

/* A prompt: the head parts in order, then the history within what is left of cap_tokens, then the
 * tail (instruction). Returns a malloc'd string, or NULL with err set when out of memory. */
char *wl_prompt_build(const char *const *head, int n_head, const History *h, const char *tail, int cap_tokens, BraidError *err);

/* The common one-call stage: the agent's head, the history within the prompt cap, the instruction;
 * output length drawn around output_mean (scale-1 tokens), max_tokens output_max. Returns 1 or -1. */
int wl_agent_stage(const AgentProfile *agent, const History *h, const char *instruction, const WorkloadParams *p, WlRng *rng,
                   int output_mean, int output_max, AgentCall *call, BraidError *err);
/* A call that continues an agent's turn, the way framework agent loops lay it out (AutoGen: the
 * agent's system message, then the shared conversation, tool results included; LangChain / CrewAI:
 * the ReAct scratchpad grows by the last output and its observation): the agent's head, then task
 * (the agent's fixed task text, shared across workflows; may be NULL), the history within the
 * prompt cap, then scratch (may be NULL) and "### <Agent>\n". No instruction block: whatever told
 * the agent what to do is already in the history or the task, so each call of a multi-call turn
 * starts with the previous call's whole prompt. Returns 1 or -1. */
int wl_agent_turn(const AgentProfile *agent, const char *task, const History *h, const char *scratch, const WorkloadParams *p,
                  WlRng *rng, int output_mean, int output_max, AgentCall *call, BraidError *err);
/* Appends an agent's output to the history under its label, cut to its output limit. */
int wl_add_output(History *h, const AgentProfile *agent, const char *output, const WorkloadParams *p, int output_max,
                  BraidError *err);

#endif
