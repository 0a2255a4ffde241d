/*
 * policy_pbkv.c — PBKV's hierarchical, lookahead eviction (../shared/papers/001_*, §4.2).
 *
 * Every node knows the workflows that used it and, per workflow, which agents (CacheNodeMeta.uses).
 * Two classes, evicted in this order:
 *   1. retired cache: every workflow that used the node has ended. Deterministically worthless to
 *      them, so it goes first; among it, nodes fewer workflows used go first (a popular shared
 *      prefix outlives a private history), then the least recently used.
 *   2. everything else, by the lookahead score of Eq. 2:
 *        Score(c) = sum_k gamma^(k-1) sum_{w active in c} s_w^(k) * A_w(c) . P_w^(k)
 *      The predictions handed to the policy are unconditional (the survival s_w^(k) is already in
 *      them: a row's missing mass is the chance the workflow ended), so per workflow the policy keeps
 *      W_w[a] = sum_k gamma^(k-1) P_w^(k)[a] and a node's score is the sum of W_w over the agents of
 *      its active workflows, in steps of PBKV_VALUE_STEP; within a step (and for nodes with no
 *      workflow at all) the least recently used goes first. A use's requests queued at the
 *      instance (CacheNodeUse.waiting, kv_cache_note_waiting) add PBKV_WAITING_WEIGHT each: the
 *      forecast the coordinator sends when it dispatches a call is "what comes after this call",
 *      so it does not count the call itself while the call waits for admission (the simulator
 *      serves a call the moment its forecast lands, so it never sees that window).
 * A workflow's agent that branched away from a node (its next call did not continue it) no longer
 * counts as a use of it (kv_cache.c forgets it), so the tail of an old prompt is retired cache.
 * gamma: PBKV_DEFAULT_GAMMA = 0.7, the paper's setting, unless EvictPolicyOptions.gamma says
 * otherwise (--pbkv-gamma). The horizon K is the predictor's (the k of each prediction). A new prediction or a workflow end changes the scores of that
 * workflow's nodes only, so both ask the cache to re-key those (CACHE_RESCORE_WORKFLOW); evictions pop the heap.
 * Per-tier state: a table indexed by interned workflow id (ids are dense and small: the cache
 * recycles the ids of workflows nothing names any more, and on_workflow_forget clears the slot).
 *
 * A node that two or more, and at least half, of the active workflows read also counts one read for
 * the workflows still to come
 * (PBKV_NEW_WORKFLOWS_WEIGHT): Eq. 2 sums over W_act(c) only, and a shared head whose agent runs once
 * per workflow would otherwise be worth nothing to the next workflow that starts. On by default;
 * EvictPolicyOptions.future = -1 (--pbkv-future off) leaves it out (Eq. 2 alone), for A/B runs.
 *
 * Prefetch (§4.3): prefetch_value is the one-step Value(c) of Eq. 1, the sum over the node's active
 * workflows' uses of the step-1 predicted probability of the agents that used it (a retired or
 * never-predicted workflow adds 0). Kept per workflow next to the K-step weights. The cache ranks
 * host-only candidates by it; reclaimable marks retired cache, which a prefetch may take the room
 * of besides free blocks. The guardrails (never active cache, prefetched nodes yield first,
 * pure-decode steps, a copy cap per step) are the cache's and the scheduler's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/evict_policy.h"
#include "cache/radix_tree.h"
#include "common/grow.h"

/* Scores closer than this are one class, ordered by recency inside: differences of a few hundredths
 * between two workflows' probabilities are the predictor's smoothing, not information, and letting
 * them decide alone cost 1-3 points of hit rate on codegen and factcheck traces (seeds 1 and 5, see
 * bench/RESULTS.md) against recency breaking the tie. */
#define PBKV_VALUE_STEP 0.05
#define PBKV_MAX_AGENTS 32
/* A request queued at the instance will read the node (CacheNodeUse.waiting): a certain next
 * call, worth what an agent predicted next with probability 1 is worth (gamma^0 * 1). The
 * coordinator's forecast for a call is "what comes after it", so without this a call waiting in
 * the queue finds its own prefix scored as if it had already been served. */
#define PBKV_WAITING_WEIGHT 1.0
/* A node that two or more active workflows, and at least half of them, read (an agent's head) will
 * be read again by the workflows that have not started yet, which Eq. 2's sum over the active ones
 * cannot see: its value gets one certain read for them. Without it a head whose
 * agent runs once per workflow (factcheck's decomposer, codegen's planner) falls to value 0 as soon
 * as its users have called it, and every new workflow recomputes it: 1.2 points of hit rate on
 * factcheck at 40 000-160 000 tokens, 0.1-0.6 on codegen (bench/RESULTS.md, issue 35 part 6). A node
 * one active workflow reads (its private history, or a prefix it shares only with ended workflows)
 * gets nothing, nor one a few of them share (pipeline's popular filings: +1 for any node two active
 * workflows read cost 3-4 points there). */
