#include "sim/simulator.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kv_cache.h"
#include "predict/workflow_forecast.h"
#include "common/grow.h"
#include "common/strmap.h"

SimConfig sim_config_default(void) {
    /* Defaults measured on the 2-core CPU with SmolLM2-135M (bench/RESULTS.md): ~400 prefill tok/s,
     * ~100 decode tok/s. Any other machine: pass your own. */
    SimConfig c = {.kv_tokens = 8192, .policy = "lru", .prefill_s_per_token = 1.0 / 400, .decode_s_per_token = 1.0 / 100,
                   /* SmolLM2-135M in fp16: 2 (K, V) x 30 layers x 3 KV heads x 64 dims x 2 bytes per token. Copy
                    * rate and latency: the CPU backend's block loads on the 2-core machine (bench_cache_ops:
                    * 13.7 GB/s, ~27 us per block at any batch size; stores run at twice that); a GPU over
                    * PCIe 4/5 sees ~25-50 GB/s. */
                   .kv_bytes_per_token = 23040, .host_bandwidth_bytes_per_s = 14e9, .host_latency_s = 1e-6,
                   /* ForkKV: SmolLM2-135M's 3 KV heads x 64 dims; LoRA rank 16, ForkKV's setting. */
                   .lora_rank = 16, .kv_dim = 192};
    return c;
}

int sim_config_residual_tokens(const SimConfig *cfg) {
    if (cfg->lora_cache == SIM_LORA_SEPARATE) return 0;
    return cfg->residual_tokens > 0 ? cfg->residual_tokens : 2 * cfg->kv_tokens;
}

void sim_hash_tokens(const uint64_t *blocks, int n, int32_t *out) {
    for (int i = 0; i < n; i++) {
        out[2 * i] = (int32_t)(uint32_t)(blocks[i] >> 32);
        out[2 * i + 1] = (int32_t)(uint32_t)blocks[i];
    }
}

/* ---- Belady: next use of each block hash, from the whole trace ---- */

typedef struct {
    int *at; /* ascending request indices that use the hash */
    int n, cap;
} HashUses;

typedef struct {
    StrMap *index;    /* hash -> position in uses */
    HashUses *uses;
    int n_hashes, cap_hashes;
    int current;      /* request being served */
} BeladyState;

/* keys: the block hashes the cache's tree is keyed by (SimBaseKeys). */
static int belady_build(BeladyState *b, const Trace *t, const SimBaseKeys *keys) {
    memset(b, 0, sizeof *b);
    if (!(b->index = strmap_create(1024))) return -1;
    for (int r = 0; r < t->n; r++)
        for (int i = 0; i < t->reqs[r].n_blocks; i++) {
            uint64_t h = keys->of[r][i];
            int32_t slot;
            if (!strmap_get(b->index, (const char *)&h, sizeof h, &slot)) {
                slot = b->n_hashes;
                if (braid_grow((void **)&b->uses, &b->cap_hashes, slot + 1, sizeof *b->uses) ||
                    strmap_put(b->index, (const char *)&h, sizeof h, slot))
                    return -1;
                b->uses[slot] = (HashUses){0};
                b->n_hashes++;
            }
            HashUses *u = &b->uses[slot];
            if (u->n > 0 && u->at[u->n - 1] == r) continue;
            if (braid_grow((void **)&u->at, &u->cap, u->n + 1, sizeof *u->at)) return -1;
            u->at[u->n++] = r;
        }
    return 0;
}

static void belady_free(BeladyState *b) {
    for (int i = 0; i < b->n_hashes; i++) free(b->uses[i].at);
    free(b->uses);
    strmap_destroy(b->index);
}

/* Lower scores are evicted first: the farthest next use of the node's first block goes first, and
 * a block never used again before anything else. */
static double belady_score(void *state, const RadixNode *node) {
    const BeladyState *b = state;
    uint64_t h = ((uint64_t)(uint32_t)node->tokens[0] << 32) | (uint32_t)node->tokens[1];
    int32_t slot;
    if (!strmap_get(b->index, (const char *)&h, sizeof h, &slot)) return -INFINITY;
    const HashUses *u = &b->uses[slot];
    int lo = 0, hi = u->n;
    while (lo < hi) { /* first use after the current request */
        int mid = (lo + hi) / 2;
        if (u->at[mid] <= b->current) lo = mid + 1;
        else hi = mid;
    }
    return lo == u->n ? -INFINITY : -(double)u->at[lo];
}

static const EvictPolicy belady_policy = {.name = "belady", .score = belady_score};

/* ---- replay ---- */

