/*
 * forkkv_context_choice.h — --lora-cache auto decided per context, not per request (issue 36).
 *
 * Why: the per-request model (forkkv_cost.h) prices one request alone. A fork's one-time cost —
 * building this adapter's residuals of the shared document, through ResidualAttention, often
 * recomputing a prefix its own separate copy held — lands on the first forked read, while the gain
 * (copies that stop evicting each other) comes on every later read of the context by every adapter.
 * So per request the margins sat within ±6 % of the threshold, and auto ended in a mix of forked
 * and separate adapters that at some pool sizes was worse than either mode (mapreduce-lora 0.66x
 * at 10 240 tokens). Here the choice is made for a whole context (a shared base prefix: the prompt's
 * first blocks, keyed by their chained hash in the tenant's base namespace) and kept until the
 * evidence moves clearly.
 *
 * Contract:
 *  - A context starts SEPARATE (the default mode; nothing is known of its readers).
 *  - forkctx_observe records each read: its adapter (k = the distinct adapters seen) and the shared
 *    prefix s (the longest common prefix, in the base namespace, of two different adapters' prompts:
 *    the document, not one agent's own history).
 *  - forkctx_price prices the read from the live cost model (forkkv_cost.h), n its prompt:
 *      steady_penalty = the penalty of a fork whose base and residuals hold s (ResidualAttention on
 *                       the decode and on the private tail only);
 *      full_saving    = c_tok · s when k ≥ 2 and the forked context fits, s·(1 + k·rank/kv_dim) ≤
 *                       FORKCTX_FIT_SHARE × the pool (one base plus k residuals, beside the running
 *                       requests' own parts), else 0: the recompute of the shared context a separate
 *                       read pays when its copy was evicted, which a fork that stays cached avoids
 *                       (one that does not fit is evicted as the copies were);
 *      one_time       = max(0, penalty + recompute of forking now (the per-request terms) −
 *                       steady_penalty): what this read's fork pays once (residuals to build);
 *      reread / evicted = of the prompt blocks this adapter's own copy held before, the ones gone now.
 *  - forkctx_decide keeps per context (per_adapter: per pair, the regret and k and s staying the
 *    context's) EWMAs of steady_penalty P and one_time O (weight max(1/samples, FORKCTX_EWMA)), and
 *    the context's regret ρ = evicted / reread over its separate reads that were not cold (decayed
 *    sums; until one is seen, the cost model's global regret). With saving S = ρ · full_saving and
 *    R = reads per adapter so far (the past as the estimate of the reads to come):
 *      SEPARATE → FORKED   when S − P − O / R > hysteresis · P
 *      FORKED   → SEPARATE when S − P < −hysteresis · P
 *    and otherwise the choice stays (stickiness: margins within a few percent of the threshold no
 *    longer flip it read by read; an evicted copy while forked is not evidence about separate).
 *  - A context one adapter reads never forks (nothing to share), nor one whose fork does not fit.
 *  - Contexts live in an open-addressed table that grows; at most FORKCTX_MAX_READERS adapters are
 *    tracked per context (more share the last slot).
 * Pure bookkeeping and arithmetic; not thread-safe; one table per scheduler / replay.
 */
#ifndef BRAID_WORKER_FORKKV_CONTEXT_CHOICE_H
#define BRAID_WORKER_FORKKV_CONTEXT_CHOICE_H

#include <stdbool.h>
#include <stdint.h>

#include "worker/forkkv_cost.h"

#define FORKCTX_MAX_READERS 16
#define FORKCTX_EWMA 0.25
/* The share of the base pool a forked context may take and still be priced as staying cached. */
#define FORKCTX_FIT_SHARE 0.75
/* The prompt's first blocks that name its context (a shorter prompt: all its full blocks). */
#define FORKCTX_KEY_BLOCKS 8

typedef struct {
    uint64_t adapter; /* the adapter's namespace seed (content_hash_namespace(tenant, adapter)) */
    int reads;
    double penalty, one_time; /* per_adapter: EWMAs of its reads' terms */
    int penalty_samples, one_time_samples;
    bool forked;      /* per_adapter: its choice */
} ForkCtxReader;

