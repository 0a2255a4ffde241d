/* braid-bench compare; the contract is in compare.h. */
#include "compare.h"

#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_input.h"
#include "bench_args.h"
#include "bench_metrics.h"
#include "compare_plot.h"
#include "replay_round.h"
#include "stats.h"

#define COMPARE_MAX_SERVERS 8

static const char compare_usage[] =
    "usage: braid-bench compare --input requests.jsonl [options] URL_A URL_B [URL...]\n"
    "  Runs the same `braid batch` input file against each OpenAI-compatible server, in interleaved\n"
    "  rounds (round r starts with server r mod S), and reports each metric's ratio to the first server\n"
    "  (URL_A): the median over the rounds with its spread [min, max]. Every time counts from the\n"
    "  request's own send.\n"
    "  --input PATH        requests, one JSON object a line (braid-bench replay's input; a workload's calls\n"
    "                      come from `braid-bench gen --workload NAME --batch-out FILE`)\n"
    "  --rounds N          rounds (default 3)\n"
    "  --concurrency C     client threads per run, each with its own connection (default 1)\n"
    "  --max-retries N     429 answers to wait out per request (default 100)\n"
    "  --slo-ttft-ms MS    goodput SLO: time to first token\n"
    "  --slo-itl-ms MS     goodput SLO: the request's time per output token (vLLM's \"tpot\")\n"
    "  --slo-e2el-ms MS    goodput SLO: end-to-end latency\n"
    "  --names A,B,...     labels of the servers in the table and plot (default A, B, ...)\n"
    "  --plot FILE.png     chart of the ratios with their spread (needs gnuplot)\n"
    "  --result-json FILE  every run in `vllm bench serve`'s JSON shape, and the ratios\n"
    "Table on stdout; progress on stderr. Exits 1 when any request failed.\n";

/* The compared figures. */
enum { M_REQ_S, M_OUT_TOK_S, M_TTFT_MEAN, M_TTFT_P99, M_TPOT_MEAN, M_ITL_MEAN, M_E2EL_MEAN, M_E2EL_P99, M_GOODPUT, M_CACHED, M_COUNT };
static const char *const metric_names[M_COUNT] = {
    "request_throughput", "output_throughput", "mean_ttft_ms",    "p99_ttft_ms",     "mean_tpot_ms",
    "mean_itl_ms",        "mean_e2el_ms",      "p99_e2el_ms",     "request_goodput", "total_cached_tokens"};
static const char *const metric_units[M_COUNT] = {"req/s", "tok/s", "ms", "ms", "ms", "ms", "ms", "ms", "req/s", "tokens"};

static double metric_value(const BenchMetrics *m, int k) {
    switch (k) {
    case M_REQ_S: return m->request_throughput;
    case M_OUT_TOK_S: return m->output_throughput;
    case M_TTFT_MEAN: return m->ttft.mean;
    case M_TTFT_P99: return m->ttft.p99;
    case M_TPOT_MEAN: return m->tpot.mean;
    case M_ITL_MEAN: return m->itl.mean;
    case M_E2EL_MEAN: return m->e2el.mean;
    case M_E2EL_P99: return m->e2el.p99;
    case M_GOODPUT: return m->request_goodput;
    case M_CACHED: return (double)m->total_cached;
    }
    return 0;
}

typedef struct {
    const char *input, *plot, *result_json, *names;
    long rounds, concurrency, max_retries;
    BenchSlo slo;
    const char *urls[COMPARE_MAX_SERVERS];
    char labels[COMPARE_MAX_SERVERS][64];
    int n_servers;
} CompareArgs;

/* ---- arguments ---- */

static int set_labels(CompareArgs *a) {
    for (int i = 0; i < a->n_servers; i++) snprintf(a->labels[i], sizeof a->labels[i], "%c", 'A' + i);
    if (!a->names) return 0;
    char copy[COMPARE_MAX_SERVERS * 64];
    snprintf(copy, sizeof copy, "%s", a->names);
    int i = 0;
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save), i++)
        if (i < a->n_servers) snprintf(a->labels[i], sizeof a->labels[i], "%s", t);
    if (i != a->n_servers) {
        fprintf(stderr, "braid-bench compare: --names has %d labels for %d servers\n", i, a->n_servers);
        return -1;
    }
    return 0;
}

