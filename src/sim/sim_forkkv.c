#include "sim/sim_forkkv.h"

#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
#include "common/strmap.h"

int sim_lora_cache_parse(const char *name) {
    if (strcmp(name, "separate") == 0) return SIM_LORA_SEPARATE;
    if (strcmp(name, "shared") == 0) return SIM_LORA_SHARED;
    return -1;
}

const char *sim_lora_cache_name(SimLoraCache mode) { return mode == SIM_LORA_SHARED ? "shared" : "separate"; }

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
    if (mode == SIM_LORA_SHARED) return recompute_tenant_hashes(t, keys, err);
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
