/*
 * residual_cache.h — ForkKV's residual radix tree: the second tree of the DualRadixTree
 * (--lora-cache shared; paper 002 § 5.2).
 *
 * With a shared base cache, an adapted sequence's K/V are split in two (§ 5.1): the base part
 * (RoPE(x·W_k), x·W_v) lives in the instance's ordinary KvCache, keyed by (tenant, tokens) only, so
 * every adapter reads the same base blocks; the residual part (x·A_k and x·A_v, rank r, no RoPE)
 * lives here, in a pool of small blocks of its own, keyed by (tenant, adapter, tokens). The
 * 1-to-N base-to-residual mapping is by token path: the residual path of (adapter a, tokens T)
 * belongs to the base path of T, and N adapters on one context are N residual paths beside one
 * base path.
 *
 * Fork: a request of adapter a whose context the base tree holds inherits those base blocks
 * (matched and held in the KvCache) and holds, here, whatever of its own residual is cached; the
 * forward then computes from min(base match, residual match) and writes each half only where it
 * was missing. Decoupled eviction: this tree has its own pool and its own policy instance (LRU by
 * default), so residuals and base blocks are evicted independently; a residual whose base was
 * evicted is still matched (a partial hit: the base is recomputed, the residual reused). A base
 * block is never freed while a residual that needs it is live, because the only live residuals
 * are those of running requests, and a running request holds its base blocks too.
 *
 * A ResidualHold is one request's part: its residual identity (interned in this tree's own name
 * tables), its locked node, its residual block table. Callers: the scheduler and braid sim. Device
 * tier only (no host tier for residuals): an evicted residual is recomputed (its tokens become fork
 * tokens). A host tier would turn those forks into full hits, but it needs the residual pool in the
 * cache-op list (STORE / LOAD of residual blocks and a host mirror in both backends); a residual
 * block is kv_dim / rank times smaller than a base block (12x for SmolLM2-135M at rank 16), so the
 * device memory it would free is small. Not thread-safe.
 */
#ifndef BRAID_CACHE_RESIDUAL_CACHE_H
#define BRAID_CACHE_RESIDUAL_CACHE_H

#include <stdint.h>

#include "cache/kv_cache.h"
#include "common/error.h"

typedef struct {
    KvCache tree;
    int block_size;
} ResidualCache;

typedef struct {
    CacheIdentity identity; /* (tenant, adapter) in the residual tree */
    bool has_identity;
    RadixNode *locked;
    int32_t *blocks;        /* residual block table */
    int n_blocks, cap_blocks;
    int matched_tokens;     /* residual tokens found cached at the last admission */
} ResidualHold;

/* n_blocks includes the null block 0; policy NULL = LRU; clock NULL = the wall clock. */
int residual_cache_init(ResidualCache *rc, int n_blocks, int block_size, const EvictPolicy *policy, double (*clock)(void),
                        BraidError *err);
void residual_cache_free(ResidualCache *rc);

/* Interns (tenant, adapter) for h (once; kept until residual_cache_hold_free). */
int residual_cache_identity(ResidualCache *rc, ResidualHold *h, const char *tenant, const char *adapter, BraidError *err);
/* Matches and holds the longest cached residual prefix of tokens (never all of them); sets
 * h->matched_tokens. The hold must be empty (released). -1 only when out of memory. */
int residual_cache_admit(ResidualCache *rc, ResidualHold *h, const int32_t *tokens, int n_tokens, BraidError *err);
/* Grows h's table to cover n_tokens slots, evicting unheld residual nodes when short. Returns 0,
 * 1 when the pool cannot supply them (nothing taken), -1 when out of memory. */
int residual_cache_grow(ResidualCache *rc, ResidualHold *h, int n_tokens, BraidError *err);
/* The first n_full blocks of h's table (tokens[0 .. n_full*block_size)) enter the tree; with
 * relock h's lock moves to the node ending them. */
int residual_cache_commit(ResidualCache *rc, ResidualHold *h, const int32_t *tokens, int n_full, bool relock, BraidError *err);
/* Drops h's holds (blocks and lock); the identity stays. */
void residual_cache_release(ResidualCache *rc, ResidualHold *h);
/* Releases everything h holds, its identity included, and frees its table. */
void residual_cache_hold_free(ResidualCache *rc, ResidualHold *h);

int residual_cache_in_use(const ResidualCache *rc);
int residual_cache_cached(const ResidualCache *rc);
int residual_cache_total(const ResidualCache *rc);
const KvCacheCounters *residual_cache_counters(const ResidualCache *rc);

#endif
