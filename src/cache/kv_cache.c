#include "cache/kv_cache.h"

#include <assert.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
#include "cache/kv_cache_internal.h"
#include "cache/kv_hints.h"
#include "cache/kv_segments.h"
#include "common/grow.h"
#include "common/timeutil.h"

/* ---- eviction heaps: per tier, a min-heap of evictable nodes keyed by the policy's score ---- */

static bool heap_less(const RadixNode *a, const RadixNode *b, int tier) {
    if (a->heap_class[tier] != b->heap_class[tier]) return a->heap_class[tier] < b->heap_class[tier];
    if (a->heap_key[tier] != b->heap_key[tier]) return a->heap_key[tier] < b->heap_key[tier];
    return a->meta.last_access < b->meta.last_access; /* deterministic among equal scores */
}

static void heap_place(KvCacheHeap *h, int tier, int pos, RadixNode *n) {
    h->nodes[pos] = n;
    n->heap_pos[tier] = pos;
}

static void heap_sift_up(KvCacheHeap *h, int tier, int pos) {
    RadixNode *n = h->nodes[pos];
    while (pos > 0) {
        int parent = (pos - 1) / 2;
        if (!heap_less(n, h->nodes[parent], tier)) break;
        heap_place(h, tier, pos, h->nodes[parent]);
        pos = parent;
    }
    heap_place(h, tier, pos, n);
}

static void heap_sift_down(KvCacheHeap *h, int tier, int pos) {
    RadixNode *n = h->nodes[pos];
    for (;;) {
        int child = 2 * pos + 1;
        if (child >= h->n) break;
        if (child + 1 < h->n && heap_less(h->nodes[child + 1], h->nodes[child], tier)) child++;
        if (!heap_less(h->nodes[child], n, tier)) break;
        heap_place(h, tier, pos, h->nodes[child]);
        pos = child;
    }
    heap_place(h, tier, pos, n);
}

static void heap_remove(KvCacheHeap *h, int tier, RadixNode *n) {
    int pos = n->heap_pos[tier];
    if (pos < 0) return;
    n->heap_pos[tier] = -1;
    RadixNode *last = h->nodes[--h->n];
    if (pos == h->n) return;
    heap_place(h, tier, pos, last);
    heap_sift_up(h, tier, pos);
    heap_sift_down(h, tier, last->heap_pos[tier]);
}

/* ---- tier membership ---- */

static bool on_tier(const RadixNode *n, unsigned bit) { return (n->meta.tiers & bit) != 0; }

static bool has_device_child(const RadixNode *n) {
    for (int i = 0; i < n->n_children; i++)
        if (on_tier(n->children[i], CACHE_ON_DEVICE)) return true;
    return false;
}

/* Evicting from the device keeps the device set ancestor-closed: only nodes with no child there. */
static bool device_evictable(const RadixNode *n) {
    return !radix_is_root(n) && on_tier(n, CACHE_ON_DEVICE) && n->lock_ref == 0 && !n->meta.pinned && !has_device_child(n);
}

/* A host copy of a device node is redundant and can always go; a host-only node only as an
 * unlocked leaf (a locked one is about to be loaded). */
static bool host_evictable(const RadixNode *n) {
    if (radix_is_root(n) || !on_tier(n, CACHE_ON_HOST) || n->meta.pinned || n->meta.lend_refs) return false;
    return on_tier(n, CACHE_ON_DEVICE) || (n->lock_ref == 0 && n->n_children == 0);
}

/* The heap key: the policy's score, in a class of its own below every other node's when the node
 * is decayed (a client's DECAY outranks whatever the policy thinks the node is worth, under every
 * policy: the class is compared before the score, so no score offset of a policy can cross it;
 * among decayed nodes the policy's order holds). On the device, a node a
 * prefetch loaded that no request has used yet, and whose host copy is still there, comes next:
 * giving its blocks back costs no store and loses nothing (the host copy stays), so a prefetch only
 * ever borrows blocks that would otherwise be free and can never make a request demote (and the
 * host tier drop) what it would have kept without prefetching: PBKV's lower-bound argument (§4.3). */
static double node_key(const KvCache *c, const KvCacheTier *tier, int t, RadixNode *n) {
    double score = tier->policy->score(tier->state, n);
    n->heap_class[t] = n->meta.decayed ? 0 : 1;
    if (n->meta.decayed) return score;
    /* (aggressive prefetch, App. E, keeps the policy's score: it paid active cache for the room) */
    if (t == CACHE_TIER_DEVICE && n->meta.prefetched && on_tier(n, CACHE_ON_HOST) && c->prefetch_rho == 0) return score - 1e14;
    return score;
}

/* Puts n in, takes it out of, or re-keys it in each tier's heap, as its state now says. */
static void heap_refresh(KvCache *c, RadixNode *n) {
    for (int t = 0; t < CACHE_N_TIERS; t++) {
        KvCacheTier *tier = &c->tiers[t];
        bool want = t == CACHE_TIER_DEVICE ? device_evictable(n) : c->host_enabled && host_evictable(n);
        if (!want) {
            heap_remove(&tier->heap, t, n);
            continue;
        }
        n->heap_key[t] = node_key(c, tier, t, n);
        if (n->heap_pos[t] >= 0) {
            heap_sift_up(&tier->heap, t, n->heap_pos[t]);
            heap_sift_down(&tier->heap, t, n->heap_pos[t]);
            continue;
        }
        /* Capacity is reserved ahead (node_count_grow), so this push cannot fail. */
        assert(tier->heap.n < tier->heap.cap);
        heap_place(&tier->heap, t, tier->heap.n++, n);
        heap_sift_up(&tier->heap, t, n->heap_pos[t]);
    }
}

/* A node's tiers or children changed: it and its parent may enter or leave a heap. */
static void membership_changed(KvCache *c, RadixNode *n) {
    heap_refresh(c, n);
    if (n->parent && !radix_is_root(n->parent)) heap_refresh(c, n->parent);
}

static void heap_rebuild(KvCache *c, int t) {
    KvCacheTier *tier = &c->tiers[t];
    for (int i = 0; i < tier->heap.n; i++) tier->heap.nodes[i]->heap_key[t] = node_key(c, tier, t, tier->heap.nodes[i]);
    for (int i = tier->heap.n / 2 - 1; i >= 0; i--) heap_sift_down(&tier->heap, t, i);
}

/* Heaps hold at most every node; room for `more` nodes beyond today's count, made before a node
 * can appear, keeps heap_refresh infallible. */
static int node_count_grow(KvCache *c, int more) {
    for (int t = 0; t < CACHE_N_TIERS; t++) {
        KvCacheHeap *h = &c->tiers[t].heap;
        if (braid_grow((void **)&h->nodes, &h->cap, c->n_nodes + more + 1, sizeof *h->nodes)) return -1;
    }
    return 0;
}

/* ---- policy notifications ---- */

typedef void (*PolicyNodeFn)(void *state, const RadixNode *node);

static void notify(KvCache *c, size_t offset, const RadixNode *n) {
    for (int t = 0; t < CACHE_N_TIERS; t++) {
        PolicyNodeFn fn = *(const PolicyNodeFn *)((const char *)c->tiers[t].policy + offset);
        if (fn) fn(c->tiers[t].state, n);
    }
}
#define NOTIFY(c, field, n) notify((c), offsetof(EvictPolicy, field), (n))

static void notify_evict(KvCache *c, int t, const RadixNode *n) {
    if (c->tiers[t].policy->on_evict) c->tiers[t].policy->on_evict(c->tiers[t].state, n);
}

/* ---- events ---- */

static uint64_t parent_hash(const RadixNode *n) {
    const RadixNode *p = n->parent;
    return p && !radix_is_root(p) ? p->hashes[p->n_blocks - 1] : 0;
}

static void emit(KvCache *c, CacheEventKind kind, CacheTier tier, const char *reason, const RadixNode *n, const int32_t *tokens) {
    if (!c->on_event) return;
    CacheEvent ev = {.kind = kind, .tier = tier, .reason = reason, .n_blocks = n->n_blocks, .hashes = n->hashes,
                     .parent_hash = parent_hash(n), .tokens = tokens, .token_block = c->block_size, .tenant = n->meta.tenant,
                     .adapter = n->meta.adapter, .tiers_after = n->meta.tiers};
    c->on_event(c->event_ctx, &ev);
}

/* ---- locks, touches, uses ---- */

static void lock_path(KvCache *c, RadixNode *node) {
    for (RadixNode *n = node; n; n = n->parent)
        if (n->lock_ref++ == 0) heap_refresh(c, n);
}

