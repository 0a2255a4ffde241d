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
 * Unified pool (residual_cache_unify; --lora-cache auto on a server, braid sim --residual-pool
 * unified): the residual tree keeps its radix tree and its block ids, but has no memory of its own.
 * Every residual block it holds or caches lives in a base block it borrowed from the base KvCache
 * (a "carrier": per_carrier = kv_dim / rank residual blocks each), so memory residuals do not use is
 * the base cache's; carriers are borrowed with kv_cache_reserve (the base evicts for them) and given
 * back as soon as a whole one is unused. Eviction is one order over both trees: the base cache asks
 * this tree before its own victims (KvCacheBorrower) and the lower victim goes first (LRU on one
 * clock: the trees' access ticks are kept equal). A residual never outlives its base: each residual
 * commit locks the base path of the same tokens ("pin", kept until the residual blocks leave), so a
 * base block is evicted only after every residual over it was. Partial hits (a residual cached, its
 * base recomputed) therefore no longer occur in this mode.
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
    uint64_t key;   /* the residual hash of the deepest block the pin covers (0: empty slot) */
    RadixNode *base; /* the base node locked for it */
    int depth;      /* blocks covered: the residual block `key` is block depth - 1 */
} ResidualPin;

typedef struct ResidualCache {
    KvCache tree;
    int block_size;
    /* Unified pool (residual_cache_unify); base NULL: a fixed pool of its own. */
    KvCache *base;
    int per_carrier;          /* residual blocks a base block holds */
    int32_t *carriers;        /* base blocks borrowed (held in the base pool) */
    int n_carriers, cap_carriers;
    ResidualPin *pins;        /* open addressing by key */
    int n_pins, cap_pins;
    KvCacheBorrower borrower;
    CacheEventFn user_event;  /* residual_cache_set_observer's */
    void *user_ctx;
    int oom;                  /* allocations that failed inside an event (pins not taken) */
} ResidualCache;

typedef struct {
    CacheIdentity identity; /* (tenant, adapter) in the residual tree */
    CacheIdentity base_identity; /* unified: (tenant) in the base cache, for the pins */
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
/* Makes rc's pool the unified one over base (see above): rc freshly initialised; its blocks are the
 * ids residuals may take (a server's residual arrays; braid sim gives base's blocks x per_carrier),
 * so its own LRU still evicts when they run out. base must outlive rc and lend to no one else. Sets rc as base's borrower and the tree's observer (use
 * residual_cache_set_observer for the tree's events). */
int residual_cache_unify(ResidualCache *rc, KvCache *base, int per_carrier, BraidError *err);
/* The residual tree's events go to fn (instead of kv_cache_set_observer on rc->tree). */
void residual_cache_set_observer(ResidualCache *rc, CacheEventFn fn, void *ctx);
/* Unified: base blocks borrowed now (held in the base pool, counted there as in use). 0 otherwise. */
int residual_cache_carriers(const ResidualCache *rc);
/* Unified: the pool's invariants: residual blocks (in use + cached) fit the carriers, no carrier is
 * wholly unused, and every cached or held residual block's base is on the device (pinned). 0 or -1
 * with err. */
int residual_cache_check(const ResidualCache *rc, BraidError *err);

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
