/*
 * engine_probe.c — reads the probe tokens' cached and fresh keys (and values, for the per-layer
 * "probe_layers" event) around a step's forward and decides the span (engine_probe.h says when
 * and why). The time the reads take is summed in Engine.probe_read_seconds (the probe's cost).
 */
#include "worker/engine_probe.h"

#include <stdlib.h>
#include <string.h>

#include "common/json_text.h"
#include "common/timeutil.h"

/* How many of span i's first tokens r probes: the head under probe_whole (the whole span), else
 * probe_tokens capped by the head. */
static int probe_len(const Scheduler *s, const SpanGuard *g, int i) {
    if (s->span_guard.probe_whole) return g->head[i];
    return s->span_guard.probe_tokens < g->head[i] ? s->span_guard.probe_tokens : g->head[i];
}

/* The probe tokens of r's probing span that entry [start, start + count) computes: [*lo, *hi);
 * false when r probes nothing there. *first: the span's first probe token. */
static bool probe_range(const Scheduler *s, const SchedRequest *r, int start, int count, int *first, int *lo, int *hi) {
    int i = r->next_span;
    const SpanGuard *g = &r->guard;
    if ((s->span_guard.probe_tokens <= 0 && !s->span_guard.probe_whole) || i >= r->segments.n || i >= g->cap ||
        g->state[i] != SPAN_PROBING)
        return false;
    int k = probe_len(s, g, i);
    *first = r->segments.spans[i].dst_start;
    *lo = start > *first ? start : *first;
    *hi = start + count < *first + k ? start + count : *first + k;
    return *lo < *hi;
}

typedef struct {
    float *keys, *values; /* (n_layers, n_kv_heads, block_size, head_dim) each */
    int32_t at;           /* the block read into them, 0 = none */
    int n_layers, n_kv, bs, hd;
} KvReader;

static int reader_init(KvReader *kr, const Engine *e, BraidError *err) {
    const ModelConfig *c = &e->backend.weights->cfg;
    *kr = (KvReader){.n_layers = c->n_layers, .n_kv = c->n_kv_heads, .bs = e->backend.cfg.block_size, .hd = c->head_dim};
    size_t n = (size_t)kr->n_layers * kr->n_kv * kr->bs * kr->hd;
    kr->keys = malloc(n * sizeof *kr->keys);
    kr->values = malloc(n * sizeof *kr->values);
    return kr->keys && kr->values ? 0 : braid_error_set(err, "engine: out of memory probing a reused segment");
}

static void reader_free(KvReader *kr) {
    free(kr->keys);
    free(kr->values);
}

static void gather(const KvReader *kr, const float *block, int slot, float *out) {
    for (int l = 0; l < kr->n_layers; l++)
        for (int h = 0; h < kr->n_kv; h++)
            memcpy(out + ((size_t)l * kr->n_kv + h) * kr->hd, block + (((size_t)l * kr->n_kv + h) * kr->bs + slot) * kr->hd,
                   (size_t)kr->hd * sizeof *out);
}

/* Token t's keys and values, per layer (n_kv * hd floats each), into k and v (n_layers * n_kv * hd). */
static int read_kv(Engine *e, KvReader *kr, const SchedRequest *r, int t, float *k, float *v, BraidError *err) {
    int32_t block = r->blocks[t / kr->bs];
    if (block != kr->at) {
        if (backend_read_block(&e->backend, block, kr->keys, kr->values, NULL, err)) return braid_error_wrap(err, "engine: probe read");
        kr->at = block;
    }
    gather(kr, kr->keys, t % kr->bs, k);
    gather(kr, kr->values, t % kr->bs, v);
    return 0;
}

/* Room for `tokens` probe tokens' cached K/V and the per-layer sums; a new probe starts empty. */
static int ensure_buffers(SpanGuard *g, int tokens, int n_layers, int kv_dim) {
    if (g->cached && g->n_layers == n_layers && g->kv_dim == kv_dim && g->cap_tokens >= tokens) return 0;
    free(g->cached);
    free(g->cached_v);
    free(g->cos_sum);
    free(g->vcos_sum);
    free(g->kcos_min);
    free(g->vcos_min);
    size_t n = (size_t)tokens * n_layers * kv_dim;
    g->cached = malloc(n * sizeof *g->cached);
    g->cached_v = malloc(n * sizeof *g->cached_v);
    g->cos_sum = calloc((size_t)n_layers, sizeof *g->cos_sum);
    g->vcos_sum = calloc((size_t)n_layers, sizeof *g->vcos_sum);
    g->kcos_min = calloc((size_t)n_layers, sizeof *g->kcos_min);
    g->vcos_min = calloc((size_t)n_layers, sizeof *g->vcos_min);
    g->n_layers = n_layers;
    g->kv_dim = kv_dim;
    g->cap_tokens = tokens;
    g->cos_count = 0;
    return g->cached && g->cached_v && g->cos_sum && g->vcos_sum && g->kcos_min && g->vcos_min ? 0 : -1;
}

static void probe_start(SpanGuard *g) {
    for (int l = 0; l < g->n_layers; l++) {
        g->cos_sum[l] = g->vcos_sum[l] = 0.0;
        g->kcos_min[l] = g->vcos_min[l] = 2.0;
    }
    g->cos_count = 0;
}