static void unlock_path(KvCache *c, RadixNode *node) {
    for (RadixNode *n = node; n; n = n->parent) {
        assert(n->lock_ref > 0);
        if (--n->lock_ref == 0) {
            NOTIFY(c, on_release, n);
            heap_refresh(c, n);
        }
    }
}

/* ---- the workflow -> nodes index, and the lifetime of workflow ids ---- */

static KvCacheWorkflowNodes *workflow_nodes(KvCache *c, uint32_t workflow) {
    if ((int)workflow >= c->cap_workflows) {
        int old = c->cap_workflows;
        if (braid_grow((void **)&c->by_workflow, &c->cap_workflows, (int)workflow + 1, sizeof *c->by_workflow)) return NULL;
        memset(c->by_workflow + old, 0, (size_t)(c->cap_workflows - old) * sizeof *c->by_workflow);
    }
    return &c->by_workflow[workflow];
}

/* Nothing names wf any more: the policies forget it, its name goes and the id is handed out again. */
static void workflow_reclaim(KvCache *c, uint32_t wf) {
    for (int t = 0; t < CACHE_N_TIERS; t++)
        if (c->tiers[t].policy->on_workflow_forget) c->tiers[t].policy->on_workflow_forget(c->tiers[t].state, wf);
    free(c->by_workflow[wf].nodes);
    c->by_workflow[wf] = (KvCacheWorkflowNodes){0};
    cache_names_release(&c->names, CACHE_NAME_WORKFLOW, wf);
}

/* After wf's holders, nodes or end changed. Referred to: busy. Unreferenced and ended: reclaimed
 * now. Unreferenced, not ended: idle (its forecast kept for its next call), the least recently
 * idle reclaimed past the bound. */
static void workflow_settle(KvCache *c, uint32_t wf) {
    const KvCacheWorkflowNodes *l = &c->by_workflow[wf];
    if (l->holders > 0 || l->n > 0) {
        cache_names_mark_busy(&c->names, CACHE_NAME_WORKFLOW, wf);
        return;
    }
    if (l->ended) {
        workflow_reclaim(c, wf);
        return;
    }
    cache_names_mark_idle(&c->names, CACHE_NAME_WORKFLOW, wf);
    while (cache_names_idle(&c->names, CACHE_NAME_WORKFLOW) > c->max_idle_workflows)
        workflow_reclaim(c, cache_names_oldest_idle(&c->names, CACHE_NAME_WORKFLOW));
}

/* Lists n under use->workflow; false when out of memory or at the bound on uses (the caller then
 * does not keep the use). */
static bool index_add(KvCache *c, RadixNode *n, CacheNodeUse *use) {
    if (c->n_uses >= c->max_uses) {
        c->counters.uses_over_bound++;
        return false;
    }
    KvCacheWorkflowNodes *l = workflow_nodes(c, use->workflow);
    if (!l || braid_grow((void **)&l->nodes, &l->cap, l->n + 1, sizeof *l->nodes)) return false;
    use->index_pos = l->n;
    l->nodes[l->n++] = n;
    c->n_uses++;
    if (l->n == 1) cache_names_mark_busy(&c->names, CACHE_NAME_WORKFLOW, use->workflow);
    return true;
}

static CacheNodeUse *use_of(RadixNode *n, uint32_t workflow) {
    for (int i = 0; i < n->meta.n_uses; i++)
        if (n->meta.uses[i].workflow == workflow) return &n->meta.uses[i];
    return NULL;
}

/* Takes n's use out of its workflow's list; the last node gone may free the workflow's id (the
 * caller drops the use itself right after). */
static void index_remove(KvCache *c, const CacheNodeUse *use) {
    uint32_t wf = use->workflow;
    KvCacheWorkflowNodes *l = &c->by_workflow[wf];
    RadixNode *last = l->nodes[--l->n];
    c->n_uses--;
    if (use->index_pos != l->n) {
        l->nodes[use->index_pos] = last;
        use_of(last, wf)->index_pos = use->index_pos;
    }
    if (l->n == 0) workflow_settle(c, wf);
}

static void index_forget_node(KvCache *c, RadixNode *n) {
    for (int i = 0; i < n->meta.n_uses; i++) index_remove(c, &n->meta.uses[i]);
}

/* Records that the identity's workflow (and agent) used node n; the most recent workflow first.
 * Every active workflow is kept (the node's uses grow); an ended one (a request still in flight
 * when its workflow ended) is only counted in workflows_seen, since the end dropped its uses. At
 * the bound on all nodes' uses (max_uses) the node's least recent use gives way to the new one;
 * a node without uses then does not learn of the workflow (counted: uses_over_bound). */
static void note_use(KvCache *c, RadixNode *n, const CacheIdentity *id) {
    if (!id || id->workflow == 0) return;
    CacheNodeMeta *m = &n->meta;
    int i = 0;
    while (i < m->n_uses && m->uses[i].workflow != id->workflow) i++;
    if (i == m->n_uses) {
        if (c->by_workflow[id->workflow].ended) {
            m->workflows_seen++;
            return;
        }
        if (c->n_uses >= c->max_uses && m->n_uses > 0) { /* past the bound: the least recent gives way */
            c->counters.uses_over_bound++;
            index_remove(c, &m->uses[m->n_uses - 1]);
            i = --m->n_uses;
        }
        if (braid_grow((void **)&m->uses, &m->cap_uses, m->n_uses + 1, sizeof *m->uses)) return; /* out of memory: not learnt */
        CacheNodeUse fresh = {.workflow = id->workflow};
        if (!index_add(c, n, &fresh)) return; /* out of memory or at the bound: the node does not learn of it */
        m->workflows_seen++;
        m->uses[m->n_uses++] = fresh;
    }
    CacheNodeUse use = m->uses[i];
    memmove(m->uses + 1, m->uses, (size_t)i * sizeof *m->uses);
    if (id->agent) use.agent_mask |= 1ull << (id->agent % 64);
    m->uses[0] = use;
}

typedef struct {
    KvCache *c;
    const CacheIdentity *id;
    bool hit;
    /* commit only: the caller's table, to adopt into host-only nodes on the path */
    const int32_t *table;
    int pos;
    bool blocked; /* the walk stopped before a node it may not pass (not where the tree ends) */
} WalkCtx;

/* The caller's blocks before block `to` all hold K/V equal to a recompute. */
static bool caller_exact(const CacheIdentity *id, int to) { return !id->has_approx || to <= id->approx_from_block; }

/* A match passes a node marked approximate only for a request that accepts approximate K/V, or
 * one of the conversation whose splice made it. */
static bool match_enter(void *ctx, const RadixNode *child, int pos) {
    (void)pos;
    const WalkCtx *w = ctx;
    return kv_internal_visible(child, w->id);
}

/* A commit does not pass a host-only node of exact K/V with approximate blocks of its own: the
 * node could not adopt them, and a device node below a host-only one would break tier closure. */
static bool commit_enter(void *ctx, const RadixNode *child, int pos) {
    WalkCtx *w = ctx;
    bool ok = (child->meta.tiers & CACHE_ON_DEVICE) || child->meta.approximate || caller_exact(w->id, pos + child->n_blocks);
    if (!ok) w->blocked = true;
    return ok;
}

static void touch(KvCache *c, RadixNode *n, const CacheIdentity *id, bool hit);

static void walk_match_step(void *ctx, RadixNode *n) {
    WalkCtx *w = ctx;
    touch(w->c, n, w->id, w->hit);
}

static void on_split(void *ctx, RadixNode *upper, RadixNode *lower) {
    KvCache *c = ctx;
    /* The heaps were grown for one more node before the walk (node_count_grow). */
    c->n_nodes++;
    /* The upper half copied the node's uses; it gets index entries of its own (a use that cannot
     * be indexed is dropped from it). */
    CacheNodeMeta *m = &upper->meta;
    for (int i = 0; i < m->n_uses;) {
        if (index_add(c, upper, &m->uses[i])) {
            i++;
            continue;
        }
        memmove(m->uses + i, m->uses + i + 1, (size_t)(m->n_uses - i - 1) * sizeof *m->uses);
        m->n_uses--;
    }
    kv_hints_on_split(c, upper);
    heap_refresh(c, upper);
    heap_refresh(c, lower);
}

static void touch(KvCache *c, RadixNode *n, const CacheIdentity *id, bool hit) {
    n->meta.last_access = ++c->tick;
    note_use(c, n, id);
    if (hit) {
        n->meta.hit_count++;
        NOTIFY(c, on_access, n);
    }
    heap_refresh(c, n);
}

/* ---- leaving a tier ---- */