#define PBKV_NEW_WORKFLOWS_WEIGHT 1.0

/* Keys combine the class, then the value, then recency (ticks stay far below 2^30). */
#define PBKV_RETIRED_BASE (-1e15)
#define PBKV_POPULARITY_UNIT 1e9
#define PBKV_SCORE_UNIT 1e12

typedef struct {
    bool known, retired;
    int n_agents;
    uint32_t agents[PBKV_MAX_AGENTS];
    double weight[PBKV_MAX_AGENTS]; /* W_w[a]: discounted predicted calls of agents[a] within the horizon */
    double next[PBKV_MAX_AGENTS];   /* P_w^(1)[a]: probability that the next call invokes agents[a] */
} PbkvWorkflow;

typedef struct {
    PbkvWorkflow *workflows; /* indexed by interned workflow id */
    int cap;
    double gamma;
    bool future;          /* count the read of the workflows still to come (PBKV_NEW_WORKFLOWS_WEIGHT) */
    int active_workflows; /* known (predicted) and not retired: the W_act that a node's share is of */
} PbkvState;

static int pbkv_create(void **state, CacheTier tier, const EvictPolicyOptions *options, BraidError *err) {
    (void)tier;
    if (options->gamma < 0 || options->gamma > 1) return braid_error_set(err, "pbkv: gamma %g is outside (0, 1]", options->gamma);
    if (options->future < -1 || options->future > 1)
        return braid_error_set(err, "pbkv: future %d is not -1 (off), 0 (default: on) or 1 (on)", options->future);
    PbkvState *s = calloc(1, sizeof *s);
    if (!s) return braid_error_set(err, "pbkv: out of memory");
    s->gamma = options->gamma > 0 ? options->gamma : PBKV_DEFAULT_GAMMA;
    s->future = options->future >= 0;
    *state = s;
    return 0;
}

static void pbkv_destroy(void *state) {
    PbkvState *s = state;
    if (!s) return;
    free(s->workflows);
    free(s);
}

static PbkvWorkflow *workflow_slot(PbkvState *s, uint32_t id) {
    if ((int)id >= s->cap) {
        int old = s->cap;
        if (braid_grow((void **)&s->workflows, &s->cap, (int)id + 1, sizeof *s->workflows)) return NULL;
        memset(s->workflows + old, 0, (size_t)(s->cap - old) * sizeof *s->workflows);
    }
    return &s->workflows[id];
}

static const PbkvWorkflow *workflow_find(const PbkvState *s, uint32_t id) { return (int)id < s->cap ? &s->workflows[id] : NULL; }

/* sum of per-agent values (weight or next) over the workflow's predicted agents that the node's
 * agent mask names */
static double use_value(const PbkvWorkflow *w, const double *per_agent, uint64_t agent_mask) {
    double v = 0;
    for (int i = 0; i < w->n_agents; i++)
        if (agent_mask & (1ull << (w->agents[i] % 64))) v += per_agent[i];
    return v;
}

static double pbkv_score(void *state, const RadixNode *node) {
    const PbkvState *s = state;
    const CacheNodeMeta *m = &node->meta;
    double recency = (double)m->last_access, value = 0;
    int active = 0;
    for (int i = 0; i < m->n_uses; i++) {
        const PbkvWorkflow *w = workflow_find(s, m->uses[i].workflow);
        if (w && w->retired) continue;
        active++;
        if (w && w->known) value += use_value(w, w->weight, m->uses[i].agent_mask);
        value += m->uses[i].waiting * PBKV_WAITING_WEIGHT;
    }
    /* Retired: every workflow that used it ended, or moved past it (the cache drops such uses). */
    if (m->workflows_seen > 0 && active == 0) return PBKV_RETIRED_BASE + (double)m->workflows_seen * PBKV_POPULARITY_UNIT + recency;
    /* A prompt at least half the active workflows read (an agent's head) is one the next workflow
     * reads too; one a few share (a popular document) is not. The share is read when the node is
     * re-keyed (a use, or a forecast or an end of one of its workflows), so it lags a little. */
    if (s->future && active >= 2 && 2 * active >= s->active_workflows) value += PBKV_NEW_WORKFLOWS_WEIGHT;
    return floor(value / PBKV_VALUE_STEP) * PBKV_VALUE_STEP * PBKV_SCORE_UNIT + recency;
}

