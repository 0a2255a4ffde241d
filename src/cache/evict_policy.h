/*
 * evict_policy.h — eviction policy interface v2: the contract every policy implements, the
 * per-node metadata it sees, and the registry (`--policy NAME`, `braid batch --list-policies`).
 *
 * The KV cache (kv_cache.h) keeps, per tier, the set of nodes it may evict from that tier in an
 * indexed min-heap ordered by the policy's score. Scores are computed by the cache when a node
 * enters the set and again after every callback that concerns the node (insert, access, release),
 * so a policy never sorts: an eviction pops the heap. A policy whose scores depend on a workflow's
 * state returns true from on_workflow_end / on_prediction when that state changed, and the cache
 * re-keys exactly the nodes that workflow uses (it keeps an index of them); a policy whose scores
 * change everywhere at once (time advanced) returns true from on_step and the cache rebuilds the
 * tier's heap in O(n).
 *
 * Each tier has its own policy instance (create is called once per tier with the tier's id). All
 * callbacks run on the instance leader's thread; a policy's state is its own; a callback must not
 * call back into the cache. A node's address is stable while it is in the tree; on_evict is the
 * last callback a node gets for that tier (on_forget when it leaves the tree altogether).
 *
 * Contract for score(): lower is evicted first; it must depend only on the node's metadata and the
 * policy's own state, and must not change between callbacks unless the policy asks for a rescore.
 */
#ifndef BRAID_CACHE_EVICT_POLICY_H
#define BRAID_CACHE_EVICT_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

typedef enum { CACHE_TIER_DEVICE = 0, CACHE_TIER_HOST = 1, CACHE_N_TIERS = 2 } CacheTier;

/* Bits of CacheNodeMeta.tiers: where a node's blocks live (a node can be on both). */
enum { CACHE_ON_DEVICE = 1u << CACHE_TIER_DEVICE, CACHE_ON_HOST = 1u << CACHE_TIER_HOST };

/* One active workflow's use of a node. A node lists every active workflow that used it (Eq. 2's
 * W_act(c), exactly): the cache drops a workflow's uses when it ends (and an agent's when it
 * branched away), so ended workflows cost nothing. The cache bounds the uses of all nodes together
 * (KvCacheConfig.max_node_uses); only past that bound does a new use take the place of the node's
 * least recent one (the approximation, counted in KvCacheCounters.uses_over_bound). */
typedef struct {
    uint32_t workflow;   /* interned workflow id (kv_cache_identity), never 0 */
    uint64_t agent_mask; /* bit (agent id mod 64) set: that agent of the workflow used this node */
    int32_t index_pos;   /* the cache's own: where the node sits in that workflow's node list */
    /* Requests of the workflow queued at the instance whose cached prefix reaches this node
     * (kv_cache_note_waiting): reads certain to come, which the coordinator's forecast, made for
     * "after this call" when the call was dispatched, does not count while the call waits. */
    uint16_t waiting;
} CacheNodeUse;

typedef struct {
    uint64_t last_access;  /* cache tick of the last match/insert touching the node */
    uint64_t hit_count;    /* matches that reused the node */
    uint32_t tenant, adapter; /* interned ids (0 = none); names via kv_cache_name */
    bool pinned;           /* never evicted while set (Leyline PIN; kv_hints.c keeps it) */
    double expires_at;     /* the pin's deadline in seconds (cache clock) */
    bool decayed;          /* Leyline DECAY: evicted before every node that is not (whatever the policy says) */
    uint32_t share_scope;  /* Leyline SHARE: 0 private, else 1 + the cache's scope index (kv_hints.c) */
    uint8_t tiers;         /* CACHE_ON_DEVICE | CACHE_ON_HOST */
    uint64_t content_hash; /* chained hash of the node's last block */
    int n_uses, cap_uses;  /* active workflows that used the node */
    CacheNodeUse *uses;    /* (n_uses) the most recent first; owned by the node (kv_cache.c grows it) */
    uint32_t workflows_seen; /* workflows that used the node, ended ones included (counted when one joins `uses`) */
    bool prefetched;       /* on the device by kv_cache_prefetch and not yet acquired by a request */
    /* Its K/V came from approximate segment reuse (or were computed over such K/V): only requests
     * that accept approximate K/V (CacheIdentity.approx_ok) match it; an exact commit of the same
     * tokens replaces its blocks and clears the flag. */
    bool approximate;
    /* An approximate node's conversation (CacheIdentity.approx_scope of the commit that made it;
     * 0 = none): requests of that conversation match it too. */
    uint64_t approx_scope;
    /* Leases of this node's blocks to other instances (KV block moves, kv_cache_lend): while
     * non-zero its host copy is not evicted (its lock already keeps the device blocks). */
    uint16_t lend_refs;
} CacheNodeMeta;