static void free_tier_blocks(KvCache *c, RadixNode *n, int t) {
    const int32_t *ids = t == CACHE_TIER_DEVICE ? n->blocks : n->host_blocks;
    if (t == CACHE_TIER_DEVICE && n->meta.prefetched) { /* prefetched, then evicted before any request used it */
        n->meta.prefetched = false;
        c->counters.prefetch_wasted_blocks += (uint64_t)n->n_blocks;
    }
    if (t == CACHE_TIER_DEVICE) kv_segments_forget_blocks(c, ids, n->n_blocks);
    for (int i = 0; i < n->n_blocks; i++) block_pool_set_in_tree(&c->tiers[t].pool, ids[i], false);
    n->meta.tiers &= (uint8_t)~(1u << t);
}

static void forget_node(KvCache *c, RadixNode *n) {
    kv_hints_forget_node(c, n);
    for (int t = 0; t < CACHE_N_TIERS; t++) heap_remove(&c->tiers[t].heap, t, n);
}

/* Removes an unlocked node and everything under it from the cache (every tier). */
static void drop_subtree(KvCache *c, RadixNode *n, const char *reason) {
    assert(n->lock_ref == 0);
    while (n->n_children > 0) drop_subtree(c, n->children[n->n_children - 1], reason);
    for (int t = 0; t < CACHE_N_TIERS; t++) {
        if (!on_tier(n, 1u << t)) continue;
        free_tier_blocks(c, n, t);
        if (t == CACHE_TIER_DEVICE) c->counters.device_evicted_blocks += (uint64_t)n->n_blocks;
        else c->counters.host_evicted_blocks += (uint64_t)n->n_blocks;
        notify_evict(c, t, n);
        emit(c, CACHE_EVENT_REMOVED, (CacheTier)t, reason, n, NULL);
    }
    c->counters.dropped_blocks += (uint64_t)n->n_blocks;
    forget_node(c, n);
    index_forget_node(c, n);
    RadixNode *parent = n->parent;
    radix_remove_leaf(&c->tree, n);
    c->n_nodes--;
    if (!radix_is_root(parent)) heap_refresh(c, parent);
}

/* Host eviction of one heap victim: a redundant host copy, or an unlocked host-only leaf. */
static void evict_host_node(KvCache *c, RadixNode *n) {
    if (!on_tier(n, CACHE_ON_DEVICE)) {
        drop_subtree(c, n, "host_evict");
        return;
    }
    free_tier_blocks(c, n, CACHE_TIER_HOST);
    c->counters.host_evicted_blocks += (uint64_t)n->n_blocks;
    notify_evict(c, CACHE_TIER_HOST, n);
    emit(c, CACHE_EVENT_REMOVED, CACHE_TIER_HOST, "host_evict", n, NULL);
    membership_changed(c, n);
}

/* Frees host blocks until n are free; false when the host heap runs dry first. */
static bool host_make_room(KvCache *c, int n) {
    KvCacheTier *host = &c->tiers[CACHE_TIER_HOST];
    while (host->pool.n_free < n && host->heap.n > 0) evict_host_node(c, host->heap.nodes[0]);
    return host->pool.n_free >= n;
}

/* Room for `more` operations, so emitting a node's operations is all or nothing. */
static bool ops_room(KvCache *c, int more) {
    return braid_grow((void **)&c->pending.ops, &c->pending.cap, c->pending.n + more, sizeof *c->pending.ops) == 0;
}

/* Copies a device node's blocks into new host blocks (STORE ops); false when it cannot. */
static bool store_to_host(KvCache *c, RadixNode *n) {
    BlockPool *host = &c->tiers[CACHE_TIER_HOST].pool;
    if (!c->host_enabled || n->n_blocks > block_pool_total(host) || !ops_room(c, n->n_blocks) || !host_make_room(c, n->n_blocks))
        return false;
    if (block_pool_alloc(host, n->n_blocks, n->host_blocks)) return false;
    for (int i = 0; i < n->n_blocks; i++) {
        block_pool_set_in_tree(host, n->host_blocks[i], true);
        block_pool_release(host, n->host_blocks[i]); /* owned by the tree alone */
        cache_ops_push(&c->pending, CACHE_OP_STORE, n->blocks[i], n->host_blocks[i], 0);
    }
    c->counters.stored_blocks += (uint64_t)n->n_blocks;
    n->meta.tiers |= CACHE_ON_HOST;
    emit(c, CACHE_EVENT_STORED, CACHE_TIER_HOST, "demote", n, NULL);
    return true;
}

/* Device eviction of one heap victim: demoted to the host tier when it can be, else dropped. */
static void evict_device_node(KvCache *c, RadixNode *n) {
    bool on_host = on_tier(n, CACHE_ON_HOST) || store_to_host(c, n);
    if (!on_host) {
        drop_subtree(c, n, "evict");
        return;
    }
    free_tier_blocks(c, n, CACHE_TIER_DEVICE);
    c->counters.device_evicted_blocks += (uint64_t)n->n_blocks;
    c->counters.demoted_blocks += (uint64_t)n->n_blocks;
    notify_evict(c, CACHE_TIER_DEVICE, n);
    emit(c, CACHE_EVENT_REMOVED, CACHE_TIER_DEVICE, "demote", n, NULL);
    membership_changed(c, n);
}

int kv_cache_evict(KvCache *c, CacheTier t, int n) {
    KvCacheTier *tier = &c->tiers[t];
    int before = tier->pool.n_free;
    while (tier->pool.n_free - before < n && tier->heap.n > 0) {
        if (t == CACHE_TIER_DEVICE) evict_device_node(c, tier->heap.nodes[0]);
        else evict_host_node(c, tier->heap.nodes[0]);
    }
    return tier->pool.n_free - before;
}

/* ---- the request protocol ---- */

bool kv_cache_victim(const KvCache *c, int *heap_class, double *key) {
    const KvCacheTier *tier = &c->tiers[CACHE_TIER_DEVICE];
    if (tier->heap.n == 0) return false;
    *heap_class = tier->heap.nodes[0]->heap_class[CACHE_TIER_DEVICE];
    *key = tier->heap.nodes[0]->heap_key[CACHE_TIER_DEVICE];
    return true;
}

void kv_cache_lock(KvCache *c, RadixNode *node) { lock_path(c, node); }

void kv_cache_set_borrower(KvCache *c, KvCacheBorrower *b) { c->borrower = b; }

/* Short of n free device blocks with a borrower: the lower of the two lowest victims goes, until
 * n are free or neither side has anything left to give. */
static void reclaim_with_borrower(KvCache *c, int n) {
    KvCacheTier *tier = &c->tiers[CACHE_TIER_DEVICE];
    KvCacheBorrower *b = c->borrower;
    while (tier->pool.n_free < n) {
        int their_class, own_class;
        double their_key, own_key;
        bool theirs = b->victim(b->ctx, &their_class, &their_key), own = kv_cache_victim(c, &own_class, &own_key);
        if (!theirs && !own) return;
        if (own && (!theirs || own_class < their_class || (own_class == their_class && own_key <= their_key)))
            evict_device_node(c, tier->heap.nodes[0]);
        else
            b->reclaim(b->ctx);
    }
}

int kv_cache_reserve(KvCache *c, int n, int32_t *out) {
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    if (n <= 0) return 0;
    if (dev->n_free < n && c->borrower) reclaim_with_borrower(c, n);
    if (dev->n_free < n) kv_cache_evict(c, CACHE_TIER_DEVICE, n - dev->n_free);
    if (dev->n_free < n) return n - dev->n_free;
    return block_pool_alloc(dev, n, out) ? n : 0;
}

static uint64_t namespace_of(const CacheIdentity *id) { return radix_namespace(id->tenant, id->adapter); }

int kv_cache_match(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, KvCacheMatch *m, BraidError *err) {
    int limit = n_tokens > 0 ? (n_tokens - 1) / c->block_size : 0;
    memset(m, 0, sizeof *m);
    RadixNode *root = radix_root(&c->tree, namespace_of(id));
    if (!root || node_count_grow(c, 1)) return braid_error_set(err, "kv cache: out of memory matching a prefix");
    WalkCtx w = {.c = c, .id = id, .hit = true};
    RadixNode *end;
    int matched = radix_walk_while(&c->tree, root, tokens, limit, &end, match_enter, walk_match_step, &w);
    if (matched < 0) return braid_error_set(err, "kv cache: out of memory matching a prefix");
    lock_path(c, end);
    m->node = end;
    m->approx_from_block = -1;
    for (RadixNode *n = end; !radix_is_root(n); n = n->parent) {
        if (on_tier(n, CACHE_ON_DEVICE)) m->device_blocks += n->n_blocks;
        else m->host_blocks += n->n_blocks;
        matched -= n->n_blocks; /* now the node's first block */
        if (n->meta.approximate) m->approx_from_block = matched;
    }
    return 0;
}

/* ---- queued requests' prefixes ---- */

