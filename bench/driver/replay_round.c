/* One replay round against one server; the contract is in replay_round.h. */
#include "replay_round.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/timeutil.h"
#include "text_copy.h"

/* Shared by the client threads of one round. The clients report ready; the main thread then
 * sets t0 and lets them all go at once. */
typedef struct {
    const BatchInput *in;
    const ReplayTarget *target;
    HttpResult *results;     /* (in->n) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int next;                /* the queue: the next input index to send */
    int ready;               /* clients set up and waiting */
    bool go;
    double t0;
} Round;

static int take_next(Round *r) {
    pthread_mutex_lock(&r->mu);
    int i = r->next < r->in->n ? r->next++ : -1;
    pthread_mutex_unlock(&r->mu);
    return i;
}

static void wait_for_start(Round *r) {
    pthread_mutex_lock(&r->mu);
    r->ready++;
    pthread_cond_broadcast(&r->cv);
    while (!r->go) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* A request the client could not send at all (bad line, no client) still gets a result, with no
 * times (0), as braid batch reports a rejected line. */
static void fail_without_sending(HttpResult *res, const char *why) {
    *res = (HttpResult){.prompt_tokens = -1, .completion_tokens = -1, .cached_tokens = -1, .text = calloc(1, 1)};
    text_copy(res->error, sizeof res->error, why);
}

static void *client_thread(void *arg) {
    Round *r = arg;
    BraidError err;
    HttpClient *client = http_client_create(r->target->url, r->target->max_retries, &err);
    wait_for_start(r);
    for (int i; (i = take_next(r)) >= 0;) {
        const BatchInputEntry *e = &r->in->entries[i];
        if (e->error[0]) fail_without_sending(&r->results[i], e->error);
        else if (!client) fail_without_sending(&r->results[i], err.msg);
        else http_client_complete(client, e->path, e->body, &r->results[i]);
    }
    http_client_free(client);
    return NULL;
}

int replay_round_run(const BatchInput *in, const ReplayTarget *target, HttpResult *results, double *t0, BraidError *err) {
    Round r = {.in = in, .target = target, .results = results};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    int n_threads = target->concurrency, started = 0;
    pthread_t *threads = calloc((size_t)n_threads, sizeof *threads);
    for (; threads && started < n_threads; started++)
        if (pthread_create(&threads[started], NULL, client_thread, &r) != 0) break;
    pthread_mutex_lock(&r.mu);
    while (r.ready < started) pthread_cond_wait(&r.cv, &r.mu);
    r.t0 = braid_now_seconds();
    r.go = true;
    pthread_cond_broadcast(&r.cv);
    pthread_mutex_unlock(&r.mu);
    for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
    free(threads);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
    *t0 = r.t0;
    if (started < n_threads) return braid_error_set(err, "%s: could start only %d of %d client threads", target->url, started, n_threads);
    return 0;
}

double replay_round_duration(const HttpResult *results, int n, double t0) {
    double last = t0;
    for (int i = 0; i < n; i++)
        if (results[i].t_end > last && results[i].status != 0) last = results[i].t_end;
    return last - t0;
}

int replay_round_samples(const HttpResult *results, int n, BenchSample *samples) {
    int rc = 0;
    for (int i = 0; i < n; i++) rc |= bench_sample_from_result(&results[i], &samples[i]);
    return rc;
}
