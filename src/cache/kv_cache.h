/*
 * kv_cache.h — one instance's KV cache: the single owner of the device block pool, the host block
 * pool (the host tier), the radix prefix tree and one eviction policy instance per tier.
 *
 * Callers (the scheduler, braid sim, tests) see match / acquire / reserve / commit / release and
 * never the pools or the tree (the models are mini-sglang's CacheManager and nano-vllm's
 * BlockManager). The cache is metadata only: what must happen to memory is appended to its pending
 * operation list (cache_ops.h: STORE on demotion, LOAD on load-back), which the caller drains with
 * kv_cache_take_ops into the next step plan and the backend applies before that step's forward.
 *
 * Tiers. A tree node's blocks live on the device, on the host, or both. Device-resident nodes
 * form an ancestor-closed set (a node on the device has its parent on the device), so a match is a
 * device prefix followed by a host-only suffix. Under device pressure, victims (unlocked nodes with
 * no child on the device, lowest policy score first) are demoted: their blocks are STOREd to host
 * blocks (none when a host copy already exists) and the device blocks freed. When the host tier is
 * off or full of locked data, victims are dropped. The host tier evicts by its own policy: a host
 * copy of a node also on the device, or an unlocked host-only leaf.
 *
 * Request protocol (every function returns -1 with err set only on out of memory or misuse):
 *   kv_cache_match      longest cached prefix of tokens (never all of them); locks the path.
 *   kv_cache_acquire    holds the device part for the caller (table[0..)), loads the host part into
 *                       freshly reserved device blocks (LOAD ops), as far as device blocks allow;
 *                       returns the number of blocks now usable in table.
 *   kv_cache_reserve    n more device blocks for the caller, evicting/demoting per policy.
 *   kv_cache_commit     the sequence's first n_full blocks enter the tree (only the new part is
 *                       taken over; host-only nodes on the path adopt the caller's blocks); the
 *                       caller's lock moves to the node ending them.
 *   kv_cache_release    drops the caller's holds on its table and its lock.
 *   kv_cache_prefetch   (between requests) loads host-only nodes the policy values into free
 *                       device blocks only; see below.
 * Blocks are "held" by callers (a request's block table) and "owned" by the tree; a block returns
 * to the free list when neither holds it. Invariant, per tier (kv_cache_check):
 *   free + cached + in use == total.
 *
 * Identity: tenant, adapter, workflow and agent names are interned (exact strings, no hashing) into
 * small ids; the tree is keyed by (tenant id, adapter id), so no match crosses tenants or adapters.
 * Workflow and agent ids are reclaimed, so a long-running instance does not keep every name it ever
 * saw (cache_names.h): kv_cache_identity makes its caller a holder of the workflow id until
 * kv_cache_identity_release; a workflow id is reclaimed when the workflow ended and no holder and
 * no node names it (the end drops its uses from the nodes; the policies forget it first:
 * on_workflow_forget), and past
 * max_idle_workflows ids that nothing refers to (workflows that never ended), the least recently
 * idle goes. Agent ids only ever count modulo 64 (agent masks), so agent names are bounded by
 * recency alone (KV_CACHE_MAX_AGENT_NAMES); a recycled agent id aliases like two agents sharing a
 * bit already do. Tenant and adapter names are not reclaimed (trees are keyed by them).
 * Content hashes (content_hash.h) are computed here, once per inserted block, seeded by a hash of
 * the namespace's names, stored on the node and carried by every event.
 *
 * Not thread-safe: the instance leader's thread (or the simulator) owns a cache.
 */
#ifndef BRAID_CACHE_KV_CACHE_H
#define BRAID_CACHE_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/block_pool.h"
#include "cache/cache_directive.h"
#include "cache/cache_names.h"
#include "cache/cache_ops.h"
#include "cache/chunker.h"
#include "cache/evict_policy.h"
#include "cache/radix_tree.h"
#include "cache/segment_index.h"
#include "cache/segment_lsh.h"
#include "common/error.h"

