/* Cache directives in the simulator; the contract is in sim_directives.h. */
#include "sim/sim_directives.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/strmap.h"

/* ---- parsing a trace line's "directives" ---- */

static int int_field(const json_t *o, const char *key, int lo, int hi, int fallback, int *out, int index, BraidError *err) {
    const json_t *v = json_object_get(o, key);
    if (!v) {
        if (fallback < lo) return braid_error_set(err, "directive %d needs \"%s\"", index, key);
        *out = fallback;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return braid_error_set(err, "directive %d: \"%s\" must be an integer in [%d, %d]", index, key, lo, hi);
    *out = (int)json_integer_value(v);
    return 0;
}

static int parse_share_audience(const json_t *o, CacheHint *h, int index, BraidError *err) {
    const json_t *with = json_object_get(o, "with");
    if (json_is_true(json_object_get(o, "all")) || (json_is_string(with) && strcmp(json_string_value(with), "all") == 0)) {
        h->share_all = 1;
        return 0;
    }
    if (!json_is_array(with) || json_array_size(with) == 0 || json_array_size(with) > CACHE_SHARE_MAX_TENANTS)
        return braid_error_set(err, "directive %d: share needs \"with\": 1 to %d tenant names, or \"all\": true", index,
                               CACHE_SHARE_MAX_TENANTS);
    if (!(h->with = calloc(json_array_size(with), sizeof *h->with))) return braid_error_set(err, "out of memory");
    for (size_t k = 0; k < json_array_size(with); k++) {
        const char *name = json_string_value(json_array_get(with, k));
        if (!name) return braid_error_set(err, "directive %d: \"with\" holds a non-string", index);
        if (!(h->with[h->n_with++] = strdup(name))) return braid_error_set(err, "out of memory");
    }
    return 0;
}

static int parse_hint(const json_t *o, const char *op, int prompt_tokens, CacheHint *h, int index, BraidError *err) {
    *h = (CacheHint){.index = index};
    int start = 0, end = prompt_tokens;
    if (!strcmp(op, "pin")) h->op = CACHE_HINT_PIN;
    else if (!strcmp(op, "unpin")) h->op = CACHE_HINT_UNPIN;
    else if (!strcmp(op, "decay")) h->op = CACHE_HINT_DECAY;
    else if (!strcmp(op, "evict")) h->op = CACHE_HINT_EVICT;
    else if (!strcmp(op, "share")) h->op = CACHE_HINT_SHARE;
    else return braid_error_set(err, "directive %d: unknown op \"%s\" (pin, unpin, decay, evict, share, splice)", index, op);
    if (int_field(o, "start", 0, prompt_tokens, 0, &start, index, err) || int_field(o, "end", 0, prompt_tokens, prompt_tokens, &end, index, err))
        return -1;
    if (end < start) return braid_error_set(err, "directive %d: end %d before start %d", index, end, start);
    h->start = start;
    h->end = end;
    if (h->op == CACHE_HINT_PIN) {
        const json_t *ttl = json_object_get(o, "ttl_s");
        if (!json_is_number(ttl) || json_number_value(ttl) <= 0)
            return braid_error_set(err, "directive %d: pin needs \"ttl_s\" > 0 (seconds of trace time)", index);
        h->ttl_s = (float)json_number_value(ttl);
    }
    return h->op == CACHE_HINT_SHARE ? parse_share_audience(o, h, index, err) : 0;
}

static int by_start(const void *a, const void *b) {
    const SimSpliceEdit *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

/* A splice op: one edit of the context; every splice of a request names the same context and mode. */
static int parse_splice(const json_t *o, SimDirectives *d, int index, BraidError *err) {
    const char *ctx = json_string_value(json_object_get(o, "context"));
    const char *mode = json_string_value(json_object_get(o, "mode"));
    uint8_t m = !mode || !strcmp(mode, "amortize") ? CACHE_SPLICE_AMORTIZE : !strcmp(mode, "forget") ? CACHE_SPLICE_FORGET : 0;
    if (!ctx || !ctx[0]) return braid_error_set(err, "directive %d: splice needs \"context\": the id of the request it edits", index);
    if (!m) return braid_error_set(err, "directive %d: splice mode must be amortize or forget, not \"%s\"", index, mode);
    if (d->context_id && (strcmp(d->context_id, ctx) || d->splice_mode != m))
        return braid_error_set(err, "directive %d: every splice of a request names one context and one mode", index);
    SimSpliceEdit e;
    const int big = 1 << 24;
    if (int_field(o, "start", 0, big, -1, &e.start, index, err) || int_field(o, "end", 0, big, -1, &e.end, index, err) ||
        int_field(o, "tokens", 0, big, 0, &e.tokens, index, err))
        return -1;
    if (e.end < e.start) return braid_error_set(err, "directive %d: splice end %d before start %d", index, e.end, e.start);
    if (!d->context_id && !(d->context_id = strdup(ctx))) return braid_error_set(err, "out of memory");
    d->splice_mode = m;
    SimSpliceEdit *grown = realloc(d->edits, ((size_t)d->n_edits + 1) * sizeof *grown);
    if (!grown) return braid_error_set(err, "out of memory");
    d->edits = grown;
    d->edits[d->n_edits++] = e;
    return 0;
}

static int parse_one(const json_t *o, int prompt_tokens, SimDirectives *d, int index, BraidError *err) {
    const char *op = json_string_value(json_object_get(o, "op"));
    if (!json_is_object(o) || !op) return braid_error_set(err, "directive %d is not an object with an \"op\"", index);
    if (!strcmp(op, "splice")) return parse_splice(o, d, index, err);
    CacheHint *grown = realloc(d->hints, ((size_t)d->n_hints + 1) * sizeof *grown);
    if (!grown) return braid_error_set(err, "out of memory");
    d->hints = grown;
    int rc = parse_hint(o, op, prompt_tokens, &d->hints[d->n_hints], index, err);
    d->n_hints++; /* even when it failed: its tenant names are freed with the rest */
    return rc;
}

int sim_directives_parse(const json_t *array, int prompt_tokens, SimDirectives **out, BraidError *err) {
    *out = NULL;
    if (!json_is_array(array)) return braid_error_set(err, "directives must be an array");
    if (json_array_size(array) == 0) return 0;
    if (json_array_size(array) > CACHE_DIRECTIVE_MAX) return braid_error_set(err, "more than %d directives", CACHE_DIRECTIVE_MAX);
    SimDirectives *d = calloc(1, sizeof *d);
    if (!d) return braid_error_set(err, "out of memory");
    for (size_t i = 0; i < json_array_size(array); i++)
        if (parse_one(json_array_get(array, i), prompt_tokens, d, (int)i, err)) {
            sim_directives_free(d);
            return -1;
        }
    if (d->n_edits > 1) qsort(d->edits, (size_t)d->n_edits, sizeof *d->edits, by_start);
    for (int k = 1; k < d->n_edits; k++)
        if (d->edits[k].start < d->edits[k - 1].end) {
            sim_directives_free(d);
            return braid_error_set(err, "splice edits overlap");
        }
    *out = d;
    return 0;
}

void sim_directives_free(SimDirectives *d) {
    if (!d) return;
    for (int i = 0; i < d->n_hints; i++) {
        for (int j = 0; j < d->hints[i].n_with; j++) free(d->hints[i].with[j]);
        free(d->hints[i].with);
    }
    free(d->hints);
    free(d->context_id);
    free(d->edits);
    free(d);
}

bool sim_trace_has_directives(const Trace *t) {
    for (int i = 0; i < t->n; i++)
        if (t->reqs[i].directives) return true;
    return false;
}

/* ---- the replay ---- */

double sim_directives_clock(void) { return 0.0; }

int sim_directives_begin(SimDirectiveReplay *dr, const Trace *t, int kv_tokens, int pin_budget_tokens, BraidError *err) {
    memset(dr, 0, sizeof *dr);
    dr->block_size = t->block_size > 0 ? t->block_size : 16;
    int budget = pin_budget_tokens > 0 ? pin_budget_tokens : kv_tokens / 4;
    dr->pin_budget_blocks = (budget + dr->block_size - 1) / dr->block_size;
    if (!(dr->context_of = malloc(((size_t)t->n + 1) * sizeof *dr->context_of))) return braid_error_set(err, "sim: out of memory");
    StrMap *ids = strmap_create((size_t)t->n + 1);
    if (!ids) return braid_error_set(err, "sim: out of memory");
    int rc = 0;
    for (int i = 0; rc == 0 && i < t->n; i++) {
        const TraceRequest *r = &t->reqs[i];
        const SimDirectives *d = r->directives;
        int32_t at = -1;
        dr->context_of[i] = -1;
        if (d && d->context_id && !strmap_get(ids, d->context_id, strlen(d->context_id), &at))
            rc = braid_error_set(err, "sim: request %s splices context \"%s\", which is no request arriving before it", r->id, d->context_id);
        else if (d && d->context_id) {
            const TraceRequest *c = &t->reqs[at];
            for (int k = 0; rc == 0 && k < d->n_edits; k++)
                if (d->edits[k].end > c->prompt_tokens)
                    rc = braid_error_set(err, "sim: request %s: splice edit [%d, %d) runs past its context %s (%d tokens)", r->id,
                                         d->edits[k].start, d->edits[k].end, c->id, c->prompt_tokens);
            dr->context_of[i] = at;
        }
        if (rc == 0 && strmap_put(ids, r->id, strlen(r->id), i)) rc = braid_error_set(err, "sim: out of memory");
    }
    strmap_destroy(ids);
    return rc;
}

void sim_directives_end(SimDirectiveReplay *dr) {
    free(dr->context_of);
    free(dr->cur.runs);
    memset(dr, 0, sizeof *dr);
}

static int add_run(SimDirectiveReplay *dr, int dst, int src, int len, int index) {
    if (len <= 0) return 0;
    if (braid_grow((void **)&dr->cur.runs, &dr->cap_runs, dr->cur.n_runs + 1, sizeof *dr->cur.runs)) return -1;
    dr->cur.runs[dr->cur.n_runs++] = (CacheSpliceRun){.dst = dst, .src = src, .len = len, .index = index};
    return 0;
}

/* The runs of P that are C unchanged: before the first edit, between edits, and after the last
 * (as far as both C and P go). P positions shift by each edit's size change. */
static int build_runs(SimDirectiveReplay *dr, const SimDirectives *d, int n_context, int n_prompt) {
    int src = 0, shift = 0;
    for (int k = 0; k <= d->n_edits; k++) {
        int src_end = k < d->n_edits ? d->edits[k].start : n_context, len = src_end - src;
        if (src + shift + len > n_prompt) len = n_prompt - (src + shift);
        if (add_run(dr, src + shift, src, len, k - 1)) return -1;
        if (k == d->n_edits) break;
        shift += d->edits[k].tokens - (d->edits[k].end - d->edits[k].start);
        src = d->edits[k].end;
        dr->stats.splice_edit_tokens += (uint64_t)d->edits[k].tokens;
    }
    return 0;
}

void sim_directives_identity(const TraceRequest *r, int segment_reuse, CacheIdentity *id) {
    uint64_t scope = cache_workflow_scope(r->workflow);
    bool amortize = r->directives && r->directives->splice_mode == CACHE_SPLICE_AMORTIZE;
    id->approx_scope = scope;
    id->scope_commits = scope != 0 && segment_reuse != SEGMENT_REUSE_APPROX;
    id->approx_ok = segment_reuse == SEGMENT_REUSE_APPROX || (amortize && scope == 0);
}

int sim_directives_before(SimDirectiveReplay *dr, KvCache *c, const CacheIdentity *id, const Trace *t, int i, BraidError *err) {
    const TraceRequest *r = &t->reqs[i];
    const SimDirectives *d = r->directives;
    int runs_cap = dr->cap_runs;
    CacheSpliceRun *runs = dr->cur.runs;
    dr->cur = (CacheDirectives){.runs = runs};
    dr->cap_runs = runs_cap;
    if (!d) return 0;
    dr->stats.requests++;
    dr->cur.hints = d->hints;
    dr->cur.n_hints = d->n_hints;
    if (d->splice_mode == CACHE_SPLICE_NONE || dr->context_of[i] < 0) return 0;
    const TraceRequest *ctx = &t->reqs[dr->context_of[i]];
    dr->cur.splice_mode = d->splice_mode;
    dr->cur.context = ctx->tokens;
    dr->cur.n_context = ctx->prompt_tokens;
    dr->cur.first_edit = d->n_edits > 0 ? d->edits[0].start : ctx->prompt_tokens;
    if (build_runs(dr, d, ctx->prompt_tokens, r->prompt_tokens)) return braid_error_set(err, "sim: out of memory planning a splice");
    for (int k = 0; k < dr->cur.n_runs; k++) { /* a copied run must be the context unchanged */
        const CacheSpliceRun *run = &dr->cur.runs[k];
        if (memcmp(r->tokens + run->dst, ctx->tokens + run->src, (size_t)run->len * sizeof *r->tokens) != 0)
            return braid_error_set(err, "sim: request %s: its tokens [%d, %d) are not context %s's [%d, %d) unchanged, as its splice "
                                        "edits say", r->id, run->dst, run->dst + run->len, ctx->id, run->src, run->src + run->len);
    }
    if (d->splice_mode != CACHE_SPLICE_FORGET) return 0;
    KvHintOutcome out;
    if (kv_cache_evict_from(c, id, dr->cur.context, dr->cur.n_context, dr->cur.first_edit, &out, err)) return -1;
    dr->stats.forgot_blocks += (uint64_t)out.blocks;
    return 0;
}

int sim_directives_plan(SimDirectiveReplay *dr, KvCache *c, const CacheIdentity *id, const Trace *t, int i, int from, int segment_reuse,
                        KvSegmentPlan *plan, int *directive_tokens, BraidError *err) {
    const TraceRequest *r = &t->reqs[i];
    *directive_tokens = 0;
    kv_cache_drop_segments(c, plan);
    int to = kv_cache_plan_shared(c, id, r->tokens, r->prompt_tokens, from, plan, err);
    if (to < 0) return -1;
    if (dr->cur.splice_mode == CACHE_SPLICE_AMORTIZE) {
        if (kv_cache_plan_splice(c, id, &dr->cur, r->prompt_tokens, to, plan, NULL, err)) return -1;
    } else if (segment_reuse != SEGMENT_REUSE_OFF &&
               kv_cache_find_more_segments(c, id, r->tokens, r->prompt_tokens, to, (SegmentReuseMode)segment_reuse, plan, err)) {
        return -1;
    }
    /* Everything but segment reuse's spans past the shared prefix came from directives. */
    *directive_tokens = dr->cur.splice_mode == CACHE_SPLICE_AMORTIZE ? plan->reused_tokens : to - from;
    return plan->reused_tokens;
}

int sim_directives_placed(SimDirectiveReplay *dr, KvCache *c, const CacheIdentity *id, BraidError *err) {
    if (dr->cur.splice_mode != CACHE_SPLICE_AMORTIZE) return 0;
    KvHintOutcome out;
    return kv_cache_decay(c, id, dr->cur.context, dr->cur.first_edit, dr->cur.n_context / dr->block_size * dr->block_size, &out, err);
}

static void count_outcome(SimDirectiveStats *s, KvHintStatus st) {
    switch (st) {
    case KV_HINT_ACCEPTED: s->hints_accepted++; break;
    case KV_HINT_CLIPPED: s->hints_clipped++; break;
    case KV_HINT_DEFERRED: s->hints_deferred++; break;
    case KV_HINT_REJECTED: s->hints_rejected++; break;
    }
}

/* One hint on the request's cached blocks, as the scheduler's apply_hint: never into the last
 * partial block. A pin's deadline is in trace time (sim_directives_clock stands still at 0). */
static int apply_hint(SimDirectiveReplay *dr, KvCache *c, const CacheIdentity *id, const TraceRequest *r, const CacheHint *h,
                      KvHintOutcome *out, BraidError *err) {
    int whole = r->prompt_tokens / dr->block_size * dr->block_size, end = h->end < whole ? h->end : whole;
    switch (h->op) {
    case CACHE_HINT_PIN: return kv_cache_pin(c, id, r->tokens, end, r->t + h->ttl_s, dr->pin_budget_blocks, out, err);
    case CACHE_HINT_DECAY: return kv_cache_decay(c, id, r->tokens, h->start, end, out, err);
    case CACHE_HINT_EVICT: return kv_cache_evict_from(c, id, r->tokens, whole, h->start, out, err);
    case CACHE_HINT_UNPIN: return kv_cache_unpin(c, id, r->tokens, end, out, err);
    case CACHE_HINT_SHARE:
        return kv_cache_share(c, id, r->tokens, end, h->share_all, (const char *const *)h->with, h->n_with, out, err);
    }
    *out = (KvHintOutcome){.status = KV_HINT_REJECTED, .reason = "unknown hint"};
    return 0;
}

int sim_directives_after(SimDirectiveReplay *dr, KvCache *c, const CacheIdentity *id, const Trace *t, int i, BraidError *err) {
    const TraceRequest *r = &t->reqs[i];
    for (int k = 0; k < dr->cur.n_hints; k++) {
        KvHintOutcome out;
        if (apply_hint(dr, c, id, r, &dr->cur.hints[k], &out, err))
            return braid_error_wrap(err, "sim: request %s: %s", r->id, cache_hint_op_name(dr->cur.hints[k].op));
        count_outcome(&dr->stats, out.status);
    }
    return 0;
}

void sim_directives_collect(SimDirectiveReplay *dr, const KvCache *c) {
    const KvCacheCounters *k = &c->counters;
    SimDirectiveStats *s = &dr->stats;
    s->spliced_tokens = k->spliced_tokens;
    s->shared_tokens = k->shared_hit_tokens;
    s->pins = k->pins;
    s->pin_expired_blocks = k->pin_expired_blocks;
    s->pin_revoked_blocks = k->pin_revoked_blocks;
    s->unpinned_blocks = k->unpinned_blocks;
    s->decayed_blocks = k->decayed_blocks;
    s->evicted_blocks = k->directive_evicted_blocks;
}

void sim_directives_print(const SimDirectiveStats *s, uint64_t prompt_tokens, bool ignored) {
    if (ignored) {
        fprintf(stderr, "[sim] directives: in the trace, ignored (--directives off)\n");
        return;
    }
    double pct = prompt_tokens ? 100.0 * (double)s->directive_hit_tokens / (double)prompt_tokens : 0.0;
    fprintf(stderr, "[sim] directives: %d requests; %llu prompt tokens copied by directives (%.1f%% of prompt tokens, in the hit rate; "
                    "planned: %llu spliced, %llu shared), %llu edit tokens computed, %llu context blocks forgotten; %llu pins "
                    "(%llu blocks expired, %llu revoked, %llu unpinned), %llu blocks decayed, %llu evicted; hints %llu accepted, "
                    "%llu clipped, %llu deferred, %llu rejected\n",
            s->requests, (unsigned long long)s->directive_hit_tokens, pct, (unsigned long long)s->spliced_tokens,
            (unsigned long long)s->shared_tokens, (unsigned long long)s->splice_edit_tokens, (unsigned long long)s->forgot_blocks,
            (unsigned long long)s->pins, (unsigned long long)s->pin_expired_blocks, (unsigned long long)s->pin_revoked_blocks,
            (unsigned long long)s->unpinned_blocks, (unsigned long long)s->decayed_blocks, (unsigned long long)s->evicted_blocks,
            (unsigned long long)s->hints_accepted, (unsigned long long)s->hints_clipped, (unsigned long long)s->hints_deferred,
            (unsigned long long)s->hints_rejected);
}

json_t *sim_directives_json(const SimDirectiveStats *s, bool ignored) {
    return json_pack("{s:b, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "ignored", ignored,
                     "requests", s->requests, "hit_tokens", (json_int_t)s->directive_hit_tokens, "spliced_tokens",
                     (json_int_t)s->spliced_tokens, "shared_tokens", (json_int_t)s->shared_tokens, "splice_edit_tokens",
                     (json_int_t)s->splice_edit_tokens, "forgot_blocks", (json_int_t)s->forgot_blocks, "pins", (json_int_t)s->pins,
                     "pin_expired_blocks", (json_int_t)s->pin_expired_blocks, "pin_revoked_blocks", (json_int_t)s->pin_revoked_blocks,
                     "unpinned_blocks", (json_int_t)s->unpinned_blocks, "decayed_blocks", (json_int_t)s->decayed_blocks,
                     "evicted_blocks", (json_int_t)s->evicted_blocks, "hints_accepted", (json_int_t)s->hints_accepted,
                     "hints_clipped", (json_int_t)s->hints_clipped, "hints_deferred", (json_int_t)s->hints_deferred,
                     "hints_rejected", (json_int_t)s->hints_rejected);
}
