/*
 * kv_hints.c — Leyline's cache hints on the tree (PIN, DECAY, EVICT, SHARE) and the two directive
 * plans that copy K/V instead of computing it (an amortized splice, a shared prefix of another
 * tenant). The contracts are in kv_cache.h and cache_directive.h.
 *
 * Pins are advisory, as the paper and the serving engines that tried hard pins concluded: a pin
 * counts against its tenant's budget (clipped when over), expires at its deadline, and
 * kv_cache_unpin_for releases pins early when a request could not be admitted otherwise, so pinned
 * memory can never deadlock the scheduler. A pinned node is simply not evictable (kv_cache.c's
 * device_evictable); its ancestors stay because a node with a device child never is.
 * Sharing marks nodes of the owner's namespace with a scope; other tenants' requests look for the
 * longest visible prefix there and copy it (COPY_SLOTS at the same positions: the same tokens with
 * the same left context give the same K/V, so the copy is exact) into their own namespace.
 */
#include <stdlib.h>
#include <string.h>

#include "cache/kv_cache_internal.h"
#include "cache/kv_hints.h"
#include "cache/kv_segments.h"
#include "common/grow.h"

const char *kv_hint_status_name(KvHintStatus s) {
    switch (s) {
    case KV_HINT_ACCEPTED: return "accepted";
    case KV_HINT_CLIPPED: return "clipped";
    case KV_HINT_DEFERRED: return "deferred";
    case KV_HINT_REJECTED: return "rejected";
    }
    return "?";
}

static uint32_t tenant_of(const RadixNode *n) { return (uint32_t)(n->ns >> 32); }

/* ---- walking a request's path ---- */

typedef struct {
    const KvCache *c;
    const CacheIdentity *id;
    bool exact_only;   /* never through nodes marked approximate */
    bool as_viewer;    /* only nodes shared with `viewer` */
    uint32_t viewer;
    bool host_too;     /* also host-only nodes (copy sources: loaded before they are read) */
} PathWalk;

static bool visible_to(const KvCache *c, const RadixNode *n, uint32_t tenant) {
    if (n->meta.share_scope == 0) return false;
    const KvShareScope *s = &c->scopes[n->meta.share_scope - 1];
    if (s->all) return true;
    for (int i = 0; i < s->n; i++)
        if (s->tenants[i] == tenant) return true;
    return false;
}

static bool path_enter(void *ctx, const RadixNode *child, int pos) {
    (void)pos;
    const PathWalk *w = ctx;
    if (!(child->meta.tiers & CACHE_ON_DEVICE) && !w->host_too) return false;
    if (child->meta.approximate && (w->exact_only || !kv_internal_visible(child, w->id))) return false;
    return !w->as_viewer || visible_to(w->c, child, w->viewer);
}

/* Follows tokens for at most max_blocks blocks of the namespace's device path (splitting so the
 * walk ends on a node boundary). Returns the blocks walked, -1 when out of memory. */
static int walk(KvCache *c, uint64_t ns, const PathWalk *w, const int32_t *tokens, int max_blocks, RadixNode **end) {
    RadixNode *root = radix_root(&c->tree, ns);
    if (!root || kv_internal_grow_nodes(c, 1)) return -1;
    return radix_walk_while(&c->tree, root, tokens, max_blocks > 0 ? max_blocks : 0, end, path_enter, NULL, (void *)w);
}

static uint64_t own_ns(const CacheIdentity *id) { return radix_namespace(id->tenant, id->adapter); }

static int blocks_ceil(const KvCache *c, int tokens) { return (tokens + c->block_size - 1) / c->block_size; }

static int oom(BraidError *err, const char *what) { return braid_error_set(err, "kv cache: out of memory %s", what); }

/* ---- pins ---- */

static int *tenant_count(KvCache *c, uint32_t tenant) {
    if ((int)tenant >= c->cap_pinned_tenants) {
        int old = c->cap_pinned_tenants;
        if (braid_grow((void **)&c->pinned_by_tenant, &c->cap_pinned_tenants, (int)tenant + 1, sizeof *c->pinned_by_tenant)) return NULL;
        memset(c->pinned_by_tenant + old, 0, (size_t)(c->cap_pinned_tenants - old) * sizeof *c->pinned_by_tenant);
    }
    return &c->pinned_by_tenant[tenant];
}

