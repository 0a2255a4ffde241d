/*
 * engine_probe.c — reads the probe tokens' cached and fresh keys around a step's forward and
 * decides the span (engine_probe.h says when and why).
 */
#include "worker/engine_probe.h"

#include <stdlib.h>
#include <string.h>

/* The probe tokens of r's probing span that entry [start, start + count) computes: [*lo, *hi);
 * false when r probes nothing there. *first: the span's first probe token. */
static bool probe_range(const Scheduler *s, const SchedRequest *r, int start, int count, int *first, int *lo, int *hi) {
    int i = r->next_span;
    const SpanGuard *g = &r->guard;
    if (s->span_guard.probe_tokens <= 0 || i >= r->segments.n || i >= g->cap || g->state[i] != SPAN_PROBING) return false;
    int k = s->span_guard.probe_tokens < g->head[i] ? s->span_guard.probe_tokens : g->head[i];
    *first = r->segments.spans[i].dst_start;
    *lo = start > *first ? start : *first;
    *hi = start + count < *first + k ? start + count : *first + k;
    return *lo < *hi;
}

typedef struct {
    float *block; /* (n_layers, n_kv_heads, block_size, head_dim) */
    int32_t at;   /* the block read into it, 0 = none */
    int n_layers, n_kv, bs, hd;
} KeyReader;

static int reader_init(KeyReader *kr, const Engine *e, BraidError *err) {
    const ModelConfig *c = &e->backend.weights->cfg;
    *kr = (KeyReader){.n_layers = c->n_layers, .n_kv = c->n_kv_heads, .bs = e->backend.cfg.block_size, .hd = c->head_dim};
    kr->block = malloc((size_t)kr->n_layers * kr->n_kv * kr->bs * kr->hd * sizeof *kr->block);
    return kr->block ? 0 : braid_error_set(err, "engine: out of memory probing a reused segment");
}

/* Token t's keys, per layer (n_kv * hd floats each), into out (n_layers * n_kv * hd). */
static int read_keys(Engine *e, KeyReader *kr, const SchedRequest *r, int t, float *out, BraidError *err) {
    int32_t block = r->blocks[t / kr->bs];
    if (block != kr->at) {
        if (backend_read_block(&e->backend, block, kr->block, NULL, NULL, err)) return braid_error_wrap(err, "engine: probe read");
        kr->at = block;
    }
    int slot = t % kr->bs;
    for (int l = 0; l < kr->n_layers; l++)
        for (int h = 0; h < kr->n_kv; h++)
            memcpy(out + ((size_t)l * kr->n_kv + h) * kr->hd, kr->block + (((size_t)l * kr->n_kv + h) * kr->bs + slot) * kr->hd,
                   (size_t)kr->hd * sizeof *out);
    return 0;
}

static int ensure_buffers(SpanGuard *g, int probe_tokens, int n_layers, int kv_dim) {
    if (g->cached && g->n_layers == n_layers && g->kv_dim == kv_dim) return 0;
    free(g->cached);
    free(g->cos_sum);
    g->cached = malloc((size_t)probe_tokens * n_layers * kv_dim * sizeof *g->cached);
    g->cos_sum = calloc((size_t)n_layers, sizeof *g->cos_sum);
    g->n_layers = n_layers;
    g->kv_dim = kv_dim;
    g->cos_count = 0;
    return g->cached && g->cos_sum ? 0 : -1;
}

int engine_probe_before(Engine *e, BraidError *err) {
    KeyReader kr = {0};
    int rc = 0;
    for (int i = 0; i < e->plan.n && rc == 0; i++) {
        const PlanEntry *pe = &e->plan.entries[i];
        SchedRequest *r = pe->req;
        int first, lo, hi;
        if (!probe_range(&e->sched, r, pe->start, pe->count, &first, &lo, &hi)) continue;
        if (!kr.block && reader_init(&kr, e, err)) return -1;
        int kv_dim = kr.n_kv * kr.hd;
        if (ensure_buffers(&r->guard, e->sched.span_guard.probe_tokens, kr.n_layers, kv_dim)) {
            rc = braid_error_set(err, "engine: out of memory probing a reused segment");
            break;
        }
        if (lo == first) { /* a new probe */
            memset(r->guard.cos_sum, 0, (size_t)kr.n_layers * sizeof *r->guard.cos_sum);
            r->guard.cos_count = 0;
        }
        for (int t = lo; t < hi && rc == 0; t++)
            rc = read_keys(e, &kr, r, t, r->guard.cached + (size_t)(t - first) * kr.n_layers * kv_dim, err);
    }
    free(kr.block);
    return rc;
}

int engine_probe_after(Engine *e, BraidError *err) {
    KeyReader kr = {0};
    float *fresh = NULL;
    int rc = 0;
    for (int i = 0; i < e->plan.n && rc == 0; i++) {
        const PlanEntry *pe = &e->plan.entries[i];
        SchedRequest *r = pe->req;
        int first, lo, hi;
        if (!probe_range(&e->sched, r, pe->start, pe->count, &first, &lo, &hi)) continue;
        if (!kr.block && reader_init(&kr, e, err)) return -1;
        int kv_dim = kr.n_kv * kr.hd;
        SpanGuard *g = &r->guard;
        if (!fresh && !(fresh = malloc((size_t)kr.n_layers * kv_dim * sizeof *fresh))) {
            rc = braid_error_set(err, "engine: out of memory probing a reused segment");
            break;
        }
        for (int t = lo; t < hi && rc == 0; t++) {
            if ((rc = read_keys(e, &kr, r, t, fresh, err))) break;
            const float *cached = g->cached + (size_t)(t - first) * kr.n_layers * kv_dim;
            for (int l = 0; l < kr.n_layers; l++)
                g->cos_sum[l] += span_guard_cosine(cached + (size_t)l * kv_dim, fresh + (size_t)l * kv_dim, kv_dim);
            g->cos_count++;
        }
        int k = e->sched.span_guard.probe_tokens < g->head[r->next_span] ? e->sched.span_guard.probe_tokens : g->head[r->next_span];
        if (rc || hi < first + k) continue; /* the probe goes on next step */
        double worst = 2.0;
        int worst_layer = 0;
        for (int l = 0; l < kr.n_layers; l++) {
            double mean = g->cos_count > 0 ? g->cos_sum[l] / g->cos_count : 1.0;
            if (mean < worst) worst = mean, worst_layer = l;
        }
        sched_span_probe_result(&e->sched, r, worst >= e->sched.span_guard.min_cos, worst, worst_layer);
    }
    free(fresh);
    free(kr.block);
    return rc;
}
