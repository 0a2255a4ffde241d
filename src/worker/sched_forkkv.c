#include "worker/sched_forkkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/block_presence.h"
#include "cache/content_hash.h"
#include "common/log.h"
#include "worker/forkkv_cost.h"

bool sched_forked(const Scheduler *s, const SchedRequest *r) { return s->forkkv && r->lora_id > 0 && !r->kv_separate; }

int sched_forkkv_add(Scheduler *s, SchedRequest *r) {
    /* Every adapted request (auto may fork one it first gave a separate cache at admission). */
    if (!s->forkkv || r->lora_id <= 0) return 0;
    BraidError err;
    if (residual_cache_identity(&s->residual, &r->res, r->tenant, r->adapter, &err)) {
        snprintf(r->error, sizeof r->error, "%s", err.msg);
        return -1;
    }
    int need = (r->n_prompt + r->max_tokens + s->block_size - 1) / s->block_size, total = residual_cache_total(&s->residual);
    if (need > total) {
        snprintf(r->error, sizeof r->error,
                 "request needs %d residual blocks (%d prompt + %d max_tokens tokens) but the ForkKV residual pool holds only "
                 "%d; lower max_tokens or start with more --residual-blocks",
                 need, r->n_prompt, r->max_tokens, total);
        return -1;
    }
    return 0;
}

int sched_forkkv_admit(Scheduler *s, SchedRequest *r, BraidError *err) {
    r->base_write_from = r->n_computed;
    r->res.matched_tokens = 0;
    if (!sched_forked(s, r)) return 0;
    if (s->cache_enabled && residual_cache_admit(&s->residual, &r->res, r->tokens, r->n_tokens, err)) return -1;
    if (r->res.matched_tokens < r->n_computed) r->n_computed = r->res.matched_tokens;
    return 0;
}

int sched_forkkv_ensure(Scheduler *s, SchedRequest *r, int tokens, BraidError *err) {
    if (!sched_forked(s, r)) return 0;
    return residual_cache_grow(&s->residual, &r->res, tokens, err);
}

void sched_forkkv_commit(Scheduler *s, SchedRequest *r, int n_full, bool relock) {
    if (!sched_forked(s, r) || n_full <= 0) return;
    BraidError err;
    if (residual_cache_commit(&s->residual, &r->res, r->tokens, n_full, relock, &err))
        LOG_WARN("sched", "req %s: residual cache insert failed: %s", r->id, err.msg);
}

void sched_forkkv_release(Scheduler *s, SchedRequest *r) {
    if (sched_forked(s, r)) residual_cache_release(&s->residual, &r->res);
}

static void observe_regret(Scheduler *s, const SchedRequest *r);

void sched_forkkv_count_first(Scheduler *s, const SchedRequest *r, int base_tokens) {
    observe_regret(s, r);
    if (!sched_forked(s, r)) return;
    int res_tokens = r->res.matched_tokens;
    s->counters.forkkv_requests++;
    s->counters.residual_hit_tokens += (uint64_t)res_tokens;
    s->counters.fork_tokens += (uint64_t)(base_tokens > res_tokens ? base_tokens - res_tokens : 0);
    s->counters.partial_hit_tokens += (uint64_t)(res_tokens > base_tokens ? res_tokens - base_tokens : 0);
}

/* ---- --lora-cache auto ---- */

/* Adapters whose last choice is remembered, to log when an adapter's choice changes. */
#define AUTO_MAX_ADAPTERS 64

typedef struct SchedForkAuto SchedForkAuto;

struct SchedForkAuto {
    ForkKvCost cost;
    BlockPresence base, residual; /* by chained hash, as the two trees hold them */
    uint64_t *hashes;             /* scratch: a prompt's chained hashes in two namespaces */
    int cap_hashes;
    char *adapters[AUTO_MAX_ADAPTERS];
    signed char last_shared[AUTO_MAX_ADAPTERS];
    int n_adapters;
    uint64_t chose_shared, chose_separate;
};

int sched_forkkv_auto_init(Scheduler *s, const SchedConfig *cfg, BraidError *err) {
    SchedForkAuto *a = calloc(1, sizeof *a);
    if (!a) return braid_error_set(err, "scheduler: out of memory for --lora-cache auto");
    /* Ghosts: evictions remembered for about one pool's turnover of both trees. */
    if (block_presence_init(&a->base, cfg->device_blocks) || block_presence_init(&a->residual, cfg->residual_blocks)) {
        block_presence_free(&a->base);
        block_presence_free(&a->residual);
        free(a);
        return braid_error_set(err, "scheduler: out of memory for --lora-cache auto");
    }
    forkkv_cost_init(&a->cost, cfg->model_layers, cfg->model_heads, cfg->model_kv_heads, cfg->model_head_dim, cfg->lora_rank);
    if (forkkv_cost_measure(&a->cost)) LOG_WARN("sched", "--lora-cache auto: no memory to measure the attention kernels; using defaults");
    LOG_INFO("sched",
             "--lora-cache auto: attention per slot and layer %.1f ns decode, %.1f ns prefill; ResidualAttention %.2fx "
             "decode, %.2fx prefill (measured)",
             a->cost.plain_decode_s * 1e9, a->cost.plain_prefill_s * 1e9, a->cost.rho_decode, a->cost.rho_prefill);
    s->fork_auto = a;
    return 0;
}

