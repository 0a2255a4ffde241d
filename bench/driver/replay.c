/* braid-bench replay; the contract is in replay.h. */
#include "replay.h"

#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_input.h"
#include "bench_args.h"
#include "common/timeutil.h"
#include "http_client.h"
#include "stats.h"
#include "text_copy.h"

static const char replay_usage[] =
    "usage: braid-bench replay --input requests.jsonl --out results.jsonl [options]\n"
    "  Sends a `braid batch` input file to a running server and writes `braid batch`'s output format.\n"
    "  --input PATH        requests, one JSON object a line: {\"id\", \"prompt\" | \"messages\", \"max_tokens\",\n"
    "                      \"temperature\", \"top_p\", \"top_k\", \"seed\", \"ignore_eos\", \"tenant\", \"adapter\",\n"
    "                      \"workflow_id\", \"agent\", \"segment_reuse\"}; braid batch's defaults apply (max_tokens 128,\n"
    "                      greedy, seed 0)\n"
    "  --out PATH          results in input order: {\"id\", \"text\", \"prompt_tokens\", \"completion_tokens\",\n"
    "                      \"cached_tokens\", \"segment_reused_tokens\", \"ttft_ms\", \"latency_ms\", \"sent_ms\",\n"
    "                      \"finish_reason\", \"status\", \"retries\"}\n"
    "                      (+ \"error\" for a failed request); ttft_ms and latency_ms count from the common start\n"
    "  --url URL           the server (default http://127.0.0.1:8000)\n"
    "  --concurrency C     client threads, each with its own connection (default 1)\n"
    "  --repeat K          replay the whole file K times in a row, each from its own start; prints a summary\n"
    "                      per round and the medians; --out holds the last round (default 1)\n"
    "  --max-retries N     429 answers to wait out per request, after Retry-After (default 100)\n"
    "Summary on stderr: generated tok/s and req/s over the time from the start to the last response,\n"
    "cache hit rate, and TTFT mean, p50 and p90.\n";

typedef struct {
    const char *input, *out, *url;
    long concurrency, repeat, max_retries;
} ReplayArgs;

/* ---- arguments ---- */

/* Returns 0 to run, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, ReplayArgs *a) {
    enum { O_INPUT = 256, O_OUT, O_URL, O_CONC, O_REPEAT, O_RETRIES };
    static const struct option opts[] = {
        {"input", required_argument, 0, O_INPUT}, {"out", required_argument, 0, O_OUT}, {"url", required_argument, 0, O_URL},
        {"concurrency", required_argument, 0, O_CONC}, {"repeat", required_argument, 0, O_REPEAT},
        {"max-retries", required_argument, 0, O_RETRIES}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (ReplayArgs){.url = "http://127.0.0.1:8000", .concurrency = 1, .repeat = 1, .max_retries = 100};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_INPUT: a->input = optarg; break;
        case O_OUT: a->out = optarg; break;
        case O_URL: a->url = optarg; break;
        case O_CONC: if (bench_parse_int("replay", "--concurrency", optarg, 1, 4096, &a->concurrency)) return 2; break;
        case O_REPEAT: if (bench_parse_int("replay", "--repeat", optarg, 1, 1000, &a->repeat)) return 2; break;
        case O_RETRIES: if (bench_parse_int("replay", "--max-retries", optarg, 0, 1000000, &a->max_retries)) return 2; break;
        case 'h': fputs(replay_usage, stdout); return 1;
        default: fputs(replay_usage, stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "braid-bench replay: unexpected argument '%s'\n%s", argv[optind], replay_usage);
        return 2;
    }
    if (!a->input || !a->out) {
        fprintf(stderr, "braid-bench replay: --input and --out are required\n%s", replay_usage);
        return 2;
    }
    return 0;
}

/* ---- one round ---- */

/* Shared by the client threads of one round. The clients report ready; the main thread then
 * sets t0 and lets them all go at once. */
