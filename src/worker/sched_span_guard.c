/*
 * sched_span_guard.c — per-span states of the depth-aware head and the online probe
 * (sched_span_guard.h says what they mean). The engine reads the keys (engine_probe.c).
 */
#include "worker/sched_span_guard.h"

#include <math.h>
#include <stdlib.h>


void span_guard_free(SpanGuard *g) {
    free(g->state);
    free(g->head);
    free(g->tail);
    free(g->cos_sum);
    free(g->cached);
    free(g->cached_v);
    free(g->vcos_sum);
    free(g->kcos_min);
    free(g->vcos_min);
    *g = (SpanGuard){.probing = -1};
}

/* Tokens at a guarded span's start computed instead of reused: the depth-aware head (its first
 * tokens have fewer than W(L-1) matching tokens before them) and the probe, whichever is longer. */
static int head_tokens(const SpanGuardConfig *cfg) {
    int depth = cfg->deep_window > cfg->window ? cfg->deep_window - cfg->window : 0;
    return depth > cfg->probe_tokens ? depth : cfg->probe_tokens;
}

int span_guard_plan(SpanGuard *g, const SpanGuardConfig *cfg, const KvSegmentPlan *plan, bool guard_inexact) {
    g->probing = -1;
    if (plan->n > g->cap) {
        uint8_t *st = realloc(g->state, (size_t)plan->n * sizeof *st);
        if (!st) return -1;
        g->state = st;
        int *hd = realloc(g->head, (size_t)plan->n * sizeof *hd);
        if (!hd) return -1;
        g->head = hd;
        int *tl = realloc(g->tail, (size_t)plan->n * sizeof *tl);
        if (!tl) return -1;
        g->tail = tl;
        g->cap = plan->n;
    }
    int lost = 0, head = head_tokens(cfg), tail = cfg->tail_tokens > 0 ? cfg->tail_tokens : 0;
    bool shaped = head > 0 || tail > 0 || cfg->min_span > 0;
    for (int i = 0; i < plan->n; i++) {
        const KvSegmentSpan *sp = &plan->spans[i];
        g->state[i] = SPAN_PLAIN;
        g->head[i] = 0;
        g->tail[i] = 0;
        if (sp->exact || !guard_inexact || (!shaped && !cfg->probe_whole)) continue;
        if (cfg->probe_whole && sp->n_tokens > 0) { /* diagnostic: all of it probed, none reused */
            g->head[i] = sp->n_tokens;
            g->state[i] = SPAN_PROBING;
            lost += sp->n_tokens;
            continue;
        }
        /* Nothing of it would stay reused, or too little to be worth its boundary: compute it whole. */
        if (head + tail >= sp->n_tokens || sp->n_tokens < cfg->min_span) {
            g->state[i] = SPAN_REJECTED;
            g->head[i] = sp->n_tokens;
            lost += sp->n_tokens;
            continue;
        }
        g->head[i] = head;
        g->tail[i] = tail;
        g->state[i] = cfg->probe_tokens > 0 ? SPAN_PROBING : SPAN_ACCEPTED;
        lost += head + tail;
    }
    return lost;
}

int span_guard_reuse_from(const SpanGuard *g, const KvSegmentPlan *plan, int i, bool *wait) {
    *wait = false;
    int st = i < g->cap && g->state ? g->state[i] : SPAN_PLAIN;
    if (st == SPAN_REJECTED) return -1;
    if (st == SPAN_PROBING) {
        *wait = true;
        return -1;
    }
    return plan->spans[i].dst_start + (st == SPAN_ACCEPTED ? g->head[i] : 0);
}

int span_guard_reuse_end(const SpanGuard *g, const KvSegmentPlan *plan, int i) {
    const KvSegmentSpan *sp = &plan->spans[i];
    return sp->dst_start + sp->n_tokens - (i < g->cap && g->tail ? g->tail[i] : 0);
}

int span_guard_head_end(const SpanGuard *g, const KvSegmentPlan *plan, int i) {
    return plan->spans[i].dst_start + (i < g->cap && g->head ? g->head[i] : 0);
}

int span_guard_decide(SpanGuard *g, const KvSegmentPlan *plan, int i, bool accept) {
    g->probing = -1;
    g->cos_count = 0;
    g->cached_n = 0;
    if (i >= g->cap || g->state[i] != SPAN_PROBING) return 0;
    if (accept) {
        g->state[i] = SPAN_ACCEPTED;
        return 0;
    }
    g->state[i] = SPAN_REJECTED;
    return plan->spans[i].n_tokens - g->head[i] - g->tail[i]; /* the tail was taken back at plan time */
}

double span_guard_cosine(const float *a, const float *b, int n) {
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (aa == 0.0 && bb == 0.0) return 1.0;
    if (aa == 0.0 || bb == 0.0) return 0.0;
    return ab / sqrt(aa * bb);
}