/* What one replay needs while it serves requests. */
typedef struct {
    const SimConfig *cfg;
    KvCache *cache;
    SimResidualPool *residual; /* --lora-cache shared or auto; NULL in separate mode */
    SimAuto *autoc;            /* --lora-cache auto: the per-request chooser; else NULL */
    const SimBaseKeys *keys;
    int bs, tpb;               /* tokens a block; tree tokens a block */
    int32_t *tokens, *blocks;  /* scratch: a request's tree tokens and its block table */
    CacheOpList ops;
    KvSegmentPlan plan;
    SimMemoryPeaks *peaks;
    const Trace *trace;
    SimDirectiveReplay *dir;   /* the trace's directives, modeled; NULL without (or ignored) */
} Replay;

typedef struct {
    int device_cached_blocks, host_cached_blocks, copied_blocks; /* of the base tree's match */
    bool forked;               /* shared mode, a request with an adapter: it held a residual part too */
    int residual_cached_blocks; /* of the residual tree's match */
    int reused_tokens; /* segment reuse */
    int directive_tokens; /* copied by directives (a splice's runs, a shared prefix): hits */
    int ok; /* 0: the request needed more blocks than the cache could give */
} Served;

/* The live engine also caches the blocks its generated tokens fill (the prompt's partial last block
 * included) when a request ends. The trace has no hashes for them; their content is this request's
 * own, so each gets tokens no other block has. Returns the blocks to commit. */
static int output_blocks(const TraceRequest *r, int bs, int tpb, int seq, int32_t *tokens) {
    int full = r->prompt_tokens + r->output_tokens > 0 ? (r->prompt_tokens + r->output_tokens - 1) / bs : 0;
    for (int b = r->n_blocks; b < full; b++) {
        memset(tokens + (size_t)tpb * b, 0, (size_t)tpb * sizeof *tokens);
        tokens[tpb * b] = (int32_t)(0x40000000u | (uint32_t)seq);
        tokens[tpb * b + 1] = b;
    }
    return full > r->n_blocks ? full : r->n_blocks;
}

/* The request's token ids (tpb = bs: segment reuse replays real ids) or, by default, two tokens a
 * block standing for its chained hash (keys: the hashes the tree is keyed by). */
static void request_tokens(const TraceRequest *r, const uint64_t *keys, int bs, int tpb, int32_t *tokens) {
    if (tpb == SIM_TOKENS_PER_BLOCK) sim_hash_tokens(keys, r->n_blocks, tokens);
    else memcpy(tokens, r->tokens, (size_t)r->n_blocks * bs * sizeof *tokens);
}

/* Segment reuse for the prompt past the usable prefix (from), as the scheduler's admission does:
 * found before the reservation (sources held), placed after it. Returns the tokens reused. */
static int reuse_segments(KvCache *c, const CacheIdentity *id, const TraceRequest *r, int mode, int from, KvSegmentPlan *plan,
                          BraidError *err) {
    if (mode == SEGMENT_REUSE_OFF) return 0;
    if (kv_cache_find_segments(c, id, r->tokens, r->prompt_tokens, from, (SegmentReuseMode)mode, plan, err)) return -1;
    return plan->reused_tokens;
}

/* Shared mode, a request with an adapter: its residual part, held beside the base blocks. Admits
 * it (the cached residual prefix among the first `limit` blocks); the blocks held, or -1. */
static int residual_admit(Replay *rp, const TraceRequest *r, bool fork, int limit, Served *out, BraidError *err) {
    out->forked = fork;
    if (!out->forked) return 0;
    return out->residual_cached_blocks = sim_residual_admit(rp->residual, r, rp->tokens, limit, err);
}

/* One request through the cache, as the scheduler admits and finishes it. In shared mode the base
 * tree is keyed by tenant alone, and an adapted request writes base blocks past the base match and
 * residual blocks past the residual match, reserving each in its own pool. */
