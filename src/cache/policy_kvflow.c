/*
 * policy_kvflow.c — the KVFlow baseline (Pan et al., NeurIPS'25; PBKV's comparison, ../shared/papers/
 * 001_*, §6.1): evict the cache of the agents whose next execution is farthest ("steps-to-execution"
 * on the agent step graph) first.
 *
 * What KVFlow's code does. Read in its public SGLang fork, github.com/PanZaifeng/KVFlow (commit
 * 7ef897e), files python/sglang/srt/managers/agent_manager.py (AgentManager),
 * python/sglang/srt/mem_cache/hiradix_cache.py (evict, _evict_helper, evict_host, insert,
 * _split_node, _update_leaf_node_timestep), python/sglang/srt/mem_cache/radix_cache.py (TreeNode,
 * _update_leaf_node_priority), python/sglang/srt/managers/scheduler.py (HandleReq),
 * python/sglang/srt/managers/scheduler_output_processor_mixin.py (where requests tag nodes,
 * DispatchLoadTasks), python/sglang/srt/server_args.py (defaults) and SScheduler/ (Scheduler.py,
 * policy/base_policy.py, timestepManager/BaseManager.py, PlanManager.py):
 *   - The step graph lives in the front end (SScheduler): at every timestep it sends the engine a
 *     dict agent -> steps-to-execution (0 = runs in the current step; only agents within its
 *     horizon; an agent reported by several sources gets the minimum) which REPLACES the previous
 *     dict (AgentManager.update_agent_timestep). Nothing else: no notion of a finished workflow, an
 *     agent that is no longer reported is simply "not in the graph".
 *   - An agent's hold priority (get_agent_hold_priority) is min(hold_step + 1, steps), hold_step =
 *     --evict-pri-level (default 4); an agent not in the dict gets hold_step + 1. A node's priority
 *     is the MIN over the agents tagged on it (get_agents_hold_priority): the nearest agent wins;
 *     a node with no agent gets hold_step + 2.
 *   - Eviction (HiRadixCache.evict with --enable-holding) evicts device leaves in passes
 *     steps = hold_step - 1, ..., 1, each pass taking only leaves whose priority >= steps, then a
 *     last pass that ignores priorities. So the order is by BAND: every priority >= hold_step - 1
 *     (far agents, agents not in the graph, untagged nodes alike) first, then hold_step - 2, ...,
 *     then 1, and the agents running now (0) last. Within a pass the victims come in tree-walk
 *     order (the heapify is commented out); the host tier (evict_host) pops a heap ordered by
 *     TreeNode.__lt__, which is last_access_time: host eviction is plain LRU.
 *   - Tags: a request tags the node that ends its cached sequence with its agent
 *     (_update_leaf_node_priority); new nodes copy their parent's tags and a split copies the tags
 *     to the upper half. Locked nodes are never evicted; an evicted leaf exposes its parent.
 *
 * How it maps onto the v2 interface (what this file does):
 *   - Steps-to-execution per workflow come from on_prediction, the stand-in for the front end's
 *     update: the current agent gets 0, and an agent gets s when it is the most likely agent of the
 *     s-th next call (the first such s; agents tied for the most likely all get s; probability 0
 *     counts for nothing). On a static workflow — the only kind PBKV runs KVFlow on — the
 *     predictions are that static schedule, so this is its steps-to-execution; an agent that is
 *     possible but never the most likely call within the horizon is "not in the graph", like one
 *     beyond SScheduler's horizon. Each prediction replaces the workflow's previous steps, as the
 *     dict is replaced.
 *   - Agent identity is (workflow, agent): every workflow instance runs its own copy of the graph.
 *     Nodes name agents by bit (agent id % 64) per workflow; agents sharing a bit share the
 *     smaller value.
 *   - A node's agents are the agents of its uses (every agent that matched or inserted through it,
 *     kept by the cache for every active workflow), and its priority is the
 *     minimum over them, capped as above. That is KVFlow's "nearest agent wins" for a shared prefix;
 *     KVFlow's own tag placement (end node + inherited copies) cannot be reproduced from node
 *     metadata, and neither can its raising of a still-current parent to max(parent, evicted
 *     child), so neither is attempted.
 *   - Score = band, then recency: band 0 for priorities >= hold_step - 1, ..., band hold_step - 1
 *     for 0 (lowest band evicted first). KVFlow's tree-walk order inside a pass is not a property
 *     of the nodes; the tie-break is last access (LRU), the order its TreeNode defines.
 *   - on_workflow_end forgets the workflow (its agents fall to "not in the graph", the top band,
 *     together with far and untagged cache — no retired-first class: KVFlow has none). The map is
 *     bounded (KVFLOW_MAX_WORKFLOWS; the least recently updated workflow is forgotten first).
 *   - The host tier's instance is LRU, as KVFlow's evict_host.
 */