typedef struct {
    const BatchInput *in;
    const ReplayArgs *args;
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
    HttpClient *client = http_client_create(r->args->url, (int)r->args->max_retries, &err);
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

/* Runs every request once with the given number of clients; results[i] for entry i. */
static int run_round(const BatchInput *in, const ReplayArgs *a, HttpResult *results, double *t0, BraidError *err) {
    Round r = {.in = in, .args = a, .results = results};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    int n_threads = (int)a->concurrency, started = 0;
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
    if (started < n_threads)
        return braid_error_set(err, "could start only %d of %d client threads", started, n_threads);
    return 0;
}

/* ---- results and summary ---- */

static double ms_since(double t, double t0) { return t > 0 ? (t - t0) * 1e3 : 0; }

static int write_result(FILE *f, const char *id, const HttpResult *res, double t0) {
    bool ok = res->error[0] == '\0';
    json_t *o = json_pack("{s:s, s:s%, s:i, s:i, s:i, s:f, s:f, s:s, s:i, s:i}", "id", id, "text", res->text ? res->text : "",
                          res->text ? res->text_len : (size_t)0, "prompt_tokens", res->prompt_tokens > 0 ? res->prompt_tokens : 0,
                          "completion_tokens", res->completion_tokens > 0 ? res->completion_tokens : 0, "cached_tokens",
                          res->cached_tokens > 0 ? res->cached_tokens : 0, "ttft_ms", ms_since(res->t_first_text, t0), "latency_ms",
                          ms_since(res->t_end, t0), "finish_reason", ok && res->finish_reason[0] ? res->finish_reason : "error",
                          "status", res->status, "retries", res->retries);
    if (o && !ok) json_object_set_new(o, "error", json_string(res->error));
    /* When it was sent (ttft_ms - sent_ms is the request's own TTFT), and Braid's reuse count. */
    if (o) json_object_set_new(o, "sent_ms", json_real(ms_since(res->t_send, t0)));
    if (o) json_object_set_new(o, "segment_reused_tokens", json_integer(res->segment_reused_tokens));
    char *line = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    int rc = line && fprintf(f, "%s\n", line) > 0 ? 0 : -1;
    free(line);
    json_decref(o);
    return rc;
}

static int write_results(const char *path, const BatchInput *in, const HttpResult *results, double t0, BraidError *err) {
    FILE *f = fopen(path, "w");
    if (!f) return braid_error_set(err, "cannot write %s", path);
    int rc = 0;
    for (int i = 0; rc == 0 && i < in->n; i++) rc = write_result(f, in->entries[i].id, &results[i], t0);
    if (fclose(f) != 0 || rc) return braid_error_set(err, "error writing %s", path);
    return 0;
}

typedef struct {
    int completed, failed, retries;
    long long generated, prompt, cached;
    double wall_s, tok_s, req_s, ttft_mean_ms, ttft_p50_ms, ttft_p90_ms;
} RoundSummary;

static RoundSummary summarize(const HttpResult *results, int n, double t0) {
    RoundSummary s = {0};
    double *ttft = malloc(((size_t)n + 1) * sizeof *ttft), last = t0;
    int n_ttft = 0;
    for (int i = 0; i < n; i++) {
        const HttpResult *r = &results[i];
        s.retries += r->retries;
        if (r->t_end > last && r->status != 0) last = r->t_end;
        if (r->error[0]) {
            s.failed++;
            continue;
        }
        s.completed++;
        s.generated += r->completion_tokens > 0 ? r->completion_tokens : 0;
        s.prompt += r->prompt_tokens > 0 ? r->prompt_tokens : 0;
        s.cached += r->cached_tokens > 0 ? r->cached_tokens : 0;
        if (ttft && r->t_first_text > 0) ttft[n_ttft++] = ms_since(r->t_first_text, t0);
    }
    s.wall_s = last - t0 > 1e-9 ? last - t0 : 1e-9;
    s.tok_s = (double)s.generated / s.wall_s;
    s.req_s = s.completed / s.wall_s;
    s.ttft_mean_ms = stats_mean(ttft, n_ttft);
    s.ttft_p50_ms = stats_percentile(ttft, n_ttft, 50);
    s.ttft_p90_ms = stats_percentile(ttft, n_ttft, 90);
    free(ttft);
    return s;
}

static void print_summary(const char *tag, int n, long concurrency, const RoundSummary *s) {
    fprintf(stderr,
            "[%s] %d requests (%d completed, %d failed) with %ld clients in %.2f s: %.1f generated tok/s, %.1f req/s\n"
            "[%s] prompt tokens %lld, cached %lld (hit rate %.1f%%), TTFT mean %.1f ms, p50 %.1f ms, p90 %.1f ms, "
            "429 retries %d\n",
            tag, n, s->completed, s->failed, concurrency, s->wall_s, s->tok_s, s->req_s, tag, s->prompt, s->cached,
            s->prompt ? 100.0 * (double)s->cached / (double)s->prompt : 0.0, s->ttft_mean_ms, s->ttft_p50_ms, s->ttft_p90_ms,
            s->retries);
}

static void print_medians(const RoundSummary *rounds, int k) {
    double *v = malloc(3 * (size_t)k * sizeof *v);
    if (!v) return;
    double *tok_s = v, *ttft = v + k, *wall = v + 2 * k;
    for (int i = 0; i < k; i++) tok_s[i] = rounds[i].tok_s, ttft[i] = rounds[i].ttft_mean_ms, wall[i] = rounds[i].wall_s;
    fprintf(stderr, "[replay] median of %d rounds: %.2f s, %.1f generated tok/s, TTFT mean %.1f ms\n", k,
            stats_percentile(wall, k, 50), stats_percentile(tok_s, k, 50), stats_percentile(ttft, k, 50));
    free(v);
}

static void free_results(HttpResult *results, int n) {
    for (int i = 0; results && i < n; i++) http_result_free(&results[i]);
}

/* Runs the rounds and writes the last one's results. Returns the exit status. */
static int replay_rounds(const BatchInput *in, const ReplayArgs *a) {
    HttpResult *results = calloc((size_t)in->n + 1, sizeof *results);
    RoundSummary *rounds = calloc((size_t)a->repeat, sizeof *rounds);
    BraidError err;
    double t0 = 0;
    int rc = results && rounds ? 0 : braid_error_set(&err, "out of memory for %d results", in->n);
    for (int k = 0; rc == 0 && k < a->repeat; k++) {
        free_results(results, in->n);
        memset(results, 0, (size_t)in->n * sizeof *results);
        rc = run_round(in, a, results, &t0, &err);
        rounds[k] = summarize(results, in->n, t0);
        char tag[32] = "replay";
        if (a->repeat > 1) snprintf(tag, sizeof tag, "replay %d/%ld", k + 1, a->repeat);
        print_summary(tag, in->n, a->concurrency, &rounds[k]);
    }
    if (rc == 0 && a->repeat > 1) print_medians(rounds, (int)a->repeat);
    if (rc == 0) rc = write_results(a->out, in, results, t0, &err);
    if (rc) fprintf(stderr, "braid-bench replay: %s\n", err.msg);
    free_results(results, in->n);
    free(results);
    free(rounds);
    return rc ? 1 : 0;
}

int replay_main(int argc, char **argv) {
    ReplayArgs a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    /* The output is opened first, so an unwritable path fails before any request is sent. */
    FILE *probe = fopen(a.out, "w");
    if (!probe) {
        fprintf(stderr, "braid-bench replay: cannot write %s\n", a.out);
        return 1;
    }
    fclose(probe);
    BatchInput in;
    BraidError err;
    if (batch_input_read(a.input, &in, &err)) {
        fprintf(stderr, "braid-bench replay: %s\n", err.msg);
        return 1;
    }
    rc = replay_rounds(&in, &a);
    batch_input_free(&in);
    return rc;
}