/* Retired cache (class 1 above): every workflow that used the node ended or moved past it. */
static bool pbkv_reclaimable(void *state, const RadixNode *node) {
    return pbkv_score(state, node) < PBKV_RETIRED_BASE / 2;
}

/* Eq. 1: Value(c) = sum over active w in c of A_w(c) . P_w^(1). */
static double pbkv_prefetch_value(void *state, const RadixNode *node) {
    const PbkvState *s = state;
    const CacheNodeMeta *m = &node->meta;
    double value = 0;
    for (int i = 0; i < m->n_uses; i++) {
        const PbkvWorkflow *w = workflow_find(s, m->uses[i].workflow);
        if (w && w->retired) continue;
        if (w && w->known) value += use_value(w, w->next, m->uses[i].agent_mask);
        value += m->uses[i].waiting * PBKV_WAITING_WEIGHT; /* a queued call's next read */
    }
    return value;
}

static CacheRescore pbkv_on_workflow_end(void *state, uint32_t workflow) {
    PbkvWorkflow *w = workflow_slot(state, workflow);
    if (!w || w->retired) return CACHE_RESCORE_NONE;
    if (w->known) ((PbkvState *)state)->active_workflows--;
    w->retired = true;
    return CACHE_RESCORE_WORKFLOW;
}

static CacheRescore pbkv_on_prediction(void *state, const CachePrediction *p) {
    PbkvState *s = state;
    PbkvWorkflow *w = workflow_slot(state, p->workflow);
    if (!w) return CACHE_RESCORE_NONE; /* out of memory: the old prediction stays */
    if (!w->known || w->retired) s->active_workflows++;
    w->known = true;
    w->retired = false; /* a call after an end revives the workflow */
    w->n_agents = p->n_agents < PBKV_MAX_AGENTS ? p->n_agents : PBKV_MAX_AGENTS;
    for (int i = 0; i < w->n_agents; i++) {
        double v = 0, discount = 1;
        for (int step = 0; step < p->k; step++, discount *= s->gamma) v += discount * p->prob[(size_t)step * p->n_agents + i];
        w->agents[i] = p->agents[i];
        w->weight[i] = v;
        w->next[i] = p->k > 0 ? p->prob[i] : 0.0;
    }
    return CACHE_RESCORE_WORKFLOW;
}

/* The id is reclaimed (no node names it): the next workflow to get it starts unknown, not retired. */
static void pbkv_on_workflow_forget(void *state, uint32_t workflow) {
    PbkvState *s = state;
    if ((int)workflow >= s->cap) return;
    if (s->workflows[workflow].known && !s->workflows[workflow].retired) s->active_workflows--;
    s->workflows[workflow] = (PbkvWorkflow){0};
}

const EvictPolicy evict_policy_pbkv = {
    .name = "pbkv",
    .description = "PBKV: retired workflows' cache first, then the lowest K-step lookahead reuse score (needs predictions)",
    .create = pbkv_create,
    .destroy = pbkv_destroy,
    .score = pbkv_score,
    .on_workflow_end = pbkv_on_workflow_end,
    .on_prediction = pbkv_on_prediction,
    .on_workflow_forget = pbkv_on_workflow_forget,
    .prefetch_value = pbkv_prefetch_value,
    .reclaimable = pbkv_reclaimable,
};

/* ---- PBKV-LAE: the lifecycle half alone (the paper's ablation arm) ----
 * Retired cache first (every workflow that used the node ended or moved past it: the cache keeps a
 * node's active workflows only, so that is a node with workflows seen and no uses left), the
 * popular before the private last, as pbkv; everything else by recency (LRU). No predictions, no
 * per-workflow state, no prefetch. */
static double lae_score(void *state, const RadixNode *node) {
    (void)state;
    const CacheNodeMeta *m = &node->meta;
    double recency = (double)m->last_access;
    if (m->workflows_seen > 0 && m->n_uses == 0) return PBKV_RETIRED_BASE + (double)m->workflows_seen * PBKV_POPULARITY_UNIT + recency;
    return recency;
}

static bool lae_reclaimable(void *state, const RadixNode *node) { return lae_score(state, node) < PBKV_RETIRED_BASE / 2; }

const EvictPolicy evict_policy_pbkv_lae = {
    .name = "pbkv-lae",
    .description = "PBKV-LAE (lifecycle only): retired workflows' cache first, then least recently used (no predictions)",
    .score = lae_score,
    .reclaimable = lae_reclaimable,
};
