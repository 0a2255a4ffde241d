/*
 * metrics.c — the coordinator's metrics registry and its Prometheus text rendering.
 *
 * Everything recordable lives in one plain struct (MetricsTotals) so that rendering can copy it
 * wholesale under the mutex and format the copy unlocked: scrapes then cost recorders one memcpy of
 * a few kilobytes, never a malloc or a printf.
 */
#include "coord/metrics.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* Bucket upper bounds (le), without the implicit +Inf bucket. Constant tables, not mutable state. */
static const double LATENCY_BOUNDS[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
static const double TTFT_BOUNDS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
#define N_LATENCY_BOUNDS ((int)(sizeof LATENCY_BOUNDS / sizeof LATENCY_BOUNDS[0]))
#define N_TTFT_BOUNDS ((int)(sizeof TTFT_BOUNDS / sizeof TTFT_BOUNDS[0]))
/* vLLM's own bucket bounds for its request histograms (vllm/v1/metrics/loggers.py), so dashboards
 * built for vLLM read the same quantile resolution from Braid. */
static const double VLLM_TTFT_BOUNDS[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double VLLM_ITL_BOUNDS[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                         0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double VLLM_E2E_BOUNDS[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
#define N_VLLM_TTFT_BOUNDS ((int)(sizeof VLLM_TTFT_BOUNDS / sizeof VLLM_TTFT_BOUNDS[0]))
#define N_VLLM_ITL_BOUNDS ((int)(sizeof VLLM_ITL_BOUNDS / sizeof VLLM_ITL_BOUNDS[0]))
#define N_VLLM_E2E_BOUNDS ((int)(sizeof VLLM_E2E_BOUNDS / sizeof VLLM_E2E_BOUNDS[0]))
#define HIST_MAX_SLOTS 24 /* finite bounds + the +Inf slot; every table must fit */

/* vllm:request_success_total's finished_reason values, in vLLM's spelling. */
static const char *const VLLM_FINISHED_REASONS[METRICS_FINISHED_N] = {"stop", "length", "abort", "error"};

/* The last slot of each label table is reserved for overflow, so it exists even when the rest
 * filled up and the label set stays bounded. */
#define OVERFLOW_ENDPOINT (METRICS_MAX_ENDPOINTS - 1)
#define OVERFLOW_PAIR (METRICS_MAX_STATUS_PAIRS - 1)

typedef struct {
    unsigned long long slot_counts[HIST_MAX_SLOTS]; /* per bucket, NOT cumulative; [n_bounds] = +Inf */
    unsigned long long count;
    double sum;
} Histogram;

typedef struct {
    char label[METRICS_LABEL_MAX + 1];
    Histogram latency, ttft;
} EndpointSeries;

typedef struct {
    int endpoint; /* index into MetricsTotals.endpoints: an int compare, not a strcmp, per record */
    int status;
    unsigned long long count;
} StatusPair;

/* One instance's request-level series under vLLM's names (the engine-level ones come from its
 * InstanceStats). */
typedef struct {
    Histogram ttft, itl, e2e;
    unsigned long long finished[METRICS_FINISHED_N];
} VllmRequestSeries;

typedef struct {
    EndpointSeries endpoints[METRICS_MAX_ENDPOINTS];
    int n_endpoints; /* used slots below OVERFLOW_ENDPOINT */
    StatusPair pairs[METRICS_MAX_STATUS_PAIRS];
    int n_pairs; /* used slots below OVERFLOW_PAIR */
    unsigned long long prompt_tokens, cached_prompt_tokens, completion_tokens, rejected;
    int inflight, queued;
    WorkflowMetrics workflows;
    unsigned long long instance_failures;
    unsigned long long instance_restarts;
    unsigned long long rewarms, rewarm_heads, rewarm_prompt_tokens;
    unsigned long long watchdog;
    WarmStartMetrics warm_start;
    RegistryMetrics registry;
} MetricsTotals;

struct Metrics {
    pthread_mutex_t lock;
    MetricsTotals totals;
    InstanceStats *instances; /* n_instances entries, zero until the first report */
    VllmRequestSeries *vllm;  /* n_instances entries: finished generations per instance */
    bool *down;               /* n_instances entries: died (metrics_instance_down) */
    int n_instances;
    char *model_name;
    char *static_text; /* metrics_set_static_text's lines, NULL until set */
};

/* ---------------------------------------------------------------- recording */

/* Copies label into dst, cutting at METRICS_LABEL_MAX bytes but never inside a UTF-8 character,
 * so a truncated label does not end in a partial sequence. */
static void copy_label(char dst[METRICS_LABEL_MAX + 1], const char *label) {
    size_t len = strlen(label);
    if (len > METRICS_LABEL_MAX) {
        len = METRICS_LABEL_MAX;
        /* label[len] is the first byte dropped; if it continues a character, drop that whole
         * character too (at most 3 steps back: UTF-8 sequences are at most 4 bytes). */
        for (int back = 0; back < 3 && len > 0 && ((unsigned char)label[len] & 0xC0) == 0x80; back++) len--;
    }
    memcpy(dst, label, len);
    dst[len] = '\0';
}

/* Slot for an endpoint label (already truncated), inserting it when new. Caller holds the lock. */
static int endpoint_slot(MetricsTotals *t, const char *label) {
    for (int i = 0; i < t->n_endpoints; i++)
        if (strcmp(t->endpoints[i].label, label) == 0) return i;
    if (strcmp(label, METRICS_OVERFLOW_LABEL) == 0 || t->n_endpoints == OVERFLOW_ENDPOINT) return OVERFLOW_ENDPOINT;
    int slot = t->n_endpoints++;
    copy_label(t->endpoints[slot].label, label);
    return slot;
}

/* Counter for one (endpoint, status) pair, inserting it when new. Caller holds the lock. */
static StatusPair *status_pair(MetricsTotals *t, int endpoint, int status) {
    for (int i = 0; i < t->n_pairs; i++)
        if (t->pairs[i].endpoint == endpoint && t->pairs[i].status == status) return &t->pairs[i];
    int is_overflow_key = endpoint == OVERFLOW_ENDPOINT && status == 0;
    if (is_overflow_key || t->n_pairs == OVERFLOW_PAIR) return &t->pairs[OVERFLOW_PAIR];
    StatusPair *p = &t->pairs[t->n_pairs++];
    p->endpoint = endpoint;
    p->status = status;
    p->count = 0;
    return p;
}

static void histogram_observe(Histogram *h, const double *bounds, int n_bounds, double v) {
    int slot = 0;
    while (slot < n_bounds && v > bounds[slot]) slot++; /* le is inclusive: v == bound lands in it */
    h->slot_counts[slot]++;
    h->count++;
    h->sum += v;
}

static unsigned long long clamp_count(int n) { return n > 0 ? (unsigned long long)n : 0; }

void metrics_record_request(Metrics *m, const char *endpoint, int status, double latency_s, double ttft_s,
                            int prompt_tokens, int cached_tokens, int completion_tokens) {
    if (!m) return;
    char label[METRICS_LABEL_MAX + 1];
    copy_label(label, endpoint ? endpoint : "unknown"); /* outside the lock: keeps the hold short */
    if (!isfinite(latency_s) || latency_s < 0) latency_s = 0;
    int has_ttft = status >= 200 && status < 300 && isfinite(ttft_s) && ttft_s >= 0;

    pthread_mutex_lock(&m->lock);
    MetricsTotals *t = &m->totals;
    int ep = endpoint_slot(t, label);
    status_pair(t, ep, status)->count++;
    histogram_observe(&t->endpoints[ep].latency, LATENCY_BOUNDS, N_LATENCY_BOUNDS, latency_s);
    if (has_ttft) histogram_observe(&t->endpoints[ep].ttft, TTFT_BOUNDS, N_TTFT_BOUNDS, ttft_s);
    t->prompt_tokens += clamp_count(prompt_tokens);
    t->cached_prompt_tokens += clamp_count(cached_tokens);
    t->completion_tokens += clamp_count(completion_tokens);
    pthread_mutex_unlock(&m->lock);
}

static void histogram_observe_n(Histogram *h, const double *bounds, int n_bounds, double v, unsigned long long n) {
    int slot = 0;
    while (slot < n_bounds && v > bounds[slot]) slot++;
    h->slot_counts[slot] += n;
    h->count += n;
    h->sum += v * (double)n;
}

static double finite_or_zero(double v) { return isfinite(v) && v > 0 ? v : 0; }

void metrics_record_generation(Metrics *m, const MetricsGeneration *g) {
    if (!m || !g) return;
    if (g->instance < 0 || g->instance >= m->n_instances) return; /* never dispatched: no engine saw it */
    int reason = g->finished_reason >= 0 && g->finished_reason < METRICS_FINISHED_N ? g->finished_reason : METRICS_FINISHED_ERROR;
    double e2e = finite_or_zero(g->e2e_s);
    pthread_mutex_lock(&m->lock);
    VllmRequestSeries *v = &m->vllm[g->instance];
    v->finished[reason]++;
    histogram_observe_n(&v->e2e, VLLM_E2E_BOUNDS, N_VLLM_E2E_BOUNDS, e2e, 1);
    if (isfinite(g->ttft_s) && g->ttft_s >= 0) histogram_observe_n(&v->ttft, VLLM_TTFT_BOUNDS, N_VLLM_TTFT_BOUNDS, g->ttft_s, 1);
    /* The coordinator sees tokens in the batches the instance streams them, not one by one, so each
     * of the n-1 gaps is observed as the request's mean gap: _sum/_count is the exact mean
     * inter-token latency, the buckets are per-request resolution. */
    if (g->generation_tokens > 1) {
        unsigned long long gaps = (unsigned long long)(g->generation_tokens - 1);
        histogram_observe_n(&v->itl, VLLM_ITL_BOUNDS, N_VLLM_ITL_BOUNDS, finite_or_zero(g->decode_s) / (double)gaps, gaps);
    }
    pthread_mutex_unlock(&m->lock);
}

void metrics_set_instance(Metrics *m, int instance, const InstanceStats *s) {
    if (!m) return;
    if (!s || instance < 0 || instance >= m->n_instances) {
        LOG_WARN("metrics", "ignoring stats for instance %d (have %d instances%s)", instance, m->n_instances,
                 s ? "" : ", no stats");
        return;
    }
    pthread_mutex_lock(&m->lock);
    if (!m->down[instance]) m->instances[instance] = *s; /* a dead instance's last word changes nothing */
    pthread_mutex_unlock(&m->lock);
}

/* Whether `instance` names one of m's instances; says which report was dropped when not (the index
 * comes from an MPI peer, so it is checked, not trusted). */
static bool known_instance(const Metrics *m, int instance, const char *report) {
    if (instance >= 0 && instance < m->n_instances) return true;
    LOG_WARN("metrics", "ignoring %s for instance %d (have %d instances)", report, instance, m->n_instances);
    return false;
}

void metrics_instance_down(Metrics *m, int instance) {
    if (!m || !known_instance(m, instance, "a failure")) return;
    pthread_mutex_lock(&m->lock);
    if (!m->down[instance]) {
        m->down[instance] = true;
        m->totals.instance_failures++;
        InstanceStats *s = &m->instances[instance];
        s->waiting = s->running = s->pool_used_blocks = s->host_used_blocks = 0;
    }
    pthread_mutex_unlock(&m->lock);
}

void metrics_instance_restarted(Metrics *m, int instance) {
    if (!m || !known_instance(m, instance, "a restart")) return;
    pthread_mutex_lock(&m->lock);
    if (m->down[instance]) {
        m->down[instance] = false;
        m->totals.instance_restarts++;
    }
    pthread_mutex_unlock(&m->lock);
}

void metrics_count_rewarm(Metrics *m, int instance, int heads, long long prompt_tokens) {
    if (!m || !known_instance(m, instance, "a re-warm")) return;
    pthread_mutex_lock(&m->lock);
    m->totals.rewarms++;
    m->totals.rewarm_heads += heads > 0 ? (unsigned long long)heads : 0;
    m->totals.rewarm_prompt_tokens += prompt_tokens > 0 ? (unsigned long long)prompt_tokens : 0;
    pthread_mutex_unlock(&m->lock);
}

void metrics_instance_idle(Metrics *m, int instance) {
    if (!m || !known_instance(m, instance, "an idle report")) return;
    pthread_mutex_lock(&m->lock);
    InstanceStats *s = &m->instances[instance];
    s->waiting = s->running = s->pool_used_blocks = 0;
    pthread_mutex_unlock(&m->lock);
}

void metrics_set_inflight(Metrics *m, int inflight) {
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    m->totals.inflight = inflight;
    pthread_mutex_unlock(&m->lock);
}

void metrics_set_registry(Metrics *m, const RegistryMetrics *r) {
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    m->totals.registry = *r;
    pthread_mutex_unlock(&m->lock);
}

void metrics_set_queued(Metrics *m, int queued) {
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    m->totals.queued = queued;
    pthread_mutex_unlock(&m->lock);
}

void metrics_set_workflows(Metrics *m, const WorkflowMetrics *w) {
    if (!m || !w) return;
    pthread_mutex_lock(&m->lock);
    m->totals.workflows = *w;
    pthread_mutex_unlock(&m->lock);
}

void metrics_count_rejected(Metrics *m) {
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    m->totals.rejected++;
    pthread_mutex_unlock(&m->lock);
}

void metrics_count_watchdog(Metrics *m) {
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    m->totals.watchdog++;
    pthread_mutex_unlock(&m->lock);
}

void metrics_set_warm_start(Metrics *m, const WarmStartMetrics *w) {
    if (!m || !w) return;
    pthread_mutex_lock(&m->lock);
    m->totals.warm_start = *w;
    pthread_mutex_unlock(&m->lock);
}

/* ---------------------------------------------------------------- lifetime */

Metrics *metrics_create(int n_instances, const char *model_name) {
    if (n_instances < 0) n_instances = 0;
    Metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    /* calloc(0) may return NULL legitimately, so ask for at least one entry. */
    m->instances = calloc(n_instances > 0 ? (size_t)n_instances : 1, sizeof *m->instances);
    m->down = calloc(n_instances > 0 ? (size_t)n_instances : 1, sizeof *m->down);
    m->vllm = calloc(n_instances > 0 ? (size_t)n_instances : 1, sizeof *m->vllm);
    m->model_name = strdup(model_name ? model_name : "");
    if (!m->instances || !m->down || !m->vllm || !m->model_name || pthread_mutex_init(&m->lock, NULL) != 0) {
        free(m->instances);
        free(m->vllm);
        free(m->down);
        free(m->model_name);
        free(m);
        return NULL;
    }
    m->n_instances = n_instances;
    copy_label(m->totals.endpoints[OVERFLOW_ENDPOINT].label, METRICS_OVERFLOW_LABEL);
    m->totals.pairs[OVERFLOW_PAIR].endpoint = OVERFLOW_ENDPOINT;
    /* The two real endpoints exist from the start so dashboards see zero-valued histograms
     * instead of missing series before the first request. */
    endpoint_slot(&m->totals, "chat");
    endpoint_slot(&m->totals, "completions");
    return m;
}

void metrics_destroy(Metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    free(m->instances);
    free(m->vllm);
    free(m->down);
    free(m->model_name);
    free(m->static_text);
    free(m);
}

int metrics_set_static_text(Metrics *m, const char *text) {
    char *copy = text ? strdup(text) : NULL;
    if (text && !copy) return -1;
    pthread_mutex_lock(&m->lock);
    char *old = m->static_text;
    m->static_text = copy;
    pthread_mutex_unlock(&m->lock);
    free(old);
    return 0;
}

/* ---------------------------------------------------------------- text output */

/* A growing output buffer; after the first allocation failure every append is a no-op and the
 * render returns NULL, so the formatting code needs no error path of its own. */
typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} TextOut;

static int out_reserve(TextOut *o, size_t extra) {
    if (o->failed) return -1;
    if (o->len + extra + 1 <= o->cap) return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (o->len + extra + 1 > cap) cap *= 2;
    char *buf = realloc(o->buf, cap);
    if (!buf) {
        o->failed = 1;
        return -1;
    }
    o->buf = buf;
    o->cap = cap;
    return 0;
}

static void out_bytes(TextOut *o, const char *s, size_t n) {
    if (out_reserve(o, n) != 0) return;
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
}

static void out_str(TextOut *o, const char *s) { out_bytes(o, s, strlen(s)); }

static void out_printf(TextOut *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_printf(TextOut *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        o->failed = 1;
        return;
    }
    if (out_reserve(o, (size_t)n) != 0) return;
    va_start(ap, fmt);
    vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    o->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence starting at s, or 0 when it is not one. Relies on the string
 * being NUL-terminated: a NUL fails the continuation check before anything past it is read. */
static int utf8_sequence_len(const unsigned char *s) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

/* Writes a label value escaped per the exposition format (\\, \", \n). The format requires UTF-8,
 * and the model name comes from a file we do not control, so invalid bytes become U+FFFD rather
 * than producing a scrape Prometheus would reject. */
static void out_label_value(TextOut *o, const char *value) {
    const unsigned char *s = (const unsigned char *)value;
    while (*s) {
        int n = utf8_sequence_len(s);
        if (n == 0) out_str(o, "\xEF\xBF\xBD");
        else if (*s == '\\') out_str(o, "\\\\");
        else if (*s == '"') out_str(o, "\\\"");
        else if (*s == '\n') out_str(o, "\\n");
        else out_bytes(o, (const char *)s, (size_t)n);
        s += n > 0 ? n : 1; /* an invalid byte is replaced alone; resync on the next one */
    }
}

/* Shortest of %.15g / %.17g that reads back exactly, so bucket bounds print as "0.025" rather
 * than "0.025000000000000001" while sums still round-trip. */
static void format_double(char buf[40], double v) {
    if (isinf(v)) {
        strcpy(buf, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (isnan(v)) {
        strcpy(buf, "NaN");
        return;
    }
    snprintf(buf, 40, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, 40, "%.17g", v);
}

static void out_family(TextOut *o, const char *name, const char *type, const char *help) {
    out_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* ---------------------------------------------------------------- rendering */

static void render_requests(TextOut *o, const MetricsTotals *t) {
    out_family(o, "braid_requests_total", "counter", "Finished HTTP requests by endpoint and status code.");
    for (int i = 0; i < METRICS_MAX_STATUS_PAIRS; i++) {
        const StatusPair *p = &t->pairs[i];
        if (i >= t->n_pairs && !(i == OVERFLOW_PAIR && p->count > 0)) continue;
        out_str(o, "braid_requests_total{endpoint=\"");
        out_label_value(o, t->endpoints[p->endpoint].label);
        out_printf(o, "\",status=\"%d\"} %llu\n", p->status, p->count);
    }
}

/* Emits `<name>_bucket{endpoint="..",le=".."}` cumulative counts, then `_sum` and `_count`. */
/* Writes a series' labels (without braces) for render_histogram. */
typedef void (*SeriesLabelsFn)(TextOut *o, const void *series);

/* One histogram series: cumulative buckets, sum and count, each sample carrying the series' labels. */
static void render_histogram(TextOut *o, const char *name, SeriesLabelsFn labels, const void *series, const Histogram *h,
                             const double *bounds, int n_bounds) {
    char num[40];
    unsigned long long cumulative = 0;
    for (int b = 0; b <= n_bounds; b++) {
        cumulative += h->slot_counts[b];
        format_double(num, b < n_bounds ? bounds[b] : INFINITY);
        out_printf(o, "%s_bucket{", name);
        labels(o, series);
        out_printf(o, ",le=\"%s\"} %llu\n", num, cumulative);
    }
    assert(cumulative == h->count);
    format_double(num, h->sum);
    out_printf(o, "%s_sum{", name);
    labels(o, series);
    out_printf(o, "} %s\n%s_count{", num, name);
    labels(o, series);
    out_printf(o, "} %llu\n", h->count);
}

static void out_endpoint_label(TextOut *o, const void *endpoint) {
    out_str(o, "endpoint=\"");
    out_label_value(o, endpoint);
    out_str(o, "\"");
}

static void render_histograms(TextOut *o, const MetricsTotals *t, int ttft) {
    const char *name = ttft ? "braid_time_to_first_token_seconds" : "braid_request_latency_seconds";
    out_family(o, name, "histogram",
               ttft ? "Seconds from request arrival to the first generated token (successful requests)."
                    : "Seconds from request arrival to the end of the response.");
    for (int i = 0; i < METRICS_MAX_ENDPOINTS; i++) {
        const EndpointSeries *e = &t->endpoints[i];
        /* The overflow slot shows up only once used (by overflow or by an explicit "_other"). */
        if (i >= t->n_endpoints && !(i == OVERFLOW_ENDPOINT && e->latency.count > 0)) continue;
        if (ttft) render_histogram(o, name, out_endpoint_label, e->label, &e->ttft, TTFT_BOUNDS, N_TTFT_BOUNDS);
        else render_histogram(o, name, out_endpoint_label, e->label, &e->latency, LATENCY_BOUNDS, N_LATENCY_BOUNDS);
    }
}

static void render_scalar(TextOut *o, const char *name, const char *type, const char *help, long long value) {
    out_family(o, name, type, help);
    out_printf(o, "%s %lld\n", name, value);
}

static void render_counter(TextOut *o, const char *name, const char *help, unsigned long long value) {
    out_family(o, name, "counter", help);
    out_printf(o, "%s %llu\n", name, value);
}

/* One series of instance stats: where its value lives in InstanceStats, whether it is an int gauge
 * or an unsigned long long counter, its per-instance family and (for the cache families) the family
 * of its sum over instances. Rows of one family are adjacent and differ by their tier label. */
typedef struct {
    const char *name, *help;         /* per instance, labelled instance="i" */
    const char *sum_name, *sum_help; /* summed over instances; NULL = not summed */
    const char *label;               /* one more label, written out (e.g. tier="host"), or NULL */
    size_t offset;
    int is_gauge; /* gauges are int fields, counters unsigned long long */
} InstanceFamily;

#define STAT(field) offsetof(InstanceStats, field)
static const InstanceFamily INSTANCE_FAMILIES[] = {
    {"braid_instance_waiting_requests", "Requests queued at the instance.", NULL, NULL, NULL, STAT(waiting), 1},
    {"braid_instance_running_sequences", "Sequences the instance is running.", NULL, NULL, NULL, STAT(running), 1},
    {"braid_instance_kv_blocks_used", "Device KV blocks held by running requests.", NULL, NULL, NULL, STAT(pool_used_blocks), 1},
    {"braid_instance_kv_blocks_total", "Device KV blocks in the pool.", NULL, NULL, NULL, STAT(pool_total_blocks), 1},
    {"braid_instance_host_kv_blocks_used", "Host-tier KV blocks holding data (cached or in use).", "braid_kv_host_blocks_used",
     "Host-tier KV blocks holding data, summed over instances.", NULL, STAT(host_used_blocks), 1},
    {"braid_instance_host_kv_blocks_total", "Host-tier KV blocks (0 when the host tier is off).", "braid_kv_host_blocks_total",
     "Host-tier KV blocks, summed over instances.", NULL, STAT(host_total_blocks), 1},
    {"braid_instance_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache, by the tier that held them.",
     "braid_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache at admission, by tier, summed over instances.",
     "tier=\"device\"", STAT(cached_prompt_tokens_device), 0},
    {"braid_instance_cached_prompt_tokens_total", NULL, "braid_prompt_tokens_cached_total", NULL, "tier=\"host\"",
     STAT(cached_prompt_tokens_host), 0},
    {"braid_instance_computed_prompt_tokens_total", "Prompt tokens computed by prefill.", "braid_prompt_tokens_computed_total",
     "Prompt tokens computed by prefill at admission, summed over instances.", NULL, STAT(computed_prompt_tokens), 0},
    {"braid_instance_kv_demoted_blocks_total", "KV blocks demoted from the device to the host tier.", "braid_kv_demoted_blocks_total",
     "KV blocks demoted from the device to the host tier, summed over instances.", NULL, STAT(demoted_blocks), 0},
    {"braid_instance_kv_loaded_blocks_total", "KV blocks loaded back from the host tier to the device.", "braid_kv_loaded_blocks_total",
     "KV blocks loaded back from the host tier to the device, summed over instances.", NULL, STAT(loaded_blocks), 0},
    {"braid_instance_kv_host_evicted_blocks_total", "KV blocks evicted from the host tier.", "braid_kv_host_evicted_blocks_total",
     "KV blocks evicted from the host tier, summed over instances.", NULL, STAT(host_evicted_blocks), 0},
    {"braid_instance_evicted_blocks_total", "KV blocks evicted from the device tier (demoted to the host or dropped).",
     "braid_kv_device_evicted_blocks_total", "KV blocks evicted from the device tier (demoted or dropped), summed over instances.",
     NULL, STAT(device_evicted_blocks), 0},
    {"braid_instance_kv_prefetched_blocks_total", "KV blocks prefetched from the host tier ahead of predicted calls.",
     "braid_kv_prefetched_blocks_total", "KV blocks prefetched from the host tier, summed over instances.", NULL,
     STAT(prefetched_blocks), 0},
    {"braid_instance_kv_prefetch_hit_blocks_total", "Prefetched KV blocks a request then used.", "braid_kv_prefetch_hit_blocks_total",
     "Prefetched KV blocks a request then used, summed over instances.", NULL, STAT(prefetch_hit_blocks), 0},
    {"braid_instance_kv_prefetch_wasted_blocks_total", "Prefetched KV blocks evicted before any request used them.",
     "braid_kv_prefetch_wasted_blocks_total", "Prefetched KV blocks evicted unused, summed over instances.", NULL,
     STAT(prefetch_wasted_blocks), 0},
    {"braid_instance_segment_reused_prompt_tokens_total", "Prompt tokens whose K/V came from reused segments (segment reuse).",
     "braid_prompt_tokens_segment_reused_total", "Prompt tokens whose K/V came from reused segments, summed over instances.", NULL,
     STAT(segment_reused_tokens), 0},
    {"braid_instance_segment_candidates_total", "Prompt chunks found in the segment index.", "braid_segment_candidates_total",
     "Prompt chunks found in the segment index, summed over instances.", NULL, STAT(segment_candidates), 0},
    {"braid_instance_segment_admissions_total", "Segments reused, by admission mode.", "braid_segment_admissions_total",
     "Segments reused by admission mode, summed over instances.", "mode=\"exact\"", STAT(segments_exact), 0},
    {"braid_instance_segment_admissions_total", NULL, "braid_segment_admissions_total", NULL, "mode=\"approx\"",
     STAT(segments_approx), 0},
    {"braid_instance_segment_rejections_total", "Segment candidates not reused, by reason.", "braid_segment_rejections_total",
     "Segment candidates not reused by reason, summed over instances.", "reason=\"left_context\"", STAT(segments_rejected_context), 0},
    {"braid_instance_segment_rejections_total", NULL, "braid_segment_rejections_total", NULL, "reason=\"window\"",
     STAT(segments_rejected_window), 0},
    {"braid_instance_segment_prefill_flops_saved_total", "Prefill FLOPs (linear layers) not spent thanks to reused segments.",
     "braid_segment_prefill_flops_saved_total", "Prefill FLOPs saved by segment reuse, summed over instances.", NULL,
     STAT(segment_flops_saved), 0},
    {"braid_instance_segment_lsh_candidates_total", "Chunks without an exact-hash entry for which the near-duplicate (LSH) index found a candidate.",
     "braid_segment_lsh_candidates_total", "Near-duplicate (LSH) segment candidates, summed over instances.", NULL,
     STAT(segment_lsh_candidates), 0},
    {"braid_instance_segment_lsh_admitted_total", "Near-duplicate chunks that reused at least one token.",
     "braid_segment_lsh_admitted_total", "Near-duplicate chunks admitted, summed over instances.", NULL, STAT(segment_lsh_admitted), 0},
    {"braid_instance_segment_lsh_reused_tokens_total", "Prompt tokens reused from near-duplicate chunks (before the probe).",
     "braid_segment_lsh_reused_tokens_total", "Prompt tokens reused from near-duplicate chunks, summed over instances.", NULL,
     STAT(segment_lsh_reused_tokens), 0},
    {"braid_instance_segment_probe_total", "Online probes of approximate spans, by result.", "braid_segment_probe_total",
     "Online probes of approximate spans by result, summed over instances.", "result=\"admitted\"", STAT(segment_probes_ok), 0},
    {"braid_instance_segment_probe_total", NULL, "braid_segment_probe_total", NULL, "result=\"rejected\"",
     STAT(segment_probes_rejected), 0},
    {"braid_instance_directive_requests_total", "Requests that carried cache directives.", "braid_directive_requests_total",
     "Requests that carried cache directives (or cache_control), summed over instances.", NULL, STAT(directive_requests), 0},
    {"braid_instance_kv_pins_total", "Pins taken (pin directives and cache_control).", "braid_kv_pins_total",
     "Pins taken, summed over instances.", NULL, STAT(pins), 0},
    {"braid_instance_kv_pinned_blocks", "Device KV blocks pinned now.", "braid_kv_pinned_blocks",
     "Device KV blocks pinned now, summed over instances.", NULL, STAT(pinned_blocks), 1},
    {"braid_instance_kv_pin_released_blocks_total", "Pinned blocks released, by why.", "braid_kv_pin_released_blocks_total",
     "Pinned blocks released by why, summed over instances.", "why=\"expired\"", STAT(pin_expired_blocks), 0},
    {"braid_instance_kv_pin_released_blocks_total", NULL, "braid_kv_pin_released_blocks_total", NULL, "why=\"admission\"",
     STAT(pin_revoked_blocks), 0},
    {"braid_instance_kv_spliced_tokens_total", "Prompt tokens an amortized splice copied (keys rotated) instead of computing.",
     "braid_kv_spliced_tokens_total", "Prompt tokens amortized splices copied, summed over instances.", NULL, STAT(spliced_tokens), 0},
    {"braid_instance_kv_shared_hit_tokens_total", "Prompt tokens copied from a prefix another tenant shared.",
     "braid_kv_shared_hit_tokens_total", "Prompt tokens copied from other tenants' shared prefixes, summed over instances.", NULL,
     STAT(shared_hit_tokens), 0},
    {"braid_instance_kv_directive_evicted_blocks_total", "KV blocks dropped by evict directives and forget splices.",
     "braid_kv_directive_evicted_blocks_total", "KV blocks dropped on request, summed over instances.", NULL,
     STAT(directive_evicted_blocks), 0},
    {"braid_instance_kv_residual_blocks", "ForkKV residual pool blocks held by requests.", "braid_kv_residual_blocks",
     "ForkKV residual pool blocks held by requests, summed over instances.", NULL, STAT(residual_used_blocks), 1},
    {"braid_instance_kv_residual_total_blocks", "ForkKV residual pool blocks usable.", NULL, NULL, NULL,
     STAT(residual_total_blocks), 1},
    {"braid_instance_kv_residual_hit_tokens_total", "Prompt tokens whose ForkKV residual was cached.",
     "braid_kv_residual_hit_tokens_total", "Prompt tokens whose ForkKV residual was cached, summed over instances.", NULL,
     STAT(residual_hit_tokens), 0},
    {"braid_instance_kv_fork_tokens_total", "Prompt tokens whose shared base K/V was cached but residual computed (a fork).",
     "braid_kv_fork_tokens_total", "ForkKV fork tokens, summed over instances.", NULL, STAT(fork_tokens), 0},
    {"braid_instance_kv_partial_hit_tokens_total", "Prompt tokens whose residual was cached but base recomputed.",
     "braid_kv_partial_hit_tokens_total", "ForkKV partial-hit tokens, summed over instances.", NULL, STAT(partial_hit_tokens), 0},
    {"braid_instance_kv_residual_evicted_blocks_total", "ForkKV residual blocks evicted.", "braid_kv_residual_evicted_blocks_total",
     "ForkKV residual blocks evicted, summed over instances.", NULL, STAT(residual_evicted_blocks), 0},
    {"braid_instance_kv_moved_in_blocks_total", "KV blocks moved in from other instances (remote hits).",
     "braid_kv_moved_in_blocks_total", "KV blocks moved between instances, summed over the receiving instances.", NULL,
     STAT(moved_in_blocks), 0},
    {"braid_instance_kv_moved_in_bytes_total", "Bytes of KV moved in from other instances.", "braid_kv_moved_in_bytes_total",
     "Bytes of KV moved between instances.", NULL, STAT(moved_in_bytes), 0},
    {"braid_instance_kv_move_failures_total", "KV moves that failed or timed out (the prefix was recomputed).",
     "braid_kv_move_failures_total", "Failed KV moves, summed over instances.", NULL, STAT(move_failures), 0},
    {"braid_instance_kv_move_declines_total",
     "KV moves declined without a fault: the lender had nothing to lend, or the prefix got here meanwhile.",
     "braid_kv_move_declines_total", "Declined KV moves, summed over instances.", NULL, STAT(move_declines), 0},
    {"braid_instance_kv_move_followers_total",
     "Requests that waited behind a KV move in flight to this instance (they share its head) instead of prefilling that head.",
     "braid_kv_move_followers_total", "Requests that waited behind a KV move in flight, summed over instances.", NULL,
     STAT(move_followers), 0},
    {"braid_instance_kv_lent_blocks_total", "KV blocks this instance lent to others.", NULL, NULL, NULL, STAT(lent_blocks), 0},
    {"braid_instance_preemptions_total", "Sequences preempted.", NULL, NULL, NULL, STAT(preemptions), 0},
    {"braid_instance_generated_tokens_total", "Tokens generated.", NULL, NULL, NULL, STAT(generated_tokens), 0},
};
#undef STAT
#define N_INSTANCE_FAMILIES (sizeof INSTANCE_FAMILIES / sizeof INSTANCE_FAMILIES[0])

static unsigned long long instance_value(const InstanceStats *s, const InstanceFamily *fam) {
    const char *field = (const char *)s + fam->offset;
    if (fam->is_gauge) {
        int v;
        memcpy(&v, field, sizeof v);
        return v > 0 ? (unsigned long long)v : 0;
    }
    unsigned long long v;
    memcpy(&v, field, sizeof v);
    return v;
}

/* `{instance="i",tier="t"}`-style label set; either part may be absent. */
static void out_labels(TextOut *o, int instance, const char *label) {
    if (instance < 0 && !label) return;
    out_str(o, "{");
    if (instance >= 0) out_printf(o, "instance=\"%d\"%s", instance, label ? "," : "");
    if (label) out_str(o, label);
    out_str(o, "}");
}

static void render_instances(TextOut *o, const InstanceStats *instances, int n_instances) {
    for (size_t f = 0; f < N_INSTANCE_FAMILIES; f++) {
        const InstanceFamily *fam = &INSTANCE_FAMILIES[f];
        if (f == 0 || strcmp(fam->name, INSTANCE_FAMILIES[f - 1].name) != 0)
            out_family(o, fam->name, fam->is_gauge ? "gauge" : "counter", fam->help);
        for (int i = 0; i < n_instances; i++) {
            out_str(o, fam->name);
            out_labels(o, i, fam->label);
            out_printf(o, " %llu\n", instance_value(&instances[i], fam));
        }
    }
}

/* The cache families summed over instances: the cluster-wide view a dashboard divides itself. */
static void render_instance_sums(TextOut *o, const InstanceStats *instances, int n_instances) {
    const char *previous = NULL;
    for (size_t f = 0; f < N_INSTANCE_FAMILIES; f++) {
        const InstanceFamily *fam = &INSTANCE_FAMILIES[f];
        if (!fam->sum_name) continue;
        if (!previous || strcmp(fam->sum_name, previous) != 0)
            out_family(o, fam->sum_name, fam->is_gauge ? "gauge" : "counter", fam->sum_help);
        previous = fam->sum_name;
        unsigned long long sum = 0;
        for (int i = 0; i < n_instances; i++) sum += instance_value(&instances[i], fam);
        out_str(o, fam->sum_name);
        out_labels(o, -1, fam->label);
        out_printf(o, " %llu\n", sum);
    }
}

/* The start-up warm start: heads by outcome, manifest lines skipped by reason. */
static void render_warm_start(TextOut *o, const WarmStartMetrics *w) {
    out_family(o, "braid_warm_start_heads_total", "counter", "Start-up warm start heads by outcome (left_out: past --warm-start-heads / -tokens).");
    out_printf(o, "braid_warm_start_heads_total{outcome=\"warmed\"} %lld\n", w->warmed);
    out_printf(o, "braid_warm_start_heads_total{outcome=\"refused\"} %lld\n", w->refused);
    out_printf(o, "braid_warm_start_heads_total{outcome=\"left_out\"} %lld\n", w->left_out);
    out_family(o, "braid_warm_start_lines_skipped_total", "counter", "Start-up warm start manifest lines skipped, by reason.");
    out_printf(o, "braid_warm_start_lines_skipped_total{reason=\"invalid\"} %lld\n", w->skipped_invalid);
    out_printf(o, "braid_warm_start_lines_skipped_total{reason=\"vocabulary\"} %lld\n", w->skipped_vocab);
    out_printf(o, "braid_warm_start_lines_skipped_total{reason=\"stale\"} %lld\n", w->skipped_stale);
    out_printf(o, "braid_warm_start_lines_skipped_total{reason=\"unknown_tenant\"} %lld\n", w->skipped_tenant);
}

/* Which instances are alive (1) or dead (0), how many are, how many died and came back since start-up. */
static void render_liveness(TextOut *o, const MetricsTotals *t, const bool *down, int n_instances) {
    int alive = 0;
    for (int i = 0; i < n_instances; i++) alive += !down[i];
    render_scalar(o, "braid_instances_alive", "gauge", "Instances serving (not dead).", alive);
    out_family(o, "braid_instance_up", "gauge", "1 while the instance is alive, 0 once it has died.");
    for (int i = 0; i < n_instances; i++) out_printf(o, "braid_instance_up{instance=\"%d\"} %d\n", i, down[i] ? 0 : 1);
    render_counter(o, "braid_instance_failures_total", "Instances that died while the server ran.", t->instance_failures);
    render_counter(o, "braid_instance_restarts_total", "Dead instances brought back (--restart-instances).", t->instance_restarts);
    render_counter(o, "braid_instance_rewarms_total", "Re-warms of restarted instances finished.", t->rewarms);
    render_counter(o, "braid_instance_rewarm_heads_total", "Hot prompt heads prefilled on restarted instances.", t->rewarm_heads);
    render_counter(o, "braid_instance_rewarm_prompt_tokens_total", "Prompt tokens of the heads prefilled on restarted instances.",
                   t->rewarm_prompt_tokens);
}

/* ---------------------------------------------------------------- vLLM's names */

/* `engine="i",model_name="..."`: vLLM's labels for one engine (here: one instance). */
static void out_vllm_labels(TextOut *o, int instance, const char *model_name) {
    out_printf(o, "engine=\"%d\",model_name=\"", instance);
    out_label_value(o, model_name);
    out_str(o, "\"");
}

/* The labels of one vLLM series: the instance as vLLM's engine index, and the served model. */
typedef struct {
    int instance;
    const char *model_name;
} VllmSeries;

static void out_vllm_series_labels(TextOut *o, const void *series) {
    const VllmSeries *v = series;
    out_vllm_labels(o, v->instance, v->model_name);
}

/* A family with one sample per instance; value(i) formats instance i's value. */
typedef void (*VllmValueFn)(char buf[40], const InstanceStats *s);

static void vllm_running(char buf[40], const InstanceStats *s) { snprintf(buf, 40, "%d", s->running > 0 ? s->running : 0); }
static void vllm_waiting(char buf[40], const InstanceStats *s) { snprintf(buf, 40, "%d", s->waiting > 0 ? s->waiting : 0); }
static void vllm_kv_usage(char buf[40], const InstanceStats *s) {
    double used = s->pool_total_blocks > 0 && s->pool_used_blocks > 0 ? (double)s->pool_used_blocks / s->pool_total_blocks : 0;
    format_double(buf, used > 1 ? 1 : used);
}
/* Prompt tokens at first admission: vLLM's prefix-cache queries are the tokens looked up, its hits
 * the tokens found (here: either cache tier). */
static unsigned long long prompt_tokens_seen(const InstanceStats *s) {
    return s->cached_prompt_tokens_device + s->cached_prompt_tokens_host + s->computed_prompt_tokens;
}
static void vllm_prompt_tokens(char buf[40], const InstanceStats *s) { snprintf(buf, 40, "%llu", prompt_tokens_seen(s)); }
static void vllm_prefix_hits(char buf[40], const InstanceStats *s) {
    snprintf(buf, 40, "%llu", s->cached_prompt_tokens_device + s->cached_prompt_tokens_host);
}
static void vllm_generated(char buf[40], const InstanceStats *s) { snprintf(buf, 40, "%llu", s->generated_tokens); }

static void render_vllm_family(TextOut *o, const char *name, const char *type, const char *help, VllmValueFn value,
                               const InstanceStats *instances, int n_instances, const char *model_name) {
    out_family(o, name, type, help);
    char buf[40];
    for (int i = 0; i < n_instances; i++) {
        value(buf, &instances[i]);
        out_printf(o, "%s{", name);
        out_vllm_labels(o, i, model_name);
        out_printf(o, "} %s\n", buf);
    }
}

/* The families vLLM exports (docs.vllm.ai, "Production Metrics"), with vLLM's names, types, labels
 * and buckets, one `engine` per instance, for routers and dashboards that scrape vLLM. */
static void render_vllm(TextOut *o, const InstanceStats *instances, const VllmRequestSeries *vllm, int n_instances,
                        const char *model_name) {
    render_vllm_family(o, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", vllm_running,
                       instances, n_instances, model_name);
    render_vllm_family(o, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", vllm_waiting,
                       instances, n_instances, model_name);
    render_vllm_family(o, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", vllm_kv_usage,
                       instances, n_instances, model_name);
    render_vllm_family(o, "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
                       vllm_prompt_tokens, instances, n_instances, model_name);
    render_vllm_family(o, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
                       vllm_prefix_hits, instances, n_instances, model_name);
    render_vllm_family(o, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", vllm_prompt_tokens,
                       instances, n_instances, model_name);
    render_vllm_family(o, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", vllm_generated,
                       instances, n_instances, model_name);
    out_family(o, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
    for (int i = 0; i < n_instances; i++)
        for (int r = 0; r < METRICS_FINISHED_N; r++) {
            out_str(o, "vllm:request_success_total{");
            out_vllm_labels(o, i, model_name);
            out_printf(o, ",finished_reason=\"%s\"} %llu\n", VLLM_FINISHED_REASONS[r], vllm[i].finished[r]);
        }
    static const struct {
        const char *name, *help;
        size_t offset;
        const double *bounds;
        int n_bounds;
    } HISTOGRAMS[] = {
        {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", offsetof(VllmRequestSeries, ttft),
         VLLM_TTFT_BOUNDS, N_VLLM_TTFT_BOUNDS},
        {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", offsetof(VllmRequestSeries, itl),
         VLLM_ITL_BOUNDS, N_VLLM_ITL_BOUNDS},
        /* vLLM's older name for the same observations (deprecated there in favour of the one above). */
        {"vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", offsetof(VllmRequestSeries, itl),
         VLLM_ITL_BOUNDS, N_VLLM_ITL_BOUNDS},
        {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", offsetof(VllmRequestSeries, e2e),
         VLLM_E2E_BOUNDS, N_VLLM_E2E_BOUNDS},
    };
    for (size_t h = 0; h < sizeof HISTOGRAMS / sizeof HISTOGRAMS[0]; h++) {
        out_family(o, HISTOGRAMS[h].name, "histogram", HISTOGRAMS[h].help);
        for (int i = 0; i < n_instances; i++) {
            const Histogram *hist = (const Histogram *)((const char *)&vllm[i] + HISTOGRAMS[h].offset);
            render_histogram(o, HISTOGRAMS[h].name, out_vllm_series_labels, &(VllmSeries){i, model_name}, hist, HISTOGRAMS[h].bounds,
                             HISTOGRAMS[h].n_bounds);
        }
    }
}

static void render_all(TextOut *o, const MetricsTotals *t, const InstanceStats *instances, const bool *down, int n_instances,
                       const char *model_name) {
    render_requests(o, t);
    render_histograms(o, t, 0);
    render_histograms(o, t, 1);
    render_counter(o, "braid_prompt_tokens_total", "Prompt tokens of finished requests.", t->prompt_tokens);
    render_counter(o, "braid_cached_prompt_tokens_total", "Prompt tokens of finished requests served from cache.",
                   t->cached_prompt_tokens);
    render_counter(o, "braid_completion_tokens_total", "Completion tokens of finished requests.",
                   t->completion_tokens);
    render_scalar(o, "braid_requests_inflight", "gauge", "Requests accepted and not yet finished.", t->inflight);
    render_scalar(o, "braid_requests_queued", "gauge", "Requests waiting in the coordinator's queue.", t->queued);
    render_counter(o, "braid_requests_rejected_total", "Requests rejected with 429 because the queue was full.",
                   t->rejected);
    render_counter(o, "braid_requests_watchdog_total",
                   "Requests answered 500 by the progress watchdog (no token and no queue movement for --request-watchdog-s).",
                   t->watchdog);
    render_warm_start(o, &t->warm_start);
    render_scalar(o, "braid_registry_blocks", "gauge", "Block hashes the coordinator's registry holds (all instances).",
                  (long long)t->registry.blocks);
    render_scalar(o, "braid_registry_bytes", "gauge", "Bytes the coordinator's registry has allocated.",
                  (long long)t->registry.bytes);
    render_counter(o, "braid_registry_evicted_blocks_total",
                   "Block hashes the registry dropped (least recently stored first) to stay within its bound.",
                   t->registry.evicted);
    render_scalar(o, "braid_workflows_active", "gauge", "Workflows the coordinator's tracker holds as active.",
                  t->workflows.workflows_active);
    render_counter(o, "braid_workflow_forecasts_total", "Next-agent forecasts sent to the instances (one per call).",
                   t->workflows.forecasts_sent);
    render_counter(o, "braid_workflow_forecast_step1_correct_total",
                   "Workflow calls whose agent was the previous forecast's most likely next agent.", t->workflows.step1_correct);
    render_counter(o, "braid_workflow_forecast_step1_total", "Workflow calls a previous forecast predicted.",
                   t->workflows.step1_total);
    render_liveness(o, t, down, n_instances);
    render_instance_sums(o, instances, n_instances);
    render_instances(o, instances, n_instances);
    out_family(o, "braid_model_info", "gauge", "The served model; the value is always 1.");
    out_str(o, "braid_model_info{model=\"");
    out_label_value(o, model_name);
    out_str(o, "\"} 1\n");
}

char *metrics_render(Metrics *m) {
    if (!m) return NULL;
    /* Allocate the snapshot before locking so recorders never wait on malloc. */
    MetricsTotals *snap = malloc(sizeof *snap);
    InstanceStats *instances = malloc((m->n_instances > 0 ? (size_t)m->n_instances : 1) * sizeof *instances);
    bool *down = malloc((m->n_instances > 0 ? (size_t)m->n_instances : 1) * sizeof *down);
    VllmRequestSeries *vllm = malloc((m->n_instances > 0 ? (size_t)m->n_instances : 1) * sizeof *vllm);
    if (!snap || !instances || !down || !vllm) {
        free(vllm);
        free(snap);
        free(instances);
        free(down);
        return NULL;
    }
    pthread_mutex_lock(&m->lock);
    *snap = m->totals;
    if (m->n_instances > 0) memcpy(instances, m->instances, (size_t)m->n_instances * sizeof *instances);
    if (m->n_instances > 0) memcpy(down, m->down, (size_t)m->n_instances * sizeof *down);
    if (m->n_instances > 0) memcpy(vllm, m->vllm, (size_t)m->n_instances * sizeof *vllm);
    /* Copied under the lock so a concurrent metrics_set_static_text cannot free it mid-render. */
    char *static_text = m->static_text ? strdup(m->static_text) : NULL;
    int static_lost = m->static_text && !static_text;
    pthread_mutex_unlock(&m->lock);

    TextOut o = {0};
    render_all(&o, snap, instances, down, m->n_instances, m->model_name);
    render_vllm(&o, instances, vllm, m->n_instances, m->model_name);
    if (static_text) out_str(&o, static_text);
    o.failed |= static_lost;
    free(static_text);
    free(snap);
    free(instances);
    free(down);
    free(vllm);
    if (o.failed) {
        free(o.buf);
        return NULL;
    }
    return o.buf;
}
