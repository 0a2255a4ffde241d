#include "sim/sim_forkkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
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
    int base_in_use = kv_cache_in_use(base, CACHE_TIER_DEVICE), base_blocks = base_in_use + kv_cache_cached(base, CACHE_TIER_DEVICE);
    int res_in_use = residual ? residual_cache_in_use(&residual->cache) : 0;
    int res_blocks = residual ? res_in_use + residual_cache_cached(&residual->cache) : 0;
    peaks->base_blocks = max_int(peaks->base_blocks, base_blocks);
    peaks->base_in_use_blocks = max_int(peaks->base_in_use_blocks, base_in_use);
    peaks->residual_blocks = max_int(peaks->residual_blocks, res_blocks);
    peaks->residual_in_use_blocks = max_int(peaks->residual_in_use_blocks, res_in_use);
    double bytes = (double)peaks->block_size * (base_blocks * peaks->base_bytes_per_token + res_blocks * peaks->residual_bytes_per_token);
    if (bytes > peaks->kv_bytes) peaks->kv_bytes = bytes;
}

int sim_pools_check(const KvCache *base, const SimResidualPool *residual, bool idle, BraidError *err) {
    if (kv_cache_check(base, err)) return braid_error_wrap(err, "sim: base cache");
    if (residual && kv_cache_check(&residual->cache.tree, err)) return braid_error_wrap(err, "sim: residual cache");
    if (!idle) return 0;
    int base_in_use = kv_cache_in_use(base, CACHE_TIER_DEVICE) + kv_cache_in_use(base, CACHE_TIER_HOST);
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

static size_t seen_slot(const SimAuto *a, uint64_t h) {
    size_t i = (size_t)(h ^ (h >> 29)) & (a->cap - 1);
    while (a->seen[i] && a->seen[i] != h) i = (i + 1) & (a->cap - 1);
    return i;
}

static bool seen_has(const SimAuto *a, uint64_t h) { return h && a->seen[seen_slot(a, h)] == h; }

int sim_auto_init(SimAuto *a, const SimForkAttention *attn, double token_s, int kv_dim, int rank, BraidError *err) {
    memset(a, 0, sizeof *a);
    a->cost = cost_of(attn, kv_dim, rank);
    a->cost.token_s = token_s;
    a->cap = 1024;
    if (!(a->seen = calloc(a->cap, sizeof *a->seen))) return braid_error_set(err, "sim: out of memory (auto chooser)");
    return 0;
}

void sim_auto_free(SimAuto *a) {
    free(a->seen);
    memset(a, 0, sizeof *a);
}

int sim_auto_held_blocks(const SimAuto *a, const uint64_t *hashes, int n_blocks) {
    int n = 0;
    while (n < n_blocks && seen_has(a, hashes[n])) n++;
    return n;
}

bool sim_auto_choose(SimAuto *a, const TraceRequest *r, const uint64_t *tenant_keys, const uint64_t *own_keys, int bs) {
    int base = sim_auto_held_blocks(a, tenant_keys, r->n_blocks), own = sim_auto_held_blocks(a, own_keys, r->n_blocks);
    int held = (base > own ? base : own) * bs;
    ForkKvRequest q = {.n_prompt = r->prompt_tokens, .max_tokens = r->output_tokens, .held = held};
    bool fork = forkkv_cost_choose(&a->cost, &q).shared;
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