typedef struct {
    uint32_t tenant, adapter; /* namespace of the tree */
    uint32_t workflow, agent; /* 0 = none */
    uint64_t hash_seed;       /* content-hash seed of the namespace (content_hash_namespace) */
    /* Approximate K/V (segment reuse in approx mode). approx_ok: matches may pass through tree
     * nodes marked approximate. For commits, when has_approx, the sequence's blocks from
     * approx_from_block on hold approximate K/V and enter the tree marked so; the zero value
     * (exact) is every existing caller's. */
    bool approx_ok, has_approx;
    int approx_from_block;
    /* Conversation scope (Leyline: an edit's savings last). approx_scope: the caller's conversation
     * key (cache_conversation_scope; 0 = none): matches also pass approximate nodes stamped with
     * it, so a conversation that accepted a spliced approximation keeps hitting it without
     * approx_ok. scope_commits: the caller's approximate blocks enter the tree stamped with
     * approx_scope (its approximation is its conversation's own), else unstamped (approx_ok only). */
    uint64_t approx_scope;
    bool scope_commits;
} CacheIdentity;

typedef struct {
    RadixNode *node;   /* locked: deepest matched node (a root when nothing matched) */
    int device_blocks; /* leading matched blocks resident on the device */
    int host_blocks;   /* following matched blocks on the host only */
    int approx_from_block; /* the first matched block of a node marked approximate; -1 when none */
} KvCacheMatch;

typedef enum {
    CACHE_EVENT_STORED = 1,  /* blocks entered a tier (insert, demotion to host, load-back) */
    CACHE_EVENT_REMOVED = 2, /* blocks left a tier */
    CACHE_EVENT_CLEARED = 3, /* everything left every tier (cache destroyed) */
} CacheEventKind;

typedef struct {
    CacheEventKind kind;
    CacheTier tier;
    const char *reason;       /* "insert", "demote", "load", "evict", "host_evict", "clear" */
    int n_blocks;
    const uint64_t *hashes;   /* (n_blocks) chained content hashes, in sequence order */
    uint64_t parent_hash;     /* chained hash of the block before the first one; 0 at a root */
    const int32_t *tokens;    /* (n_blocks * token_block) STORED on insert only, else NULL */
    int token_block;          /* tokens per block in `tokens` */
    uint32_t tenant, adapter;
    uint8_t tiers_after;      /* where the blocks are after the event (0 = gone from the cache) */
} CacheEvent;

typedef void (*CacheEventFn)(void *ctx, const CacheEvent *event);