/* A workflow's predicted future, as the coordinator's predictor sees it after its latest call:
 * prob[(s - 1) * n_agents + i] is the probability that the workflow's s-th next call (s = 1..k)
 * invokes agents[i] (unconditional: the mass missing from a row is the chance it ended before). */
typedef struct {
    uint32_t workflow;       /* interned workflow id */
    uint32_t current_agent;  /* the agent invoked now (interned; 0 = unknown) */
    int k;                   /* horizon */
    int n_agents;
    const uint32_t *agents;  /* (n_agents) interned agent ids */
    const float *prob;       /* (k, n_agents) */
} CachePrediction;

struct RadixNode;

/* Run-time settings a policy may read at create (--pbkv-gamma, --pbkv-future); the zero value is every policy's
 * defaults. A policy ignores what it has no use for. */
typedef struct {
    double gamma; /* PBKV's lookahead discount, in (0, 1]; 0 = the policy's default (PBKV_DEFAULT_GAMMA) */
    int future;   /* PBKV's read for the workflows still to come (--pbkv-future): 0 = default (on), 1 = on, -1 = off */
} EvictPolicyOptions;

/* PBKV's default discount (the paper's setting, App. D). */
#define PBKV_DEFAULT_GAMMA 0.7

typedef enum { CACHE_RESCORE_NONE = 0, CACHE_RESCORE_WORKFLOW = 1, CACHE_RESCORE_ALL = 2 } CacheRescore;

typedef struct EvictPolicy {
    const char *name;
    const char *description; /* one line, for --list-policies */
    /* Optional: per-tier state. NULL create means the state is the one the cache was given.
     * options is never NULL (the cache's KvCacheConfig.policy_options; read, not kept). */
    int (*create)(void **state, CacheTier tier, const EvictPolicyOptions *options, BraidError *err);
    void (*destroy)(void *state);
    /* Required. Lower scores are evicted first. */
    double (*score)(void *state, const struct RadixNode *node);
    /* Optional notifications. */
    void (*on_insert)(void *state, const struct RadixNode *node);
    void (*on_access)(void *state, const struct RadixNode *node);
    void (*on_release)(void *state, const struct RadixNode *node); /* its last lock went */
    void (*on_evict)(void *state, const struct RadixNode *node);   /* leaves this tier */
    /* What changed: CACHE_RESCORE_WORKFLOW re-keys the nodes the workflow uses, CACHE_RESCORE_ALL
     * rebuilds the tier's heap (e.g. the policy also forgot another workflow). */
    CacheRescore (*on_workflow_end)(void *state, uint32_t workflow);
    CacheRescore (*on_prediction)(void *state, const CachePrediction *prediction); /* copy what you keep */
    /* Optional: the cache reclaims a workflow id (the workflow ended, or sat idle past the cache's
     * bound, and no node names it any more); the id will name another workflow next. Drop
     * everything kept for it. Called once per tier instance (twice on a shared state: idempotent). */
    void (*on_workflow_forget)(void *state, uint32_t workflow);
    /* Return true when scores changed anywhere (the cache rebuilds the tier's heap). */
    bool (*on_step)(void *state, double now);
    /* Optional: prefetching from the host tier (kv_cache_prefetch). The expected use of a host-only
     * node by the next call of the workflows that used it (PBKV's one-step Value(c), Eq. 1); only
     * nodes valued above 0 are loaded, highest first. Asked of the device tier's instance. A policy
     * without it never prefetches. */
    double (*prefetch_value)(void *state, const struct RadixNode *node);
    /* Optional, with prefetch_value: true for a node the policy holds worthless whatever the
     * predictions say (PBKV's retired cache). A prefetch may take such nodes' device blocks as well
     * as free ones (PBKV §4.3: the prefetch region is free space plus retired cache). */
    bool (*reclaimable)(void *state, const struct RadixNode *node);
} EvictPolicy;

/* Least recently used: score = last access tick. */
extern const EvictPolicy evict_policy_lru;
/* PBKV (policy_pbkv.c): retired workflows' cache first, then the K-step lookahead score. */
extern const EvictPolicy evict_policy_pbkv;
/* PBKV-LAE (policy_pbkv.c): the lifecycle half alone: retired cache first, then LRU. */
extern const EvictPolicy evict_policy_pbkv_lae;
/* KVFlow baseline (policy_kvflow.c): farthest steps-to-execution first, from the predictions. */
extern const EvictPolicy evict_policy_kvflow;
/* Looks a policy up by name; NULL when unknown. */
const EvictPolicy *evict_policy_find(const char *name);
/* The registry, in a fixed order; returns the count. */
int evict_policy_list(const EvictPolicy *const **policies);

#endif
