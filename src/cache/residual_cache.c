#include "cache/residual_cache.h"

#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
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

/* ---- unified pool: carriers ---- */

static int used_blocks(const ResidualCache *rc) {
    return kv_cache_in_use(&rc->tree, CACHE_TIER_DEVICE) + kv_cache_cached(&rc->tree, CACHE_TIER_DEVICE);
}

/* Gives back to the base every carrier no residual block needs; the count given back. */
static int trim_carriers(ResidualCache *rc) {
    int need = (used_blocks(rc) + rc->per_carrier - 1) / rc->per_carrier, extra = rc->n_carriers - need;
    if (extra <= 0) return 0;
    rc->n_carriers -= extra;
    kv_cache_release(rc->base, NULL, rc->carriers + rc->n_carriers, extra);
    return extra;
}

/* One logical clock for both trees' LRU ticks, so their victims compare. */
static void sync_ticks(ResidualCache *rc) {
    uint64_t t = rc->tree.tick > rc->base->tick ? rc->tree.tick : rc->base->tick;
    rc->tree.tick = rc->base->tick = t;
}

/* KvCacheBorrower: surplus carriers come before any victim (they are free memory). */
static bool borrower_victim(void *ctx, int *heap_class, double *key) {
    ResidualCache *rc = ctx;
    if (rc->n_carriers * rc->per_carrier - used_blocks(rc) >= rc->per_carrier) {
        *heap_class = -1;
        *key = 0;
        return true;
    }
    return kv_cache_victim(&rc->tree, heap_class, key);
}

static int borrower_reclaim(void *ctx) {
    ResidualCache *rc = ctx;
    int back = trim_carriers(rc);
    if (back > 0) return back;
    kv_cache_evict(&rc->tree, CACHE_TIER_DEVICE, 1);
    return trim_carriers(rc);
}

/* ---- unified pool: pins (a residual's base path stays locked while the residual is cached) ---- */

static ResidualPin *pin_slot(ResidualPin *pins, int cap, uint64_t key) {
    size_t i = (size_t)(key ^ (key >> 31)) & (size_t)(cap - 1);
    while (pins[i].key && pins[i].key != key) i = (i + 1) & (size_t)(cap - 1);
    return &pins[i];
}

static int pins_grow(ResidualCache *rc) {
    int cap = rc->cap_pins ? rc->cap_pins * 2 : 256;
    ResidualPin *bigger = calloc((size_t)cap, sizeof *bigger);
    if (!bigger) return -1;
    for (int i = 0; i < rc->cap_pins; i++)
        if (rc->pins[i].key) *pin_slot(bigger, cap, rc->pins[i].key) = rc->pins[i];
    free(rc->pins);
    rc->pins = bigger;
    rc->cap_pins = cap;
    return 0;
}

/* Removes the pin at p, keeping the probe chains of the others whole (backward-shift deletion). */
static void pin_delete(ResidualCache *rc, ResidualPin *p) {
    size_t mask = (size_t)rc->cap_pins - 1, i = (size_t)(p - rc->pins);
    rc->pins[i].key = 0;
    rc->n_pins--;
    for (size_t j = (i + 1) & mask; rc->pins[j].key; j = (j + 1) & mask) {
        ResidualPin moved = rc->pins[j];
        rc->pins[j].key = 0;
        *pin_slot(rc->pins, rc->cap_pins, moved.key) = moved;
    }
}

static int pin_add(ResidualCache *rc, uint64_t key, RadixNode *base_node, int depth) {
    if (!key) return 0;
    if (2 * (rc->n_pins + 1) > rc->cap_pins && pins_grow(rc)) return -1;
    ResidualPin *p = pin_slot(rc->pins, rc->cap_pins, key);
    if (p->key) return 0; /* already pinned */
    kv_cache_lock(rc->base, base_node);
    *p = (ResidualPin){.key = key, .base = base_node, .depth = depth};
    rc->n_pins++;
    return 0;
}

static int node_depth(const RadixNode *n) {
    int d = 0;
    for (; n && !radix_is_root(n); n = n->parent) d += n->n_blocks;
    return d;
}

/* The residual blocks hashes[0..n) left the tree: their pins go; where the node's parent stays,
 * its last block takes over the pin at its own depth (a shallower base path stays locked). */
static void unpin_removed(ResidualCache *rc, const CacheEvent *ev) {
    for (int j = 0; j < ev->n_blocks && rc->n_pins > 0; j++) {
        ResidualPin *p = pin_slot(rc->pins, rc->cap_pins, ev->hashes[j]);
        if (!p->key) continue;
        ResidualPin old = *p;
        pin_delete(rc, p);
        int parent_depth = old.depth - j - 1;
        if (parent_depth > 0 && ev->parent_hash) {
            RadixNode *up = old.base;
            while (!radix_is_root(up->parent) && node_depth(up->parent) >= parent_depth) up = up->parent;
            if (pin_add(rc, ev->parent_hash, up, parent_depth)) rc->oom++;
        }
        kv_cache_release(rc->base, old.base, NULL, 0);
    }
}