typedef struct {
    KvCache *c;
    const CacheIdentity *id;
    int delta; /* +1 note, -1 unnote */
    int changed;
    const int32_t *tokens; /* the prompt, and its whole blocks a match may cover */
    int limit;
} WaitWalk;

static void wait_step(void *ctx, RadixNode *n);

/* The walk passes only nodes the prompt continues whole, so it never splits one (splits would
 * change the tree's shape, and with it LRU's victims): a node the prompt shares only a head of is
 * counted as it stands and the walk stops there. When the request's admission later splits that
 * node, the lower half keeps the count until its workflow ends or moves past it (a tail the call
 * did not read, kept a little longer). */
static bool wait_enter(void *ctx, const RadixNode *child, int pos) {
    WaitWalk *w = ctx;
    if (!kv_internal_visible(child, w->id)) return false;
    int bs = w->c->block_size;
    bool whole = pos + child->n_blocks <= w->limit &&
                 memcmp(child->tokens, w->tokens + (size_t)pos * bs, (size_t)child->n_blocks * bs * sizeof *w->tokens) == 0;
    if (!whole) wait_step(ctx, (RadixNode *)child);
    return whole;
}

static void wait_step(void *ctx, RadixNode *n) {
    WaitWalk *w = ctx;
    if (w->delta > 0) note_use(w->c, n, w->id); /* the use without a tick: recency is untouched */
    CacheNodeUse *u = use_of(n, w->id->workflow);
    if (!u) return; /* ended workflow, or at the bound on uses */
    if (w->delta > 0 && u->waiting < UINT16_MAX) u->waiting++;
    else if (w->delta < 0 && u->waiting > 0) u->waiting--;
    else return;
    w->changed++;
    heap_refresh(w->c, n);
}

static int walk_waiting(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, int delta) {
    if (id->workflow == 0) return 0;
    int limit = n_tokens > 0 ? (n_tokens - 1) / c->block_size : 0;
    RadixNode *root = radix_root(&c->tree, namespace_of(id));
    if (!root) return -1;
    WaitWalk w = {.c = c, .id = id, .delta = delta, .tokens = tokens, .limit = limit};
    RadixNode *end;
    if (radix_walk_while(&c->tree, root, tokens, limit, &end, wait_enter, wait_step, &w) < 0) return -1;
    return w.changed;
}

int kv_cache_note_waiting(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens) {
    return walk_waiting(c, id, tokens, n_tokens, +1);
}

int kv_cache_unnote_waiting(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens) {
    return walk_waiting(c, id, tokens, n_tokens, -1);
}

int kv_cache_lend(KvCache *c, const KvCacheMatch *m, uint8_t *tiers, int32_t *blocks) {
    int n = m->device_blocks + m->host_blocks, at = n;
    for (RadixNode *node = m->node; !radix_is_root(node); node = node->parent) {
        bool device = on_tier(node, CACHE_ON_DEVICE);
        at -= node->n_blocks;
        for (int i = 0; i < node->n_blocks; i++) {
            tiers[at + i] = device ? CACHE_TIER_DEVICE : CACHE_TIER_HOST;
            blocks[at + i] = device ? node->blocks[i] : node->host_blocks[i];
        }
        node->meta.lend_refs++;
        heap_refresh(c, node);
    }
    c->counters.lent_blocks += (uint64_t)n;
    return n;
}

void kv_cache_lend_end(KvCache *c, RadixNode *lock) {
    for (RadixNode *node = lock; node && !radix_is_root(node); node = node->parent) {
        if (node->meta.lend_refs > 0) node->meta.lend_refs--;
        heap_refresh(c, node);
    }
    kv_cache_release(c, lock, NULL, 0);
}

/* Loads a host-only node into n_blocks freshly reserved device blocks (held by the caller). */
/* A host-only node whose n->blocks were just allocated on the device (ops room made) becomes a
 * node on both tiers: the tree owns the blocks and LOADs fill them before the next forward. */
static void place_on_device(KvCache *c, RadixNode *n) {
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    for (int i = 0; i < n->n_blocks; i++) {
        block_pool_set_in_tree(dev, n->blocks[i], true);
        cache_ops_push(&c->pending, CACHE_OP_LOAD, n->host_blocks[i], n->blocks[i], 0);
    }
    n->meta.tiers |= CACHE_ON_DEVICE;
    emit(c, CACHE_EVENT_STORED, CACHE_TIER_DEVICE, "load", n, NULL);
    membership_changed(c, n);
}

/* Loads a host-only node for a request: its blocks are reserved (evicting if need be) and held by
 * the caller. */
static bool load_node(KvCache *c, RadixNode *n) {
    if (!ops_room(c, n->n_blocks) || kv_cache_reserve(c, n->n_blocks, n->blocks) != 0) return false;
    place_on_device(c, n);
    c->counters.loaded_blocks += (uint64_t)n->n_blocks;
    return true;
}

int kv_cache_acquire(KvCache *c, KvCacheMatch *m, int32_t *table, BraidError *err) {
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    int depth = 0;
    for (RadixNode *n = m->node; !radix_is_root(n); n = n->parent) depth++;
    if (braid_grow((void **)&c->path, &c->cap_path, depth + 1, sizeof *c->path))
        return braid_error_set(err, "kv cache: out of memory acquiring a prefix");
    int i = depth;
    for (RadixNode *n = m->node; !radix_is_root(n); n = n->parent) c->path[--i] = n;
    int pos = 0, loaded = 0, device = 0;
    RadixNode *last = m->node;
    while (!radix_is_root(last)) last = last->parent; /* the root until a node is usable */
    for (i = 0; i < depth; i++) {
        RadixNode *n = c->path[i];
        if (on_tier(n, CACHE_ON_DEVICE)) {
            for (int b = 0; b < n->n_blocks; b++) block_pool_hold(dev, n->blocks[b]);
            device += n->n_blocks;
            if (n->meta.prefetched) { /* a prefetch paid off: a device hit instead of a load-back */
                n->meta.prefetched = false;
                c->counters.prefetch_hit_blocks += (uint64_t)n->n_blocks;
            }
        } else if (load_node(c, n)) {
            loaded += n->n_blocks; /* reserve already made the caller a holder */
        } else {
            break;
        }
        memcpy(table + pos, n->blocks, (size_t)n->n_blocks * sizeof *table);
        pos += n->n_blocks;
        last = n;
    }
    if (last != m->node) { /* loads stopped short: the lock follows what is usable */
        lock_path(c, last);
        unlock_path(c, m->node);
        m->node = last;
    }
    m->device_blocks = device;
    m->host_blocks = loaded;
    c->counters.device_hit_blocks += (uint64_t)device;
    c->counters.host_hit_blocks += (uint64_t)loaded;
    return pos;
}

/* ---- prefetch ---- */

typedef struct KvCachePrefetchCand {
    double value;
    RadixNode *node;
} KvCachePrefetchCand;

typedef struct {
    KvCache *c;
    const EvictPolicy *policy;
    void *state;
    int n; /* candidates in the max-heap c->cands */
    bool oom;
} PrefetchCtx;

static void cand_push(PrefetchCtx *p, RadixNode *node) {
    KvCache *c = p->c;
    double v = p->policy->prefetch_value(p->state, node);
    if (!(v > 0)) return;
    if (braid_grow((void **)&c->cands, &c->cap_cands, p->n + 1, sizeof *c->cands)) {
        p->oom = true;
        return;
    }
    int pos = p->n++;
    while (pos > 0 && c->cands[(pos - 1) / 2].value < v) {
        c->cands[pos] = c->cands[(pos - 1) / 2];
        pos = (pos - 1) / 2;
    }
    c->cands[pos] = (KvCachePrefetchCand){v, node};
}

static RadixNode *cand_pop(PrefetchCtx *p) {
    KvCachePrefetchCand *h = p->c->cands;
    RadixNode *top = h[0].node;
    KvCachePrefetchCand last = h[--p->n];
    int pos = 0;
    for (;;) {
        int child = 2 * pos + 1;
        if (child >= p->n) break;
        if (child + 1 < p->n && h[child + 1].value > h[child].value) child++;
        if (h[child].value <= last.value) break;
        h[pos] = h[child];
        pos = child;
    }
    if (p->n > 0) h[pos] = last;
    return top;
}

/* Host-only children of device nodes (roots count as on the device) under n. */
static void collect_candidates(PrefetchCtx *p, RadixNode *n) {
    for (int i = 0; i < n->n_children; i++) {
        RadixNode *ch = n->children[i];
        if (on_tier(ch, CACHE_ON_DEVICE)) collect_candidates(p, ch);
        else cand_push(p, ch);
    }
}

