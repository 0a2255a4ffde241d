#include "cache/residual_cache.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"

int residual_cache_init(ResidualCache *rc, int n_blocks, int block_size, const EvictPolicy *policy, double (*clock)(void),
                        BraidError *err) {
    memset(rc, 0, sizeof *rc);
    if (n_blocks < 2 || block_size < 1)
        return braid_error_set(err, "residual cache: needs at least 2 blocks of at least 1 token (got %d of %d)", n_blocks,
                               block_size);
    KvCacheConfig cc = {.block_size = block_size, .device_blocks = n_blocks, .host_blocks = 0, .policy = policy, .clock = clock};
    if (kv_cache_init(&rc->tree, &cc, err)) return braid_error_wrap(err, "residual cache");
    rc->block_size = block_size;
    return 0;
}

void residual_cache_free(ResidualCache *rc) {
    if (rc->block_size > 0) kv_cache_free(&rc->tree);
    memset(rc, 0, sizeof *rc);
}

int residual_cache_identity(ResidualCache *rc, ResidualHold *h, const char *tenant, const char *adapter, BraidError *err) {
    if (h->has_identity) return 0;
    if (kv_cache_identity(&rc->tree, tenant, adapter, NULL, NULL, &h->identity, err)) return -1;
    h->has_identity = true;
    return 0;
}

int residual_cache_admit(ResidualCache *rc, ResidualHold *h, const int32_t *tokens, int n_tokens, BraidError *err) {
    KvCacheMatch m;
    h->n_blocks = 0;
    h->matched_tokens = 0;
    if (kv_cache_match(&rc->tree, &h->identity, tokens, n_tokens, &m, err)) return -1;
    if (braid_grow((void **)&h->blocks, &h->cap_blocks, m.device_blocks + m.host_blocks + 1, sizeof *h->blocks)) {
        kv_cache_release(&rc->tree, m.node, NULL, 0);
        return braid_error_set(err, "residual cache: out of memory");
    }
    int got = kv_cache_acquire(&rc->tree, &m, h->blocks, err);
    if (got < 0) {
        kv_cache_release(&rc->tree, m.node, NULL, 0);
        return -1;
    }
    h->locked = m.node;
    h->n_blocks = got;
    h->matched_tokens = got * rc->block_size;
    return 0;
}

int residual_cache_grow(ResidualCache *rc, ResidualHold *h, int n_tokens, BraidError *err) {
    int need = (n_tokens + rc->block_size - 1) / rc->block_size - h->n_blocks;
    if (need <= 0) return 0;
    if (braid_grow((void **)&h->blocks, &h->cap_blocks, h->n_blocks + need, sizeof *h->blocks))
        return braid_error_set(err, "residual cache: out of memory");
    if (kv_cache_reserve(&rc->tree, need, h->blocks + h->n_blocks)) return 1;
    h->n_blocks += need;
    return 0;
}

int residual_cache_commit(ResidualCache *rc, ResidualHold *h, const int32_t *tokens, int n_full, bool relock, BraidError *err) {
    if (n_full <= 0) return 0;
    if (n_full > h->n_blocks) n_full = h->n_blocks;
    return kv_cache_commit(&rc->tree, &h->identity, tokens, n_full, h->blocks, &h->locked, relock, err);
}

void residual_cache_release(ResidualCache *rc, ResidualHold *h) {
    if (h->locked || h->n_blocks > 0) kv_cache_release(&rc->tree, h->locked, h->blocks, h->n_blocks);
    h->locked = NULL;
    h->n_blocks = 0;
}

void residual_cache_hold_free(ResidualCache *rc, ResidualHold *h) {
    residual_cache_release(rc, h);
    if (h->has_identity) kv_cache_identity_release(&rc->tree, &h->identity);
    free(h->blocks);
    memset(h, 0, sizeof *h);
}

int residual_cache_in_use(const ResidualCache *rc) { return kv_cache_in_use(&rc->tree, CACHE_TIER_DEVICE); }
int residual_cache_cached(const ResidualCache *rc) { return kv_cache_cached(&rc->tree, CACHE_TIER_DEVICE); }
int residual_cache_total(const ResidualCache *rc) { return kv_cache_total(&rc->tree, CACHE_TIER_DEVICE); }
const KvCacheCounters *residual_cache_counters(const ResidualCache *rc) { return &rc->tree.counters; }
