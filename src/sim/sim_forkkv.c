#include "sim/sim_forkkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
#include "sim/simulator.h"
#include "common/strmap.h"

int sim_lora_cache_parse(const char *name) {
    if (strcmp(name, "separate") == 0) return SIM_LORA_SEPARATE;
    if (strcmp(name, "shared") == 0) return SIM_LORA_SHARED;
    if (strcmp(name, "auto") == 0) return SIM_LORA_AUTO;
    return -1;
}

const char *sim_lora_cache_name(SimLoraCache mode) {
    return mode == SIM_LORA_SHARED ? "shared" : mode == SIM_LORA_AUTO ? "auto" : "separate";
}

double sim_residual_bytes_per_token(double kv_bytes_per_token, int kv_dim, int rank) {
    return kv_dim > 0 ? kv_bytes_per_token * rank / kv_dim : 0.0;
}

int sim_trace_adapters(const Trace *t) {
    StrMap *seen = strmap_create(16);
    if (!seen) return -1;
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        const char *a = t->reqs[i].adapter;
        int32_t unused;
        if (!a[0] || strmap_get(seen, a, strlen(a), &unused)) continue;
        if (strmap_put(seen, a, strlen(a), n)) {
            strmap_destroy(seen);
            return -1;
        }
        n++;
    }
    strmap_destroy(seen);
    return n;
}

static int recompute_tenant_hashes(const Trace *t, SimBaseKeys *keys, BraidError *err) {
    size_t total = 0;
    for (int i = 0; i < t->n; i++) {
        if (!t->reqs[i].tokens)
            return braid_error_set(err, "sim: --lora-cache shared keys the base cache by tenant alone, so it rehashes the prompts' "
                                        "token ids, but trace request %s has no \"tokens\" (write the trace with --trace-tokens)",
                                   t->reqs[i].id);
        total += (size_t)t->reqs[i].n_blocks;
    }
    if (!(keys->recomputed = malloc((total + 1) * sizeof *keys->recomputed)))
        return braid_error_set(err, "sim: out of memory rehashing the trace");
    uint64_t *next = keys->recomputed;
    for (int i = 0; i < t->n; i++) {
        const TraceRequest *r = &t->reqs[i];
        /* The adapter left out: every adapter's base K/V of one context are the same tensors. */
        content_hash_blocks(content_hash_namespace(r->tenant, NULL), r->tokens, r->n_blocks, t->block_size, next, NULL);
        keys->of[i] = next;
        next += r->n_blocks;
    }
    return 0;
}

int sim_base_keys_build(const Trace *t, SimLoraCache mode, SimBaseKeys *keys, BraidError *err) {
    memset(keys, 0, sizeof *keys);
    if (!(keys->of = malloc(((size_t)t->n + 1) * sizeof *keys->of))) return braid_error_set(err, "sim: out of memory");
    if (mode != SIM_LORA_SEPARATE) return recompute_tenant_hashes(t, keys, err);
    for (int i = 0; i < t->n; i++) keys->of[i] = t->reqs[i].blocks;
    return 0;
}

void sim_base_keys_free(SimBaseKeys *keys) {
    free(keys->of);
    free(keys->recomputed);
    memset(keys, 0, sizeof *keys);
}

int sim_residual_init(SimResidualPool *p, int residual_tokens, int block_size, int tree_tokens_per_block, BraidError *err) {
    memset(p, 0, sizeof *p);
    if (residual_tokens < block_size)
        return braid_error_set(err, "sim: a residual pool of %d tokens holds no whole block of %d tokens", residual_tokens, block_size);
    /* NULL policy: ForkKV gives each tree an LRU state of its own (decoupled eviction). */
    if (residual_cache_init(&p->cache, residual_tokens / block_size + 1, tree_tokens_per_block, NULL, NULL, err))
        return braid_error_wrap(err, "sim: residual pool of %d tokens", residual_tokens);
    p->block_size = block_size;
    p->tree_tokens_per_block = tree_tokens_per_block;
    return 0;
}