/* Loads a host-only node into free device blocks owned by the tree alone; false when they are not
 * free (nothing is evicted for it) or out of memory. */
static bool prefetch_node(KvCache *c, RadixNode *n) {
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    if (!ops_room(c, n->n_blocks) || block_pool_alloc(dev, n->n_blocks, n->blocks)) return false;
    n->meta.prefetched = true;
    place_on_device(c, n);
    for (int i = 0; i < n->n_blocks; i++) block_pool_release(dev, n->blocks[i]); /* no request holds it */
    c->counters.prefetched_blocks += (uint64_t)n->n_blocks;
    return true;
}

/* The blocks the ranked candidates would load, greedily, at most max_blocks (the first pass of a
 * prefetch: how much room it wants). */
static int wanted_blocks(PrefetchCtx *p, int max_blocks) {
    int want = 0;
    while (p->n > 0 && want < max_blocks) {
        RadixNode *n = cand_pop(p);
        want += n->n_blocks < max_blocks - want ? n->n_blocks : max_blocks - want;
    }
    return want;
}

/* Evicts the policy's reclaimable device nodes (retired cache, the heap's first victims) until
 * `room` blocks beyond keep_free are free or none is left; they are demoted or dropped as any
 * eviction would. Returns the free blocks beyond keep_free. */
static int reclaim_for_prefetch(KvCache *c, int room, int keep_free) {
    KvCacheTier *dev = &c->tiers[CACHE_TIER_DEVICE];
    while (dev->pool.n_free - keep_free < room && dev->heap.n > 0 && dev->policy->reclaimable &&
           dev->policy->reclaimable(dev->state, dev->heap.nodes[0]))
        evict_device_node(c, dev->heap.nodes[0]);
    return dev->pool.n_free - keep_free;
}

/* Aggressive prefetch (App. E): past free blocks and retired cache, evicts the device heap's
 * lowest-scored nodes, active cache included, until `room` blocks beyond keep_free are free, the
 * heap is empty, or the next victim would take the active blocks displaced past rho x the device's
 * blocks. A prefetched node no request used yet is given back on the way (it has its host copy) and
 * does not count against rho. Returns the free blocks beyond keep_free. */
static int displace_for_prefetch(KvCache *c, int room, int keep_free) {
    KvCacheTier *dev = &c->tiers[CACHE_TIER_DEVICE];
    long limit = (long)(c->prefetch_rho * (double)(dev->pool.n_blocks - 1)), displaced = 0;
    while (dev->pool.n_free - keep_free < room && dev->heap.n > 0) {
        RadixNode *victim = dev->heap.nodes[0];
        bool active = !(victim->meta.prefetched && on_tier(victim, CACHE_ON_HOST));
        if (active && displaced + victim->n_blocks > limit) break;
        if (active) displaced += victim->n_blocks;
        evict_device_node(c, victim);
    }
    c->counters.prefetch_displaced_blocks += (uint64_t)displaced;
    return dev->pool.n_free - keep_free;
}

static void collect_all_candidates(PrefetchCtx *p) {
    for (int i = 0; i < p->c->tree.n_roots; i++) collect_candidates(p, p->c->tree.roots[i].root);
}

int kv_cache_prefetch(KvCache *c, int max_blocks, int keep_free, int *loaded_out) {
    KvCacheTier *dev = &c->tiers[CACHE_TIER_DEVICE];
    int loaded = 0;
    if (loaded_out) *loaded_out = 0;
    if (!c->host_enabled || !dev->policy->prefetch_value || max_blocks <= 0 || c->tiers[CACHE_TIER_HOST].pool.n_cached == 0) return 0;
    /* Pass 1: how much the candidates want; room for it from free blocks, then retired cache. The
     * candidates are collected again afterwards: reclaiming may demote or drop nodes. */
    PrefetchCtx p = {.c = c, .policy = dev->policy, .state = dev->state};
    collect_all_candidates(&p);
    if (p.oom) return -1;
    int want = wanted_blocks(&p, max_blocks);
    if (want == 0) return 0;
    int budget = reclaim_for_prefetch(c, want, keep_free);
    if (c->prefetch_rho > 0 && budget < want) budget = displace_for_prefetch(c, want, keep_free);
    if (budget > max_blocks) budget = max_blocks;
    if (budget <= 0) return 0;
    p = (PrefetchCtx){.c = c, .policy = dev->policy, .state = dev->state};
    collect_all_candidates(&p);
    while (p.n > 0 && loaded < budget) {
        RadixNode *n = cand_pop(&p);
        int room = budget - loaded;
        /* The budget's last blocks go to the node's first ones: it is split there, and its rest stays
         * on the host (a candidate of the next prefetch, its parent now on the device). */
        if (n->n_blocks > room && (node_count_grow(c, 1) || !(n = radix_split(&c->tree, n, room)))) {
            p.oom = true;
            break;
        }
        if (!prefetch_node(c, n)) {
            p.oom = true;
            break;
        }
        loaded += n->n_blocks;
        for (int i = 0; i < n->n_children; i++) cand_push(&p, n->children[i]); /* all host-only: n was */
    }
    if (loaded_out) *loaded_out = loaded;
    return p.oom ? -1 : 0;
}

/* An approximate node's host copy holds approximate K/V: it goes when the node turns exact. */
static void drop_host_copy(KvCache *c, RadixNode *n) {
    if (!on_tier(n, CACHE_ON_HOST)) return;
    free_tier_blocks(c, n, CACHE_TIER_HOST);
    c->counters.host_evicted_blocks += (uint64_t)n->n_blocks;
    notify_evict(c, CACHE_TIER_HOST, n);
    emit(c, CACHE_EVENT_REMOVED, CACHE_TIER_HOST, "replace", n, NULL);
}

/* An approximate device node the caller computed exactly: its blocks give way to the caller's. */
static void replace_approximate(KvCache *c, RadixNode *n, const int32_t *exact) {
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    kv_segments_forget_blocks(c, n->blocks, n->n_blocks);
    for (int i = 0; i < n->n_blocks; i++) {
        block_pool_set_in_tree(dev, n->blocks[i], false); /* freed now, or when its last holder lets go */
        n->blocks[i] = exact[i];
        block_pool_set_in_tree(dev, n->blocks[i], true);
    }
    drop_host_copy(c, n);
    n->meta.approximate = false;
    n->meta.approx_scope = 0;
    emit(c, CACHE_EVENT_STORED, CACHE_TIER_DEVICE, "replace", n, NULL);
    membership_changed(c, n);
}

static void walk_commit_step(void *ctx, RadixNode *n) {
    WalkCtx *w = ctx;
    KvCache *c = w->c;
    bool exact = caller_exact(w->id, w->pos + n->n_blocks);
    if (on_tier(n, CACHE_ON_DEVICE) && n->meta.approximate && exact && n->blocks[0] != w->table[w->pos])
        replace_approximate(c, n, w->table + w->pos);
    if (!on_tier(n, CACHE_ON_DEVICE)) {
        if (n->meta.approximate && exact) { /* it adopts exact blocks below: no approximate copy stays */
            drop_host_copy(c, n);
            n->meta.approximate = false;
            n->meta.approx_scope = 0;
        }
        /* Host-only: the caller computed these blocks itself, so the node adopts them. */
        BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
        for (int i = 0; i < n->n_blocks; i++) {
            n->blocks[i] = w->table[w->pos + i];
            assert(!dev->in_tree[n->blocks[i]]);
            block_pool_set_in_tree(dev, n->blocks[i], true);
        }
        n->meta.tiers |= CACHE_ON_DEVICE;
        emit(c, CACHE_EVENT_STORED, CACHE_TIER_DEVICE, "insert", n, n->tokens);
        membership_changed(c, n);
    }
    w->pos += n->n_blocks;
    touch(c, n, w->id, false);
}

/* Drops (workflow, agent) from a node's uses; true when it was there. */
static bool drop_use(KvCache *c, RadixNode *n, uint32_t workflow, uint64_t agent_bit) {
    CacheNodeMeta *m = &n->meta;
    for (int i = 0; i < m->n_uses; i++) {
        if (m->uses[i].workflow != workflow || !(m->uses[i].agent_mask & agent_bit)) continue;
        m->uses[i].agent_mask &= ~agent_bit;
        if (m->uses[i].agent_mask == 0) {
            index_remove(c, &m->uses[i]);
            memmove(m->uses + i, m->uses + i + 1, (size_t)(m->n_uses - i - 1) * sizeof *m->uses);
            m->n_uses--;
        }
        return true;
    }
    return false;
}