/* Returns 0 to run, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, CompareArgs *a) {
    enum { O_INPUT = 256, O_ROUNDS, O_CONC, O_RETRIES, O_SLO_TTFT, O_SLO_ITL, O_SLO_E2EL, O_NAMES, O_PLOT, O_RESULT_JSON };
    static const struct option opts[] = {
        {"input", required_argument, 0, O_INPUT}, {"rounds", required_argument, 0, O_ROUNDS},
        {"concurrency", required_argument, 0, O_CONC}, {"max-retries", required_argument, 0, O_RETRIES},
        {"slo-ttft-ms", required_argument, 0, O_SLO_TTFT}, {"slo-itl-ms", required_argument, 0, O_SLO_ITL},
        {"slo-e2el-ms", required_argument, 0, O_SLO_E2EL}, {"names", required_argument, 0, O_NAMES},
        {"plot", required_argument, 0, O_PLOT}, {"result-json", required_argument, 0, O_RESULT_JSON},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (CompareArgs){.rounds = 3, .concurrency = 1, .max_retries = 100};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_INPUT: a->input = optarg; break;
        case O_ROUNDS: if (bench_parse_int("compare", "--rounds", optarg, 1, 1000, &a->rounds)) return 2; break;
        case O_CONC: if (bench_parse_int("compare", "--concurrency", optarg, 1, 4096, &a->concurrency)) return 2; break;
        case O_RETRIES: if (bench_parse_int("compare", "--max-retries", optarg, 0, 1000000, &a->max_retries)) return 2; break;
        case O_SLO_TTFT: if (bench_slo_parse("compare", "--slo-ttft-ms", optarg, &a->slo)) return 2; break;
        case O_SLO_ITL: if (bench_slo_parse("compare", "--slo-itl-ms", optarg, &a->slo)) return 2; break;
        case O_SLO_E2EL: if (bench_slo_parse("compare", "--slo-e2el-ms", optarg, &a->slo)) return 2; break;
        case O_NAMES: a->names = optarg; break;
        case O_PLOT: a->plot = optarg; break;
        case O_RESULT_JSON: a->result_json = optarg; break;
        case 'h': fputs(compare_usage, stdout); return 1;
        default: fputs(compare_usage, stderr); return 2;
        }
    }
    for (; optind < argc; optind++) {
        if (a->n_servers == COMPARE_MAX_SERVERS) {
            fprintf(stderr, "braid-bench compare: at most %d servers\n", COMPARE_MAX_SERVERS);
            return 2;
        }
        a->urls[a->n_servers++] = argv[optind];
    }
    if (!a->input || a->n_servers < 2) {
        fprintf(stderr, "braid-bench compare: --input and at least two server URLs are required\n%s", compare_usage);
        return 2;
    }
    return set_labels(a) ? 2 : 0;
}

/* ---- the runs ---- */

/* Everything measured: per server and round, the metrics and (for --result-json) the run's JSON. */
typedef struct {
    BenchMetrics *metrics;   /* (n_servers, rounds) */
    json_t *runs;            /* [server] -> [round] -> vLLM-shaped object; NULL without --result-json */
    int failed;              /* failed requests over every run */
} CompareData;

static BenchMetrics *metrics_at(const CompareData *d, const CompareArgs *a, int server, int round) {
    return &d->metrics[(size_t)server * (size_t)a->rounds + (size_t)round];
}