int engine_probe_before(Engine *e, BraidError *err) {
    KvReader kr = {0};
    int rc = 0;
    double t0 = braid_now_seconds();
    bool any = false;
    for (int i = 0; i < e->plan.n && rc == 0; i++) {
        const PlanEntry *pe = &e->plan.entries[i];
        SchedRequest *r = pe->req;
        int first, lo, hi;
        if (!probe_range(&e->sched, r, pe->start, pe->count, &first, &lo, &hi)) continue;
        if (!kr.keys && reader_init(&kr, e, err)) {
            reader_free(&kr);
            return -1;
        }
        any = true;
        int kv_dim = kr.n_kv * kr.hd;
        if (ensure_buffers(&r->guard, probe_len(&e->sched, &r->guard, r->next_span), kr.n_layers, kv_dim)) {
            rc = braid_error_set(err, "engine: out of memory probing a reused segment");
            break;
        }
        if (lo == first) probe_start(&r->guard); /* a new probe */
        for (int t = lo; t < hi && rc == 0; t++) {
            size_t at = (size_t)(t - first) * kr.n_layers * kv_dim;
            rc = read_kv(e, &kr, r, t, r->guard.cached + at, r->guard.cached_v + at, err);
        }
    }
    reader_free(&kr);
    if (any) e->probe_read_seconds += braid_now_seconds() - t0;
    return rc;
}

/* One line per decided probe: per layer the mean and least cosine of cached vs fresh keys and
 * values over the probe's tokens (the per-layer drift table of issue 35). */
static void write_layers_event(const Engine *e, const SchedRequest *r, int tokens) {
    FILE *f = e->sched.events;
    const SpanGuard *g = &r->guard;
    if (!f || g->cos_count == 0) return;
    const KvSegmentSpan *sp = &r->segments.spans[r->next_span];
    fprintf(f, "{\"event\":\"probe_layers\",\"req\":");
    json_text_string(f, r->id);
    fprintf(f, ",\"span\":%d,\"span_tokens\":%d,\"shift\":%d,\"probe_tokens\":%d", sp->dst_start, sp->n_tokens,
            sp->dst_start - sp->src_pos, tokens);
    const char *names[4] = {"k_mean", "k_min", "v_mean", "v_min"};
    for (int which = 0; which < 4; which++) {
        fprintf(f, ",\"%s\":[", names[which]);
        for (int l = 0; l < g->n_layers; l++) {
            double v = which == 0 ? g->cos_sum[l] / g->cos_count
                     : which == 1 ? g->kcos_min[l]
                     : which == 2 ? g->vcos_sum[l] / g->cos_count
                                  : g->vcos_min[l];
            fprintf(f, "%s%.6f", l ? "," : "", v);
        }
        fputc(']', f);
    }
    fputs("}\n", f);
}

int engine_probe_after(Engine *e, BraidError *err) {
    KvReader kr = {0};
    float *fresh = NULL, *fresh_v = NULL;
    int rc = 0;
    double t0 = braid_now_seconds();
    bool any = false;
    for (int i = 0; i < e->plan.n && rc == 0; i++) {
        const PlanEntry *pe = &e->plan.entries[i];
        SchedRequest *r = pe->req;
        int first, lo, hi;
        if (!probe_range(&e->sched, r, pe->start, pe->count, &first, &lo, &hi)) continue;
        if (!kr.keys && reader_init(&kr, e, err)) {
            rc = -1;
            break;
        }
        any = true;
        int kv_dim = kr.n_kv * kr.hd;
        SpanGuard *g = &r->guard;
        if (!fresh && (!(fresh = malloc((size_t)kr.n_layers * kv_dim * sizeof *fresh)) ||
                       !(fresh_v = malloc((size_t)kr.n_layers * kv_dim * sizeof *fresh_v)))) {
            rc = braid_error_set(err, "engine: out of memory probing a reused segment");
            break;
        }
        for (int t = lo; t < hi && rc == 0; t++) {
            if ((rc = read_kv(e, &kr, r, t, fresh, fresh_v, err))) break;
            size_t at = (size_t)(t - first) * kr.n_layers * kv_dim;
            for (int l = 0; l < kr.n_layers; l++) {
                size_t o = (size_t)l * kv_dim;
                double kc = span_guard_cosine(g->cached + at + o, fresh + o, kv_dim);
                double vc = span_guard_cosine(g->cached_v + at + o, fresh_v + o, kv_dim);
                g->cos_sum[l] += kc;
                g->vcos_sum[l] += vc;
                if (kc < g->kcos_min[l]) g->kcos_min[l] = kc;
                if (vc < g->vcos_min[l]) g->vcos_min[l] = vc;
            }
            g->cos_count++;
        }
        int k = probe_len(&e->sched, g, r->next_span);
        if (rc || hi < first + k) continue; /* the probe goes on next step */
        double worst = 2.0;
        int worst_layer = 0;
        for (int l = 0; l < kr.n_layers; l++) {
            double mean = g->cos_count > 0 ? g->cos_sum[l] / g->cos_count : 1.0;
            if (e->sched.span_guard.probe_values && g->cos_count > 0 && g->vcos_sum[l] / g->cos_count < mean)
                mean = g->vcos_sum[l] / g->cos_count;
            if (mean < worst) worst = mean, worst_layer = l;
        }
        write_layers_event(e, r, k);
        sched_span_probe_result(&e->sched, r, worst >= e->sched.span_guard.min_cos, worst, worst_layer);
    }
    free(fresh);
    free(fresh_v);
    reader_free(&kr);
    if (any) e->probe_read_seconds += braid_now_seconds() - t0;
    return rc;
}