int kv_cache_pinned(const KvCache *c) { return c->pinned_total; }

int kv_cache_pinned_by(const KvCache *c, uint32_t tenant) {
    return (int)tenant < c->cap_pinned_tenants ? c->pinned_by_tenant[tenant] : 0;
}

static int list_pinned(KvCache *c, RadixNode *n) {
    if (braid_grow((void **)&c->pinned, &c->cap_pinned, c->n_pinned + 1, sizeof *c->pinned)) return -1;
    n->pin_pos = c->n_pinned;
    c->pinned[c->n_pinned++] = n;
    return 0;
}

static void unlist_pinned(KvCache *c, RadixNode *n) {
    RadixNode *last = c->pinned[--c->n_pinned];
    c->pinned[n->pin_pos] = last;
    last->pin_pos = n->pin_pos;
    n->pin_pos = -1;
}

/* The count was reserved by the caller (tenant_count) before, so this cannot fail. */
static int pin_node(KvCache *c, RadixNode *n, double until) {
    if (n->meta.pinned) {
        if (until > n->meta.expires_at) n->meta.expires_at = until;
        return 0;
    }
    if (list_pinned(c, n)) return -1;
    n->meta.pinned = true;
    n->meta.expires_at = until;
    c->pinned_by_tenant[tenant_of(n)] += n->n_blocks;
    c->pinned_total += n->n_blocks;
    kv_internal_refresh(c, n);
    return 0;
}

static void unpin_node(KvCache *c, RadixNode *n) {
    if (!n->meta.pinned) return;
    unlist_pinned(c, n);
    n->meta.pinned = false;
    c->pinned_by_tenant[tenant_of(n)] -= n->n_blocks;
    c->pinned_total -= n->n_blocks;
    kv_internal_refresh(c, n);
}

void kv_hints_on_split(KvCache *c, RadixNode *upper) {
    /* Blocks were split between two pinned nodes: the counts are unchanged. Out of memory listing
     * it: the upper half is unpinned, so its count goes. */
    if (!upper->meta.pinned || upper->pin_pos >= 0) return;
    if (list_pinned(c, upper)) {
        upper->meta.pinned = false;
        c->pinned_by_tenant[tenant_of(upper)] -= upper->n_blocks;
        c->pinned_total -= upper->n_blocks;
    }
}

void kv_hints_forget_node(KvCache *c, RadixNode *n) {
    if (n->pin_pos < 0) return;
    unlist_pinned(c, n);
    n->meta.pinned = false;
    c->pinned_by_tenant[tenant_of(n)] -= n->n_blocks;
    c->pinned_total -= n->n_blocks;
}

void kv_hints_expire(KvCache *c, double now) {
    for (int i = 0; i < c->n_pinned;) {
        RadixNode *n = c->pinned[i];
        if (n->meta.expires_at > now) {
            i++;
            continue;
        }
        c->counters.pin_expired_blocks += (uint64_t)n->n_blocks;
        unpin_node(c, n); /* moves the last entry to i */
    }
}

int kv_cache_unpin_for(KvCache *c, int n_blocks) {
    int freed = 0;
    while (freed < n_blocks && c->n_pinned > 0) {
        RadixNode *first = c->pinned[0];
        for (int i = 1; i < c->n_pinned; i++)
            if (c->pinned[i]->meta.expires_at < first->meta.expires_at) first = c->pinned[i];
        freed += first->n_blocks;
        c->counters.pin_revoked_blocks += (uint64_t)first->n_blocks;
        unpin_node(c, first);
    }
    return freed;
}

/* The longest prefix (in blocks) of the path to end whose not yet pinned blocks fit in `room`. */
static int pin_fit(const RadixNode *end, int path_blocks, int room) {
    int total = 0;
    for (const RadixNode *n = end; !radix_is_root(n); n = n->parent)
        if (!n->meta.pinned) total += n->n_blocks;
    if (total <= room) return path_blocks;
    int pos = path_blocks, used_below = total;
    for (const RadixNode *n = end; !radix_is_root(n); n = n->parent) {
        int start = pos - n->n_blocks;
        int above = used_below - (n->meta.pinned ? 0 : n->n_blocks); /* new blocks in the path above n */
        if (above <= room) return n->meta.pinned ? pos : start + (room - above);
        used_below = above;
        pos = start;
    }
    return 0;
}