typedef struct {
    uint64_t inserted_blocks;       /* blocks that entered the tree */
    uint64_t device_hit_blocks;     /* matched on the device (every match, incl. re-admissions) */
    uint64_t host_hit_blocks;       /* matched on the host and loaded back */
    uint64_t demoted_blocks;        /* device -> host (STORE ops + moves of blocks already on host) */
    uint64_t stored_blocks;         /* STORE ops emitted */
    uint64_t loaded_blocks;         /* LOAD ops emitted for load-backs (prefetches: prefetched_blocks) */
    uint64_t device_evicted_blocks; /* left the device tier by eviction (demoted or dropped) */
    uint64_t host_evicted_blocks;   /* left the host tier by eviction */
    uint64_t dropped_blocks;        /* left the cache altogether */
    /* kv_cache_prefetch: blocks loaded ahead of any request (LOAD ops); of those, blocks a request
     * then acquired (also counted in device_hit_blocks), and blocks that left the device again
     * unused. prefetched - hit - wasted are on the device now, not yet used. */
    uint64_t prefetched_blocks, prefetch_hit_blocks, prefetch_wasted_blocks;
    /* Aggressive prefetch (KvCacheConfig.prefetch_rho > 0): active device blocks evicted (demoted
     * or dropped) to make room for a prefetch. Always 0 in the conservative mode. */
    uint64_t prefetch_displaced_blocks;
    /* Segment reuse: chunks indexed (and refused with the index full); per lookup, chunks whose
     * hash was found (candidates), reused exactly or approximately, or rejected because the left
     * context (exact) or window (approximate) differed; the tokens reused. */
    uint64_t segments_indexed, segments_refused_full;
    uint64_t segment_candidates, segments_exact, segments_approx, segments_rejected_context, segments_rejected_window;
    uint64_t segment_reused_tokens;
    /* Near-duplicate segments (segment_lsh.h; approx mode with segment_lsh on, for chunks whose
     * hash no entry has): chunks indexed and refused with the LSH index full; lookups that found
     * LSH candidates, of those admitted (some tokens reused) and rejected (below tau_seg / tau_ctx,
     * or no token passed the window guard), and the tokens they reused (also in segment_reused_tokens). */
    uint64_t segment_lsh_indexed, segment_lsh_refused_full;
    uint64_t segment_lsh_candidates, segment_lsh_admitted, segment_lsh_rejected_tau, segment_lsh_rejected_guard;
    uint64_t segment_lsh_reused_tokens;
    /* Directives (kv_hints.c): tokens copied from another tenant's shared prefix, and from a
     * spliced context (amortize); pins taken, blocks whose pin expired, blocks unpinned early to
     * admit a request (the engine keeps ownership of memory); blocks decayed and evicted on request. */
    uint64_t shared_hit_tokens, spliced_tokens;
    uint64_t pins, pin_expired_blocks, pin_revoked_blocks, decayed_blocks, directive_evicted_blocks, unpinned_blocks;
    /* KV block moves: blocks lent to other instances (kv_cache_lend). */
    uint64_t lent_blocks;
    /* Workflow uses of nodes not recorded (or recorded in place of a node's least recent one)
     * because all nodes' uses together were at KvCache.max_uses: 0 while the counts are exact. */
    uint64_t uses_over_bound;
} KvCacheCounters;

/* Segment reuse (paper 003): how a request may take chunks of other sequences at other offsets.
 *   OFF     prefix cache only;
 *   EXACT   a chunk only where it has the same left context as its cached copy, so the reused K/V
 *           are what recompute would give (same positions too: delta 0). By causality this can
 *           only add the tokens between the prefix match's last whole block and the divergence;
 *   APPROX  also chunks whose last `approx_window` tokens of left context match (W = 0: any
 *           context); their keys are re-positioned by delta-RoPE and their K/V are approximations
 *           (the left context shaped them in every layer past the first), so a request opts in. */
typedef enum { SEGMENT_REUSE_OFF = 0, SEGMENT_REUSE_EXACT = 1, SEGMENT_REUSE_APPROX = 2 } SegmentReuseMode;

typedef struct {
    int dst_start, n_tokens; /* tokens [dst_start, dst_start + n_tokens) of the new sequence */
    int32_t src_pos;         /* where the first of them sits in the cached sequence */
    bool exact;
    int first_block, n_blocks; /* the source's device blocks: KvSegmentPlan.src_blocks[first_block ..) */
} KvSegmentSpan;

/* The segments found for one sequence (kv_cache_find_segments). Between find and place/drop its
 * source blocks are held, so eviction cannot hand them out. */
typedef struct {
    KvSegmentSpan *spans;
    int n, cap;
    int32_t *src_blocks;
    int n_src_blocks, cap_src_blocks;
    bool held;
    int reused_tokens;  /* sum of the spans' n_tokens */
    bool inexact;       /* some span is approximate; the first starts at first_inexact */
    int first_inexact;
    int lsh_tokens;     /* of reused_tokens, those from near-duplicate chunks (segment_lsh.h) */
} KvSegmentPlan;

/* Defaults: workflow ids nothing refers to kept for a workflow's return (its forecast stays), and
 * agent names kept. */
#define KV_CACHE_MAX_IDLE_WORKFLOWS 4096
#define KV_CACHE_MAX_AGENT_NAMES 4096
/* Default bound on the workflow uses of all nodes together (CacheNodeUse: 16 bytes on the node and
 * a pointer in the workflow's list): this many per block of both pools, and at least the minimum.
 * A node's uses are its active workflows (ended ones are dropped), so the bound is reached only
 * when active workflows times the nodes each uses passes it. */
