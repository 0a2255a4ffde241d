/* The scheduler's side of cache directives; the contract is in sched_directives.h. */
#include "worker/sched_directives.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

int sched_directives_admit(Scheduler *s, SchedRequest *r, BraidError *err) {
    CacheDirectives *d = &r->directives;
    if (r->splice_done || d->splice_mode == CACHE_SPLICE_NONE || !s->cache_enabled) return 0;
    if (d->splice_mode == CACHE_SPLICE_AMORTIZE && !r->splice_reused && d->n_runs > 0 &&
        !(r->splice_reused = calloc((size_t)d->n_runs, sizeof *r->splice_reused)))
        return braid_error_set(err, "sched: out of memory planning a splice");
    if (d->splice_mode != CACHE_SPLICE_FORGET) return 0;
    KvHintOutcome out;
    if (kv_cache_evict_from(&s->cache, &r->identity, d->context, d->n_context, d->first_edit, &out, err)) return -1;
    r->splice_forgot_blocks += out.blocks;
    return 0;
}

void sched_directives_placed(Scheduler *s, SchedRequest *r) {
    const CacheDirectives *d = &r->directives;
    if (d->splice_mode != CACHE_SPLICE_AMORTIZE || !s->cache_enabled) return;
    KvHintOutcome out;
    BraidError err;
    if (kv_cache_decay(&s->cache, &r->identity, d->context, d->first_edit, d->n_context, &out, &err))
        LOG_WARN("sched", "req %s: decaying the spliced context: %s", r->id, err.msg);
}

/* The outcome list, written as JSON text (reasons are this module's and the cache's own ASCII
 * constants, so nothing needs escaping). */
typedef struct {
    char *text;
    size_t len, cap;
    bool failed;
} OutcomeText;

static void put(OutcomeText *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(OutcomeText *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->text ? t->text + t->len : NULL, t->text ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->text && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap + (size_t)n + 64) * 2;
        char *grown = realloc(t->text, cap);
        if (!grown) {
            t->failed = true;
            return;
        }
        t->text = grown;
        t->cap = cap;
    }
}

static void open_outcome(OutcomeText *t, int index, const char *op, const char *outcome, const char *reason) {
    put(t, "%s{\"index\":%d,\"op\":\"%s\",\"outcome\":\"%s\"", t->len > 1 ? "," : "", index, op, outcome);
    if (reason) put(t, ",\"reason\":\"%s\"", reason);
}

/* One object per splice directive: the tokens after it its runs could reuse, and did. */
static void splice_outcomes(const Scheduler *s, const SchedRequest *r, OutcomeText *t) {
    const CacheDirectives *d = &r->directives;
    for (int i = 0; i < d->n_runs; i++) {
        const CacheSpliceRun *run = &d->runs[i];
        if (run->index < 0) continue;
        if (d->splice_mode == CACHE_SPLICE_FORGET) {
            open_outcome(t, run->index, "splice", "accepted", NULL);
            if (d->auto_splice) put(t, ",\"auto\":true");
            put(t, ",\"mode\":\"forget\",\"dropped_tokens\":%d}", r->splice_forgot_blocks * s->block_size);
            if (d->auto_splice) break; /* one outcome: the edit's first run */
            continue;
        }
        /* What the run could have given past the cached prefix (matched tokens were not recomputed). */
        int lo = run->dst > r->splice_from ? run->dst : r->splice_from, hi = run->dst + run->len, last = r->n_prompt - 1;
        if (hi > last) hi = last;
        int wanted = hi > lo ? hi - lo : 0;
        int reused = r->splice_reused ? r->splice_reused[i] : 0;
        /* The cache holds whole blocks: the context's last partial block is always recomputed. */
        bool clipped = wanted - reused >= s->block_size;
        open_outcome(t, run->index, "splice", clipped ? "clipped" : "accepted",
                     clipped ? "part of the context after the edit was not cached (or could not be loaded onto the device) and was recomputed" : NULL);
        if (d->auto_splice) put(t, ",\"auto\":true");
        put(t, ",\"mode\":\"amortize\",\"delta\":%d,\"rotated_tokens\":%d,\"recomputed_tokens\":%d}", run->dst - run->src, reused,
            wanted - reused);
    }
}

static int apply_hint(Scheduler *s, SchedRequest *r, const CacheHint *h, KvHintOutcome *out, BraidError *err) {
    /* The tree holds whole blocks and the walks compare whole blocks, so a hint never reaches into
     * the request's last partial block (reading it would run past r->tokens). */
    int whole = r->n_tokens / s->block_size * s->block_size;
    int end = h->end < whole ? h->end : whole;
    switch (h->op) {
    case CACHE_HINT_PIN:
        return kv_cache_pin(&s->cache, &r->identity, r->tokens, end, h->ttl_s, s->pin_budget_blocks, out, err);
    case CACHE_HINT_DECAY: return kv_cache_decay(&s->cache, &r->identity, r->tokens, h->start, end, out, err);
    case CACHE_HINT_EVICT: return kv_cache_evict_from(&s->cache, &r->identity, r->tokens, r->n_tokens, h->start, out, err);
    case CACHE_HINT_UNPIN: return kv_cache_unpin(&s->cache, &r->identity, r->tokens, end, out, err);
    case CACHE_HINT_SHARE:
        return kv_cache_share(&s->cache, &r->identity, r->tokens, end, h->share_all, (const char *const *)h->with, h->n_with, out, err);
    }
    *out = (KvHintOutcome){.status = KV_HINT_REJECTED, .reason = "unknown hint"};
    return 0;
}

static void hint_outcome(const Scheduler *s, const CacheHint *h, const KvHintOutcome *out, OutcomeText *t) {
    open_outcome(t, h->index, cache_hint_op_name(h->op), kv_hint_status_name(out->status), out->status == KV_HINT_ACCEPTED ? NULL : out->reason);
    put(t, ",\"tokens\":%d", out->blocks * s->block_size);
    if (out->status == KV_HINT_CLIPPED) put(t, ",\"asked_tokens\":%d", out->blocks_asked * s->block_size);
    if (h->op == CACHE_HINT_PIN && out->blocks > 0) put(t, ",\"ttl_s\":%g", (double)h->ttl_s);
    put(t, "}");
}

void sched_directives_finish(Scheduler *s, SchedRequest *r, bool completed) {
    OutcomeText t = {0};
    put(&t, "[");
    splice_outcomes(s, r, &t);
    for (int i = 0; i < r->directives.n_hints; i++) {
        const CacheHint *h = &r->directives.hints[i];
        KvHintOutcome out = {.status = KV_HINT_REJECTED, .reason = "the request did not complete"};
        BraidError err;
        if (!s->cache_enabled) out.reason = "the prefix cache is off on this server";
        else if (completed && apply_hint(s, r, h, &out, &err)) {
            LOG_WARN("sched", "req %s: %s: %s", r->id, cache_hint_op_name(h->op), err.msg);
            out = (KvHintOutcome){.status = KV_HINT_DEFERRED, .reason = "the instance was out of memory"};
        }
        hint_outcome(s, h, &out, &t);
    }
    put(&t, "]");
    free(r->directive_outcomes);
    r->directive_outcomes = t.failed ? NULL : t.text;
    if (t.failed) free(t.text);
}