void sched_forkkv_auto_free(Scheduler *s) {
    SchedForkAuto *a = s->fork_auto;
    if (!a) return;
    block_presence_free(&a->base);
    block_presence_free(&a->residual);
    free(a->hashes);
    for (int i = 0; i < a->n_adapters; i++) free(a->adapters[i]);
    free(a);
    s->fork_auto = NULL;
}

void sched_forkkv_on_event(Scheduler *s, const CacheEvent *ev, bool residual) {
    SchedForkAuto *a = s->fork_auto;
    if (a && block_presence_on_event(residual ? &a->residual : &a->base, ev))
        LOG_WARN("sched", "--lora-cache auto: out of memory following the cache; its choices may err");
}

ForkKvCost *sched_forkkv_cost(Scheduler *s) { return s->fork_auto ? &s->fork_auto->cost : NULL; }

void sched_forkkv_observe_step(Scheduler *s, int n_tokens, int n_decode, double seconds) {
    if (s->fork_auto) forkkv_cost_observe_step(&s->fork_auto->cost, n_tokens, n_decode, seconds);
}

/* Logs an adapter's choice when it differs from its last one. */
static void note_choice(SchedForkAuto *a, const SchedRequest *r, const ForkKvChoice *ch, int held) {
    int i = 0;
    while (i < a->n_adapters && strcmp(a->adapters[i], r->adapter) != 0) i++;
    if (i == a->n_adapters && i < AUTO_MAX_ADAPTERS && (a->adapters[i] = strdup(r->adapter))) a->last_shared[a->n_adapters++] = -1;
    if (i < a->n_adapters && a->last_shared[i] == (signed char)ch->shared) return;
    if (i < a->n_adapters) a->last_shared[i] = (signed char)ch->shared;
    LOG_INFO("sched",
             "--lora-cache auto: adapter %s now %s (req %s: %d prompt tokens, %d held, max_tokens %d; attention penalty "
             "%.3f s + recompute %.3f s vs memory saving %.3f s; regret %.3f, %.2f ms a token)",
             r->adapter, ch->shared ? "forked on the shared base" : "on a separate cache", r->id, r->n_prompt, held,
             r->max_tokens, ch->penalty_s, ch->recompute_s, ch->saving_s, a->cost.regret, a->cost.token_s * 1e3);
}

/* The prompt's chained hashes in the shared base namespace and in its adapter's (a->hashes: base
 * ones, then own ones); the number of blocks, or -1 when out of memory. */
static int prompt_hashes(SchedForkAuto *a, const Scheduler *s, const SchedRequest *r) {
    int bs = s->block_size, n_blocks = r->n_prompt > 0 ? (r->n_prompt - 1) / bs : 0; /* a match never covers all of it */
    if (n_blocks > a->cap_hashes) {
        uint64_t *h = realloc(a->hashes, (size_t)2 * n_blocks * sizeof *h);
        if (!h) return -1;
        a->hashes = h;
        a->cap_hashes = n_blocks;
    }
    content_hash_blocks(content_hash_namespace(r->tenant, NULL), r->tokens, n_blocks, bs, a->hashes, NULL);
    content_hash_blocks(content_hash_namespace(r->tenant, r->adapter), r->tokens, n_blocks, bs, a->hashes + n_blocks, NULL);
    return n_blocks;
}

/* Other adapters' separate copies of r's prompt (the adapters auto has decided for, same tenant:
 * their namespaces of the base pool): the longest prefix one holds, and their sum, in blocks. */
static void other_copies(SchedForkAuto *a, const Scheduler *s, const SchedRequest *r, int n_blocks, int *longest, int *sum) {
    *longest = *sum = 0;
    uint64_t *h = a->hashes + n_blocks; /* the own-namespace half, rewritten per adapter and restored after */
    for (int i = 0; i < a->n_adapters; i++) {
        if (strcmp(a->adapters[i], r->adapter) == 0) continue;
        content_hash_blocks(content_hash_namespace(r->tenant, a->adapters[i]), r->tokens, n_blocks, s->block_size, h, NULL);
        int k = block_presence_prefix(&a->base, h, n_blocks);
        *sum += k;
        if (k > *longest) *longest = k;
    }
    content_hash_blocks(content_hash_namespace(r->tenant, r->adapter), r->tokens, n_blocks, s->block_size, h, NULL);
}

/* Whether r forked could be admitted by an idle pool: its base blocks and, in the unified pool,
 * the carriers its residual blocks borrow from the same base pool (sched_add checked the base
 * blocks alone, all a separate cache needs; the residual pool of its own, sched_forkkv_add). A fork
 * that fails this would wait at the head of the queue for room that never frees. */