#define KV_CACHE_USES_PER_BLOCK 16
#define KV_CACHE_MIN_USES 65536

typedef struct {
    int block_size;       /* tokens per block */
    int max_idle_workflows; /* 0 = KV_CACHE_MAX_IDLE_WORKFLOWS */
    long max_node_uses;   /* bound on all nodes' workflow uses together; 0 = the default above */
    int device_blocks;    /* device pool size including the null block 0 */
    int host_blocks;      /* host pool size including its null block; <= 1 turns the host tier off */
    const EvictPolicy *policy; /* both tiers; NULL = LRU */
    EvictPolicyOptions policy_options; /* handed to the policy's create (zero: its defaults) */
    void *policy_state;   /* for policies without create (e.g. the simulator's Belady) */
    double (*clock)(void); /* seconds, for TTLs and events; NULL = braid_now_seconds */
    /* Segment index (off when false): the chunker's anchor tokens (the chat template's control
     * tokens), the approximate mode's window W, the most chunks indexed (0 = one per
     * CHUNKER_MIN_TOKENS device slots) and a seed naming the model (mixed into chunk hashes so a
     * chunk never matches across models, tokenizers or RoPE settings). */
    bool segments;
    const int32_t *anchor_tokens;
    int n_anchor_tokens;
    int approx_window;
    int segment_max_entries;
    uint64_t model_seed;
    /* Near-duplicate segments (segment_lsh.h), approx mode only: on when segment_lsh; a chunk
     * with no exact-hash entry may take the equal tokens of an entry whose MinHash similarity is at
     * least tau_seg and whose left-context similarity is at least tau_ctx (0 = the defaults
     * below). segment_canon (n_segment_canon; NULL = token ids as they are; borrowed, must outlive
     * the cache): each token id's canonical class, for index keys only. */
    bool segment_lsh;
    double segment_tau_seg, segment_tau_ctx;
    const int32_t *segment_canon;
    int n_segment_canon;
    /* By default a near-duplicate is taken only past the sequence's first approximate span (it
     * never makes an exact sequence approximate: approximate blocks are never sources, so an early
     * approximation shrinks what later requests can reuse). anywhere: also before it. */
    bool segment_lsh_anywhere;
    /* Prefetch mode (PBKV App. E). 0 = conservative (§4.3, the default): free blocks and retired
     * cache only, and a prefetched node no request used yet is the device's next victim. In (0, 1]:
     * aggressive, the paper's variant: each kv_cache_prefetch may also evict active cache, lowest
     * score first, up to prefetch_rho x the device's blocks, and prefetched nodes keep the policy's
     * own score (they are not given back first). */
    double prefetch_rho;
} KvCacheConfig;

#define KV_CACHE_DEFAULT_TAU_SEG 0.5
#define KV_CACHE_DEFAULT_TAU_CTX 0.5

/* A SHARE's audience: the owner tenant's nodes marked with it are visible to these tenants. */
typedef struct {
    uint32_t owner;
    bool all;
    uint32_t *tenants; /* sorted */
    int n;
} KvShareScope;

/* What a hint did (kv_hints.c). */
typedef enum { KV_HINT_ACCEPTED = 0, KV_HINT_CLIPPED, KV_HINT_DEFERRED, KV_HINT_REJECTED } KvHintStatus;
typedef struct {
    KvHintStatus status;
    int blocks;        /* blocks it took effect on */
    int blocks_asked;  /* blocks it named that the cache holds */
    const char *reason; /* static text; for clipped, deferred and rejected */
} KvHintOutcome;
const char *kv_hint_status_name(KvHintStatus s);

typedef struct KvCacheHeap {
    RadixNode **nodes;
    int n, cap;
} KvCacheHeap;