static int serve_one(Replay *rp, const TraceRequest *r, int seq, Served *out, BraidError *err) {
    KvCache *c = rp->cache;
    const SimConfig *cfg = rp->cfg;
    int bs = rp->bs, tpb = rp->tpb;
    int32_t *tokens = rp->tokens, *blocks = rp->blocks;
    KvSegmentPlan *plan = &rp->plan;
    CacheIdentity id;
    /* Shared mode: every adapter's base K/V of one context are the same tensors. Auto mode: an
     * adapted request the chooser keeps separate reads and writes its adapter's own namespace. */
    bool fork = rp->residual && r->adapter[0];
    if (fork && rp->autoc) fork = sim_auto_choose(rp->autoc, r, rp->keys->of[seq], r->blocks, bs);
    bool own_namespace = r->adapter[0] && !fork;
    const uint64_t *keys = own_namespace && rp->autoc ? r->blocks : rp->keys->of[seq];
    if (kv_cache_identity(c, r->tenant, rp->residual && !own_namespace ? NULL : r->adapter, r->workflow, r->agent, &id, err)) return -1;
    id.approx_ok = cfg->segment_reuse == SEGMENT_REUSE_APPROX && !cfg->no_approx_prefix;
    if (rp->dir) sim_directives_identity(r, cfg->segment_reuse, &id);
    if (rp->dir && sim_directives_before(rp->dir, c, &id, rp->trace, seq, err)) return -1;
    /* Match at most the prompt's full blocks, and never the whole prompt. */
    int limit = r->prompt_tokens > 0 ? (r->prompt_tokens - 1) / bs : 0;
    if (limit > r->n_blocks) limit = r->n_blocks;
    request_tokens(r, keys, bs, tpb, tokens);
    uint64_t copies_before = c->counters.stored_blocks + c->counters.loaded_blocks;
    KvCacheMatch m;
    if (kv_cache_match(c, &id, tokens, limit * tpb + 1, &m, err)) return -1;
    int got = kv_cache_acquire(c, &m, blocks, err);
    if (got < 0 || residual_admit(rp, r, fork, limit, out, err) < 0) return -1;
    int directive_tokens = 0;
    int reused = rp->dir ? sim_directives_plan(rp->dir, c, &id, rp->trace, seq, got * bs, cfg->segment_reuse, plan, &directive_tokens, err)
                         : reuse_segments(c, &id, r, cfg->segment_reuse, got * bs, plan, err);
    if (reused < 0) return -1;
    int total = (r->prompt_tokens + r->output_tokens + bs - 1) / bs, need = total - got, n_commit = r->n_blocks;
    if (cfg->cache_outputs) n_commit = output_blocks(r, bs, tpb, seq, tokens);
    out->ok = kv_cache_reserve(c, need, blocks + got) == 0;
    if (!out->ok && plan->n > 0) { /* the held sources may be what stood in the way */
        kv_cache_drop_segments(c, plan);
        reused = 0;
        out->ok = kv_cache_reserve(c, need, blocks + got) == 0;
    }
    if (!out->ok && rp->dir && kv_cache_pinned(c) > 0) { /* pins are hints: they go before a request is refused */
        kv_cache_unpin_for(c, kv_cache_pinned(c));
        out->ok = kv_cache_reserve(c, need, blocks + got) == 0;
    }
    int held = out->ok ? total : got;
    if (out->ok && out->forked) { /* decoupled: the residual pool evicts by its own LRU */
        int short_of_blocks = sim_residual_reserve(rp->residual, total, err);
        if (short_of_blocks < 0) return -1;
        out->ok = short_of_blocks == 0;
    }
    sim_memory_sample(rp->peaks, c, rp->residual);
    if (out->ok && plan->n > 0 && kv_cache_place_segments(c, plan, blocks, err)) return -1;
    if (out->ok && rp->dir && sim_directives_placed(rp->dir, c, &id, err)) return -1;
    /* From the first approximate token on (a matched approximate node or reused span), the blocks
     * enter the tree marked approximate, as the scheduler commits them. */
    int approx_from = m.approx_from_block >= 0 && m.approx_from_block < got ? m.approx_from_block * bs : -1;
    if (out->ok && plan->inexact && (approx_from < 0 || plan->first_inexact < approx_from)) approx_from = plan->first_inexact;
    id.has_approx = approx_from >= 0;
    id.approx_from_block = approx_from >= 0 ? approx_from / bs : 0;
    kv_cache_drop_segments(c, plan);
    out->directive_tokens = out->ok && reused > 0 ? directive_tokens : 0;
    out->reused_tokens = out->ok ? reused - out->directive_tokens : 0;
    RadixNode *lock = m.node;
    if (out->ok && kv_cache_commit(c, &id, tokens, n_commit, blocks, &lock, false, err)) return -1;
    if (out->ok && out->forked && sim_residual_commit(rp->residual, tokens, n_commit, err)) return -1;
    kv_cache_release(c, lock, blocks, held);
    if (out->forked) sim_residual_finish(rp->residual);
    if (out->ok && rp->dir && sim_directives_after(rp->dir, c, &id, rp->trace, seq, err)) return -1;
    kv_cache_identity_release(c, &id); /* as the scheduler does when a request finishes */
    out->device_cached_blocks = m.device_blocks;
    out->host_cached_blocks = m.host_blocks;
    out->copied_blocks = (int)(c->counters.stored_blocks + c->counters.loaded_blocks - copies_before);
    if (rp->autoc && own_namespace) sim_auto_observe_separate(rp->autoc, keys, r->n_blocks, m.device_blocks + m.host_blocks);
    if (rp->autoc && out->ok && sim_auto_remember(rp->autoc, keys, r->n_blocks)) return braid_error_set(err, "sim: out of memory");
    /* Nothing carries the operations out here; their cost is modeled from the counters. */
    if (kv_cache_take_ops(c, &rp->ops)) return braid_error_set(err, "sim: out of memory");
    cache_ops_clear(&rp->ops);
    return 0;
}