static void on_tree_event(void *ctx, const CacheEvent *ev) {
    ResidualCache *rc = ctx;
    if (rc->base && ev->kind == CACHE_EVENT_REMOVED && ev->tier == CACHE_TIER_DEVICE && !(ev->tiers_after & CACHE_ON_DEVICE))
        unpin_removed(rc, ev);
    if (rc->user_event) rc->user_event(rc->user_ctx, ev);
}

static void unpin_all(ResidualCache *rc) {
    for (int i = 0; i < rc->cap_pins; i++)
        if (rc->pins[i].key) kv_cache_release(rc->base, rc->pins[i].base, NULL, 0);
    free(rc->pins);
    rc->pins = NULL;
    rc->n_pins = rc->cap_pins = 0;
}

int residual_cache_unify(ResidualCache *rc, KvCache *base, int per_carrier, BraidError *err) {
    if (per_carrier < 1) return braid_error_set(err, "residual cache: a base block must hold at least one residual block");
    if (base->borrower) return braid_error_set(err, "residual cache: the base cache already lends its blocks");
    rc->base = base;
    rc->per_carrier = per_carrier;
    rc->borrower = (KvCacheBorrower){.victim = borrower_victim, .reclaim = borrower_reclaim, .ctx = rc};
    kv_cache_set_borrower(base, &rc->borrower);
    kv_cache_set_observer(&rc->tree, on_tree_event, rc);
    return 0;
}

void residual_cache_set_observer(ResidualCache *rc, CacheEventFn fn, void *ctx) {
    rc->user_event = fn;
    rc->user_ctx = ctx;
    if (!rc->base) kv_cache_set_observer(&rc->tree, fn, ctx);
}

int residual_cache_carriers(const ResidualCache *rc) { return rc->base ? rc->n_carriers : 0; }

void residual_cache_free(ResidualCache *rc) {
    if (rc->base) {
        kv_cache_set_borrower(rc->base, NULL);
        kv_cache_set_observer(&rc->tree, NULL, NULL);
        unpin_all(rc);
        if (rc->n_carriers > 0) kv_cache_release(rc->base, NULL, rc->carriers, rc->n_carriers);
        free(rc->carriers);
    }
    if (rc->block_size > 0) kv_cache_free(&rc->tree);
    memset(rc, 0, sizeof *rc);
}

int residual_cache_identity(ResidualCache *rc, ResidualHold *h, const char *tenant, const char *adapter, BraidError *err) {
    if (h->has_identity) return 0;
    if (kv_cache_identity(&rc->tree, tenant, adapter, NULL, NULL, &h->identity, err)) return -1;
    if (rc->base && kv_cache_identity(rc->base, tenant, NULL, NULL, NULL, &h->base_identity, err)) {
        kv_cache_identity_release(&rc->tree, &h->identity);
        return -1;
    }
    h->has_identity = true;
    return 0;
}