#include <stdlib.h>
#include <string.h>

#include "cache/evict_policy.h"
#include "cache/radix_tree.h"

#define KVFLOW_HOLD_STEP 4                          /* --evict-pri-level default */
#define KVFLOW_NOT_IN_GRAPH (KVFLOW_HOLD_STEP + 1)  /* an agent with no steps-to-execution */
#define KVFLOW_NO_AGENT (KVFLOW_HOLD_STEP + 2)      /* a node no agent tagged */
#define KVFLOW_MAX_WORKFLOWS 4096
#define KVFLOW_BAND_UNIT 1099511627776.0 /* 2^40: bands above recency (ticks stay far below it) */

typedef struct {
    uint32_t workflow; /* 0 = empty slot */
    uint64_t updated;  /* sequence number of its latest prediction */
    uint8_t steps[64]; /* capped steps-to-execution per agent-mask bit */
} KvflowEntry;

typedef struct {
    CacheTier tier;
    KvflowEntry *slots; /* open addressing with linear probing; cap is 0 or a power of two */
    int cap, n;
    uint64_t seq;
    bool forgot; /* entry_add forgot another workflow to stay in bounds: its nodes' scores moved */
} KvflowState;

static int kvflow_create(void **state, CacheTier tier, const EvictPolicyOptions *options, BraidError *err) {
    (void)options;
    KvflowState *s = calloc(1, sizeof *s);
    if (!s) return braid_error_set(err, "kvflow: out of memory");
    s->tier = tier;
    *state = s;
    return 0;
}

static void kvflow_destroy(void *state) {
    KvflowState *s = state;
    if (!s) return;
    free(s->slots);
    free(s);
}

static int home_slot(const KvflowState *s, uint32_t workflow) { return (int)((workflow * 2654435761u) & (uint32_t)(s->cap - 1)); }

static KvflowEntry *entry_find(const KvflowState *s, uint32_t workflow) {
    if (s->cap == 0 || workflow == 0) return NULL;
    for (int i = home_slot(s, workflow);; i = (i + 1) & (s->cap - 1)) {
        if (s->slots[i].workflow == workflow) return &s->slots[i];
        if (s->slots[i].workflow == 0) return NULL;
    }
}

/* Backward-shift deletion: later entries of the probe run move up so lookups never need tombstones. */
static void entry_remove(KvflowState *s, KvflowEntry *e) {
    int mask = s->cap - 1, hole = (int)(e - s->slots);
    s->slots[hole].workflow = 0;
    s->n--;
    for (int j = (hole + 1) & mask; s->slots[j].workflow != 0; j = (j + 1) & mask) {
        int home = home_slot(s, s->slots[j].workflow);
        bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays) continue;
        s->slots[hole] = s->slots[j];
        s->slots[j].workflow = 0;
        hole = j;
    }
}

static void entry_place(KvflowState *s, const KvflowEntry *e) {
    int i = home_slot(s, e->workflow);
    while (s->slots[i].workflow != 0) i = (i + 1) & (s->cap - 1);
    s->slots[i] = *e;
    s->n++;
}

/* A new, empty entry for workflow (not present); NULL when out of memory. */
static KvflowEntry *entry_add(KvflowState *s, uint32_t workflow) {
    if (s->n >= KVFLOW_MAX_WORKFLOWS) { /* the bound: forget the least recently updated */
        KvflowEntry *oldest = NULL;
        for (int i = 0; i < s->cap; i++)
            if (s->slots[i].workflow != 0 && (!oldest || s->slots[i].updated < oldest->updated)) oldest = &s->slots[i];
        entry_remove(s, oldest);
        s->forgot = true;
    }
    if ((s->n + 1) * 2 > s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        KvflowEntry *slots = calloc((size_t)cap, sizeof *slots), *old = s->slots;
        if (!slots) return NULL;
        int old_cap = s->cap;
        s->slots = slots;
        s->cap = cap;
        s->n = 0;
        for (int i = 0; i < old_cap; i++)
            if (old[i].workflow != 0) entry_place(s, &old[i]);
        free(old);
    }
    KvflowEntry fresh = {.workflow = workflow};
    memset(fresh.steps, KVFLOW_NOT_IN_GRAPH, sizeof fresh.steps);
    entry_place(s, &fresh);
    return entry_find(s, workflow);
}