/* ---- per-workflow and per-agent summaries ---- */

/* Index of key in map, adding it as the next index when new; -1 when out of memory. */
static int32_t intern(StrMap *map, const char *key, int32_t *n_keys) {
    int32_t idx;
    if (strmap_get(map, key, strlen(key), &idx)) return idx;
    if (strmap_put(map, key, strlen(key), *n_keys)) return -1;
    return (*n_keys)++;
}

typedef struct {
    double total, stage_max, stage_t;
    bool open;
} WorkflowClock;

static void workflow_add(WorkflowClock *w, double t, double latency) {
    if (w->open && t == w->stage_t) { /* same stage: a fan-out's calls run side by side */
        if (latency > w->stage_max) w->stage_max = latency;
        return;
    }
    w->total += w->stage_max;
    *w = (WorkflowClock){.total = w->total, .stage_max = latency, .stage_t = t, .open = true};
}

static int summarize(const Trace *t, const double *ttft, const double *latency, SimResult *res) {
    StrMap *wf_ids = strmap_create((size_t)t->n + 1), *agent_ids = strmap_create(64);
    WorkflowClock *clocks = calloc((size_t)t->n + 1, sizeof *clocks);
    res->agents = calloc((size_t)t->n + 1, sizeof *res->agents);
    int rc = wf_ids && agent_ids && clocks && res->agents ? 0 : -1;
    int32_t n_wf = 0, n_agents = 0;
    for (int i = 0; rc == 0 && i < t->n; i++) {
        const TraceRequest *r = &t->reqs[i];
        int32_t w = r->workflow[0] ? intern(wf_ids, r->workflow, &n_wf) : n_wf++;
        int32_t a = intern(agent_ids, r->agent, &n_agents);
        if (w < 0 || a < 0) { rc = -1; break; }
        workflow_add(&clocks[w], r->t, latency[i]);
        SimAgentStats *s = &res->agents[a];
        if (!s->agent && !(s->agent = strdup(r->agent))) { rc = -1; break; }
        s->requests++;
        s->mean_ttft_s += ttft[i]; /* a sum until the end */
    }
    double sum = 0;
    for (int w = 0; w < n_wf; w++) sum += clocks[w].total + clocks[w].stage_max;
    res->workflows = n_wf;
    res->mean_workflow_latency_s = n_wf ? sum / n_wf : 0.0;
    res->n_agents = n_agents;
    for (int a = 0; a < n_agents; a++) res->agents[a].mean_ttft_s /= res->agents[a].requests ? res->agents[a].requests : 1;
    strmap_destroy(wf_ids);
    strmap_destroy(agent_ids);
    free(clocks);
    return rc;
}

void sim_result_free(SimResult *res) {
    for (int a = 0; a < res->n_agents; a++) free(res->agents[a].agent);
    free(res->agents);
    res->agents = NULL;
    res->n_agents = 0;
    free(res->timeline);
    res->timeline = NULL;
    res->n_timeline = 0;
}

static double copy_seconds(const SimConfig *cfg, int blocks, int bs) {
    if (blocks == 0) return 0.0;
    return cfg->host_latency_s + (double)blocks * bs * cfg->kv_bytes_per_token / cfg->host_bandwidth_bytes_per_s;
}

/* Workflow ends at or before time t reach the forecaster and the cache's policy. */
static void deliver_ends(KvCache *c, WorkflowForecast *f, const Trace *t, int *next_end, double until) {
    while (*next_end < t->n_ends && t->ends[*next_end].t <= until) {
        const TraceWorkflowEnd *e = &t->ends[(*next_end)++];
        if (f) workflow_forecast_end(f, e->workflow, e->t);
        kv_cache_workflow_end(c, e->workflow);
    }
}

/* App. E's perturbation of a forecast: (1 - lambda) P + lambda U per step, into out (k, n_agents). */
static void mix_with_uniform(const AgentPrediction *p, double lambda, float *out) {
    for (int i = 0; i < p->k * p->n_agents; i++) out[i] = (float)((1 - lambda) * p->prob[i] + lambda / p->n_agents);
}

/* The workflow's forecast after this call reaches the cache's policy (perturbed by
 * cfg->prediction_noise). */