/* One run of the file against one server; fills its metrics and, when asked, its JSON. */
static int run_one(const BatchInput *in, const CompareArgs *a, int server, int round, CompareData *d, BraidError *err) {
    HttpResult *results = calloc((size_t)in->n + 1, sizeof *results);
    BenchSample *samples = calloc((size_t)in->n + 1, sizeof *samples);
    if (!results || !samples) {
        free(results), free(samples);
        return braid_error_set(err, "out of memory for %d results", in->n);
    }
    ReplayTarget target = {.url = a->urls[server], .concurrency = (int)a->concurrency, .max_retries = (int)a->max_retries};
    double t0 = 0;
    int rc = replay_round_run(in, &target, results, &t0, err);
    if (replay_round_samples(results, in->n, samples)) fprintf(stderr, "[compare] out of memory: some ITL samples are missing\n");
    BenchMetrics *m = metrics_at(d, a, server, round);
    *m = bench_metrics_compute(samples, in->n, replay_round_duration(results, in->n, t0), &a->slo);
    d->failed += m->failed;
    char tag[96];
    snprintf(tag, sizeof tag, "compare round %d/%ld, %s", round + 1, a->rounds, a->labels[server]);
    fprintf(stderr, "[%s] %s: %d completed, %d failed, %.2f req/s, %.1f output tok/s, TTFT mean %.1f ms\n", tag, a->urls[server],
            m->completed, m->failed, m->request_throughput, m->output_throughput, m->ttft.mean);
    for (int i = 0; i < in->n; i++)
        if (samples[i].error[0]) {
            fprintf(stderr, "[%s] first failed request (%s): %s\n", tag, in->entries[i].id, samples[i].error);
            break;
        }
    if (rc == 0 && d->runs) {
        BenchRunInfo info = {.backend = "braid-bench", .base_url = a->urls[server], .max_concurrency = (int)a->concurrency,
                             .num_prompts = in->n};
        json_t *o = bench_metrics_vllm_json(&info, m, samples, in->n, &a->slo);
        if (!o || json_array_append_new(json_array_get(d->runs, (size_t)server), o))
            rc = braid_error_set(err, "out of memory building the result JSON");
    }
    for (int i = 0; i < in->n; i++) http_result_free(&results[i]), bench_sample_free(&samples[i]);
    free(results), free(samples);
    return rc;
}

static int run_all(const BatchInput *in, const CompareArgs *a, CompareData *d, BraidError *err) {
    for (int r = 0; r < a->rounds; r++)
        for (int j = 0; j < a->n_servers; j++)
            if (run_one(in, a, (r + j) % a->n_servers, r, d, err)) return -1;
    return 0;
}

/* ---- ratios ---- */

/* Per server and metric: median, min and max over the rounds of server / first server. */
static void compute_ratios(const CompareArgs *a, const CompareData *d, CompareRatio *out) {
    int k = (int)a->rounds;
    double *v = malloc((size_t)k * sizeof *v);
    for (int s = 0; s < a->n_servers; s++)
        for (int m = 0; m < M_COUNT; m++) {
            int n = 0;
            for (int r = 0; v && r < k; r++) {
                double base = metric_value(metrics_at(d, a, 0, r), m);
                if (base > 0) v[n++] = metric_value(metrics_at(d, a, s, r), m) / base;
            }
            CompareRatio *o = &out[s * M_COUNT + m];
            *o = (CompareRatio){NAN, NAN, NAN};
            if (n == 0) continue;
            o->median = stats_percentile(v, n, 50);
            o->min = stats_percentile(v, n, 0);
            o->max = stats_percentile(v, n, 100);
        }
    free(v);
}

static double median_value(const CompareArgs *a, const CompareData *d, int server, int metric) {
    double v[1000];
    int k = (int)a->rounds;
    for (int r = 0; r < k; r++) v[r] = metric_value(metrics_at(d, a, server, r), metric);
    return stats_percentile(v, k, 50);
}

static const char cached_note[] =
    "cached tokens: the granularity differs by server. Braid counts whole KV blocks (16 tokens by default: a\n"
    "repeated 5-token prompt shows 0 cached), others may count single tokens (llama-server would show 4); compare\n"
    "cache figures as a rough signal, not ratio for ratio.\n";

static void print_table(const CompareArgs *a, const CompareData *d, const CompareRatio *ratios) {
    printf("braid-bench compare: %s, %ld rounds (interleaved), %ld clients; ratio = server / %s, per round\n", a->input, a->rounds,
           a->concurrency, a->labels[0]);
    for (int s = 0; s < a->n_servers; s++) printf("  %-8s %s\n", a->labels[s], a->urls[s]);
    printf("%-22s %-8s %-8s %14s %8s  %s\n", "metric", "unit", "server", "median", "ratio", "[min, max] over rounds");
    for (int m = 0; m < M_COUNT; m++) {
        if (m == M_GOODPUT && !metrics_at(d, a, 0, 0)->has_goodput) continue;
        for (int s = 0; s < a->n_servers; s++) {
            const CompareRatio *r = &ratios[s * M_COUNT + m];
            printf("%-22s %-8s %-8s %14.2f", s == 0 ? metric_names[m] : "", s == 0 ? metric_units[m] : "", a->labels[s],
                   median_value(a, d, s, m));
            if (isnan(r->median)) printf(" %8s\n", "-");
            else if (s == 0) printf(" %8.2f\n", r->median);
            else printf(" %8.2f  [%.2f, %.2f]\n", r->median, r->min, r->max);
        }
    }
    int failed[COMPARE_MAX_SERVERS] = {0};
    for (int s = 0; s < a->n_servers; s++)
        for (int r = 0; r < a->rounds; r++) failed[s] += metrics_at(d, a, s, r)->failed;
    printf("%-22s %-8s", "failed requests", "");
    for (int s = 0; s < a->n_servers; s++) printf(" %s %d", a->labels[s], failed[s]);
    printf("\n%s", cached_note);
}

