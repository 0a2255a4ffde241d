/*
 * cache_directive.h — a request's cache directives (Leyline, paper 004) in the form the instance
 * acts on: token positions only, already checked and resolved by the coordinator (or braid batch)
 * from the client's spans, matches and replacement texts (src/coord/directive_plan.h).
 *
 * Splice. The client's prompt is the cached context C it extends; its splices turned it into the
 * prompt P the request runs. `runs` says which stretches of P are C's tokens unchanged:
 * P[dst, dst + len) == C[src, src + len). Amortize: those stretches' K/V are copied from C's cached
 * blocks with their keys turned by dst - src (delta-RoPE) instead of being computed, except the first
 * run before any edit, which is the ordinary cached prefix. Forget: C's cache from the first edit on
 * is dropped and P is computed as any prompt (the prefix before the edit still hits).
 *
 * Hints act on P's cached blocks once its prefill is done; spans are P positions [start, end):
 *   PIN    keep the prefix through `end` on the device for ttl_s (a pinned block is never evicted
 *          before its deadline), within the tenant's pin budget (clipped when over);
 *   DECAY  the blocks of the span are evicted before any other;
 *   EVICT  the blocks from `start` on, and what the cache holds after them on this path (a prefix
 *          cache cannot serve K/V past a dropped block), leave the cache now (those in use: later);
 *   SHARE  the prefix through `end` becomes visible to the named tenants (or to all): their
 *          requests copy it instead of computing it;
 *   UNPIN  the pins on the prefix through `end` end now (its blocks become ordinary cached blocks,
 *          evictable by the policy; the tenant's pin budget gets them back).
 * `index` is the directive's place in the client's list, so outcomes name it.
 */
#ifndef BRAID_CACHE_CACHE_DIRECTIVE_H
#define BRAID_CACHE_CACHE_DIRECTIVE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { CACHE_SPLICE_NONE = 0, CACHE_SPLICE_AMORTIZE = 1, CACHE_SPLICE_FORGET = 2 } CacheSpliceMode;
typedef enum { CACHE_HINT_PIN = 1, CACHE_HINT_DECAY = 2, CACHE_HINT_EVICT = 3, CACHE_HINT_SHARE = 4, CACHE_HINT_UNPIN = 5 } CacheHintOp;

#define CACHE_DIRECTIVE_MAX 32        /* directives in one request */
#define CACHE_SHARE_MAX_TENANTS 16    /* tenants one SHARE names */

typedef struct {
    int32_t dst, src, len;
    int32_t index; /* the splice directive just before this run (-1 for the run before every edit) */
} CacheSpliceRun;

typedef struct {
    uint8_t op;        /* CacheHintOp */
    int32_t index;
    int32_t start, end;
    float ttl_s;       /* PIN */
    uint8_t share_all; /* SHARE: every tenant */
    int n_with;        /* SHARE: tenant names */
    char **with;
} CacheHint;

typedef struct {
    uint8_t splice_mode;   /* CacheSpliceMode; NONE when the request has no splice */
    int32_t first_edit;    /* P (and C) position of the first edit */
    int32_t *context;      /* C, the cached context the splices edit */
    int n_context;
    CacheSpliceRun *runs;  /* sorted by dst, disjoint */
    int n_runs;
    CacheHint *hints;
    int n_hints;
    /* The request's conversation scope when the client named one (conversation_id); 0 = the
     * workflow's, if any (cache_conversation_scope). Not a directive: cache_directives_any ignores it. */
    uint64_t conversation;
    /* The splice was planned by the server (coord/auto_splice.h), not written by the client. */
    uint8_t auto_splice;
} CacheDirectives;

/* Conversation scopes (CacheIdentity.approx_scope): a request's turns share approximate K/V that
 * an amortized splice of the same conversation made. An explicit conversation id and a workflow
 * id give distinct scopes; never 0; 0 for a NULL or empty name. Within one tenant (the tree's
 * namespace already separates tenants). */
uint64_t cache_conversation_scope(const char *conversation_id);
uint64_t cache_workflow_scope(const char *workflow);

void cache_directives_free(CacheDirectives *d);
/* Deep copy; -1 when out of memory (dst left empty). */
int cache_directives_copy(CacheDirectives *dst, const CacheDirectives *src);
static inline bool cache_directives_any(const CacheDirectives *d) { return d->splice_mode != CACHE_SPLICE_NONE || d->n_hints > 0; }
const char *cache_hint_op_name(int op);

#endif