static int forecast_call(KvCache *c, WorkflowForecast *f, const SimConfig *cfg, const TraceRequest *r, BraidError *err) {
    if (!f || !r->workflow[0] || !r->agent[0]) return 0;
    const AgentPrediction *p;
    /* The replay has the call's recorded hidden state at arrival; a server gets it after the prefill. */
    const float *text = r->hidden && r->hidden_dim == workflow_forecast_text_dim(f) ? r->hidden : NULL;
    if (workflow_forecast_call_text(f, r->workflow, r->agent, text, r->t, &p, err)) return -1;
    if (p->k == 0) return 0;
    if (cfg->prediction_noise <= 0 || p->n_agents == 0)
        return kv_cache_predict(c, r->workflow, r->agent, p->k, p->n_agents, (const char *const *)p->agents, p->prob, err);
    float *noisy = malloc((size_t)p->k * p->n_agents * sizeof *noisy);
    if (!noisy) return braid_error_set(err, "sim: out of memory perturbing a forecast");
    mix_with_uniform(p, cfg->prediction_noise, noisy);
    int rc = kv_cache_predict(c, r->workflow, r->agent, p->k, p->n_agents, (const char *const *)p->agents, noisy, err);
    free(noisy);
    return rc;
}

static int forecast_init(const SimConfig *cfg, WorkflowForecast *f, BraidError *err) {
    WorkflowForecastConfig fc = {.kind = cfg->predictor_kind == 2 ? PREDICTOR_MARKOV2 : PREDICTOR_MARKOV1, .learn = cfg->predictor_learn,
                                 .horizon = cfg->horizon > 0 ? cfg->horizon : WORKFLOW_FORECAST_DEFAULT_HORIZON,
                                 .run_cap = cfg->forecast_run_cap};
    if (cfg->predictor_path && agent_predictor_load(&fc.predictor, cfg->predictor_path, err)) return -1;
    return workflow_forecast_init(f, &fc, err);
}

/* One served request into the totals; returns the tokens it found cached (min(b, r) for a fork). */
static int account(SimResult *res, const TraceRequest *r, const Served *sv, int bs) {
    int base_hit = (sv->device_cached_blocks + sv->host_cached_blocks) * bs, cached = base_hit + sv->directive_tokens;
    if (sv->forked) {
        int residual_hit = sv->residual_cached_blocks * bs;
        cached = base_hit < residual_hit ? base_hit : residual_hit;
        res->residual_hit_tokens += (uint64_t)residual_hit;
        res->fork_tokens += (uint64_t)(base_hit - cached);
        res->partial_tokens += (uint64_t)(residual_hit - cached);
    }
    if (!sv->ok) res->too_large++;
    res->requests++;
    res->prompt_tokens += (uint64_t)r->prompt_tokens;
    res->cached_tokens += (uint64_t)cached;
    res->base_hit_tokens += (uint64_t)base_hit;
    res->computed_tokens += (uint64_t)(r->prompt_tokens - cached - sv->reused_tokens);
    res->segment_reused_tokens += (uint64_t)sv->reused_tokens;
    res->directives.directive_hit_tokens += (uint64_t)sv->directive_tokens;
    res->device_cached_tokens += (uint64_t)sv->device_cached_blocks * bs;
    res->host_cached_tokens += (uint64_t)sv->host_cached_blocks * bs;
    return cached;
}

/* The tree an adapted request's own blocks go to: the residual tree in shared mode, else the cache. */
static const KvCacheCounters *adapter_tree_counters(const Replay *rp) {
    return rp->residual ? sim_residual_counters(rp->residual) : &rp->cache->counters;
}

static int check_pools(const Replay *rp, SimResult *res, BraidError *err) {
    if (!rp->cfg->check_invariants) return 0;
    if (sim_pools_check(rp->cache, rp->residual, true, err)) return -1;
    res->invariant_checks++;
    return 0;
}