int sim_residual_unify(SimResidualPool *p, KvCache *base, int per_carrier, BraidError *err) {
    if (residual_cache_unify(&p->cache, base, per_carrier, err)) return braid_error_wrap(err, "sim: unified residual pool");
    return 0;
}

void sim_residual_free(SimResidualPool *p) {
    residual_cache_hold_free(&p->cache, &p->hold);
    residual_cache_free(&p->cache);
}

int sim_residual_admit(SimResidualPool *p, const TraceRequest *r, const int32_t *tokens, int max_blocks, BraidError *err) {
    if (residual_cache_identity(&p->cache, &p->hold, r->tenant, r->adapter, err)) return -1;
    /* One token past the blocks, so that all max_blocks of them may match. */
    if (residual_cache_admit(&p->cache, &p->hold, tokens, max_blocks * p->tree_tokens_per_block + 1, err)) return -1;
    return p->hold.n_blocks;
}

int sim_residual_reserve(SimResidualPool *p, int n_blocks, BraidError *err) {
    return residual_cache_grow(&p->cache, &p->hold, n_blocks * p->tree_tokens_per_block, err);
}

int sim_residual_commit(SimResidualPool *p, const int32_t *tokens, int n_full, BraidError *err) {
    return residual_cache_commit(&p->cache, &p->hold, tokens, n_full, false, err);
}

void sim_residual_finish(SimResidualPool *p) { residual_cache_hold_free(&p->cache, &p->hold); }

const KvCacheCounters *sim_residual_counters(const SimResidualPool *p) { return residual_cache_counters(&p->cache); }

static int max_int(int a, int b) { return a > b ? a : b; }

void sim_memory_sample(SimMemoryPeaks *peaks, const KvCache *base, const SimResidualPool *residual) {
    int carriers = residual ? residual_cache_carriers(&residual->cache) : 0;
    int base_in_use = kv_cache_in_use(base, CACHE_TIER_DEVICE) - carriers, base_blocks = base_in_use + kv_cache_cached(base, CACHE_TIER_DEVICE);
    int res_in_use = residual ? residual_cache_in_use(&residual->cache) : 0;
    int res_blocks = residual ? res_in_use + residual_cache_cached(&residual->cache) : 0;
    peaks->base_blocks = max_int(peaks->base_blocks, base_blocks);
    peaks->base_in_use_blocks = max_int(peaks->base_in_use_blocks, base_in_use);
    peaks->residual_blocks = max_int(peaks->residual_blocks, res_blocks);
    peaks->residual_in_use_blocks = max_int(peaks->residual_in_use_blocks, res_in_use);
    /* Unified: the residuals' bytes are their carriers', whole base blocks. */
    double res_bytes = residual && residual->cache.base ? (double)carriers * peaks->base_bytes_per_token
                                                        : (double)res_blocks * peaks->residual_bytes_per_token;
    double bytes = (double)peaks->block_size * (base_blocks * peaks->base_bytes_per_token + res_bytes);
    if (bytes > peaks->kv_bytes) peaks->kv_bytes = bytes;
}

int sim_pools_check(const KvCache *base, const SimResidualPool *residual, bool idle, BraidError *err) {
    if (kv_cache_check(base, err)) return braid_error_wrap(err, "sim: base cache");
    if (residual && residual_cache_check(&residual->cache, err)) return braid_error_wrap(err, "sim: residual cache");
    if (!idle) return 0;
    int carriers = residual ? residual_cache_carriers(&residual->cache) : 0;
    int base_in_use = kv_cache_in_use(base, CACHE_TIER_DEVICE) + kv_cache_in_use(base, CACHE_TIER_HOST) - carriers;
    int res_in_use = residual ? residual_cache_in_use(&residual->cache) : 0;
    if (base_in_use || res_in_use)
        return braid_error_set(err, "sim: with no request running, %d base and %d residual blocks are still in use", base_in_use,
                               res_in_use);
    return 0;
}

/* ---- ResidualAttention's time ---- */