/* Per interned workflow id: the nodes whose uses name it (CacheNodeUse.index_pos is a node's place
 * in its list), so a forecast or an end re-keys only them; the identities (requests) holding the
 * id; whether the workflow ended. An id nothing refers to (no holder, no node) is reclaimed at once
 * when the workflow ended, else it waits on the names' idle list (see Identity above). */
typedef struct {
    RadixNode **nodes;
    int n, cap;
    int holders;
    bool ended;
} KvCacheWorkflowNodes;

typedef struct {
    const EvictPolicy *policy;
    void *state;
    bool owns_state;
    BlockPool pool;
    KvCacheHeap heap;
} KvCacheTier;

typedef struct KvCache {
    int block_size;
    KvCacheTier tiers[CACHE_N_TIERS];
    bool host_enabled;
    RadixTree tree;
    CacheNames names;
    CacheOpList pending;      /* operations not yet taken into a step plan */
    uint64_t tick;            /* access clock (CacheNodeMeta.last_access) */
    int n_nodes;              /* non-root nodes; each heap has room for all of them */
    KvCacheCounters counters;
    CacheEventFn on_event;
    void *event_ctx;
    double (*clock)(void);
    RadixNode **path;         /* (cap_path) acquire's root-to-node scratch */
    int cap_path;
    KvCacheWorkflowNodes *by_workflow; /* (cap_workflows) indexed by interned workflow id */
    int cap_workflows;
    int max_idle_workflows;
    long n_uses, max_uses;    /* workflow uses on all nodes (== index entries), and their bound */
    struct KvCachePrefetchCand *cands; /* (cap_cands) kv_cache_prefetch's candidate heap */
    int cap_cands;
    double prefetch_rho;       /* KvCacheConfig.prefetch_rho: 0 conservative, > 0 aggressive */
    bool segments_on;
    SegmentIndex segments;
    bool lsh_on;               /* near-duplicate index (segment_lsh.h) kept beside segments */
    SegmentLsh lsh;
    double tau_seg, tau_ctx;
    bool lsh_anywhere;
    ChunkerConfig chunker;
    int approx_window;
    uint64_t model_seed;
    Chunk *chunks;             /* (cap_chunks) chunker scratch */
    int cap_chunks;
    int32_t *seq_blocks;       /* (cap_seq_blocks) a committed sequence's tree blocks */
    int cap_seq_blocks;
    /* Directives (kv_hints.c): pinned nodes (RadixNode.pin_pos), pinned device blocks per interned
     * tenant id and in all, share scopes, namespaces holding shared nodes. */
    RadixNode **pinned;
    int n_pinned, cap_pinned;
    int *pinned_by_tenant;
    int cap_pinned_tenants;
    int pinned_total;
    KvShareScope *scopes;
    int n_scopes, cap_scopes;
    uint64_t *shared_ns;
    int n_shared_ns, cap_shared_ns;
    struct KvCacheBorrower *borrower; /* kv_cache_set_borrower; NULL = none */
} KvCache;

/* A borrower of device blocks (cache/residual_cache.h's unified pool: ForkKV residuals live in base
 * blocks it reserved here). When kv_cache_reserve is short, this cache and the borrower give memory
 * back in one eviction order: whichever lowest victim is lower (heap class, then key: the caches
 * must share one clock) goes first. victim: the borrower's lowest victim (false: none); reclaim:
 * frees it and returns the blocks it no longer needs to this cache (kv_cache_release); its count. */
typedef struct KvCacheBorrower {
    bool (*victim)(void *ctx, int *heap_class, double *key);
    int (*reclaim)(void *ctx);
    void *ctx;
} KvCacheBorrower;

int kv_cache_init(KvCache *c, const KvCacheConfig *cfg, BraidError *err);
/* Emits a CLEARED event, then frees everything. */
void kv_cache_free(KvCache *c);
void kv_cache_set_observer(KvCache *c, CacheEventFn fn, void *ctx);
/* b (kept by the caller, NULL = none) is asked before this cache's own victims when reserve is short. */
void kv_cache_set_borrower(KvCache *c, KvCacheBorrower *b);
/* The lowest device victim's (heap class, key); false when nothing is evictable. */
bool kv_cache_victim(const KvCache *c, int *heap_class, double *key);
/* Locks node's path as a match does (a lock keeps a node from eviction); kv_cache_release(c, node, NULL, 0) ends it. */
void kv_cache_lock(KvCache *c, RadixNode *node);