int kv_cache_pin(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int end, double ttl_s, int budget_blocks,
                 KvHintOutcome *out, BraidError *err) {
    *out = (KvHintOutcome){.status = KV_HINT_ACCEPTED};
    PathWalk w = {.c = c, .id = id};
    RadixNode *node;
    int matched = walk(c, own_ns(id), &w, tokens, blocks_ceil(c, end), &node);
    if (matched < 0) return oom(err, "pinning");
    if (matched == 0) return *out = (KvHintOutcome){.status = KV_HINT_REJECTED, .reason = "nothing of the span is cached"}, 0;
    int *count = tenant_count(c, id->tenant);
    if (!count) return oom(err, "pinning");
    int room = budget_blocks - *count;
    int global_room = kv_cache_total(c, CACHE_TIER_DEVICE) / 2 - c->pinned_total; /* half the pool stays unpinned */
    if (global_room < room) room = global_room;
    if (room < 0) room = 0;
    int fit = pin_fit(node, matched, room);
    out->blocks_asked = matched;
    if (fit < matched) {
        out->status = fit > 0 ? KV_HINT_CLIPPED : KV_HINT_REJECTED;
        out->reason = room == budget_blocks - *count ? "the tenant's pin budget is used up" : "half of the KV pool is pinned already";
        if (fit == 0) return 0;
        if (walk(c, own_ns(id), &w, tokens, fit, &node) != fit) return oom(err, "pinning");
    }
    double until = c->clock() + ttl_s;
    int pinned = 0;
    for (RadixNode *n = node; !radix_is_root(n); n = n->parent) {
        if (pin_node(c, n, until)) return oom(err, "pinning");
        pinned += n->n_blocks;
    }
    c->counters.pins++;
    out->blocks = pinned;
    return 0;
}

/* ---- decay, evict ---- */

int kv_cache_decay(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int start, int end, KvHintOutcome *out, BraidError *err) {
    *out = (KvHintOutcome){.status = KV_HINT_ACCEPTED};
    PathWalk w = {.c = c, .id = id};
    RadixNode *last, *first;
    int to = walk(c, own_ns(id), &w, tokens, blocks_ceil(c, end), &last);
    int from = to < 0 ? -1 : walk(c, own_ns(id), &w, tokens, start / c->block_size, &first);
    if (to < 0 || from < 0) return oom(err, "decaying");
    if (to <= from) return *out = (KvHintOutcome){.status = KV_HINT_REJECTED, .reason = "nothing of the span is cached"}, 0;
    out->blocks_asked = to - from;
    for (RadixNode *n = last; n != first; n = n->parent) {
        if (n->meta.pinned) continue; /* a pin outranks a decay */
        n->meta.decayed = true;
        kv_internal_refresh(c, n);
        out->blocks += n->n_blocks;
    }
    c->counters.decayed_blocks += (uint64_t)out->blocks;
    if (out->blocks < out->blocks_asked) {
        out->status = out->blocks > 0 ? KV_HINT_CLIPPED : KV_HINT_REJECTED;
        out->reason = "pinned blocks are not decayed";
    }
    return 0;
}

/* Drops what of n's subtree nobody holds or pins, leaves first; the rest is decayed. */
static void evict_subtree(KvCache *c, RadixNode *n, int *dropped, int *kept) {
    for (int i = n->n_children - 1; i >= 0; i--) evict_subtree(c, n->children[i], dropped, kept);
    if (n->n_children == 0 && n->lock_ref == 0 && !n->meta.pinned) {
        *dropped += n->n_blocks;
        kv_internal_drop_subtree(c, n, "directive_evict");
        return;
    }
    *kept += n->n_blocks;
    if (!n->meta.pinned) {
        n->meta.decayed = true;
        kv_internal_refresh(c, n);
    }
}