int sim_fork_attention_parse(const char *spec, SimForkAttention *out) {
    /* bench/RESULTS.md, issue 36: the --lora-cache auto probe on the 2-core dev machine. */
    const SimForkAttention cpu = {.n_layers = 30, .rho_decode = 3.14, .rho_prefill = 1.58, .plain_decode_s = 72.2e-9,
                                  .plain_prefill_s = 50.6e-9};
    if (strcmp(spec, "none") == 0) {
        *out = (SimForkAttention){0};
        return 0;
    }
    *out = cpu;
    if (strcmp(spec, "cpu") == 0) return 0;
    char tail;
    if (sscanf(spec, "%lf:%lf%c", &out->rho_decode, &out->rho_prefill, &tail) != 2 || out->rho_decode <= 0 || out->rho_prefill <= 0)
        return -1;
    return 0;
}

/* The live cost model's struct with these attention figures (the other fields as init leaves them). */
static ForkKvCost cost_of(const SimForkAttention *a, int kv_dim, int rank) {
    ForkKvCost c;
    /* heads do not enter the arithmetic: one KV head of kv_dim wide */
    forkkv_cost_init(&c, a->n_layers, 1, 1, kv_dim, rank);
    c.rho_decode = a->rho_decode;
    c.rho_prefill = a->rho_prefill;
    c.plain_decode_s = a->plain_decode_s;
    c.plain_prefill_s = a->plain_prefill_s;
    return c;
}

double sim_fork_attention_s(const SimForkAttention *a, int n_prompt, int computed, int output) {
    if (a->n_layers <= 0) return 0.0;
    ForkKvCost c = cost_of(a, 1, 1);
    ForkKvRequest r = {.n_prompt = n_prompt, .max_tokens = output, .held = n_prompt - computed};
    return forkkv_cost_choose(&c, &r).penalty_s;
}

/* ---- auto mode's chooser ---- */

/* Versions 5 / 6: a context's choice moves when its margin clears this many steady penalties (forkkv_context_choice.h). */
#ifndef SIM_FORKCTX_HYSTERESIS
#define SIM_FORKCTX_HYSTERESIS 0.5
#endif

static size_t seen_slot(const SimAuto *a, uint64_t h) {
    size_t i = (size_t)(h ^ (h >> 29)) & (a->cap - 1);
    while (a->seen[i] && a->seen[i] != h) i = (i + 1) & (a->cap - 1);
    return i;
}

static bool seen_has(const SimAuto *a, uint64_t h) { return h && a->seen[seen_slot(a, h)] == h; }

/* The trace's distinct adapter names, each with the tenant it first came with. */
static int collect_adapters(SimAuto *a, const Trace *t) {
    if (!t) return 0;
    if (!(a->adapters = malloc(((size_t)t->n + 1) * sizeof *a->adapters)) ||
        !(a->adapter_tenants = malloc(((size_t)t->n + 1) * sizeof *a->adapter_tenants)))
        return -1;
    for (int i = 0; i < t->n; i++) {
        const TraceRequest *r = &t->reqs[i];
        if (!r->adapter[0]) continue;
        int k = 0;
        while (k < a->n_adapters && !(strcmp(a->adapters[k], r->adapter) == 0 && strcmp(a->adapter_tenants[k], r->tenant) == 0)) k++;
        if (k < a->n_adapters) continue;
        a->adapters[a->n_adapters] = r->adapter;
        a->adapter_tenants[a->n_adapters++] = r->tenant;
    }
    return 0;
}

int sim_auto_init(SimAuto *a, const SimForkAttention *attn, double token_s, int kv_dim, int rank, const Trace *t, BraidError *err) {
    memset(a, 0, sizeof *a);
    a->cost = cost_of(attn, kv_dim, rank);
    a->cost.token_s = token_s;
    a->cap = 1024;
    a->trace = t;
    if (!(a->seen = calloc(a->cap, sizeof *a->seen)) || collect_adapters(a, t) || block_presence_init(&a->presence, 1024) ||
        block_presence_init(&a->residual_presence, 1024)) {
        sim_auto_free(a);
        return braid_error_set(err, "sim: out of memory (auto chooser)");
    }
    return 0;
}