/* Interns the names (NULL or "" = none) into ids; the caller holds the workflow id until
 * kv_cache_identity_release (a new call of an ended workflow revives it). -1 only when out of
 * memory (then nothing is held). */
int kv_cache_identity(KvCache *c, const char *tenant, const char *adapter, const char *workflow, const char *agent,
                      CacheIdentity *id, BraidError *err);
/* The caller is done with id (after its last commit/release): its workflow id may be reclaimed. */
void kv_cache_identity_release(KvCache *c, const CacheIdentity *id);
/* Workflow ids interned now, and the largest id ever handed out (tables indexed by it). */
int kv_cache_workflows_live(const KvCache *c);
int kv_cache_workflows_max_id(const KvCache *c);
/* The name of an interned id of a kind, "" for 0 or unknown. */
const char *kv_cache_name(const KvCache *c, CacheNameKind kind, uint32_t id);

int kv_cache_match(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, KvCacheMatch *m, BraidError *err);
/* The whole blocks kv_cache_match would match now (device and host tiers), read-only: no lock, no
 * split, no LRU touch, no counter. For deciding whether a request should wait for blocks another
 * one is about to bring (worker/import_followers.h, the scheduler's shared-prefill rule). */
int kv_cache_peek_prefix(const KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens);
/* See the protocol above; table needs room for m->device_blocks + m->host_blocks entries. On
 * return m->node is the locked node ending the usable prefix (it may move up when loads stopped
 * short) and m->device_blocks the usable count, m->host_blocks the number loaded. */
int kv_cache_acquire(KvCache *c, KvCacheMatch *m, int32_t *table, BraidError *err);
/* n device blocks held by the caller into out. Returns 0, or the number of blocks it could not
 * find even after evicting everything evictable (then it takes none). */
int kv_cache_reserve(KvCache *c, int n, int32_t *out);
/* *lock is the caller's locked node (NULL = none); with relock it moves to the node ending the
 * committed blocks. table[0..n_full) are the caller's blocks for those tokens. */
int kv_cache_commit(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_full, const int32_t *table, RadixNode **lock,
                    bool relock, BraidError *err);
void kv_cache_release(KvCache *c, RadixNode *lock, const int32_t *table, int n_blocks);

/* KV block moves, the lending side (worker/kv_moves.h). After kv_cache_match, the matched blocks
 * (device_blocks + host_blocks of m) in sequence order: each block's tier (CACHE_TIER_DEVICE where
 * its node is on the device, else CACHE_TIER_HOST) and id, for another instance to read. Until
 * kv_cache_lend_end the match's lock keeps the device blocks and the path's host copies are not
 * evicted either. Returns the count. */
int kv_cache_lend(KvCache *c, const KvCacheMatch *m, uint8_t *tiers, int32_t *blocks);
/* A request of id's workflow waits in the instance's queue and will read the cached prefix of
 * tokens (as kv_cache_match would find it now): each node of that prefix records the workflow (and
 * agent) as a use and counts the wait (CacheNodeUse.waiting), so a policy that values a workflow's
 * uses (pbkv) keeps what the queued call is about to read. No tick, hit or lock: LRU order and
 * the pool are unchanged. kv_cache_unnote_waiting takes the count back when the request leaves
 * the queue (admitted or cancelled); a node evicted meanwhile took its count with it. Both return
 * the nodes changed (0 for a request without a workflow), -1 when out of memory. */
int kv_cache_note_waiting(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens);
int kv_cache_unnote_waiting(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens);
/* The lease of kv_cache_lend is over: the marks go and the match's lock is released. */
void kv_cache_lend_end(KvCache *c, RadixNode *lock);

