/*
 * kv_segments_lsh.c — near-duplicate segment reuse (paper 003 § 3.4, candidate retrieval by
 * MinHash/LSH, approximate mode): the cache's hooks into its LSH index (segment_lsh.h) and the
 * admission of a near-duplicate's K/V.
 *
 * What is reused, and why it is sound in approximate mode: a near-duplicate differs from the new
 * chunk in a few tokens. A differing token's K/V belong to another token and are never reused: the
 * two chunks are aligned by their common prefix and common suffix of token ids, and everything
 * between is computed. An equal token's cached K/V were shaped (in every layer past the first) by
 * the tokens before it, so the same guard as every approximate reuse applies: its W tokens of left
 * context must be equal. For the prefix that is the window before the chunk (compared by its hash,
 * as for an exact-hash chunk); for the suffix it means starting W tokens past the last differing
 * token. Exact mode never gets here (kv_segments.c asks only in approximate mode).
 *
 * Where: approximate blocks never become sources (kv_segments_register), so an approximation early
 * in a sequence takes everything after it out of later requests' reach. Measured in the simulator,
 * near-duplicates taken anywhere cost more exact-hash reuse than they add; by default they are
 * taken only once the plan is already approximate (segment_lsh_anywhere lifts that).
 */
#include "cache/kv_segments.h"

int kv_segments_lsh_init(KvCache *c, const KvCacheConfig *cfg, int max_entries, BraidError *err) {
    if (!cfg->segment_lsh) return 0;
    if (segment_lsh_init(&c->lsh, cfg->device_blocks, max_entries, cfg->segment_canon, cfg->n_segment_canon, err))
        return braid_error_wrap(err, "kv cache: segment lsh index");
    c->lsh_on = true;
    c->tau_seg = cfg->segment_tau_seg > 0 ? cfg->segment_tau_seg : KV_CACHE_DEFAULT_TAU_SEG;
    c->tau_ctx = cfg->segment_tau_ctx > 0 ? cfg->segment_tau_ctx : KV_CACHE_DEFAULT_TAU_CTX;
    c->lsh_anywhere = cfg->segment_lsh_anywhere;
    return 0;
}

/* The left context's signature: the SEGMENT_LSH_CTX_TOKENS tokens before start. */
static void sign_context(const KvCache *c, uint64_t seed, const int32_t *tokens, int start, LshSignature *out) {
    int from = start > SEGMENT_LSH_CTX_TOKENS ? start - SEGMENT_LSH_CTX_TOKENS : 0;
    segment_lsh_sign(&c->lsh, seed, tokens + from, start - from, out);
}

void kv_segments_lsh_register(KvCache *c, const CacheIdentity *id, uint64_t seed, const int32_t *tokens, const Chunk *ch,
                              uint64_t window_hash, const int32_t *blocks, int n_blocks) {
    if (!c->lsh_on) return;
    LshSignature seg, ctx;
    segment_lsh_sign(&c->lsh, seed, tokens + ch->start, ch->len, &seg);
    sign_context(c, seed, tokens, ch->start, &ctx);
    SegmentLshKey key = {.tenant = id->tenant, .adapter = id->adapter, .seg = &seg, .ctx = &ctx, .window_hash = window_hash,
                         .pos = ch->start, .len = ch->len, .tokens = tokens + ch->start};
    int rc = segment_lsh_add(&c->lsh, &key, blocks, n_blocks);
    if (rc == 0) c->counters.segment_lsh_indexed++;
    else if (rc == 2) c->counters.segment_lsh_refused_full++;
}

static int common_prefix(const int32_t *a, const int32_t *b, int n) {
    int i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static int common_suffix(const int32_t *a, int na, const int32_t *b, int nb, int n) {
    int i = 0;
    while (i < n && a[na - 1 - i] == b[nb - 1 - i]) i++;
    return i;
}

/* Adds chunk-relative tokens [rel_lo, rel_hi) of the new chunk, at src_rel in the entry, clipped
 * to [lo, hi) of the sequence. Returns the tokens added, -1 when out of memory. */
static int add_run(KvCache *c, KvSegmentPlan *plan, const Chunk *ch, const SegmentLshEntry *e, int rel_lo, int rel_hi, int src_rel,
                   int lo, int hi) {
    int a = ch->start + rel_lo, b = ch->start + rel_hi;
    if (a < lo) {
        src_rel += lo - a;
        a = lo;
    }
    if (b > hi) b = hi;
    if (b <= a) return 0;
    if (kv_segments_add_span(c, plan, a, b, e->pos + src_rel, e->blocks, e->pos / c->block_size, false)) return -1;
    return b - a;
}

int kv_segments_lsh_find(KvCache *c, const CacheIdentity *id, uint64_t seed, const int32_t *tokens, const Chunk *ch, int lo, int hi,
                         uint64_t window_hash, KvSegmentPlan *plan) {
    if (!c->lsh_on) return 0;
    /* Spans come in position order: an inexact plan's first approximate token is before lo. */
    if (!c->lsh_anywhere && !plan->inexact) return 0;
    LshSignature seg, ctx;
    segment_lsh_sign(&c->lsh, seed, tokens + ch->start, ch->len, &seg);
    sign_context(c, seed, tokens, ch->start, &ctx);
    SegmentLshResult res;
    segment_lsh_query(&c->lsh, id->tenant, id->adapter, &seg, &ctx, c->tau_seg, c->tau_ctx, &res);
    if (res.n_candidates == 0) return 0;
    c->counters.segment_lsh_candidates++;
    if (res.best < 0) {
        c->counters.segment_lsh_rejected_tau++;
        return 0;
    }
    const SegmentLshEntry *e = segment_lsh_entry(&c->lsh, res.best);
    const int32_t *mine = tokens + ch->start;
    int n = ch->len, m = e->len, shorter = n < m ? n : m, w = c->approx_window;
    int p = common_prefix(mine, e->tokens, shorter);
    int s = p == shorter ? 0 : common_suffix(mine, n, e->tokens, m, shorter - p);
    int got = 0, r;
    if (p > 0 && e->window_hash == window_hash) { /* equal windows before the chunk */
        if ((r = add_run(c, plan, ch, e, 0, p, 0, lo, hi)) < 0) return -1;
        got += r;
    }
    if (s > w) { /* the suffix's tokens whose W-window lies inside the equal suffix */
        if ((r = add_run(c, plan, ch, e, n - s + w, n, m - s + w, lo, hi)) < 0) return -1;
        got += r;
    }
    if (got == 0) {
        c->counters.segment_lsh_rejected_guard++;
        return 0;
    }
    c->counters.segment_lsh_admitted++;
    c->counters.segment_lsh_reused_tokens += (uint64_t)got;
    plan->lsh_tokens += got;
    return 0;
}