void sim_auto_on_event(void *ctx, const CacheEvent *ev) {
    SimAuto *a = ctx;
    if (block_presence_on_event(&a->presence, ev)) a->presence_oom = true;
}

void sim_auto_on_residual_event(void *ctx, const CacheEvent *ev) {
    SimAuto *a = ctx;
    if (block_presence_on_event(&a->residual_presence, ev)) a->presence_oom = true;
}

void sim_auto_free(SimAuto *a) {
    block_presence_free(&a->presence);
    block_presence_free(&a->residual_presence);
    if (a->contexts_ready) forkctx_free(&a->contexts);
    free(a->adapters);
    free(a->adapter_tenants);
    free(a->scratch);
    free(a->cache_h);
    free(a->tree_tokens);
    free(a->seen);
    memset(a, 0, sizeof *a);
}

int sim_auto_held_blocks(const SimAuto *a, const uint64_t *hashes, int n_blocks) {
    int n = 0;
    while (n < n_blocks && seen_has(a, hashes[n])) n++;
    return n;
}

/* The first blocks of r's prompt the base cache holds now in namespace (r's tenant, adapter) whose
 * replay keys are keys: the cache hashes the replay's tree tokens (the keys as tokens, or the token
 * ids), seeded by the namespace, so the keys are rehashed its way for the presence set. */
static int present_in(SimAuto *a, const BlockPresence *set, const TraceRequest *r, const char *adapter, const uint64_t *keys) {
    int n = r->n_blocks, per = a->tpb > 0 ? a->tpb : SIM_TOKENS_PER_BLOCK;
    if (n <= 0) return 0;
    if (n > a->cap_cache_h) {
        uint64_t *h = realloc(a->cache_h, (size_t)n * sizeof *h);
        if (h) a->cache_h = h;
        int32_t *t = h ? realloc(a->tree_tokens, (size_t)n * (per > a->bs ? per : a->bs) * sizeof *t) : NULL;
        if (!t) return 0; /* out of memory: nothing counted as present */
        a->tree_tokens = t;
        a->cap_cache_h = n;
    }
    if (per == SIM_TOKENS_PER_BLOCK) sim_hash_tokens(keys, n, a->tree_tokens);
    else memcpy(a->tree_tokens, r->tokens, (size_t)n * a->bs * sizeof *a->tree_tokens);
    content_hash_blocks(content_hash_namespace(r->tenant, adapter), a->tree_tokens, n, per, a->cache_h, NULL);
    return block_presence_prefix(set, a->cache_h, n);
}

static int present_blocks(SimAuto *a, const TraceRequest *r, const char *adapter, const uint64_t *keys) {
    return present_in(a, &a->presence, r, adapter, keys);
}

/* Other adapters' separate copies of r's prompt (same tenant): the longest prefix one of them
 * held (*longest, ever committed) and the sum of what they hold now (in memory), in blocks. */
static void other_copies(SimAuto *a, const TraceRequest *r, int *longest, int *sum) {
    *longest = *sum = 0;
    if (!r->tokens || r->n_blocks <= 0) return;
    if (r->n_blocks > a->cap_scratch) {
        uint64_t *s = realloc(a->scratch, (size_t)r->n_blocks * sizeof *s);
        if (!s) return; /* out of memory: no copies counted (the old choice) */
        a->scratch = s;
        a->cap_scratch = r->n_blocks;
    }
    for (int k = 0; k < a->n_adapters; k++) {
        if (strcmp(a->adapter_tenants[k], r->tenant) != 0 || strcmp(a->adapters[k], r->adapter) == 0) continue;
        content_hash_blocks(content_hash_namespace(r->tenant, a->adapters[k]), r->tokens, r->n_blocks, a->trace->block_size, a->scratch, NULL);
        int held = sim_auto_held_blocks(a, a->scratch, r->n_blocks);
        *sum += present_blocks(a, r, a->adapters[k], a->scratch); /* duplicates in memory now */
        if (held > *longest) *longest = held;
    }
}