/* Frees at least n blocks of a tier (device: demote or drop; host: evict), as pressure would.
 * Returns the number freed. */
int kv_cache_evict(KvCache *c, CacheTier tier, int n);
/* Appends the pending operations to out and clears them; -1 when out of memory (kept pending). */
int kv_cache_take_ops(KvCache *c, CacheOpList *out);
/* A workflow ended: its policies hear it; its id is reclaimed once nothing names it. Unknown names
 * are ignored. */
void kv_cache_workflow_end(KvCache *c, const char *workflow);
/* A workflow's predicted next calls (see CachePrediction: prob is (k, n_agents), agents by name)
 * reach the policies; names are interned. -1 only when out of memory. */
int kv_cache_predict(KvCache *c, const char *workflow, const char *current_agent, int k, int n_agents, const char *const *agents,
                     const float *prob, BraidError *err);
/* Conservative prefetch from the host tier (PBKV §4.3). Candidates are host-only nodes whose parent
 * is on the device (or is a root), so loading one keeps the device set ancestor-closed; a loaded
 * node's host-only children become candidates in turn. They are ranked by the device policy's
 * prefetch_value (highest first, only values > 0) and loaded greedily, at most max_blocks (the
 * caller's copy budget; a node longer than what is left is split there and its first blocks
 * loaded, its rest staying a candidate), into the prefetch region: device blocks free beyond keep_free (what
 * the caller's running requests still need), plus the policy's reclaimable nodes (retired cache),
 * which are evicted for it first; active cache is never evicted or demoted for a prefetch. A load
 * is a load-back with no request: LOAD ops on the pending list, the node on both tiers, its device
 * blocks owned by the tree alone. Until a request uses it, such a node is the device's next victim
 * after decayed and retired cache (its host copy stays, so giving it back costs nothing): a
 * prefetch borrows room, it never displaces. Aggressive mode (KvCacheConfig.prefetch_rho > 0,
 * App. E): when free blocks and retired cache leave less room than the candidates want, active
 * device nodes are evicted too, lowest score first, at most prefetch_rho x the device's blocks per
 * call (counted as prefetch_displaced_blocks), and a prefetched node keeps its policy score (it is
 * not the next victim). *loaded_out (may be NULL) gets the blocks loaded. A
 * policy without prefetch_value, or no host tier, loads nothing. Returns 0, or -1 when out of
 * memory (what was loaded before stays loaded and counted). */
int kv_cache_prefetch(KvCache *c, int max_blocks, int keep_free, int *loaded_out);
/* Segment reuse (kv_segments.c). Finds, for tokens[from, n_tokens - 1) (the last token is always
 * computed: its logits pick the next one), the chunks the index holds that mode admits, and holds
 * their source blocks; plan is reset first. 0, or -1 when out of memory (nothing held). With the
 * index off or mode OFF it finds nothing. */
int kv_cache_find_segments(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, int from,
                           SegmentReuseMode mode, KvSegmentPlan *plan, BraidError *err);
/* The same, appending to plan (spans already in it end at or before `from`). */
int kv_cache_find_more_segments(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, int from,
                                SegmentReuseMode mode, KvSegmentPlan *plan, BraidError *err);
/* Appends the COPY_SLOTS operations that land the plan's spans in the sequence's blocks (table
 * covers every span) to the pending list, then releases the holds. -1 when out of memory (then
 * nothing was appended and the holds are released). */
int kv_cache_place_segments(KvCache *c, KvSegmentPlan *plan, const int32_t *table, BraidError *err);
/* Releases the holds and forgets the spans. */
void kv_cache_drop_segments(KvCache *c, KvSegmentPlan *plan);
void kv_cache_segment_plan_free(KvSegmentPlan *plan);
/* The parsed name ("off", "exact", "approx") of a mode; -1 when unknown. */
int segment_reuse_parse(const char *name);
const char *segment_reuse_name(SegmentReuseMode mode);