static int replay(const Trace *t, Replay *rp, WorkflowForecast *f, BeladyState *bstate, SimResult *res, double *ttfts, double *latencies,
                  BraidError *err) {
    const SimConfig *cfg = rp->cfg;
    KvCache *c = rp->cache;
    int bs = rp->bs, max_blocks = 1, next_end = 0;
    for (int i = 0; i < t->n; i++) {
        int need = (t->reqs[i].prompt_tokens + t->reqs[i].output_tokens + bs - 1) / bs + t->reqs[i].n_blocks + 1;
        if (need > max_blocks) max_blocks = need;
    }
    rp->tokens = malloc((size_t)max_blocks * rp->tpb * sizeof *rp->tokens);
    rp->blocks = malloc((size_t)max_blocks * sizeof *rp->blocks);
    int rc = rp->tokens && rp->blocks ? 0 : braid_error_set(err, "sim: out of memory");
    double ttft_sum = 0;
    for (int i = 0; rc == 0 && i < t->n; i++) {
        const TraceRequest *r = &t->reqs[i];
        bstate->current = i;
        deliver_ends(c, f, t, &next_end, r->t);
        if (rp->dir) kv_cache_step(c, r->t); /* pins expire in trace time */
        if (cfg->prefetch && i > 0) {
            /* The idle time before this arrival: what the forecasts made so far (the previous calls'
             * workflows) expect next, into free device blocks and retired cache only; at most
             * prefetch_max_blocks (default no cap: the copies are charged as time). */
            int loaded = 0, budget = cfg->prefetch_max_blocks > 0 ? cfg->prefetch_max_blocks : INT_MAX;
            if (kv_cache_prefetch(c, budget, 0, &loaded) || kv_cache_take_ops(c, &rp->ops)) {
                rc = braid_error_set(err, "sim: out of memory prefetching");
                break;
            }
            cache_ops_clear(&rp->ops);
            res->prefetch_copy_s += copy_seconds(cfg, loaded, bs);
        }
        Served sv = {0};
        uint64_t adapter_inserted = adapter_tree_counters(rp)->inserted_blocks;
        if ((rc = forecast_call(c, f, cfg, r, err)) || (rc = serve_one(rp, r, i, &sv, err)) || (rc = check_pools(rp, res, err))) break;
        if (r->adapter[0]) res->adapter_blocks_inserted += adapter_tree_counters(rp)->inserted_blocks - adapter_inserted;
        int cached = account(res, r, &sv, bs), computed = r->prompt_tokens - cached - sv.reused_tokens;
        double copy = copy_seconds(cfg, sv.copied_blocks, bs), ttft = computed * cfg->prefill_s_per_token + copy;
        res->copy_s += copy;
        ttft_sum += ttft;
        ttfts[i] = ttft;
        latencies[i] = ttft + r->output_tokens * cfg->decode_s_per_token;
        if (sv.forked) { /* ResidualAttention's extra time (0 unless fork_attention is set) */
            double extra = sim_fork_attention_s(&cfg->fork_attention, r->prompt_tokens, computed, r->output_tokens);
            latencies[i] += extra;
            res->fork_attention_s += extra;
            res->forked_requests++;
        } else if (rp->autoc && r->adapter[0]) {
            res->separate_adapted_requests++;
        }
        res->modeled_latency_s += latencies[i];
        if (res->timeline)
            res->timeline[res->n_timeline++] = (SimRequestRow){.t = r->t, .prompt_tokens = r->prompt_tokens, .cached_tokens = cached,
                                                               .host_cached_tokens = sv.host_cached_blocks * bs,
                                                               .reused_tokens = sv.reused_tokens, .ttft_s = ttft,
                                                               .latency_s = latencies[i]};
    }
    deliver_ends(c, f, t, &next_end, INFINITY);
    if (rc == 0) rc = check_pools(rp, res, err);
    if (f) {
        res->predicted_calls = f->predicted_calls;
        res->correct_next = f->correct_next;
    }
    res->mean_ttft_s = res->requests ? ttft_sum / res->requests : 0.0;
    return rc;
}

static void replay_free(Replay *rp) {
    cache_ops_free(&rp->ops);
    kv_cache_segment_plan_free(&rp->plan);
    free(rp->tokens);
    free(rp->blocks);
}

/* Options that cannot go together, and what the trace must carry for them. */
static int check_config(const Trace *t, const SimConfig *cfg, bool belady, BraidError *err) {
    if (cfg->segment_reuse && belady) return braid_error_set(err, "sim: belady replays block hashes; segment reuse needs another policy");
    if (cfg->lora_cache != SIM_LORA_SEPARATE && cfg->segment_reuse)
        return braid_error_set(err, "sim: --lora-cache %s does not model segment reuse; use one or the other",
                               sim_lora_cache_name(cfg->lora_cache));
    if (cfg->lora_cache == SIM_LORA_AUTO && belady)
        return braid_error_set(err, "sim: --lora-cache auto keys a request by its choice, which belady's index cannot know in advance");
    if (cfg->lora_cache != SIM_LORA_SEPARATE && (cfg->lora_rank < 1 || cfg->kv_dim < 1 || cfg->residual_tokens < 0))
        return braid_error_set(err, "sim: --lora-cache shared needs a LoRA rank >= 1 (got %d), a KV width >= 1 (got %d) and "
                                    "residual tokens >= 0 (got %d)", cfg->lora_rank, cfg->kv_dim, cfg->residual_tokens);
    for (int i = 0; cfg->segment_reuse && i < t->n; i++)
        if (!t->reqs[i].tokens)
            return braid_error_set(err, "sim: segment reuse needs the prompts' token ids, but trace request %s has no \"tokens\" "
                                        "(write the trace with --trace-tokens)", t->reqs[i].id);
    return 0;
}

