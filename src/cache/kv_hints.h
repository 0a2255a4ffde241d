/*
 * kv_hints.h — internal to src/cache: the hooks by which kv_cache.c keeps the directive state
 * (pinned-node list, per-tenant pin counts, share scopes) in step with the tree. The public side
 * (pin / decay / evict / share / plans) is in kv_cache.h.
 */
#ifndef BRAID_CACHE_KV_HINTS_H
#define BRAID_CACHE_KV_HINTS_H

#include "cache/kv_cache.h"

/* A split copied a pinned node's meta into its new upper half: list the half too. */
void kv_hints_on_split(KvCache *c, RadixNode *upper);
/* A node leaves the tree: unlist it (counts corrected) if pinned. */
void kv_hints_forget_node(KvCache *c, RadixNode *n);
/* Pins whose deadline passed are released. */
void kv_hints_expire(KvCache *c, double now);
void kv_hints_free(KvCache *c);

#endif