/* ---- outputs ---- */

static int write_json(const CompareArgs *a, CompareData *d, const CompareRatio *ratios, BraidError *err) {
    json_t *servers = json_array(), *rat = json_object();
    for (int s = 0; servers && s < a->n_servers; s++)
        json_array_append_new(servers, json_pack("{s:s, s:s, s:O}", "label", a->labels[s], "url", a->urls[s], "rounds",
                                                 json_array_get(d->runs, (size_t)s)));
    for (int m = 0; rat && m < M_COUNT; m++) {
        json_t *per = json_array();
        for (int s = 0; per && s < a->n_servers; s++) {
            const CompareRatio *r = &ratios[s * M_COUNT + m];
            json_array_append_new(per, isnan(r->median) ? json_pack("{s:s, s:n}", "label", a->labels[s], "median")
                                                        : json_pack("{s:s, s:f, s:f, s:f}", "label", a->labels[s], "median",
                                                                    r->median, "min", r->min, "max", r->max));
        }
        json_object_set_new(rat, metric_names[m], per);
    }
    json_t *o = json_pack("{s:s, s:I, s:I, s:o, s:o, s:s}", "input", a->input, "rounds", (json_int_t)a->rounds, "concurrency",
                          (json_int_t)a->concurrency, "servers", servers, "ratios", rat, "cached_tokens_note", cached_note);
    if (!o) return braid_error_set(err, "out of memory building %s", a->result_json);
    int rc = json_dump_file(o, a->result_json, JSON_INDENT(2));
    json_decref(o);
    return rc ? braid_error_set(err, "cannot write %s", a->result_json) : 0;
}

static int write_plot(const CompareArgs *a, const CompareRatio *ratios, BraidError *err) {
    const char *servers[COMPARE_MAX_SERVERS];
    for (int s = 0; s < a->n_servers; s++) servers[s] = a->labels[s];
    char title[256];
    snprintf(title, sizeof title, "braid-bench compare: %s, %ld rounds", a->input, a->rounds);
    return compare_plot_write(a->plot, title, servers, a->n_servers, metric_names, M_COUNT, ratios, err);
}

static int compare_run(const BatchInput *in, const CompareArgs *a) {
    CompareData d = {.metrics = calloc((size_t)a->n_servers * (size_t)a->rounds, sizeof *d.metrics)};
    CompareRatio ratios[COMPARE_MAX_SERVERS * M_COUNT];
    BraidError err;
    int rc = d.metrics ? 0 : braid_error_set(&err, "out of memory");
    if (rc == 0 && a->result_json) {
        d.runs = json_array();
        for (int s = 0; d.runs && s < a->n_servers; s++) json_array_append_new(d.runs, json_array());
        if (!d.runs) rc = braid_error_set(&err, "out of memory");
    }
    if (rc == 0) rc = run_all(in, a, &d, &err);
    if (rc == 0) {
        compute_ratios(a, &d, ratios);
        print_table(a, &d, ratios);
        fflush(stdout);
        if (a->result_json) rc = write_json(a, &d, ratios, &err);
        if (rc == 0 && a->plot) rc = write_plot(a, ratios, &err);
    }
    if (rc) fprintf(stderr, "braid-bench compare: %s\n", err.msg);
    else if (d.failed) fprintf(stderr, "braid-bench compare: %d requests failed over all runs\n", d.failed);
    json_decref(d.runs);
    free(d.metrics);
    return rc || d.failed ? 1 : 0;
}

int compare_main(int argc, char **argv) {
    CompareArgs a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    BatchInput in;
    BraidError err;
    if (batch_input_read(a.input, &in, &err)) {
        fprintf(stderr, "braid-bench compare: %s\n", err.msg);
        return 1;
    }
    rc = compare_run(&in, &a);
    batch_input_free(&in);
    return rc;
}
