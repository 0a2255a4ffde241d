/* The warm-up thread: start-up warm start and re-warms of restarted instances (contract in warm_start.h). */
#include "coord/warm_start.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "coord/manifest_heads.h"
#include "coord/warm_heads.h"
#include "worker/engine.h"

struct WarmStart {
    WarmStartConfig cfg;
    char *path, *pin_ttl;
    _Atomic uint64_t seed_counter;
    atomic_bool stop;
    pthread_t thread;
    /* Re-warms queued by the MPI thread, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    bool *rewarm_due; /* (n_instances) */
    int n_instances;
};

/* ManifestTenantFilter: with API keys, only tenants some key runs in (a tenantless line's namespace
 * is one no keyed request reaches). */
static bool tenant_known(void *ctx, const char *tenant) { return auth_keys_knows_tenant(ctx, tenant); }

/* The heads of a manifest text read from f; label names the source in the log. 0 heads when it
 * cannot be read (logged). */
static void read_heads(WarmStart *w, FILE *f, const char *label, ManifestHeads *heads) {
    const BraidModel *model = w->cfg.generate.model;
    BraidError err;
    ManifestTenantFilter filter = {.allows = tenant_known, .ctx = (void *)w->cfg.keys};
    memset(heads, 0, sizeof *heads);
    if (!f) LOG_ERROR("warm-start", "cannot read %s; nothing from it is warmed", label);
    else if (manifest_heads_read_filtered(f, model->weights.cfg.vocab_size, engine_model_seed(&model->weights.cfg),
                                          w->cfg.keys ? &filter : NULL, heads, &err))
        LOG_ERROR("warm-start", "%s: %s; nothing from it is warmed", label, err.msg);
    if (f) fclose(f);
}

static void read_file_heads(WarmStart *w, ManifestHeads *heads) { read_heads(w, fopen(w->path, "r"), w->path, heads); }

/* ---- start-up ---- */

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

/* Most counted first; file order among equals (qsort is not stable: the index breaks ties). */
typedef struct {
    long long count;
    int index;
} HeadOrder;

