/*
 * cache_key_affinity.h — OpenAI's `prompt_cache_key` as a routing rule: requests naming the same
 * key (within one tenant) go to the instance that served the key last, where the key's cache is,
 * ahead of the router's prefix overlap when that overlap is short.
 *
 * Why: the router sees only what the instances have reported cached (KV events arrive after a
 * prefill). Requests of one key that arrive together, or whose prompts share only a short head
 * with what is cached, look alike to every instance, so load spreads them and each instance
 * computes the key's context again. The key says they belong together.
 *
 * Rule (cache_key_affinity_route): the key's instance K replaces the router's choice C when K is
 * alive, not badly overloaded (load within the router's load_slack of the least loaded live
 * instance), and C's cached prefix is at most CACHE_KEY_SHORT_OVERLAP_BLOCKS blocks longer than
 * K's. A longer overlap elsewhere wins: it is a real hit, the key only a hint. The router's
 * round-robin baseline ignores keys, as it ignores caches. When K wins, C becomes the move source if
 * it holds more of the prefix than K (move_plan.h decides whether to pull it).
 *
 * Scoping: keys are per tenant (cache_key_affinity_scoped); two tenants using the same key never
 * share an instance choice, as they never share cache. The table is bounded: past
 * CACHE_KEY_MAX_KEYS keys it starts afresh (a key is a routing hint; losing one costs one miss).
 *
 * Owner: the coordinator's MPI thread (like the router); not thread-safe. scoped keys are malloc'd
 * strings the caller frees.
 */
#ifndef BRAID_COORD_CACHE_KEY_AFFINITY_H
#define BRAID_COORD_CACHE_KEY_AFFINITY_H

#include <stdint.h>

#include "common/strmap.h"
#include "coord/router.h"

#define CACHE_KEY_SHORT_OVERLAP_BLOCKS 4 /* router's overlap beyond the key instance's that still yields to the key */
#define CACHE_KEY_MAX_KEYS 65536
#define CACHE_KEY_MAX_BYTES 256          /* a prompt_cache_key's length limit (api_request.c checks it) */

typedef struct {
    StrMap *instance_of; /* scoped key -> instance + 1 */
    unsigned long long routed, overridden; /* requests with a key; those the key moved */
} CacheKeyAffinity;

/* A zeroed CacheKeyAffinity is ready to use (its table is made at the first key); free releases it. */
void cache_key_affinity_free(CacheKeyAffinity *a);

/* "<tenant>\x1f<key>" (tenant NULL: ""), malloc'd; NULL when key is NULL or out of memory. */
char *cache_key_affinity_scoped(const char *tenant, const char *key);

/* Applies the rule above to the router's decision d for a request with scoped key `key` (NULL: no
 * key; nothing changes) and prompt block hashes. */
void cache_key_affinity_route(CacheKeyAffinity *a, const Router *r, const char *key, const uint64_t *hashes, int n_hashes,
                              RouteDecision *d);

/* The request with `key` was sent to `instance`: the key's cache is there now. */
void cache_key_affinity_assigned(CacheKeyAffinity *a, const char *key, int instance);

#endif