int kv_cache_evict_from(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, int start, KvHintOutcome *out,
                        BraidError *err) {
    *out = (KvHintOutcome){.status = KV_HINT_ACCEPTED};
    PathWalk w = {.c = c, .id = id};
    int first = start / c->block_size;
    RadixNode *before, *node;
    int at = walk(c, own_ns(id), &w, tokens, first, &before);
    int to = at < 0 ? -1 : walk(c, own_ns(id), &w, tokens, n_tokens / c->block_size > first ? first + 1 : first, &node);
    if (at < 0 || to < 0) return oom(err, "evicting");
    if (at < first || to <= first)
        return *out = (KvHintOutcome){.status = KV_HINT_REJECTED, .reason = "nothing from the span on is cached"}, 0;
    int dropped = 0, kept = 0;
    evict_subtree(c, node, &dropped, &kept);
    c->counters.directive_evicted_blocks += (uint64_t)dropped;
    out->blocks = dropped;
    out->blocks_asked = dropped + kept;
    if (kept > 0) {
        out->status = dropped > 0 ? KV_HINT_CLIPPED : KV_HINT_DEFERRED;
        out->reason = "blocks in use or pinned stay until released (decayed: they go first)";
    }
    return 0;
}

/* ---- unpin ---- */

int kv_cache_unpin(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int end, KvHintOutcome *out, BraidError *err) {
    *out = (KvHintOutcome){.status = KV_HINT_ACCEPTED};
    PathWalk w = {.c = c, .id = id};
    RadixNode *node;
    int matched = walk(c, own_ns(id), &w, tokens, blocks_ceil(c, end), &node);
    if (matched < 0) return oom(err, "unpinning");
    out->blocks_asked = matched;
    for (RadixNode *n = node; !radix_is_root(n); n = n->parent) {
        if (!n->meta.pinned) continue;
        out->blocks += n->n_blocks;
        unpin_node(c, n);
    }
    c->counters.unpinned_blocks += (uint64_t)out->blocks;
    if (out->blocks == 0) *out = (KvHintOutcome){.status = KV_HINT_REJECTED, .reason = "nothing of the span is pinned", .blocks_asked = matched};
    return 0;
}

/* ---- dropping an adapter's namespaces ---- */

/* Unpins every pinned node of n's subtree (n itself included unless it is a root). */
static void unpin_subtree(KvCache *c, RadixNode *n, int *unpinned) {
    for (int i = 0; i < n->n_children; i++) unpin_subtree(c, n->children[i], unpinned);
    if (!radix_is_root(n) && n->meta.pinned) {
        *unpinned += n->n_blocks;
        unpin_node(c, n);
    }
}

int kv_cache_drop_adapter(KvCache *c, const char *adapter, int *kept) {
    *kept = 0;
    uint32_t id = adapter && adapter[0] ? cache_names_find(&c->names, CACHE_NAME_ADAPTER, adapter) : 0;
    if (id == 0) return 0; /* never seen here (or the base namespace, which is never dropped) */
    int dropped = 0, unpinned = 0;
    for (int r = 0; r < c->tree.n_roots; r++) {
        if ((uint32_t)(c->tree.roots[r].ns & 0xffffffffu) != id) continue;
        RadixNode *root = c->tree.roots[r].root;
        unpin_subtree(c, root, &unpinned); /* the adapter is gone: nothing of it is worth keeping */
        for (int i = root->n_children - 1; i >= 0; i--) evict_subtree(c, root->children[i], &dropped, kept);
    }
    c->counters.directive_evicted_blocks += (uint64_t)dropped;
    c->counters.pin_revoked_blocks += (uint64_t)unpinned;
    return dropped;
}

/* ---- share ---- */

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The scope id (1 + index) of the union of scope `old` (0 = none) and the new audience; equal
 * scopes are shared. 0 when out of memory. */