static bool fork_fits(const Scheduler *s, const SchedRequest *r) {
    int bs = s->block_size, blocks = (r->n_prompt + r->max_tokens + bs - 1) / bs;
    const ResidualCache *rc = &s->residual;
    int carriers = rc->base && rc->per_carrier > 0 ? (blocks + rc->per_carrier - 1) / rc->per_carrier : 0;
    return blocks + carriers <= kv_cache_total(&s->cache, CACHE_TIER_DEVICE);
}

/* The cost model's choice for r now; *held_tokens: the context it would reuse. Held: the longest
 * prefix the shared base, this adapter's residuals or its separate copy holds, or held until
 * evicted (the context is the adapter's even when memory pushed it out), or another adapter's
 * separate copy holds (forkkv_cost.h: copies). */
static ForkKvChoice decide(SchedForkAuto *a, const Scheduler *s, const SchedRequest *r, int *held_tokens) {
    *held_tokens = 0;
    /* Approximate segment reuse and an amortized splice copy K/V into the request's blocks, which a
     * forked request skips (its residuals would need copies too): a request that asks for them
     * gets them. (Exact segment reuse is every request's default on a server: not an ask.) */
    if (r->segment_mode == SEGMENT_REUSE_APPROX || r->directives.splice_mode == CACHE_SPLICE_AMORTIZE) return (ForkKvChoice){0};
    if (!fork_fits(s, r)) return (ForkKvChoice){0};
    int n_blocks = prompt_hashes(a, s, r);
    if (n_blocks < 0) return (ForkKvChoice){.shared = true}; /* out of memory: fork, as --lora-cache shared would */
    const uint64_t *base_h = a->hashes, *own_h = a->hashes + n_blocks;
    int base_hit = block_presence_prefix(&a->base, base_h, n_blocks), res_hit = block_presence_prefix(&a->residual, own_h, n_blocks);
    int own = 0;
    while (own < n_blocks && (block_presence_has(&a->base, own_h[own]) || block_presence_evicted(&a->base, own_h[own]))) own++;
    int others, copies, own_now = block_presence_prefix(&a->base, own_h, n_blocks); /* in memory now */
    other_copies(a, s, r, n_blocks, &others, &copies);
    int held = base_hit > res_hit ? base_hit : res_hit;
    if (own > held) held = own;
    if (others > held) held = others;
    *held_tokens = held * s->block_size;
    int bs = s->block_size;
    ForkKvRequest req = {.n_prompt = r->n_prompt, .max_tokens = r->max_tokens, .held = *held_tokens, .base = base_hit * bs,
                         .own = own_now * bs, .copies = copies * bs,
                         .residual_known = true, .residual = res_hit * bs};
    return forkkv_cost_choose(&a->cost, &req);
}

/* A separate request's first admission: the share of its prompt blocks its namespace had evicted. */
static void observe_regret(Scheduler *s, const SchedRequest *r) {
    SchedForkAuto *a = s->fork_auto;
    if (!a || r->lora_id <= 0 || !r->kv_separate) return;
    int n_blocks = prompt_hashes(a, s, r), evicted = 0;
    for (int i = 0; i < n_blocks; i++) evicted += block_presence_evicted(&a->base, a->hashes[n_blocks + i]);
    if (n_blocks > 0) forkkv_cost_observe_regret(&a->cost, evicted, n_blocks);
}

void sched_forkkv_choose(Scheduler *s, SchedRequest *r) {
    SchedForkAuto *a = s->fork_auto;
    r->kv_separate = false;
    if (!a || r->lora_id <= 0) return;
    int held;
    r->kv_separate = !decide(a, s, r, &held).shared;
}

bool sched_forkkv_rechoose(Scheduler *s, SchedRequest *r) {
    SchedForkAuto *a = s->fork_auto;
    if (!a || r->lora_id <= 0 || r->cached_tokens >= 0) return false;
    int held;
    ForkKvChoice ch = decide(a, s, r, &held);
    if (ch.shared == !r->kv_separate) {
        note_choice(a, r, &ch, held);
        return false;
    }
    /* The namespace moves: only the identity's adapter (and its hash seed) differ between the two. */
    int64_t adapter = ch.shared ? 0 : cache_names_intern(&s->cache.names, CACHE_NAME_ADAPTER, r->adapter);
    if (adapter < 0) return false; /* out of memory: keep the first choice */
    r->identity.adapter = (uint32_t)adapter;
    r->identity.hash_seed = content_hash_namespace(r->tenant, ch.shared ? NULL : r->adapter);
    r->kv_separate = !ch.shared;
    /* A waiting request whose choice changes between attempts says so, with the pools it waits on
     * (a request that went back and forth would show here; issue 36 found none). */
    LOG_INFO("sched", "--lora-cache auto: req %s (%s) waiting: now %s (base blocks in use %d, residual %d; running %d, waiting %d)",
             r->id, r->adapter, ch.shared ? "forked" : "separate", kv_cache_in_use(&s->cache, CACHE_TIER_DEVICE),
             residual_cache_in_use(&s->residual), s->n_running, s->n_waiting);
    note_choice(a, r, &ch, held);
    return true;
}