static void forget_use_below(KvCache *c, RadixNode *n, uint32_t workflow, uint64_t agent_bit) {
    if (!drop_use(c, n, workflow, agent_bit)) return; /* the workflow's agent never went further down here */
    heap_refresh(c, n);
    for (int i = 0; i < n->n_children; i++) forget_use_below(c, n->children[i], workflow, agent_bit);
}

/* A workflow's agent branched off at `branch` into `leaf`: what the same agent of the same workflow
 * left below the other branches (the tail of its previous call: the instruction, the old end of the
 * conversation) will not be read by it again, so that use goes from those nodes (policies that
 * weigh uses see them as dead for that workflow). Other workflows' and agents' uses stay. */
static void forget_passed_branches(KvCache *c, RadixNode *branch, RadixNode *leaf, const CacheIdentity *id) {
    if (id->workflow == 0 || id->agent == 0) return;
    uint64_t bit = 1ull << (id->agent % 64);
    for (int i = 0; i < branch->n_children; i++)
        if (branch->children[i] != leaf) forget_use_below(c, branch->children[i], id->workflow, bit);
}

static RadixNode *insert_leaf(KvCache *c, const CacheIdentity *id, RadixNode *parent, const int32_t *tokens, const int32_t *table, int k,
                              bool approximate) {
    RadixNode *leaf = radix_add_leaf(&c->tree, parent, tokens, k);
    if (!leaf) return NULL;
    c->n_nodes++;
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    memcpy(leaf->blocks, table, (size_t)k * sizeof *table);
    for (int i = 0; i < k; i++) block_pool_set_in_tree(dev, leaf->blocks[i], true);
    uint64_t seed = radix_is_root(parent) ? id->hash_seed : parent->hashes[parent->n_blocks - 1];
    content_hash_blocks(seed, tokens, k, c->block_size, leaf->hashes, NULL);
    leaf->meta.tenant = id->tenant;
    leaf->meta.adapter = id->adapter;
    leaf->meta.tiers = CACHE_ON_DEVICE;
    leaf->meta.content_hash = leaf->hashes[k - 1];
    leaf->meta.approximate = approximate;
    leaf->meta.approx_scope = approximate && id->scope_commits ? id->approx_scope : 0;
    c->counters.inserted_blocks += (uint64_t)k;
    touch(c, leaf, id, false);
    NOTIFY(c, on_insert, leaf);
    emit(c, CACHE_EVENT_STORED, CACHE_TIER_DEVICE, "insert", leaf, tokens);
    membership_changed(c, leaf);
    return leaf;
}

int kv_cache_commit(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_full, const int32_t *table, RadixNode **lock,
                    bool relock, BraidError *err) {
    if (n_full <= 0) return 0;
    RadixNode *root = radix_root(&c->tree, namespace_of(id)), *end;
    if (!root || node_count_grow(c, 3)) return braid_error_set(err, "kv cache: out of memory inserting blocks");
    WalkCtx w = {.c = c, .id = id, .table = table};
    int matched = radix_walk_while(&c->tree, root, tokens, n_full, &end, commit_enter, walk_commit_step, &w);
    if (matched < 0) return braid_error_set(err, "kv cache: out of memory inserting blocks");
    if (matched < n_full && !w.blocked) {
        int bs = c->block_size;
        RadixNode *branch = end, *first = NULL;
        /* Exact blocks and approximate ones go in separate nodes, the approximate ones below. */
        int split = id->has_approx && id->approx_from_block < n_full ? id->approx_from_block : n_full;
        if (split > matched) {
            first = end = insert_leaf(c, id, end, tokens + (size_t)matched * bs, table + matched, split - matched, false);
            if (!end) return braid_error_set(err, "kv cache: out of memory inserting blocks");
        }
        int from = split > matched ? split : matched;
        if (from < n_full) {
            RadixNode *leaf = insert_leaf(c, id, end, tokens + (size_t)from * bs, table + from, n_full - from, true);
            if (!leaf) return braid_error_set(err, "kv cache: out of memory inserting blocks");
            end = leaf;
            if (!first) first = leaf;
        }
        forget_passed_branches(c, branch, first, id);
    }
    kv_segments_register(c, id, tokens, n_full, end);
    if (relock && lock && end != *lock) {
        lock_path(c, end);
        if (*lock) unlock_path(c, *lock);
        *lock = end;
    }
    return 0;
}

void kv_cache_release(KvCache *c, RadixNode *lock, const int32_t *table, int n_blocks) {
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    for (int i = 0; i < n_blocks; i++) block_pool_release(dev, table[i]);
    if (lock) unlock_path(c, lock);
}

int kv_cache_take_ops(KvCache *c, CacheOpList *out) {
    if (cache_ops_append(out, &c->pending)) return -1;
    cache_ops_clear(&c->pending);
    return 0;
}

static void rescore(KvCache *c, int t, uint32_t workflow, CacheRescore what) {
    if (what == CACHE_RESCORE_ALL) {
        heap_rebuild(c, t);
    } else if (what == CACHE_RESCORE_WORKFLOW && (int)workflow < c->cap_workflows) {
        const KvCacheWorkflowNodes *l = &c->by_workflow[workflow];
        for (int i = 0; i < l->n; i++) heap_refresh(c, l->nodes[i]);
    }
}

/* An ended workflow is in no node's W_act any more: its uses go from every node that lists it
 * (each re-keyed), so a node counts exactly its active workflows and ended ones cost no memory. */
static void drop_workflow_uses(KvCache *c, uint32_t wf) {
    KvCacheWorkflowNodes *l = &c->by_workflow[wf];
    while (l->n > 0) {
        RadixNode *n = l->nodes[--l->n]; /* the list's last: no other entry moves */
        c->n_uses--;
        CacheNodeMeta *m = &n->meta;
        for (int i = 0; i < m->n_uses; i++)
            if (m->uses[i].workflow == wf) {
                memmove(m->uses + i, m->uses + i + 1, (size_t)(m->n_uses - i - 1) * sizeof *m->uses);
                m->n_uses--;
                break;
            }
        heap_refresh(c, n);
    }
}

void kv_cache_workflow_end(KvCache *c, const char *workflow) {
    uint32_t wf = cache_names_find(&c->names, CACHE_NAME_WORKFLOW, workflow);
    if (wf == 0 || (int)wf >= c->cap_workflows) return;
    bool rebuild[CACHE_N_TIERS] = {false};
    for (int t = 0; t < CACHE_N_TIERS; t++)
        if (c->tiers[t].policy->on_workflow_end) rebuild[t] = c->tiers[t].policy->on_workflow_end(c->tiers[t].state, wf) == CACHE_RESCORE_ALL;
    drop_workflow_uses(c, wf); /* re-keys the workflow's nodes: CACHE_RESCORE_WORKFLOW done */
    for (int t = 0; t < CACHE_N_TIERS; t++)
        if (rebuild[t]) heap_rebuild(c, t);
    c->by_workflow[wf].ended = true;
    workflow_settle(c, wf);
}

/* An agent's id (interning it), made the most recently used; past the bound the least recently
 * used agent name goes (its id is recycled). -1 when out of memory. */
static int64_t intern_agent(KvCache *c, const char *agent) {
    int64_t a = cache_names_intern(&c->names, CACHE_NAME_AGENT, agent);
    if (a <= 0) return a;
    cache_names_mark_idle(&c->names, CACHE_NAME_AGENT, (uint32_t)a);
    while (cache_names_live(&c->names, CACHE_NAME_AGENT) > KV_CACHE_MAX_AGENT_NAMES)
        cache_names_release(&c->names, CACHE_NAME_AGENT, cache_names_oldest_idle(&c->names, CACHE_NAME_AGENT));
    return a;
}

/* A workflow's id with its entry in by_workflow (a forecast or a new call revives an ended
 * workflow); 0 for none, -1 when out of memory. */
static int64_t intern_workflow(KvCache *c, const char *workflow) {
    int64_t wf = cache_names_intern(&c->names, CACHE_NAME_WORKFLOW, workflow);
    if (wf <= 0) return wf;
    KvCacheWorkflowNodes *l = workflow_nodes(c, (uint32_t)wf);
    if (!l) { /* every interned id has an entry, so this name is new: it goes again */
        cache_names_release(&c->names, CACHE_NAME_WORKFLOW, (uint32_t)wf);
        return -1;
    }
    l->ended = false;
    return wf;
}

static int predict_with_ids(KvCache *c, uint32_t wf, const char *current_agent, int k, int n_agents, const char *const *agents,
                            const float *prob, uint32_t *ids) {
    int64_t cur = intern_agent(c, current_agent);
    if (cur < 0) return -1;
    for (int i = 0; i < n_agents; i++) {
        int64_t a = intern_agent(c, agents[i]);
        if (a < 0) return -1;
        ids[i] = (uint32_t)a;
    }
    CachePrediction p = {.workflow = wf, .current_agent = (uint32_t)cur, .k = k, .n_agents = n_agents, .agents = ids, .prob = prob};
    for (int t = 0; t < CACHE_N_TIERS; t++)
        if (c->tiers[t].policy->on_prediction) rescore(c, t, p.workflow, c->tiers[t].policy->on_prediction(c->tiers[t].state, &p));
    return 0;
}