static uint32_t scope_union(KvCache *c, uint32_t owner, uint32_t old, bool all, const uint32_t *tenants, int n) {
    uint32_t set[2 * CACHE_SHARE_MAX_TENANTS];
    int k = 0;
    const KvShareScope *o = old ? &c->scopes[old - 1] : NULL;
    if (o && o->all) all = true;
    for (int i = 0; !all && i < n; i++) set[k++] = tenants[i];
    for (int i = 0; !all && o && i < o->n && k < 2 * CACHE_SHARE_MAX_TENANTS; i++) set[k++] = o->tenants[i];
    qsort(set, (size_t)k, sizeof *set, cmp_u32);
    int u = 0;
    for (int i = 0; i < k; i++)
        if (u == 0 || set[u - 1] != set[i]) set[u++] = set[i];
    for (int s = 0; s < c->n_scopes; s++) {
        const KvShareScope *x = &c->scopes[s];
        if (x->owner == owner && x->all == all && x->n == u && (u == 0 || memcmp(x->tenants, set, (size_t)u * sizeof *set) == 0))
            return (uint32_t)s + 1;
    }
    if (braid_grow((void **)&c->scopes, &c->cap_scopes, c->n_scopes + 1, sizeof *c->scopes)) return 0;
    uint32_t *copy = u ? malloc((size_t)u * sizeof *copy) : NULL;
    if (u && !copy) return 0;
    if (u) memcpy(copy, set, (size_t)u * sizeof *set);
    c->scopes[c->n_scopes] = (KvShareScope){.owner = owner, .all = all, .tenants = copy, .n = u};
    return (uint32_t)++c->n_scopes;
}

static int note_shared_ns(KvCache *c, uint64_t ns) {
    for (int i = 0; i < c->n_shared_ns; i++)
        if (c->shared_ns[i] == ns) return 0;
    if (braid_grow((void **)&c->shared_ns, &c->cap_shared_ns, c->n_shared_ns + 1, sizeof *c->shared_ns)) return -1;
    c->shared_ns[c->n_shared_ns++] = ns;
    return 0;
}

int kv_cache_share(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int end, bool all, const char *const *tenants,
                   int n_tenants, KvHintOutcome *out, BraidError *err) {
    *out = (KvHintOutcome){.status = KV_HINT_ACCEPTED};
    uint32_t ids[CACHE_SHARE_MAX_TENANTS];
    int n = 0;
    for (int i = 0; !all && i < n_tenants && n < CACHE_SHARE_MAX_TENANTS; i++) {
        int64_t t = cache_names_intern(&c->names, CACHE_NAME_TENANT, tenants[i]);
        if (t < 0) return oom(err, "sharing");
        if ((uint32_t)t != id->tenant) ids[n++] = (uint32_t)t;
    }
    if (!all && n == 0) return *out = (KvHintOutcome){.status = KV_HINT_REJECTED, .reason = "it names no other tenant"}, 0;
    PathWalk w = {.c = c, .id = id, .exact_only = true};
    RadixNode *node;
    int matched = walk(c, own_ns(id), &w, tokens, blocks_ceil(c, end), &node);
    if (matched < 0) return oom(err, "sharing");
    if (matched == 0) return *out = (KvHintOutcome){.status = KV_HINT_REJECTED, .reason = "nothing of the span is cached exactly"}, 0;
    if (note_shared_ns(c, own_ns(id))) return oom(err, "sharing");
    for (RadixNode *x = node; !radix_is_root(x); x = x->parent) {
        uint32_t scope = scope_union(c, id->tenant, x->meta.share_scope, all, ids, n);
        if (!scope) return oom(err, "sharing");
        x->meta.share_scope = scope;
    }
    out->blocks = out->blocks_asked = matched;
    return 0;
}

/* ---- directive plans: an amortized splice, another tenant's shared prefix ---- */

/* A copy source walked with host_too: its host-only part loaded onto the device (LOAD ops come
 * before the copies in the pending list, so the copies read loaded blocks). Returns the blocks of
 * the path now on the device (*end moved up to the last of them), -1 when out of memory. */
static int load_source(KvCache *c, RadixNode **end, int walked, int n_tokens, int from) {
    if (walked <= 0 || ((*end)->meta.tiers & CACHE_ON_DEVICE)) return walked;
    /* Loaded sources are held next to the request's own new blocks: load only what leaves room
     * for both (else the request could not be admitted with its copies, and would drop them all). */
    int device_part = 0;
    for (const RadixNode *n = *end; !radix_is_root(n); n = n->parent)
        if (n->meta.tiers & CACHE_ON_DEVICE) device_part += n->n_blocks;
    int need = blocks_ceil(c, n_tokens) - from / c->block_size;
    int room = kv_cache_total(c, CACHE_TIER_DEVICE) - kv_cache_in_use(c, CACHE_TIER_DEVICE) - need - device_part;
    return kv_internal_load_path(c, end, room > 0 ? room : 0);
}

