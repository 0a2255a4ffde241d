/* The warm start's thread (contract in warm_start.h). */
#include "coord/warm_start.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "coord/adapter_select.h"
#include "coord/http_choices.h"
#include "coord/manifest_heads.h"
#include "worker/engine.h"

struct WarmStart {
    WarmStartConfig cfg;
    char *path, *pin_ttl;
    _Atomic uint64_t seed_counter;
    atomic_bool stop;
    pthread_t thread;
};

typedef struct {
    int warmed, failed;
    long long prompt_tokens, cached_tokens;
} WarmTotals;

/* The completion body of one head; malloc'd JSON text or NULL when out of memory. */
static char *head_body(const ManifestHead *h, const char *pin_ttl) {
    json_t *ids = json_array();
    for (int i = 0; ids && i < h->n_tokens; i++)
        if (json_array_append_new(ids, json_integer(h->tokens[i]))) json_decref(ids), ids = NULL;
    json_t *o = ids ? json_pack("{s:o, s:i, s:i}", "prompt", ids, "max_tokens", 1, "temperature", 0) : NULL;
    if (o && h->tenant && json_object_set_new(o, "tenant", json_string(h->tenant))) json_decref(o), o = NULL;
    if (o && h->adapter && json_object_set_new(o, "adapter", json_string(h->adapter))) json_decref(o), o = NULL;
    if (o && pin_ttl && json_object_set_new(o, "directives", json_pack("[{s:s, s:s}]", "op", "pin", "ttl", pin_ttl)))
        json_decref(o), o = NULL;
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

static void wait_finished(CoordRequest *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->finished) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* Prefills one head through the request path; 0, or -1 with why saying what refused it. */
static int warm_head(WarmStart *w, const ManifestHead *h, WarmTotals *t, char *why, size_t cap) {
    const HttpGenerateContext *ctx = &w->cfg.generate;
    char *body = head_body(h, w->pin_ttl);
    if (!body) return snprintf(why, cap, "out of memory"), -1;
    ApiRequest a;
    ApiError e = {0};
    ChoiceSet set = {0};
    int rc = api_request_parse(body, strlen(body), API_COMPLETION, NULL, &a, &e);
    free(body);
    if (rc) return snprintf(why, cap, "%s", e.message), -1;
    rc = adapter_select(&a, ctx->served_model, ctx->lora, &e);
    if (rc == 0) rc = choices_build(ctx, &a, &set, &e);
    if (rc == 0) rc = choices_submit(ctx, &set, &e);
    if (rc) snprintf(why, cap, "%d %s", e.status, e.message);
    if (rc == 0) {
        CoordRequest *r = set.c[0].r;
        wait_finished(r);
        pthread_mutex_lock(&r->mu);
        if (r->error[0]) rc = -1, snprintf(why, cap, "%s", r->error);
        t->prompt_tokens += r->prompt_tokens;
        t->cached_tokens += r->cached_tokens;
        pthread_mutex_unlock(&r->mu);
    }
    choices_free(ctx, &set, rc != 0);
    api_request_free(&a);
    return rc;
}

/* Until the instances are up (true), or the server stops or fails first (false). */
static bool wait_for_instances(WarmStart *w) {
    for (;;) {
        if (atomic_load(&w->stop)) return false;
        const char *state = coordinator_state(w->cfg.generate.coord);
        if (strcmp(state, "loading") != 0) return strcmp(state, "warming") == 0;
        struct timespec nap = {0, 50 * 1000000};
        nanosleep(&nap, NULL);
    }
}

static bool progress_due(int done, int total) { return total <= 20 || done == total || done % (total / 10) == 0; }

static void warm_heads(WarmStart *w, const ManifestHeads *m) {
    WarmTotals t = {0};
    double t0 = braid_now_seconds();
    char why[400];
    for (int i = 0; i < m->n_heads && !atomic_load(&w->stop); i++) {
        const ManifestHead *h = &m->heads[i];
        if (warm_head(w, h, &t, why, sizeof why) == 0) t.warmed++;
        else {
            t.failed++;
            LOG_WARN("warm-start", "head %d (%d tokens, tenant '%s') not warmed: %s", i + 1, h->n_tokens, h->tenant ? h->tenant : "", why);
        }
        if (progress_due(i + 1, m->n_heads))
            LOG_INFO("warm-start", "warm start: %d/%d heads, %d skipped, %d refused", i + 1, m->n_heads, m->skipped, t.failed);
    }
    LOG_INFO("warm-start",
             "warm start done in %.1f s: %d heads warmed (%lld prompt tokens, %lld of them already cached), %d refused; "
             "manifest lines: %d read, %d skipped, %d duplicate, %d unchained%s",
             braid_now_seconds() - t0, t.warmed, t.prompt_tokens, t.cached_tokens, t.failed, m->lines, m->skipped, m->duplicates,
             m->unchained, w->pin_ttl ? "; heads pinned" : "");
}

static void *warm_thread(void *arg) {
    WarmStart *w = arg;
    const BraidModel *model = w->cfg.generate.model;
    ManifestHeads heads = {0};
    BraidError err;
    FILE *f = fopen(w->path, "r");
    if (!f) LOG_ERROR("warm-start", "cannot read the manifest %s; nothing is warmed", w->path);
    else if (manifest_heads_read(f, model->weights.cfg.vocab_size, engine_model_seed(&model->weights.cfg), &heads, &err))
        LOG_ERROR("warm-start", "%s: %s; nothing is warmed", w->path, err.msg);
    else
        LOG_INFO("warm-start", "%s: %d prompt heads from %d lines (%d skipped); waiting for the instances", w->path, heads.n_heads,
                 heads.lines, heads.skipped);
    if (f) fclose(f);
    if (heads.n_heads > 0 && wait_for_instances(w)) warm_heads(w, &heads);
    manifest_heads_free(&heads);
    coordinator_warming_done(w->cfg.generate.coord);
    return NULL;
}

WarmStart *warm_start_begin(const WarmStartConfig *cfg, BraidError *err) {
    WarmStart *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(cfg->path)) || (cfg->pin_ttl && !(w->pin_ttl = strdup(cfg->pin_ttl)))) {
        if (w) free(w->path), free(w);
        return braid_error_set(err, "warm start: out of memory"), NULL;
    }
    w->cfg = *cfg;
    w->cfg.generate.seed_counter = &w->seed_counter;
    w->cfg.generate.manifest = NULL; /* its own requests are not traffic */
    w->cfg.generate.metrics = NULL;
    if (pthread_create(&w->thread, NULL, warm_thread, w)) {
        free(w->path);
        free(w->pin_ttl);
        free(w);
        return braid_error_set(err, "warm start: cannot start its thread"), NULL;
    }
    return w;
}

void warm_start_end(WarmStart *w) {
    if (!w) return;
    atomic_store(&w->stop, true);
    pthread_join(w->thread, NULL);
    free(w->path);
    free(w->pin_ttl);
    free(w);
}