/* A trace with directives replays token ids through the base cache alone. */
static int check_directives(const Trace *t, const SimConfig *cfg, bool belady, BraidError *err) {
    if (belady) return braid_error_set(err, "sim: belady replays block hashes; a trace with directives needs another policy");
    if (cfg->lora_cache != SIM_LORA_SEPARATE)
        return braid_error_set(err, "sim: --lora-cache %s does not model directives; replay the trace with separate caches",
                               sim_lora_cache_name(cfg->lora_cache));
    for (int i = 0; i < t->n; i++)
        if (!t->reqs[i].tokens)
            return braid_error_set(err, "sim: a trace with directives replays token ids, but request %s has no \"tokens\" "
                                        "(write the trace with --trace-tokens)", t->reqs[i].id);
    return 0;
}

/* Shared mode's residual pool (2 x the base cache's tokens unless sized; unified: ids for every
 * residual block the base's blocks could carry, kv_dim / rank each); NULL in separate mode. */
static int residual_pool_init(const SimConfig *cfg, KvCache *cache, int bs, int tpb, SimResidualPool *pool, SimResidualPool **out,
                              BraidError *err) {
    *out = NULL;
    if (cfg->lora_cache == SIM_LORA_SEPARATE) return 0;
    int per_carrier = cfg->kv_dim / cfg->lora_rank > 0 ? cfg->kv_dim / cfg->lora_rank : 1;
    int tokens = cfg->residual_unified ? kv_cache_total(cache, CACHE_TIER_DEVICE) * per_carrier * bs : sim_config_residual_tokens(cfg);
    if (sim_residual_init(pool, tokens, bs, tpb, err)) return -1;
    if (cfg->residual_unified && sim_residual_unify(pool, cache, per_carrier, err)) {
        sim_residual_free(pool);
        return -1;
    }
    *out = pool;
    return 0;
}

static void copy_counters(const KvCache *cache, const SimResidualPool *residual, SimResult *res) {
    const KvCacheCounters *k = &cache->counters;
    res->evicted_blocks = k->device_evicted_blocks;
    res->demoted_blocks = k->demoted_blocks;
    res->loaded_blocks = k->loaded_blocks;
    res->stored_blocks = k->stored_blocks;
    res->host_evicted_blocks = k->host_evicted_blocks;
    res->prefetched_blocks = k->prefetched_blocks;
    res->prefetch_hit_blocks = k->prefetch_hit_blocks;
    res->prefetch_wasted_blocks = k->prefetch_wasted_blocks;
    res->prefetch_displaced_blocks = k->prefetch_displaced_blocks;
    res->uses_over_bound = k->uses_over_bound;
    res->segment_lsh_candidates = k->segment_lsh_candidates;
    res->segment_lsh_admitted = k->segment_lsh_admitted;
    res->segment_lsh_rejected = k->segment_lsh_rejected_tau + k->segment_lsh_rejected_guard;
    res->segment_lsh_reused_tokens = k->segment_lsh_reused_tokens;
    res->segment_lsh_refused_full = k->segment_lsh_refused_full;
    if (residual) res->residual_evicted_blocks = sim_residual_counters(residual)->device_evicted_blocks;
    res->hit_rate = res->prompt_tokens ? (double)res->cached_tokens / (double)res->prompt_tokens : 0.0;
}

