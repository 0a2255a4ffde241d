/*
 * kv_cache_internal.h — internal to src/cache: the few kv_cache.c operations that kv_hints.c and
 * kv_segments.c need (heap membership, dropping a subtree, room for node splits).
 */
#ifndef BRAID_CACHE_KV_CACHE_INTERNAL_H
#define BRAID_CACHE_KV_CACHE_INTERNAL_H

#include "cache/kv_cache.h"

/* Puts n in, takes it out of, or re-keys it in each tier's eviction heap, as its state says. */
void kv_internal_refresh(KvCache *c, RadixNode *n);
/* Removes an unlocked node and everything below it from every tier (REMOVED events). */
void kv_internal_drop_subtree(KvCache *c, RadixNode *n, const char *reason);
/* Room in the heaps for `more` new nodes (a walk that may split); -1 when out of memory. */
int kv_internal_grow_nodes(KvCache *c, int more);

/* Makes the path from its root to *end usable on the device: its host-only nodes (a suffix of the
 * path) are loaded, top down, into device blocks the tree owns (LOAD ops, evicting elsewhere if
 * need be; the path itself is locked meanwhile). *end becomes the deepest node now on the device
 * (the root when none); returns the path's blocks down to it, -1 when out of memory. At most
 * max_load blocks are loaded (whole nodes). */
int kv_internal_load_path(KvCache *c, RadixNode **end, int max_load);
/* Whether a walk for `id` may pass n's K/V: exact ones always, approximate ones when the caller
 * accepts approximate K/V or the node belongs to the caller's conversation. */
static inline bool kv_internal_visible(const RadixNode *n, const CacheIdentity *id) {
    return !n->meta.approximate || id->approx_ok || (id->approx_scope != 0 && n->meta.approx_scope == id->approx_scope);
}

#endif