/* The blocks of the device path walked to `end` (`n` blocks), into c->seq_blocks. */
static int path_blocks(KvCache *c, const RadixNode *end, int n) {
    if (braid_grow((void **)&c->seq_blocks, &c->cap_seq_blocks, n + 1, sizeof *c->seq_blocks)) return -1;
    int pos = n;
    for (const RadixNode *r = end; !radix_is_root(r); r = r->parent) {
        pos -= r->n_blocks;
        memcpy(c->seq_blocks + pos, r->blocks, (size_t)r->n_blocks * sizeof *r->blocks);
    }
    return 0;
}

int kv_cache_plan_splice(KvCache *c, const CacheIdentity *id, const CacheDirectives *d, int n_tokens, int from, KvSegmentPlan *plan,
                         int *reused, BraidError *err) {
    if (reused) memset(reused, 0, (size_t)d->n_runs * sizeof *reused);
    if (d->splice_mode != CACHE_SPLICE_AMORTIZE || d->n_context <= 0) return 0;
    PathWalk w = {.c = c, .id = id, .host_too = true};
    RadixNode *end;
    int cached = walk(c, own_ns(id), &w, d->context, d->n_context / c->block_size, &end);
    if (cached >= 0) cached = load_source(c, &end, cached, n_tokens, from);
    if (cached < 0 || path_blocks(c, end, cached)) return oom(err, "planning a splice");
    int cached_tokens = cached * c->block_size, limit = n_tokens - 1;
    for (int i = 0; i < d->n_runs; i++) {
        const CacheSpliceRun *run = &d->runs[i];
        int lo = run->dst > from ? run->dst : from, hi = run->dst + run->len < limit ? run->dst + run->len : limit;
        int32_t src_lo = run->src + (lo - run->dst);
        if (hi - lo > cached_tokens - src_lo) hi = lo + (cached_tokens - src_lo);
        if (hi <= lo || src_lo < 0) continue;
        /* The run before every edit is the cached prefix itself: same tokens, same left context. */
        bool exact = run->index < 0 && run->dst == run->src;
        if (kv_segments_add_span(c, plan, lo, hi, src_lo, c->seq_blocks, 0, exact)) {
            kv_cache_drop_segments(c, plan);
            return oom(err, "planning a splice");
        }
        if (reused) reused[i] = hi - lo;
        if (!exact) c->counters.spliced_tokens += (uint64_t)(hi - lo);
    }
    return 0;
}

int kv_cache_plan_shared(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, int from, KvSegmentPlan *plan,
                         BraidError *err) {
    int limit = n_tokens - 1, best = 0;
    uint64_t own = own_ns(id);
    RadixNode *best_end = NULL;
    PathWalk w = {.c = c, .id = id, .exact_only = true, .as_viewer = true, .viewer = id->tenant, .host_too = true};
    for (int i = 0; i < c->n_shared_ns; i++) {
        uint64_t ns = c->shared_ns[i];
        if (ns == own || (uint32_t)ns != id->adapter) continue;
        RadixNode *end;
        int n = walk(c, ns, &w, tokens, limit / c->block_size, &end);
        if (n < 0) return oom(err, "looking up shared prefixes");
        if (n > best) best = n, best_end = end;
    }
    if (best > from / c->block_size) best = load_source(c, &best_end, best, n_tokens, from);
    if (best < 0) return oom(err, "planning a shared prefix");
    int hi = best * c->block_size < limit ? best * c->block_size : limit;
    if (hi <= from) return from;
    if (path_blocks(c, best_end, best) || kv_segments_add_span(c, plan, from, hi, from, c->seq_blocks, 0, true)) {
        kv_cache_drop_segments(c, plan);
        return oom(err, "planning a shared prefix");
    }
    c->counters.shared_hit_tokens += (uint64_t)(hi - from);
    return hi;
}

void kv_hints_free(KvCache *c) {
    free(c->pinned);
    free(c->pinned_by_tenant);
    for (int i = 0; i < c->n_scopes; i++) free(c->scopes[i].tenants);
    free(c->scopes);
    free(c->shared_ns);
}