/* ---- directives (kv_hints.c; cache_directive.h says what each does) ----
 * Spans are positions of `tokens`, the sequence as the request runs it, in id's namespace; only
 * what is cached on the device on that path (and through approximate nodes the identity may
 * match: approx_ok, or its conversation's) is acted on. Each fills out and returns 0, or -1 with err when out of memory. */
/* Pins the prefix through `end` until now + ttl_s, within budget_blocks pinned blocks for the
 * tenant (clipped to what fits; the blocks already pinned on the path are not counted twice). */
int kv_cache_pin(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int end, double ttl_s, int budget_blocks,
                 KvHintOutcome *out, BraidError *err);
int kv_cache_decay(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int start, int end, KvHintOutcome *out, BraidError *err);
/* Drops the path's blocks from the one holding `start` on, with everything below them; nodes in
 * use or pinned stay (decayed, so they go first once free): then clipped, or deferred if all stay. */
int kv_cache_evict_from(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, int start, KvHintOutcome *out,
                        BraidError *err);
/* Unpins the pinned blocks of the path through `end` (they become ordinary cached blocks, evictable
 * by the policy): accepted with the blocks unpinned, rejected when none of the path was pinned. */
int kv_cache_unpin(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int end, KvHintOutcome *out, BraidError *err);
/* Drops adapter `adapter`'s namespaces (every tenant's tree of that adapter name, or cache name):
 * their pins are released and every block nobody holds leaves the cache at once (every tier); held
 * blocks stay, decayed, and *kept counts them. Returns the blocks dropped (0 when the name was never
 * seen). For an adapter that was unloaded: no request can reach those trees again. */
int kv_cache_drop_adapter(KvCache *c, const char *adapter, int *kept);
/* Makes the prefix through `end` visible to the named tenants (all: to every tenant). */
int kv_cache_share(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int end, bool all, const char *const *tenants,
                   int n_tenants, KvHintOutcome *out, BraidError *err);
/* Unpins until at least n_blocks pinned device blocks are released, earliest deadline first (a
 * request that cannot otherwise be admitted); returns the blocks unpinned. */
int kv_cache_unpin_for(KvCache *c, int n_blocks);
int kv_cache_pinned(const KvCache *c);              /* pinned device blocks */
int kv_cache_pinned_by(const KvCache *c, uint32_t tenant);
/* Amortized splice: appends to plan the spans of d's runs whose source K/V the context's cached
 * path holds (clipped to [from, n_tokens - 1)), holding their blocks; reused[i] (n_runs entries,
 * may be NULL) gets each run's reused tokens. A host-only part of the path is loaded back onto the
 * device first (LOAD ops before the copies; as far as device blocks allow, evicting elsewhere;
 * counted in host_hit_blocks / loaded_blocks). 0 or -1 (out of memory; plan dropped). */
int kv_cache_plan_splice(KvCache *c, const CacheIdentity *id, const CacheDirectives *d, int n_tokens, int from, KvSegmentPlan *plan,
                         int *reused, BraidError *err);
/* Tenant sharing: the longest prefix of tokens another tenant shared with id's tenant (same adapter,
 * exact K/V, on the device or loaded back from the host as a splice's source is) beyond `from`,
 * appended to plan as one exact span. Returns the position
 * the plan now covers to (from when nothing), -1 when out of memory. */
int kv_cache_plan_shared(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, int from, KvSegmentPlan *plan,
                         BraidError *err);

/* Once per scheduler step, with the step's time. */
void kv_cache_step(KvCache *c, double now);

int kv_cache_total(const KvCache *c, CacheTier tier);  /* usable blocks */
int kv_cache_free_blocks(const KvCache *c, CacheTier tier);
int kv_cache_in_use(const KvCache *c, CacheTier tier);
int kv_cache_cached(const KvCache *c, CacheTier tier);
/* Full consistency check (tests, debug builds): per-tier accounting, tree, heaps, tier closure. */
int kv_cache_check(const KvCache *c, BraidError *err);

#endif