static int by_count_desc(const void *a, const void *b) {
    const HeadOrder *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Puts the hottest heads first, so a bounded warm start warms what clients send most. Left in file
 * order when out of memory. */
static void order_hottest_first(ManifestHeads *heads) {
    int n = heads->n_heads;
    HeadOrder *order = n > 1 ? malloc((size_t)n * sizeof *order) : NULL;
    ManifestHead *sorted = order ? malloc((size_t)n * sizeof *sorted) : NULL;
    if (sorted) {
        for (int i = 0; i < n; i++) order[i] = (HeadOrder){.count = heads->heads[i].count, .index = i};
        qsort(order, (size_t)n, sizeof *order, by_count_desc);
        for (int i = 0; i < n; i++) sorted[i] = heads->heads[order[i].index];
        free(heads->heads);
        heads->heads = sorted;
    }
    free(order);
}

static void warm_at_start_up(WarmStart *w) {
    ManifestHeads heads;
    read_file_heads(w, &heads);
    order_hottest_first(&heads);
    LOG_INFO("warm-start", "%s: %d prompt heads from %d lines (%d skipped); warming at most %lld heads, %lld tokens once the instances are up",
             w->path, heads.n_heads, heads.lines, heads.skipped, w->cfg.max_heads, w->cfg.max_tokens);
    WarmTotals t = {.left = heads.n_heads};
    if (heads.n_heads > 0 && wait_for_instances(w)) {
        double t0 = braid_now_seconds();
        WarmHeadsJob job = {.generate = &w->cfg.generate, .label = "warm start", .pin_ttl = w->pin_ttl, .pin_instance = -1,
                            .max_heads = w->cfg.max_heads > 0 && w->cfg.max_heads < (1 << 30) ? (int)w->cfg.max_heads : 0,
                            .max_tokens = w->cfg.max_tokens, .stop = &w->stop};
        t = warm_heads_send(&job, &heads);
        LOG_INFO("warm-start",
                 "warm start done in %.1f s: %d heads warmed (%lld prompt tokens, %lld of them already cached), %d refused, "
                 "%d left out (past --warm-start-heads %lld / --warm-start-tokens %lld, or stopped); "
                 "manifest lines: %d read, %d skipped, %d duplicate, %d unchained%s",
                 braid_now_seconds() - t0, t.warmed, t.prompt_tokens, t.cached_tokens, t.refused, t.left, w->cfg.max_heads,
                 w->cfg.max_tokens, heads.lines, heads.skipped, heads.duplicates, heads.unchained, w->pin_ttl ? "; heads pinned" : "");
    }
    WarmStartMetrics wm = {.warmed = t.warmed, .refused = t.refused, .left_out = t.left,
                           .skipped_invalid = heads.skips[MANIFEST_SKIP_INVALID].count,
                           .skipped_vocab = heads.skips[MANIFEST_SKIP_VOCAB].count,
                           .skipped_stale = heads.skips[MANIFEST_SKIP_STALE].count,
                           .skipped_tenant = heads.skips[MANIFEST_SKIP_TENANT].count};
    metrics_set_warm_start(w->cfg.metrics, &wm);
    manifest_heads_free(&heads);
    coordinator_warming_done(w->cfg.generate.coord);
}

/* ---- re-warm of a restarted instance ---- */

/* The recorder's hot heads (counted at least WARM_START_REWARM_MIN_COUNT times), most counted first. */
static void read_recorder_heads(WarmStart *w, ManifestHeads *heads) {
    memset(heads, 0, sizeof *heads);
    if (!w->cfg.recorder) return;
    char *text = manifest_recorder_export(w->cfg.recorder, WARM_START_REWARM_MIN_COUNT, NULL);
    if (!text) LOG_ERROR("warm-start", "out of memory exporting the recorded chunks; the re-warm goes without them");
    else if (text[0]) read_heads(w, fmemopen(text, strlen(text), "r"), "the recorded chunks", heads);
    free(text);
}

/* Moves every head of from to the end of into (from is left empty); -1 when out of memory (from kept). */
static int append_heads(ManifestHeads *into, ManifestHeads *from) {
    if (from->n_heads == 0) return 0;
    ManifestHead *all = realloc(into->heads, (size_t)(into->n_heads + from->n_heads) * sizeof *all);
    if (!all) return -1;
    memcpy(all + into->n_heads, from->heads, (size_t)from->n_heads * sizeof *all);
    into->heads = all;
    into->n_heads += from->n_heads;
    free(from->heads);
    from->heads = NULL;
    from->n_heads = 0;
    return 0;
}

typedef struct {
    WarmStart *w;
    int instance;
} RewarmTarget;

/* The instance is still up (it may die again mid-way; its heads would then go elsewhere). */
static bool instance_still_up(void *ctx) {
    RewarmTarget *t = ctx;
    InstanceStatus *status = calloc((size_t)t->w->n_instances, sizeof *status);
    if (!status) return false;
    coordinator_instances(t->w->cfg.generate.coord, status, t->w->n_instances);
    bool up = status[t->instance].state == INSTANCE_UP;
    free(status);
    return up;
}

static void rewarm_instance(WarmStart *w, int instance) {
    ManifestHeads heads, from_file = {0};
    read_recorder_heads(w, &heads);
    int recorded = heads.n_heads;
    if (w->path) read_file_heads(w, &from_file);
    if (append_heads(&heads, &from_file))
        LOG_ERROR("warm-start", "instance %d re-warm: out of memory; the --warm-start heads are left out", instance);
    char label[64];
    snprintf(label, sizeof label, "instance %d re-warm", instance);
    LOG_INFO("warm-start", "%s: %d hot heads recorded, %d from --warm-start; sending at most %d heads, %lld tokens", label,
             recorded, heads.n_heads - recorded, w->cfg.rewarm_max_heads, w->cfg.rewarm_max_tokens);
    double t0 = braid_now_seconds();
    RewarmTarget target = {.w = w, .instance = instance};
    WarmHeadsJob job = {.generate = &w->cfg.generate, .label = label, .pin_ttl = w->pin_ttl, .pin_instance = instance,
                        .max_heads = w->cfg.rewarm_max_heads, .max_tokens = w->cfg.rewarm_max_tokens, .stop = &w->stop,
                        .keep_going = instance_still_up, .keep_going_ctx = &target};
    WarmTotals t = warm_heads_send(&job, &heads);
    metrics_count_rewarm(w->cfg.metrics, instance, t.warmed, t.prompt_tokens);
    LOG_INFO("warm-start", "%s done in %.1f s: %d heads warmed (%lld prompt tokens, %lld of them already cached), %d refused, %d left out",
             label, braid_now_seconds() - t0, t.warmed, t.prompt_tokens, t.cached_tokens, t.refused, t.left);
    manifest_heads_free(&heads);
    manifest_heads_free(&from_file);
}

/* The next instance due a re-warm, or -1 once the thread is to stop. */
static int next_rewarm(WarmStart *w) {
    pthread_mutex_lock(&w->mu);
    int due = -1;
    while (due < 0 && !atomic_load(&w->stop)) {
        for (int i = 0; i < w->n_instances && due < 0; i++)
            if (w->rewarm_due[i]) due = i, w->rewarm_due[i] = false;
        if (due < 0) pthread_cond_wait(&w->wake, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return due;
}

void warm_start_instance_restarted(void *warm_start, int instance) {
    WarmStart *w = warm_start;
    if (instance < 0 || instance >= w->n_instances || w->cfg.rewarm_max_heads <= 0) return;
    pthread_mutex_lock(&w->mu);
    w->rewarm_due[instance] = true;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->mu);
}

/* ---- the thread ---- */

static void *warm_thread(void *arg) {
    WarmStart *w = arg;
    if (w->path) warm_at_start_up(w);
    for (int i; (i = next_rewarm(w)) >= 0;) rewarm_instance(w, i);
    return NULL;
}

static void warm_start_free(WarmStart *w) {
    free(w->path);
    free(w->pin_ttl);
    free(w->rewarm_due);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->wake);
    free(w);
}

WarmStart *warm_start_begin(const WarmStartConfig *cfg, BraidError *err) {
    WarmStart *w = calloc(1, sizeof *w);
    if (!w) return braid_error_set(err, "warm start: out of memory"), NULL;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->wake, NULL);
    w->n_instances = cfg->generate.coord->cfg.n_instances;
    if ((cfg->path && !(w->path = strdup(cfg->path))) || (cfg->pin_ttl && !(w->pin_ttl = strdup(cfg->pin_ttl))) ||
        !(w->rewarm_due = calloc((size_t)(w->n_instances > 0 ? w->n_instances : 1), sizeof *w->rewarm_due))) {
        warm_start_free(w);
        return braid_error_set(err, "warm start: out of memory"), NULL;
    }
    w->cfg = *cfg;
    w->cfg.generate.seed_counter = &w->seed_counter;
    w->cfg.generate.manifest = NULL; /* its own requests are not traffic */
    w->cfg.generate.metrics = NULL;
    if (pthread_create(&w->thread, NULL, warm_thread, w)) {
        warm_start_free(w);
        return braid_error_set(err, "warm start: cannot start its thread"), NULL;
    }
    coordinator_on_instance_restarted(cfg->generate.coord, warm_start_instance_restarted, w);
    return w;
}

void warm_start_end(WarmStart *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    atomic_store(&w->stop, true);
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    warm_start_free(w);
}
