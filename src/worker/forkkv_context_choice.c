#include "worker/forkkv_context_choice.h"

#include <stdlib.h>
#include <string.h>

int forkctx_init(ForkCtxTable *t, double hysteresis, bool per_adapter) {
    memset(t, 0, sizeof *t);
    t->cap = 64;
    t->hysteresis = hysteresis > 0 ? hysteresis : 0;
    t->per_adapter = per_adapter;
    if (!(t->slots = calloc((size_t)t->cap, sizeof *t->slots))) return -1;
    return 0;
}

void forkctx_free(ForkCtxTable *t) {
    for (int i = 0; t->slots && i < t->cap; i++) free(t->slots[i].last);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

uint64_t forkctx_context_key(const uint64_t *base_hashes, int n_blocks) {
    if (n_blocks <= 0) return 0;
    uint64_t k = base_hashes[(n_blocks < FORKCTX_KEY_BLOCKS ? n_blocks : FORKCTX_KEY_BLOCKS) - 1];
    return k ? k : 1; /* 0 marks an empty slot */
}

static int slot_of(const ForkCtxTable *t, uint64_t key) {
    int i = (int)((key ^ (key >> 31)) & (uint64_t)(t->cap - 1));
    while (t->slots[i].key && t->slots[i].key != key) i = (i + 1) & (t->cap - 1);
    return i;
}

static ForkCtx *find(const ForkCtxTable *t, uint64_t key) {
    if (!key || !t->slots) return NULL;
    ForkCtx *x = &t->slots[slot_of(t, key)];
    return x->key == key ? x : NULL;
}

/* Doubles the table (its load kept under one half); -1 when out of memory (the table unchanged). */
static int grow(ForkCtxTable *t) {
    ForkCtxTable bigger = *t;
    bigger.cap = t->cap * 2;
    if (!(bigger.slots = calloc((size_t)bigger.cap, sizeof *bigger.slots))) return -1;
    for (int i = 0; i < t->cap; i++)
        if (t->slots[i].key) bigger.slots[slot_of(&bigger, t->slots[i].key)] = t->slots[i];
    free(t->slots);
    *t = bigger;
    return 0;
}

static ForkCtx *find_or_add(ForkCtxTable *t, uint64_t key) {
    ForkCtx *x = find(t, key);
    if (x || !key) return x;
    if (2 * (t->n + 1) > t->cap && grow(t)) return NULL;
    x = &t->slots[slot_of(t, key)];
    x->key = key;
    t->n++;
    return x;
}

/* The adapter's slot in the context (a new one while there is room, else the last). */
static ForkCtxReader *reader_of(ForkCtx *x, uint64_t adapter, bool add) {
    for (int i = 0; i < x->n_readers; i++)
        if (x->readers[i].adapter == adapter) return &x->readers[i];
    if (!add) return NULL;
    if (x->n_readers == FORKCTX_MAX_READERS) return &x->readers[FORKCTX_MAX_READERS - 1];
    x->readers[x->n_readers] = (ForkCtxReader){.adapter = adapter};
    return &x->readers[x->n_readers++];
}

int forkctx_observe(ForkCtxTable *t, uint64_t context, uint64_t adapter, const uint64_t *base_hashes, int n_blocks,
                    int block_tokens, ForkCtxSeen *seen) {
    memset(seen, 0, sizeof *seen);
    ForkCtx *x = find_or_add(t, context);
    if (!x) return -1;
    if (n_blocks > x->cap_last) { /* before anything changes: out of memory records nothing */
        uint64_t *h = realloc(x->last, (size_t)n_blocks * sizeof *h);
        if (!h) return -1;
        x->last = h;
        x->cap_last = n_blocks;
    }
    ForkCtxReader *rd = reader_of(x, adapter, true);
    rd->reads++;
    x->reads++;
    /* Shared = what two different adapters' prompts have in common: the document, not one agent's
     * own growing history (which a forked adapter alone writes into the base tree). */
    if (x->n_last > 0 && x->last_adapter != adapter) {
        int common = 0, n = n_blocks < x->n_last ? n_blocks : x->n_last;
        while (common < n && x->last[common] == base_hashes[common]) common++;
        if (common * block_tokens > x->shared_tokens) x->shared_tokens = common * block_tokens;
    }
    if (n_blocks > 0) memcpy(x->last, base_hashes, (size_t)n_blocks * sizeof *base_hashes);
    x->n_last = n_blocks;
    x->last_adapter = adapter;
    seen->shared_tokens = x->shared_tokens;
    seen->readers = x->n_readers;
    seen->adapter_reads = rd->reads;
    return 0;
}

void forkctx_price(const ForkKvCost *c, const ForkKvRequest *q, const ForkCtxSeen *seen, int own_before, int pool_tokens,
                   uint64_t context, uint64_t adapter, int block_tokens, ForkCtxRead *out) {
    int n = q->n_prompt > 0 ? q->n_prompt : 0, shared = seen->shared_tokens < n ? seen->shared_tokens : n;
    int reuses_now = q->base < q->residual ? q->base : q->residual, steady_reuse = shared;
    if (reuses_now > steady_reuse) steady_reuse = reuses_now;
    if (q->own > steady_reuse) steady_reuse = q->own;
    /* Steady state: the base and this adapter's residuals hold the shared context and whatever this
     * adapter's namespace holds now (its own earlier turns); a fork computes only the rest of its
     * prompt through ResidualAttention. */
    ForkKvRequest warm = *q;
    warm.residual_known = true;
    warm.base = warm.residual = steady_reuse;
    warm.own = 0;
    ForkKvChoice steady = forkkv_cost_choose(c, &warm), now = forkkv_cost_choose(c, q);
    double res = c->kv_dim_over_rank > 0 ? 1.0 / c->kv_dim_over_rank : 1.0, k = seen->readers > 0 ? seen->readers : 1;
    /* One base plus k residuals of the shared context in place of k copies: where that fits the pool
     * (beside the running requests' own parts) the fork stops the recompute; where it does not, the
     * forked context is evicted as the copies were, and forking saves nothing. */
    double fork_tokens = shared * (1.0 + k * res);
    bool stays_cached = k > 1 && fork_tokens <= FORKCTX_FIT_SHARE * pool_tokens;
    double once = now.penalty_s + now.recompute_s - steady.penalty_s;
    int bt = block_tokens > 0 ? block_tokens : 1, own_now = q->own > 0 ? q->own : 0;
    int before = own_before > own_now ? own_before : own_now;
    *out = (ForkCtxRead){.context = context, .adapter = adapter, .steady_penalty_s = steady.penalty_s,
                         .full_saving_s = stays_cached ? c->token_s * shared : 0.0, .one_time_s = once > 0 ? once : 0.0,
                         .fallback_regret = c->regret, .reread_blocks = before / bt, .evicted_blocks = (before - own_now) / bt};
}

static double ewma(double old, double sample, int n) {
    double w = 1.0 / (n > 0 ? n : 1);
    if (w < FORKCTX_EWMA) w = FORKCTX_EWMA;
    return old + w * (sample - old);
}

/* Old evidence of the context's regret fades by this much a warm separate read. */
#define REGRET_DECAY 0.8

/* The hysteresis: a choice moves only when its margin clears the band on the other side. */
static bool settle(ForkCtxTable *t, ForkCtx *x, bool *forked, double saving, double penalty, double one_time, double reads_each) {
    double band = t->hysteresis * penalty;
    if (!*forked && saving - penalty - one_time / (reads_each > 1 ? reads_each : 1) > band) {
        *forked = true;
    } else if (*forked && saving - penalty < -band) {
        *forked = false;
    } else {
        return *forked;
    }
    x->switches++;
    t->switches++;
    return *forked;
}

int forkctx_decide(ForkCtxTable *t, const ForkCtxRead *r) {
    ForkCtx *x = find(t, r->context);
    if (!x) return -1;
    /* A full context prices adapters past the last slot as that slot's (forkctx_observe put them there). */
    ForkCtxReader *rd = reader_of(x, r->adapter, x->n_readers == FORKCTX_MAX_READERS);
    if (!rd) return -1;
    bool forked = t->per_adapter ? rd->forked : x->forked;
    /* Regret is evidence about separate copies: only a separate read with a copy before says it. */
    if (!forked && r->reread_blocks > 0) {
        x->evicted = REGRET_DECAY * x->evicted + r->evicted_blocks;
        x->reread = REGRET_DECAY * x->reread + r->reread_blocks;
    }
    double regret = x->reread > 0 ? x->evicted / x->reread : r->fallback_regret;
    x->penalty = ewma(x->penalty, r->steady_penalty_s, ++x->penalty_samples);
    if (!forked) x->one_time = ewma(x->one_time, r->one_time_s, ++x->one_time_samples);
    double saving = regret * r->full_saving_s, reads_each = (double)x->reads / (x->n_readers > 0 ? x->n_readers : 1);
    if (!t->per_adapter) return settle(t, x, &x->forked, saving, x->penalty, x->one_time, reads_each);
    rd->penalty = ewma(rd->penalty, r->steady_penalty_s, ++rd->penalty_samples);
    if (!forked) rd->one_time = ewma(rd->one_time, r->one_time_s, ++rd->one_time_samples);
    return settle(t, x, &rd->forked, saving, rd->penalty, rd->one_time, rd->reads);
}

int forkctx_choose(ForkCtxTable *t, const ForkKvCost *c, const ForkKvRequest *q, const uint64_t *base_hashes, int n_blocks,
                   int block_tokens, uint64_t adapter, int own_before, int pool_tokens) {
    uint64_t context = forkctx_context_key(base_hashes, n_blocks);
    ForkCtxSeen seen;
    if (!context || forkctx_observe(t, context, adapter, base_hashes, n_blocks, block_tokens, &seen)) return -1;
    ForkCtxRead read;
    forkctx_price(c, q, &seen, own_before, pool_tokens, context, adapter, block_tokens, &read);
    return forkctx_decide(t, &read);
}

int forkctx_current(const ForkCtxTable *t, uint64_t context, uint64_t adapter) {
    const ForkCtx *x = find(t, context);
    if (!x) return -1;
    if (!t->per_adapter) return x->forked;
    for (int i = 0; i < x->n_readers; i++)
        if (x->readers[i].adapter == adapter) return x->readers[i].forked;
    return -1;
}