/* KVFlow's node priority: the nearest of the node's agents, capped. */
static int node_priority(const KvflowState *s, const CacheNodeMeta *m) {
    int p = KVFLOW_NO_AGENT;
    for (int u = 0; u < m->n_uses; u++) {
        const KvflowEntry *e = entry_find(s, m->uses[u].workflow);
        for (uint64_t mask = m->uses[u].agent_mask; mask; mask &= mask - 1) {
            int v = e ? e->steps[__builtin_ctzll(mask)] : KVFLOW_NOT_IN_GRAPH;
            if (v < p) p = v;
        }
    }
    return p;
}

static double kvflow_score(void *state, const RadixNode *node) {
    const KvflowState *s = state;
    double recency = (double)node->meta.last_access;
    if (s->tier != CACHE_TIER_DEVICE) return recency; /* evict_host: LRU */
    int p = node_priority(s, &node->meta);
    int band = (KVFLOW_HOLD_STEP - 1) - (p < KVFLOW_HOLD_STEP - 1 ? p : KVFLOW_HOLD_STEP - 1);
    return band * KVFLOW_BAND_UNIT + recency;
}

static CacheRescore kvflow_on_prediction(void *state, const CachePrediction *p) {
    KvflowState *s = state;
    s->forgot = false;
    if (s->tier != CACHE_TIER_DEVICE || p->workflow == 0) return CACHE_RESCORE_NONE;
    uint8_t steps[64];
    memset(steps, KVFLOW_NOT_IN_GRAPH, sizeof steps);
    for (int step = 1; step <= p->k; step++) {
        const float *row = p->prob + (size_t)(step - 1) * (size_t)p->n_agents;
        float best = 0;
        for (int i = 0; i < p->n_agents; i++)
            if (row[i] > best) best = row[i];
        if (!(best > 0)) continue;
        uint8_t v = step < KVFLOW_NOT_IN_GRAPH ? (uint8_t)step : KVFLOW_NOT_IN_GRAPH;
        for (int i = 0; i < p->n_agents; i++) {
            int bit = (int)(p->agents[i] % 64);
            if (row[i] == best && v < steps[bit]) steps[bit] = v;
        }
    }
    if (p->current_agent) steps[p->current_agent % 64] = 0;

    KvflowEntry *e = entry_find(s, p->workflow);
    if (!e) {
        bool any = false;
        for (int b = 0; b < 64; b++) any |= steps[b] != KVFLOW_NOT_IN_GRAPH;
        if (!any) return CACHE_RESCORE_NONE; /* the same as not being in the graph */
        e = entry_add(s, p->workflow);
        if (!e) return s->forgot ? CACHE_RESCORE_ALL : CACHE_RESCORE_NONE; /* out of memory: it stays out of the graph */
    }
    bool changed = memcmp(e->steps, steps, sizeof steps) != 0;
    memcpy(e->steps, steps, sizeof steps);
    e->updated = ++s->seq;
    /* A workflow forgotten to make room moved its own nodes' scores too. */
    if (s->forgot) return CACHE_RESCORE_ALL;
    return changed ? CACHE_RESCORE_WORKFLOW : CACHE_RESCORE_NONE;
}

static CacheRescore kvflow_on_workflow_end(void *state, uint32_t workflow) {
    KvflowState *s = state;
    KvflowEntry *e = s->tier == CACHE_TIER_DEVICE ? entry_find(s, workflow) : NULL;
    if (!e) return CACHE_RESCORE_NONE;
    bool changed = false;
    for (int b = 0; b < 64; b++) changed |= e->steps[b] != KVFLOW_NOT_IN_GRAPH;
    entry_remove(s, e);
    return changed ? CACHE_RESCORE_WORKFLOW : CACHE_RESCORE_NONE;
}

/* The id is reclaimed (no node names it, so no score moves): its steps must not reach the next
 * workflow to get the id. */
static void kvflow_on_workflow_forget(void *state, uint32_t workflow) {
    KvflowState *s = state;
    KvflowEntry *e = entry_find(s, workflow);
    if (e) entry_remove(s, e);
}

const EvictPolicy evict_policy_kvflow = {
    .name = "kvflow",
    .description = "KVFlow baseline: farthest steps-to-execution first, in bands (needs predictions; host tier LRU)",
    .create = kvflow_create,
    .destroy = kvflow_destroy,
    .score = kvflow_score,
    .on_workflow_end = kvflow_on_workflow_end,
    .on_prediction = kvflow_on_prediction,
    .on_workflow_forget = kvflow_on_workflow_forget,
};
