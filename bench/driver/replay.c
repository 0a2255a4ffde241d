/* braid-bench replay; the contract is in replay.h. */
#include "replay.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_input.h"
#include "bench_args.h"
#include "bench_metrics.h"
#include "replay_round.h"
#include "stats.h"

static const char replay_usage[] =
    "usage: braid-bench replay --input requests.jsonl --out results.jsonl [options]\n"
    "  Sends a `braid batch` input file to a running server and writes `braid batch`'s output format.\n"
    "  --input PATH        requests, one JSON object a line: {\"id\", \"prompt\" | \"messages\", \"max_tokens\",\n"
    "                      \"temperature\", \"top_p\", \"top_k\", \"seed\", \"ignore_eos\", \"tenant\", \"adapter\",\n"
    "                      \"workflow_id\", \"agent\", \"segment_reuse\"}; braid batch's defaults apply (max_tokens 128,\n"
    "                      greedy, seed 0)\n"
    "  --out PATH          results in input order: {\"id\", \"text\", \"prompt_tokens\", \"completion_tokens\",\n"
    "                      \"cached_tokens\", \"segment_reused_tokens\", \"ttft_ms\", \"latency_ms\", \"sent_ms\",\n"
    "                      \"finish_reason\", \"status\", \"retries\", \"connection_retries\"}\n"
    "                      (+ \"error\" for a failed request); ttft_ms and latency_ms count from the common start\n"
    "                      (braid batch's format; the summary and --result-json time each request from its send)\n"
    "  --url URL           the server (default http://127.0.0.1:8000)\n"
    "  --concurrency C     client threads, each with its own connection (default 1)\n"
    "  --repeat K          replay the whole file K times in a row, each from its own start; prints a summary\n"
    "                      per round and the medians; --out holds the last round (default 1)\n"
    "  --max-retries N     429 answers to wait out per request, after Retry-After (default 100)\n"
    "  --slo-ttft-ms MS    goodput SLO: time to first token (from the request's own send)\n"
    "  --slo-itl-ms MS     goodput SLO: the request's time per output token (vLLM's \"tpot\" SLO)\n"
    "  --slo-e2el-ms MS    goodput SLO: end-to-end latency\n"
    "  --result-json FILE  the last round in the JSON shape `vllm bench serve --save-result` writes\n"
    "Summary on stderr: requests/s, output and total tokens/s over the time from the start to the last\n"
    "response; TTFT, TPOT, ITL and end-to-end latency per request from its own send (mean, p50, p90,\n"
    "p99); goodput (requests/s meeting every SLO given); cache hit rate; 429 and connection retries.\n";

typedef struct {
    const char *input, *out, *url, *result_json;
    long concurrency, repeat, max_retries;
    BenchSlo slo;
} ReplayArgs;

/* ---- arguments ---- */