typedef struct {
    uint64_t key; /* 0: an empty slot */
    int shared_tokens; /* the longest prefix two different adapters' reads shared */
    uint64_t *last;    /* the last read's base-namespace hashes, and its adapter */
    int n_last, cap_last;
    uint64_t last_adapter;
    int reads, n_readers;
    ForkCtxReader readers[FORKCTX_MAX_READERS];
    double penalty, one_time;     /* EWMAs over the context's reads (one_time: over its separate ones) */
    int penalty_samples, one_time_samples;
    double evicted, reread;       /* decayed sums over its warm separate reads: the context's regret */
    bool forked;
    int switches;
} ForkCtx;

typedef struct {
    ForkCtx *slots;
    int cap, n;
    double hysteresis; /* in units of the steady penalty */
    bool per_adapter;
    int switches;      /* every context's (or pair's) switches, both ways */
} ForkCtxTable;

/* One read of a context, priced (forkctx_price) or filled by hand (tests). */
typedef struct {
    uint64_t context, adapter;
    double steady_penalty_s;  /* > 0 */
    double full_saving_s;     /* the saving at regret 1 (every separate copy evicted before reuse) */
    double one_time_s;        /* forking now beyond steady state (0 when its residuals are warm) */
    double fallback_regret;   /* the cost model's global regret, until the context measures its own */
    int reread_blocks, evicted_blocks; /* regret evidence: own-copy blocks held before, and gone now */
} ForkCtxRead;

/* hysteresis ≥ 0. -1 when out of memory. */
int forkctx_init(ForkCtxTable *t, double hysteresis, bool per_adapter);
void forkctx_free(ForkCtxTable *t);
/* The context of a prompt: the chained hash of its first FORKCTX_KEY_BLOCKS blocks (fewer when it
 * has fewer) in the tenant's base namespace; 0 (no context: decide per request) without a block. */
uint64_t forkctx_context_key(const uint64_t *base_hashes, int n_blocks);

typedef struct {
    int shared_tokens;  /* the longest prefix two different adapters' reads of the context shared */
    int readers;        /* distinct adapters seen on the context, this one included */
    int adapter_reads;  /* this adapter's reads of the context, this one included */
} ForkCtxSeen;

/* Records a read of context by adapter (its prompt's base-namespace hashes, n_blocks of
 * block_tokens tokens): the shared prefix is the common prefix of these hashes with the last read
 * by another adapter (kept per context). Call once per request, before forkctx_decide. 0, or -1
 * when out of memory (nothing recorded). */
int forkctx_observe(ForkCtxTable *t, uint64_t context, uint64_t adapter, const uint64_t *base_hashes, int n_blocks,
                    int block_tokens, ForkCtxSeen *seen);
/* The read's terms from the cost model: q is what the per-request model would be given now
 * (residual_known), seen what forkctx_observe returned for this read, own_before the prefix (tokens)
 * this adapter's separate copy held at some time (held or evicted since), q->own what it holds now,
 * pool_tokens the base pool's size (the fork's fit test). */
void forkctx_price(const ForkKvCost *c, const ForkKvRequest *q, const ForkCtxSeen *seen, int own_before, int pool_tokens,
                   uint64_t context, uint64_t adapter, int block_tokens, ForkCtxRead *out);
/* Folds the read's margin into its context (per_adapter: its pair) and returns the choice for it:
 * 1 fork, 0 separate, -1 when the context was never observed. */
int forkctx_decide(ForkCtxTable *t, const ForkCtxRead *r);
/* The three above for one request, as a scheduler or the replay calls them: the context of its
 * prompt's base-namespace hashes, observed, priced (q: the per-request model's inputs now) and
 * decided. 1 fork, 0 separate, -1 when there is no context (no full block) or out of memory: the
 * caller keeps the per-request choice. */
int forkctx_choose(ForkCtxTable *t, const ForkKvCost *c, const ForkKvRequest *q, const uint64_t *base_hashes, int n_blocks,
                   int block_tokens, uint64_t adapter, int own_before, int pool_tokens);
/* The current choice without a new read: 1, 0, or -1 when the context is unknown. For a server that
 * asks again at each admission attempt of the same request. */
int forkctx_current(const ForkCtxTable *t, uint64_t context, uint64_t adapter);

#endif
