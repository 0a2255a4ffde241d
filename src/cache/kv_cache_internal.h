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

#endif