/* Returns 0 to run, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, ReplayArgs *a) {
    enum { O_INPUT = 256, O_OUT, O_URL, O_CONC, O_REPEAT, O_RETRIES, O_SLO_TTFT, O_SLO_ITL, O_SLO_E2EL, O_RESULT_JSON };
    static const struct option opts[] = {
        {"input", required_argument, 0, O_INPUT}, {"out", required_argument, 0, O_OUT}, {"url", required_argument, 0, O_URL},
        {"concurrency", required_argument, 0, O_CONC}, {"repeat", required_argument, 0, O_REPEAT},
        {"max-retries", required_argument, 0, O_RETRIES}, {"slo-ttft-ms", required_argument, 0, O_SLO_TTFT},
        {"slo-itl-ms", required_argument, 0, O_SLO_ITL}, {"slo-e2el-ms", required_argument, 0, O_SLO_E2EL},
        {"result-json", required_argument, 0, O_RESULT_JSON}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
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
        case O_SLO_TTFT: if (bench_slo_parse("replay", "--slo-ttft-ms", optarg, &a->slo)) return 2; break;
        case O_SLO_ITL: if (bench_slo_parse("replay", "--slo-itl-ms", optarg, &a->slo)) return 2; break;
        case O_SLO_E2EL: if (bench_slo_parse("replay", "--slo-e2el-ms", optarg, &a->slo)) return 2; break;
        case O_RESULT_JSON: a->result_json = optarg; break;
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
    if (o) json_object_set_new(o, "connection_retries", json_integer(res->connection_retries));
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
    BenchMetrics m;
    long long prompt, cached;
} RoundSummary;

static RoundSummary summarize(const BenchSample *samples, int n, double duration_s, const BenchSlo *slo) {
    RoundSummary s = {.m = bench_metrics_compute(samples, n, duration_s, slo)};
    s.prompt = s.m.total_input;
    s.cached = s.m.total_cached;
    return s;
}

static void print_summary(const char *tag, long concurrency, const RoundSummary *s) {
    fprintf(stderr, "[%s] %ld clients; prompt tokens %lld, cached %lld (hit rate %.1f%%)\n", tag, concurrency, s->prompt, s->cached,
            s->prompt ? 100.0 * (double)s->cached / (double)s->prompt : 0.0);
    bench_metrics_print(stderr, tag, &s->m);
}

static void print_medians(const RoundSummary *rounds, int k) {
    double *v = malloc(4 * (size_t)k * sizeof *v);
    if (!v) return;
    double *tok_s = v, *ttft = v + k, *wall = v + 2 * k, *itl = v + 3 * k;
    for (int i = 0; i < k; i++)
        tok_s[i] = rounds[i].m.output_throughput, ttft[i] = rounds[i].m.ttft.mean, wall[i] = rounds[i].m.duration_s,
        itl[i] = rounds[i].m.itl.mean;
    fprintf(stderr, "[replay] median of %d rounds: %.2f s, %.1f output tok/s, TTFT mean %.1f ms, ITL mean %.1f ms\n", k,
            stats_percentile(wall, k, 50), stats_percentile(tok_s, k, 50), stats_percentile(ttft, k, 50),
            stats_percentile(itl, k, 50));
    free(v);
}

static void free_results(HttpResult *results, int n) {
    for (int i = 0; results && i < n; i++) http_result_free(&results[i]);
}

static void free_samples(BenchSample *samples, int n) {
    for (int i = 0; samples && i < n; i++) bench_sample_free(&samples[i]);
}

/* Runs the rounds and writes the last one's results. Returns the exit status. */
static int replay_rounds(const BatchInput *in, const ReplayArgs *a) {
    HttpResult *results = calloc((size_t)in->n + 1, sizeof *results);
    BenchSample *samples = calloc((size_t)in->n + 1, sizeof *samples);
    RoundSummary *rounds = calloc((size_t)a->repeat, sizeof *rounds);
    BraidError err;
    double t0 = 0;
    ReplayTarget target = {.url = a->url, .concurrency = (int)a->concurrency, .max_retries = (int)a->max_retries};
    int rc = results && samples && rounds ? 0 : braid_error_set(&err, "out of memory for %d results", in->n);
    for (int k = 0; rc == 0 && k < a->repeat; k++) {
        free_results(results, in->n);
        free_samples(samples, in->n);
        memset(results, 0, (size_t)in->n * sizeof *results);
        rc = replay_round_run(in, &target, results, &t0, &err);
        if (replay_round_samples(results, in->n, samples)) fprintf(stderr, "[replay] out of memory: some ITL samples are missing\n");
        rounds[k] = summarize(samples, in->n, replay_round_duration(results, in->n, t0), &a->slo);
        char tag[32] = "replay";
        if (a->repeat > 1) snprintf(tag, sizeof tag, "replay %d/%ld", k + 1, a->repeat);
        print_summary(tag, a->concurrency, &rounds[k]);
    }
    if (rc == 0 && a->repeat > 1) print_medians(rounds, (int)a->repeat);
    if (rc == 0) rc = write_results(a->out, in, results, t0, &err);
    if (rc == 0 && a->result_json) {
        BenchRunInfo info = {.backend = "braid-bench", .base_url = a->url, .max_concurrency = (int)a->concurrency, .num_prompts = in->n};
        rc = bench_metrics_write_vllm_json(a->result_json, &info, &rounds[a->repeat - 1].m, samples, in->n, &a->slo, &err);
    }
    if (rc) fprintf(stderr, "braid-bench replay: %s\n", err.msg);
    free_results(results, in->n);
    free_samples(samples, in->n);
    free(results);
    free(samples);
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