int kv_cache_predict(KvCache *c, const char *workflow, const char *current_agent, int k, int n_agents, const char *const *agents,
                     const float *prob, BraidError *err) {
    int64_t wf = intern_workflow(c, workflow);
    if (wf < 0) return braid_error_set(err, "kv cache: out of memory taking a prediction");
    if (wf == 0) return 0;
    uint32_t *ids = malloc((size_t)(n_agents > 0 ? n_agents : 1) * sizeof *ids);
    int rc = ids ? predict_with_ids(c, (uint32_t)wf, current_agent, k, n_agents, agents, prob, ids) : -1;
    free(ids);
    workflow_settle(c, (uint32_t)wf); /* a forecast for a workflow nothing else names: idle */
    return rc ? braid_error_set(err, "kv cache: out of memory taking a prediction") : 0;
}

void kv_cache_step(KvCache *c, double now) {
    kv_hints_expire(c, now);
    for (int t = 0; t < CACHE_N_TIERS; t++)
        if (c->tiers[t].policy->on_step && c->tiers[t].policy->on_step(c->tiers[t].state, now)) heap_rebuild(c, t);
}

/* ---- identity ---- */

int kv_cache_identity(KvCache *c, const char *tenant, const char *adapter, const char *workflow, const char *agent, CacheIdentity *id,
                      BraidError *err) {
    int64_t t = cache_names_intern(&c->names, CACHE_NAME_TENANT, tenant), a = cache_names_intern(&c->names, CACHE_NAME_ADAPTER, adapter);
    int64_t ag = intern_agent(c, agent), wf = t < 0 || a < 0 || ag < 0 ? -1 : intern_workflow(c, workflow);
    if (wf < 0) return braid_error_set(err, "kv cache: out of memory interning a request's names");
    if (wf > 0) {
        c->by_workflow[wf].holders++;
        cache_names_mark_busy(&c->names, CACHE_NAME_WORKFLOW, (uint32_t)wf);
    }
    *id = (CacheIdentity){.tenant = (uint32_t)t, .adapter = (uint32_t)a, .workflow = (uint32_t)wf, .agent = (uint32_t)ag,
                          .hash_seed = content_hash_namespace(tenant, adapter)};
    return 0;
}

void kv_cache_identity_release(KvCache *c, const CacheIdentity *id) {
    if (id->workflow == 0 || (int)id->workflow >= c->cap_workflows) return;
    KvCacheWorkflowNodes *l = &c->by_workflow[id->workflow];
    assert(l->holders > 0);
    if (l->holders > 0) l->holders--;
    workflow_settle(c, id->workflow);
}

int kv_cache_workflows_live(const KvCache *c) { return cache_names_live(&c->names, CACHE_NAME_WORKFLOW); }
int kv_cache_workflows_max_id(const KvCache *c) { return cache_names_max_id(&c->names, CACHE_NAME_WORKFLOW); }

const char *kv_cache_name(const KvCache *c, CacheNameKind kind, uint32_t id) { return cache_names_get(&c->names, kind, id); }

/* ---- set-up ---- */

int kv_cache_init(KvCache *c, const KvCacheConfig *cfg, BraidError *err) {
    memset(c, 0, sizeof *c);
    c->block_size = cfg->block_size;
    c->max_idle_workflows = cfg->max_idle_workflows > 0 ? cfg->max_idle_workflows : KV_CACHE_MAX_IDLE_WORKFLOWS;
    long blocks = (long)(cfg->device_blocks > 0 ? cfg->device_blocks : 0) + (cfg->host_blocks > 1 ? cfg->host_blocks : 0);
    c->max_uses = cfg->max_node_uses > 0 ? cfg->max_node_uses
                                         : (blocks * KV_CACHE_USES_PER_BLOCK > KV_CACHE_MIN_USES ? blocks * KV_CACHE_USES_PER_BLOCK : KV_CACHE_MIN_USES);
    c->clock = cfg->clock ? cfg->clock : braid_now_seconds;
    c->host_enabled = cfg->host_blocks > 1;
    int sizes[CACHE_N_TIERS] = {cfg->device_blocks, c->host_enabled ? cfg->host_blocks : 1};
    const EvictPolicy *policy = cfg->policy ? cfg->policy : &evict_policy_lru;
    if (cfg->device_blocks < 2)
        return braid_error_set(err, "kv cache: need at least 2 device blocks (one is the null block), got %d", cfg->device_blocks);
    if (!(cfg->prefetch_rho >= 0 && cfg->prefetch_rho <= 1))
        return braid_error_set(err, "kv cache: prefetch rho %g is outside [0, 1]", cfg->prefetch_rho);
    c->prefetch_rho = cfg->prefetch_rho;
    if (radix_init(&c->tree, cfg->block_size, err)) return -1;
    c->tree.on_split = on_split;
    c->tree.split_ctx = c;
    if (cache_names_init(&c->names)) {
        kv_cache_free(c);
        return braid_error_set(err, "kv cache: out of memory");
    }
    for (int t = 0; t < CACHE_N_TIERS; t++) {
        KvCacheTier *tier = &c->tiers[t];
        tier->policy = policy;
        tier->state = cfg->policy_state;
        if (block_pool_init(&tier->pool, sizes[t], err)) {
            kv_cache_free(c);
            return -1;
        }
        if (policy->create) {
            if (policy->create(&tier->state, (CacheTier)t, &cfg->policy_options, err)) {
                kv_cache_free(c);
                return -1;
            }
            tier->owns_state = true;
        }
    }
    if (kv_segments_init(c, cfg, err)) {
        kv_cache_free(c);
        return -1;
    }
    return 0;
}

void kv_cache_set_observer(KvCache *c, CacheEventFn fn, void *ctx) {
    c->on_event = fn;
    c->event_ctx = ctx;
}

void kv_cache_free(KvCache *c) {
    if (c->on_event) {
        CacheEvent ev = {.kind = CACHE_EVENT_CLEARED, .reason = "clear"};
        c->on_event(c->event_ctx, &ev);
    }
    radix_free(&c->tree, NULL, NULL);
    for (int t = 0; t < CACHE_N_TIERS; t++) {
        KvCacheTier *tier = &c->tiers[t];
        if (tier->owns_state && tier->policy->destroy) tier->policy->destroy(tier->state);
        free(tier->heap.nodes);
        if (tier->pool.holders) block_pool_free(&tier->pool);
    }
    cache_names_free(&c->names);
    cache_ops_free(&c->pending);
    free(c->path);
    for (int w = 0; w < c->cap_workflows; w++) free(c->by_workflow[w].nodes);
    free(c->by_workflow);
    free(c->cands);
    kv_segments_free(c);
    kv_hints_free(c);
    memset(c, 0, sizeof *c);
}

/* ---- accounting ---- */

int kv_cache_total(const KvCache *c, CacheTier t) { return block_pool_total(&c->tiers[t].pool); }
int kv_cache_free_blocks(const KvCache *c, CacheTier t) { return c->tiers[t].pool.n_free; }
int kv_cache_in_use(const KvCache *c, CacheTier t) { return c->tiers[t].pool.n_in_use; }
int kv_cache_cached(const KvCache *c, CacheTier t) { return c->tiers[t].pool.n_cached; }

/* ---- consistency check ---- */

typedef struct {
    uint8_t *seen[CACHE_N_TIERS];
    int owned[CACHE_N_TIERS];
    long uses; /* workflow uses on nodes: the index must hold exactly as many entries */
} CheckState;

static int check_uses(const KvCache *c, const RadixNode *n, CheckState *st, BraidError *err) {
    for (int i = 0; i < n->meta.n_uses; i++) {
        const CacheNodeUse *u = &n->meta.uses[i];
        const KvCacheWorkflowNodes *l = (int)u->workflow < c->cap_workflows ? &c->by_workflow[u->workflow] : NULL;
        if (!l || u->index_pos < 0 || u->index_pos >= l->n || l->nodes[u->index_pos] != n)
            return braid_error_set(err, "kv cache: workflow %u's node index does not list a node that uses it", u->workflow);
        for (int j = 0; j < i; j++)
            if (n->meta.uses[j].workflow == u->workflow) return braid_error_set(err, "kv cache: a node lists workflow %u twice", u->workflow);
    }
    st->uses += n->meta.n_uses;
    return 0;
}