/* Cost versions 5 / 6: the choice of r's context (1 fork, 0 separate), its read recorded; -1 when
 * it has none (no full block) or out of memory. q: the version-4 inputs. */
static int context_choice(SimAuto *a, const TraceRequest *r, const uint64_t *tenant_keys, int bs, const ForkKvRequest *q,
                          int own_before) {
    if (!a->contexts_ready) {
        if (forkctx_init(&a->contexts, SIM_FORKCTX_HYSTERESIS, a->cost_version == 6)) return -1;
        a->contexts_ready = true;
    }
    return forkctx_choose(&a->contexts, &a->cost, q, tenant_keys, r->n_blocks, bs, r->ns, own_before, a->pool_tokens);
}

bool sim_auto_choose(SimAuto *a, const TraceRequest *r, const uint64_t *tenant_keys, const uint64_t *own_keys, int bs) {
    int base = sim_auto_held_blocks(a, tenant_keys, r->n_blocks), own = sim_auto_held_blocks(a, own_keys, r->n_blocks);
    int others, copies, own_now = present_blocks(a, r, r->adapter, own_keys);
    other_copies(a, r, &others, &copies);
    int held = base > own ? base : own;
    if (others > held) held = others;
    ForkKvRequest q = {.n_prompt = r->prompt_tokens, .max_tokens = r->output_tokens, .held = held * bs, .base = base * bs,
                       .own = own_now * bs, .copies = copies * bs};
    if (a->cost_version >= 4) { /* as the server's decide: what the pools hold now (5, 6: the same inputs) */
        q.base = present_blocks(a, r, NULL, tenant_keys) * bs;
        q.residual = present_in(a, &a->residual_presence, r, r->adapter, tenant_keys) * bs;
        q.residual_known = true;
    }
    if (a->cost_version == 1 || a->cost_version == 3) { /* the first model: whatever a namespace held counts as shared, no copies */
        int first = base > own ? base : own;
        if (a->cost_version == 3 && others > first) first = others; /* 3: other adapters' copies too */
        q = (ForkKvRequest){.n_prompt = r->prompt_tokens, .max_tokens = r->output_tokens, .held = first * bs, .base = first * bs};
    }
    bool fork = forkkv_cost_choose(&a->cost, &q).shared;
    if (a->cost_version >= 5) {
        int by_context = context_choice(a, r, tenant_keys, bs, &q, own * bs);
        if (by_context >= 0) fork = by_context == 1; /* else (no context, out of memory) the per-request choice */
    }
    if (fork) a->forked_requests++;
    else a->separate_requests++;
    return fork;
}

void sim_auto_observe_separate(SimAuto *a, const uint64_t *own_keys, int n_blocks, int hit_blocks) {
    if (n_blocks <= 0) return;
    int evicted = 0;
    for (int b = hit_blocks; b < n_blocks; b++) evicted += seen_has(a, own_keys[b]);
    forkkv_cost_observe_regret(&a->cost, evicted, n_blocks);
}

static int seen_grow(SimAuto *a) {
    SimAuto bigger = *a;
    bigger.cap = a->cap * 2;
    bigger.n_seen = 0;
    if (!(bigger.seen = calloc(bigger.cap, sizeof *bigger.seen))) return -1;
    for (size_t i = 0; i < a->cap; i++)
        if (a->seen[i]) {
            bigger.seen[seen_slot(&bigger, a->seen[i])] = a->seen[i];
            bigger.n_seen++;
        }
    free(a->seen);
    *a = bigger;
    return 0;
}

int sim_auto_remember(SimAuto *a, const uint64_t *keys, int n_blocks) {
    for (int b = 0; b < n_blocks; b++) {
        if (!keys[b]) continue; /* 0 marks an empty slot; a zero hash is simply not remembered */
        if (2 * (a->n_seen + 1) > a->cap && seen_grow(a)) return -1;
        size_t i = seen_slot(a, keys[b]);
        if (a->seen[i] == keys[b]) continue;
        a->seen[i] = keys[b];
        a->n_seen++;
    }
    return 0;
}
