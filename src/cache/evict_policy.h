/*
 * evict_policy.h — the eviction policy interface of the radix cache, and the LRU baseline.
 *
 * The radix tree keeps the set of evictable leaves (unlocked, childless) incrementally and asks the
 * policy which of them to drop. A policy sees each node's CacheNodeMeta, which already carries the
 * fields later policies need (ARCHITECTURE § 5): access time and count, tenant and adapter, the
 * workflows and agents that used the node (PBKV's A_w(c)), pin / TTL, tier flags, content hash.
 * Callbacks run on the instance leader's thread; a policy's state is its own.
 */
#ifndef BRAID_CACHE_EVICT_POLICY_H
#define BRAID_CACHE_EVICT_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#define CACHE_NODE_MAX_WORKFLOWS 4

typedef struct {
    uint64_t workflow_id;
    uint64_t agent_mask; /* bit a set: agent a of that workflow used this node */
} CacheNodeUse;

typedef struct {
    uint64_t last_access;  /* tree tick of the last match/insert touching the node */
    uint64_t hit_count;    /* matches that reused the node */
    uint32_t tenant, adapter;
    bool pinned;           /* never evicted while set (Leyline PIN) */
    double expires_at;     /* TTL deadline in seconds, 0 = none */
    uint8_t tier_flags;    /* later: on device / on host */
    uint64_t content_hash; /* chained hash of the node's last block */
    int n_uses;
    CacheNodeUse uses[CACHE_NODE_MAX_WORKFLOWS];
} CacheNodeMeta;

struct RadixNode;

typedef struct EvictPolicy {
    const char *name;
    void (*on_insert)(void *state, struct RadixNode *node);
    void (*on_access)(void *state, struct RadixNode *node);
    void (*on_release)(void *state, struct RadixNode *node);
    /* Lower scores are evicted first. */
    double (*score)(void *state, const struct RadixNode *node);
    /* Chooses victims among n candidates (evictable leaves) until their blocks reach need_blocks
     * or candidates run out; writes them to out (capacity n) in eviction order, returns the count.
     * NULL means: ascending score. */
    int (*pick_victims)(void *state, struct RadixNode *const *candidates, int n, int need_blocks, struct RadixNode **out);
} EvictPolicy;

/* Least recently used: score = last access tick. */
extern const EvictPolicy evict_policy_lru;
/* Looks a policy up by name ("lru"); NULL when unknown. */
const EvictPolicy *evict_policy_find(const char *name);

#endif