int residual_cache_admit(ResidualCache *rc, ResidualHold *h, const int32_t *tokens, int n_tokens, BraidError *err) {
    KvCacheMatch m;
    h->n_blocks = 0;
    h->matched_tokens = 0;
    if (rc->base) sync_ticks(rc);
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

/* Unified: borrows carriers until `need` more residual blocks fit. 0, 1 when the base cannot
 * supply them, -1 when out of memory. */
static int back_blocks(ResidualCache *rc, int need, BraidError *err) {
    sync_ticks(rc);
    int deficit = used_blocks(rc) + need - rc->n_carriers * rc->per_carrier;
    if (deficit <= 0) return 0;
    int k = (deficit + rc->per_carrier - 1) / rc->per_carrier;
    if (braid_grow((void **)&rc->carriers, &rc->cap_carriers, rc->n_carriers + k, sizeof *rc->carriers))
        return braid_error_set(err, "residual cache: out of memory");
    /* The base evicts for them in the one order, this tree's victims included (borrower_reclaim),
     * which may lower the deficit: ask again for what is still missing. */
    if (kv_cache_reserve(rc->base, k, rc->carriers + rc->n_carriers)) {
        deficit = used_blocks(rc) + need - rc->n_carriers * rc->per_carrier;
        k = deficit > 0 ? (deficit + rc->per_carrier - 1) / rc->per_carrier : 0;
        if (k > 0 && kv_cache_reserve(rc->base, k, rc->carriers + rc->n_carriers)) return 1;
    }
    rc->n_carriers += k;
    return 0;
}

int residual_cache_grow(ResidualCache *rc, ResidualHold *h, int n_tokens, BraidError *err) {
    int need = (n_tokens + rc->block_size - 1) / rc->block_size - h->n_blocks;
    if (need <= 0) return 0;
    if (braid_grow((void **)&h->blocks, &h->cap_blocks, h->n_blocks + need, sizeof *h->blocks))
        return braid_error_set(err, "residual cache: out of memory");
    if (rc->base) {
        int short_of = back_blocks(rc, need, err);
        if (short_of) return short_of;
    }
    if (kv_cache_reserve(&rc->tree, need, h->blocks + h->n_blocks)) {
        if (rc->base) trim_carriers(rc);
        return 1;
    }
    h->n_blocks += need;
    return 0;
}

/* Unified: locks the base path of tokens[0 .. n_full blocks) for the residual block that ends it
 * (the deepest one this commit inserted); the match's hit counters are not the requests'. */
static int pin_commit(ResidualCache *rc, ResidualHold *h, const int32_t *tokens, int n_full, uint64_t key, BraidError *err) {
    KvCacheCounters before = rc->base->counters;
    KvCacheMatch m;
    if (kv_cache_match(rc->base, &h->base_identity, tokens, n_full * rc->block_size + 1, &m, err)) return -1;
    rc->base->counters = before;
    int rc2 = radix_is_root(m.node) ? 0 : pin_add(rc, key, m.node, n_full); /* shallower than n_full: residual_cache_check says so */
    kv_cache_release(rc->base, m.node, NULL, 0);
    return rc2 ? braid_error_set(err, "residual cache: out of memory pinning a base path") : 0;
}

int residual_cache_commit(ResidualCache *rc, ResidualHold *h, const int32_t *tokens, int n_full, bool relock, BraidError *err) {
    if (n_full <= 0) return 0;
    if (n_full > h->n_blocks) n_full = h->n_blocks;
    uint64_t inserted = rc->tree.counters.inserted_blocks;
    if (kv_cache_commit(&rc->tree, &h->identity, tokens, n_full, h->blocks, &h->locked, relock, err)) return -1;
    if (!rc->base || rc->tree.counters.inserted_blocks == inserted) return 0;
    /* The deepest committed block's residual hash: the chain of the identity's seed over the tokens. */
    uint64_t *chained = malloc((size_t)n_full * sizeof *chained);
    if (!chained) return braid_error_set(err, "residual cache: out of memory");
    content_hash_blocks(h->identity.hash_seed, tokens, n_full, rc->block_size, chained, NULL);
    int r = pin_commit(rc, h, tokens, n_full, chained[n_full - 1], err);
    free(chained);
    return r;
}

void residual_cache_release(ResidualCache *rc, ResidualHold *h) {
    if (h->locked || h->n_blocks > 0) kv_cache_release(&rc->tree, h->locked, h->blocks, h->n_blocks);
    h->locked = NULL;
    h->n_blocks = 0;
    if (rc->base) trim_carriers(rc);
}

void residual_cache_hold_free(ResidualCache *rc, ResidualHold *h) {
    residual_cache_release(rc, h);
    if (h->has_identity) {
        kv_cache_identity_release(&rc->tree, &h->identity);
        if (rc->base) kv_cache_identity_release(rc->base, &h->base_identity);
    }
    free(h->blocks);
    memset(h, 0, sizeof *h);
}

int residual_cache_check(const ResidualCache *rc, BraidError *err) {
    if (kv_cache_check(&rc->tree, err)) return braid_error_wrap(err, "residual tree");
    if (!rc->base) return 0;
    int used = used_blocks(rc), room = rc->n_carriers * rc->per_carrier;
    if (used > room) return braid_error_set(err, "residual cache: %d residual blocks in %d carriers of %d", used, rc->n_carriers, rc->per_carrier);
    if (room - used >= rc->per_carrier)
        return braid_error_set(err, "residual cache: %d carriers for %d residual blocks (a whole one unused: leaked)", rc->n_carriers, used);
    if (rc->oom) return braid_error_set(err, "residual cache: %d pins were lost to out of memory", rc->oom);
    for (int i = 0; i < rc->cap_pins; i++) {
        const ResidualPin *p = &rc->pins[i];
        if (!p->key) continue;
        if (p->base->lock_ref < 1 || !(p->base->meta.tiers & CACHE_ON_DEVICE) || node_depth(p->base) < p->depth)
            return braid_error_set(err, "residual cache: a pin's base path (%d blocks) is not held on the device", p->depth);
    }
    return 0;
}

int residual_cache_in_use(const ResidualCache *rc) { return kv_cache_in_use(&rc->tree, CACHE_TIER_DEVICE); }
int residual_cache_cached(const ResidualCache *rc) { return kv_cache_cached(&rc->tree, CACHE_TIER_DEVICE); }
int residual_cache_total(const ResidualCache *rc) { return kv_cache_total(&rc->tree, CACHE_TIER_DEVICE); }
const KvCacheCounters *residual_cache_counters(const ResidualCache *rc) { return &rc->tree.counters; }
