/*
 * block_presence.h — which blocks a KvCache holds on the device, and which it evicted lately, by
 * chained content hash (content_hash.h), kept beside the cache from its events (CacheEvent).
 *
 * ForkKV's --lora-cache auto (worker/sched_forkkv.h) asks, before a request is given a cache
 * namespace, how much of its prompt each candidate namespace holds (a peek: no lock, no LRU touch,
 * no counter moves, unlike kv_cache_match), and whether the blocks it misses were evicted recently
 * (the regret that says memory is short). A chained hash names a whole prefix in one namespace, so
 * "the first k blocks are cached" is "the hash of block k-1 is present" (the tree is prefix-closed).
 *
 * Sizes: the present set grows as blocks enter (open addressing, tombstones reused); the evicted
 * ring holds the last `ghost_capacity` removals (a later one overwrites the oldest). Hash
 * collisions (64-bit) are ignored. Not thread-safe. -1 from a function only when out of memory.
 */
#ifndef BRAID_CACHE_BLOCK_PRESENCE_H
#define BRAID_CACHE_BLOCK_PRESENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/kv_cache.h"

typedef struct {
    uint64_t *slots;  /* open addressing: 0 empty, 1 tombstone, else a hash (0 and 1 are remapped) */
    int cap, used, live;
} HashSet;

typedef struct {
    HashSet present;   /* device-tier blocks now */
    HashSet ghosts;    /* the hashes in ring */
    uint64_t *ring;    /* the last ghost_capacity evictions, oldest overwritten */
    int ghost_capacity, ring_next, ring_len;
} BlockPresence;

int block_presence_init(BlockPresence *p, int ghost_capacity);
void block_presence_free(BlockPresence *p);
/* Follows one event of the cache (device tier: stored blocks become present, removed ones leave
 * and become ghosts; a cleared cache empties both). */
int block_presence_on_event(BlockPresence *p, const CacheEvent *ev);
bool block_presence_has(const BlockPresence *p, uint64_t hash);
bool block_presence_evicted(const BlockPresence *p, uint64_t hash);
/* The number of leading blocks of chained[0..n) present (the longest cached prefix). */
int block_presence_prefix(const BlockPresence *p, const uint64_t *chained, int n);

#endif