int sim_run(const Trace *t, const SimConfig *cfg, SimResult *res, BraidError *err) {
    memset(res, 0, sizeof *res);
    /* Directives and segment reuse replay token ids (a block is bs tree tokens), else block hashes. */
    bool directives = sim_trace_has_directives(t);
    int bs = t->block_size > 0 ? t->block_size : 16, tpb = cfg->segment_reuse || directives ? bs : SIM_TOKENS_PER_BLOCK;
    bool belady = strcmp(cfg->policy, "belady") == 0;
    const EvictPolicy *policy = belady ? &belady_policy : evict_policy_find(cfg->policy);
    if (!policy) return braid_error_set(err, "sim: unknown policy '%s' (a registered one or belady)", cfg->policy);
    if (check_config(t, cfg, belady, err) || (directives && check_directives(t, cfg, belady, err))) return -1;
    res->peaks.block_size = bs;
    res->peaks.base_bytes_per_token = cfg->kv_bytes_per_token;
    res->peaks.residual_bytes_per_token = sim_residual_bytes_per_token(cfg->kv_bytes_per_token, cfg->kv_dim, cfg->lora_rank);
    if ((res->adapters = sim_trace_adapters(t)) < 0) return braid_error_set(err, "sim: out of memory");
    SimBaseKeys keys;
    if (sim_base_keys_build(t, cfg->lora_cache, &keys, err)) {
        sim_base_keys_free(&keys);
        return -1;
    }
    BeladyState bstate = {0};
    if (belady && belady_build(&bstate, t, &keys)) {
        belady_free(&bstate);
        sim_base_keys_free(&keys);
        return braid_error_set(err, "sim: out of memory indexing the trace");
    }
    KvCacheConfig cc = {.block_size = tpb, .device_blocks = cfg->kv_tokens / bs + 1,
                        .host_blocks = cfg->host_kv_tokens > 0 ? cfg->host_kv_tokens / bs + 1 : 0, .policy = policy,
                        .policy_options = {.gamma = cfg->pbkv_gamma, .future = cfg->pbkv_future}, .policy_state = belady ? &bstate : NULL, .segments = cfg->segment_reuse != 0,
                        .anchor_tokens = cfg->anchor_tokens, .n_anchor_tokens = cfg->n_anchor_tokens,
                        .approx_window = cfg->approx_window, .segment_lsh = cfg->segment_lsh,
                        .segment_lsh_anywhere = cfg->segment_lsh_anywhere,
                        .segment_tau_seg = cfg->segment_tau_seg, .segment_tau_ctx = cfg->segment_tau_ctx,
                        .segment_canon = cfg->segment_canon, .n_segment_canon = cfg->n_segment_canon,
                        .prefetch_rho = cfg->prefetch ? cfg->prefetch_rho : 0,
                        .clock = directives ? sim_directives_clock : NULL};
    KvCache cache;
    SimResidualPool residual_pool;
    Replay rp = {.cfg = cfg, .cache = &cache, .keys = &keys, .bs = bs, .tpb = tpb, .peaks = &res->peaks, .trace = t};
    SimDirectiveReplay dir_replay = {0};
    WorkflowForecast forecast, *f = policy->on_prediction ? &forecast : NULL;
    int rc = f ? forecast_init(cfg, f, err) : 0;
    bool forecast_up = f && rc == 0, cache_up = rc == 0 && (rc = kv_cache_init(&cache, &cc, err)) == 0;
    if (rc == 0) rc = residual_pool_init(cfg, &cache, bs, tpb, &residual_pool, &rp.residual, err);
    SimAuto chooser;
    if (rc == 0 && cfg->lora_cache == SIM_LORA_AUTO &&
        (rc = sim_auto_init(&chooser, &cfg->fork_attention, cfg->prefill_s_per_token, cfg->kv_dim, cfg->lora_rank, t, err)) == 0)
        rp.autoc = &chooser, chooser.cost_version = cfg->auto_cost ? cfg->auto_cost : 4;
    if (rp.autoc) {
        chooser.bs = bs;
        chooser.tpb = tpb;
        chooser.pool_tokens = cfg->kv_tokens; /* the per-context choice's fit test (sim_forkkv.h) */
        kv_cache_set_observer(&cache, sim_auto_on_event, rp.autoc);
        if (rp.residual) residual_cache_set_observer(&rp.residual->cache, sim_auto_on_residual_event, rp.autoc);
    }
    if (rc == 0 && directives && !cfg->ignore_directives && (rc = sim_directives_begin(&dir_replay, t, cfg->kv_tokens, cfg->pin_budget_tokens, err)) == 0)
        rp.dir = &dir_replay;
    double *ttfts = malloc(((size_t)t->n + 1) * sizeof *ttfts), *latencies = malloc(((size_t)t->n + 1) * sizeof *latencies);
    if (cfg->timeline) res->timeline = malloc(((size_t)t->n + 1) * sizeof *res->timeline);
    if (rc == 0 && !(ttfts && latencies && (!cfg->timeline || res->timeline))) rc = braid_error_set(err, "sim: out of memory");
    if (rc == 0) rc = replay(t, &rp, f, &bstate, res, ttfts, latencies, err);
    if (rc == 0 && summarize(t, ttfts, latencies, res)) rc = braid_error_set(err, "sim: out of memory");
    res->workflow_ends = t->n_ends;
    if (cache_up) copy_counters(&cache, rp.residual, res);
    if (cache_up && rp.dir) {
        uint64_t hits = res->directives.directive_hit_tokens;
        sim_directives_collect(rp.dir, &cache);
        res->directives = rp.dir->stats;
        res->directives.directive_hit_tokens = hits;
    }
    sim_directives_end(&dir_replay);
    free(ttfts);
    free(latencies);
    replay_free(&rp);
    if (rp.residual) sim_residual_free(rp.residual);
    if (rp.autoc) {
        kv_cache_set_observer(&cache, NULL, NULL); /* the chooser follows the cache's events until here */
        sim_auto_free(rp.autoc);
    }
    if (cache_up) kv_cache_free(&cache);
    if (forecast_up) workflow_forecast_free(f);
    if (belady) belady_free(&bstate);
    sim_base_keys_free(&keys);
    return rc;
}