static int check_blocks(const KvCache *c, const RadixNode *n, int t, CheckState *st, BraidError *err) {
    const BlockPool *pool = &c->tiers[t].pool;
    const int32_t *ids = t == CACHE_TIER_DEVICE ? n->blocks : n->host_blocks;
    for (int i = 0; i < n->n_blocks; i++) {
        int32_t b = ids[i];
        if (b <= 0 || b >= pool->n_blocks) return braid_error_set(err, "kv cache: tier %d node holds invalid block %d", t, b);
        if (st->seen[t][b]++) return braid_error_set(err, "kv cache: tier %d block %d appears twice in the tree", t, b);
        if (!pool->in_tree[b]) return braid_error_set(err, "kv cache: tier %d block %d in the tree is not marked as owned", t, b);
    }
    st->owned[t] += n->n_blocks;
    return 0;
}

static int check_heap_member(const KvCache *c, const RadixNode *n, int t, bool want, BraidError *err) {
    const KvCacheHeap *h = &c->tiers[t].heap;
    int pos = n->heap_pos[t];
    if ((pos >= 0) != want) return braid_error_set(err, "kv cache: tier %d heap membership wrong for a node (want %d)", t, want);
    if (pos >= 0 && (pos >= h->n || h->nodes[pos] != n)) return braid_error_set(err, "kv cache: tier %d heap index mismatch", t);
    return 0;
}

static int check_node(const KvCache *c, const RadixNode *n, CheckState *st, BraidError *err) {
    int child_locks = 0;
    if (!radix_is_root(n)) {
        if (n->n_blocks < 1) return braid_error_set(err, "kv cache: empty non-root node");
        if (n->meta.tiers == 0) return braid_error_set(err, "kv cache: node on no tier");
        if (on_tier(n, CACHE_ON_DEVICE) && !radix_is_root(n->parent) && !on_tier(n->parent, CACHE_ON_DEVICE))
            return braid_error_set(err, "kv cache: device node under a host-only parent (tier closure broken)");
        if (n->meta.prefetched && !on_tier(n, CACHE_ON_DEVICE)) return braid_error_set(err, "kv cache: prefetched node not on the device");
        for (int t = 0; t < CACHE_N_TIERS; t++)
            if (on_tier(n, 1u << t) && check_blocks(c, n, t, st, err)) return -1;
        if (check_uses(c, n, st, err)) return -1;
    }
    for (int i = 0; i < n->n_children; i++) {
        const RadixNode *ch = n->children[i];
        if (ch->parent != n) return braid_error_set(err, "kv cache: broken parent link");
        child_locks += ch->lock_ref;
        if (check_node(c, ch, st, err)) return -1;
    }
    if (n->lock_ref < child_locks) return braid_error_set(err, "kv cache: lock count %d below its children's %d", n->lock_ref, child_locks);
    if (check_heap_member(c, n, CACHE_TIER_DEVICE, device_evictable(n), err) ||
        check_heap_member(c, n, CACHE_TIER_HOST, c->host_enabled && host_evictable(n), err))
        return -1;
    return 0;
}

static int check_heap_order(const KvCache *c, int t, BraidError *err) {
    const KvCacheHeap *h = &c->tiers[t].heap;
    for (int i = 1; i < h->n; i++)
        if (heap_less(h->nodes[i], h->nodes[(i - 1) / 2], t)) return braid_error_set(err, "kv cache: tier %d heap out of order at %d", t, i);
    return 0;
}

/* A referenced workflow id still names its workflow; an ended one nothing refers to is gone. */
static int check_workflow_id(const KvCache *c, uint32_t w, BraidError *err) {
    const KvCacheWorkflowNodes *l = &c->by_workflow[w];
    if (l->ended && l->n > 0) return braid_error_set(err, "kv cache: ended workflow %u still listed as a use of %d nodes", w, l->n);
    bool live = *cache_names_get(&c->names, CACHE_NAME_WORKFLOW, w) != '\0', referred = l->holders > 0 || l->n > 0;
    if (referred && !live) return braid_error_set(err, "kv cache: workflow id %u reclaimed while %d nodes and %d requests name it", w, l->n, l->holders);
    if (live && l->ended && !referred) return braid_error_set(err, "kv cache: workflow id %u ended and unreferenced but not reclaimed", w);
    return 0;
}

int kv_cache_check(const KvCache *c, BraidError *err) {
    CheckState st = {0};
    int rc = 0;
    for (int t = 0; t < CACHE_N_TIERS; t++)
        if (!(st.seen[t] = calloc((size_t)c->tiers[t].pool.n_blocks, 1))) rc = braid_error_set(err, "kv cache: out of memory");
    for (int i = 0; rc == 0 && i < c->tree.n_roots; i++) rc = check_node(c, c->tree.roots[i].root, &st, err);
    for (int t = 0; rc == 0 && t < CACHE_N_TIERS; t++) {
        const BlockPool *pool = &c->tiers[t].pool;
        for (int b = 1; rc == 0 && b < pool->n_blocks; b++)
            if (pool->in_tree[b] && !st.seen[t][b]) rc = braid_error_set(err, "kv cache: tier %d block %d owned but in no node", t, b);
        if (rc == 0) rc = check_heap_order(c, t, err);
        if (rc == 0) rc = block_pool_check(pool, err);
    }
    long indexed = 0;
    for (int w = 0; w < c->cap_workflows; w++) indexed += c->by_workflow[w].n;
    if (rc == 0 && indexed != c->n_uses) rc = braid_error_set(err, "kv cache: %ld workflow index entries, %ld uses counted", indexed, c->n_uses);
    if (rc == 0 && c->n_uses > c->max_uses) rc = braid_error_set(err, "kv cache: %ld uses past the bound %ld", c->n_uses, c->max_uses);
    for (int w = 1; rc == 0 && w < c->cap_workflows; w++) rc = check_workflow_id(c, (uint32_t)w, err);
    if (rc == 0 && indexed != st.uses) rc = braid_error_set(err, "kv cache: %ld workflow index entries for %ld uses", indexed, st.uses);
    if (rc == 0 && c->tiers[CACHE_TIER_HOST].pool.n_in_use != 0)
        rc = braid_error_set(err, "kv cache: %d host blocks held by requests", c->tiers[CACHE_TIER_HOST].pool.n_in_use);
    for (int t = 0; t < CACHE_N_TIERS; t++) free(st.seen[t]);
    return rc;
}

/* ---- internal entry points for kv_hints.c / kv_segments.c (kv_cache_internal.h) ---- */

void kv_internal_refresh(KvCache *c, RadixNode *n) { heap_refresh(c, n); }
void kv_internal_drop_subtree(KvCache *c, RadixNode *n, const char *reason) { drop_subtree(c, n, reason); }
int kv_internal_grow_nodes(KvCache *c, int more) { return node_count_grow(c, more); }

int kv_internal_load_path(KvCache *c, RadixNode **end, int max_load) {
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    RadixNode *root = *end;
    int depth = 0;
    for (; !radix_is_root(root); root = root->parent) depth++;
    if (braid_grow((void **)&c->path, &c->cap_path, depth + 1, sizeof *c->path)) return -1;
    int i = depth;
    for (RadixNode *n = *end; !radix_is_root(n); n = n->parent) c->path[--i] = n;
    /* Locked, so that making room for one node's blocks never demotes the path above it. */
    RadixNode *locked = *end, *last = root;
    lock_path(c, locked);
    int blocks = 0;
    for (i = 0; i < depth; i++) {
        RadixNode *n = c->path[i];
        if (!on_tier(n, CACHE_ON_DEVICE)) {
            if (n->n_blocks > max_load || !load_node(c, n)) break;
            max_load -= n->n_blocks;
            for (int b = 0; b < n->n_blocks; b++) block_pool_release(dev, n->blocks[b]); /* the tree's alone */
            c->counters.host_hit_blocks += (uint64_t)n->n_blocks;
        }
        blocks += n->n_blocks;
        last = n;
    }
    unlock_path(c, locked);
    *end = last;
    return blocks;
}

static bool peek_visible(const void *id, const RadixNode *child) { return kv_internal_visible(child, id); }

/* Read-only twin of kv_cache_match's walk (radix_peek): whole blocks only, stopping at a node the
 * caller may not read (kv_internal_visible). The namespace's root is looked up, never created. */
int kv_cache_peek_prefix(const KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens) {
    int limit = n_tokens > 0 ? (n_tokens - 1) / c->block_size : 0;
    uint64_t ns = namespace_of(id);
    for (int i = 0; i < c->tree.n_roots; i++)
        if (c->tree.roots[i].ns == ns) return radix_peek(c->tree.roots[i].root, c->block_size, tokens, limit, peek_visible, id);
    return 0;
}
