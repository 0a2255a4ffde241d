/* braid-bench run: arguments, set-up and wiring; see run.h (the work is in run_driver.c). */
#include "run.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_args.h"
#include "bench_metrics.h"
#include "cli/cli_common.h"
#include "prompt_trace.h"
#include "run_driver.h"
#include "run_report.h"
#include "workload.h"

static const char run_usage[] =
    "usage: braid-bench run --workload NAME [options]\n"
    "  Drives the workload's workflows against a running server through /v1/completions (greedy) and\n"
    "  records every request; each call waits its tool delay first; ended workflows are announced with\n"
    "  POST /v1/workflows/{id}/end (optional: a server that answers 404/405 is warned about once and\n"
    "  sent no more; that is no error).\n"
    "  --workload NAME       one of: %s\n"
    "  --url URL             the server (default http://127.0.0.1:8000)\n"
    "  --workflows N         workflows to run (default 8)\n"
    "  --concurrency C       most workflows active at once; a stage's calls run concurrently (default 4)\n"
    "  --seed S              workload seed (default 1)\n"
    "  --context-tokens N    react-lora / mapreduce-lora: shared context size (default: the workload's)\n"
    "  --fanout N            mapreduce-lora: map agents per workflow (default: the workload's)\n"
    "  --scale X             multiplies prompt-part sizes; small values for quick tests (default 1)\n"
    "  --out DIR             where the results go (default runs/NAME-seedS)\n"
    "  --model PATH          GGUF file whose tokenizer the trace uses; must be the served model\n"
    "                        (default: $BRAID_MODEL or " BRAID_DEFAULT_MODEL ")\n"
    "  --block-size B        the server's KV block size, for the trace's block hashes (default 16)\n"
    "  --no-trace            write no trace.jsonl (and load no tokenizer)\n"
    "  --max-retries N       429 answers to wait out per call (default 100)\n"
    "  --max-tokens-cap N    ask no call for more than N tokens (quick tests; default: the workload's max_tokens)\n"
    "  --fixed-output        each call asks for exactly its realistic output length (the workload's expected\n"
    "                        tokens, within max_tokens) with ignore_eos: fixed lengths for timing, e.g. a\n"
    "                        server running a synthetic:NAME model, whose random weights end calls at random\n"
    "  --noise on|off        codegen / factcheck: off runs the same workflows without their noise (wrong\n"
    "                        difficulty labels, flaky tests, double-checks, give-ups; default on)\n"
    "  --slo-ttft-ms MS      goodput SLO: time to first token (from the request's own send)\n"
    "  --slo-itl-ms MS       goodput SLO: the request's time per output token (vLLM's \"tpot\" SLO)\n"
    "  --slo-e2el-ms MS      goodput SLO: end-to-end request latency\n"
    "  --result-json FILE    also write the requests in the JSON shape `vllm bench serve --save-result` writes\n"
    "Writes DIR/requests.jsonl (per request: workflow, agent, t_send_s, ttft_ms, latency_ms, prompt_tokens,\n"
    "cached_tokens, completion_tokens, status), DIR/workflows.jsonl (per workflow: latency), DIR/summary.json\n"
    "and DIR/trace.jsonl (docs/TRACE_FORMAT.md; arrival times from the start of the run, successful\n"
    "requests only) for `braid sim`. Progress and the summary table go to stderr.\n";

typedef struct {
    const char *workload, *url, *out_dir, *model;
    WorkloadParams params;
    long concurrency, block_size, max_retries, max_tokens_cap;
    bool trace, fixed_output;
    BenchSlo slo;
    const char *result_json;
    char default_dir[256];
} RunArgs;

static void print_usage(FILE *f) {
    char names[512] = "";
    const char *const *all = workload_names();
    for (int i = 0; all[i]; i++) {
        if (i) strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, all[i], sizeof names - strlen(names) - 1);
    }
    fprintf(f, run_usage, names);
}

static bool known_workload(const char *name) {
    const char *const *all = workload_names();
    for (int i = 0; all[i]; i++)
        if (strcmp(all[i], name) == 0) return true;
    return false;
}

/* ---- arguments ---- */

static int parse_numbers(int opt, const char *arg, RunArgs *a);

enum { O_WORKLOAD = 256, O_URL, O_WORKFLOWS, O_CONC, O_SEED, O_CONTEXT, O_FANOUT, O_SCALE, O_OUT, O_MODEL, O_BLOCK, O_NO_TRACE, O_RETRIES, O_CAP, O_NOISE, O_SLO_TTFT, O_SLO_ITL, O_SLO_E2EL,
       O_RESULT_JSON, O_FIXED_OUTPUT };

/* Returns 0 to run, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, RunArgs *a) {
    static const struct option opts[] = {
        {"workload", required_argument, 0, O_WORKLOAD}, {"url", required_argument, 0, O_URL},
        {"workflows", required_argument, 0, O_WORKFLOWS}, {"concurrency", required_argument, 0, O_CONC},
        {"seed", required_argument, 0, O_SEED}, {"context-tokens", required_argument, 0, O_CONTEXT},
        {"fanout", required_argument, 0, O_FANOUT}, {"scale", required_argument, 0, O_SCALE}, {"out", required_argument, 0, O_OUT},
        {"model", required_argument, 0, O_MODEL}, {"block-size", required_argument, 0, O_BLOCK},
        {"no-trace", no_argument, 0, O_NO_TRACE}, {"max-retries", required_argument, 0, O_RETRIES},
        {"max-tokens-cap", required_argument, 0, O_CAP}, {"noise", required_argument, 0, O_NOISE},
        {"slo-ttft-ms", required_argument, 0, O_SLO_TTFT}, {"slo-itl-ms", required_argument, 0, O_SLO_ITL},
        {"slo-e2el-ms", required_argument, 0, O_SLO_E2EL}, {"result-json", required_argument, 0, O_RESULT_JSON},
        {"fixed-output", no_argument, 0, O_FIXED_OUTPUT},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (RunArgs){.url = "http://127.0.0.1:8000", .params = {.n_workflows = 8, .seed = 1, .scale = 1.0}, .concurrency = 4,
                   .block_size = 16, .max_retries = 100, .trace = true};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_WORKLOAD: a->workload = optarg; break;
        case O_URL: a->url = optarg; break;
        case O_OUT: a->out_dir = optarg; break;
        case O_MODEL: a->model = optarg; break;
        case O_NO_TRACE: a->trace = false; break;
        case O_FIXED_OUTPUT: a->fixed_output = true; break;
        case O_RESULT_JSON: a->result_json = optarg; break;
        case 'h': print_usage(stdout); return 1;
        case '?': print_usage(stderr); return 2;
        default: if (parse_numbers(c, optarg, a)) return 2; break;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "braid-bench run: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->workload) {
        fprintf(stderr, "braid-bench run: --workload is required\n");
        print_usage(stderr);
        return 2;
    }
    if (!known_workload(a->workload)) {
        fprintf(stderr, "braid-bench run: unknown workload '%s'\n", a->workload);
        print_usage(stderr);
        return 2;
    }
    if (!a->out_dir) {
        snprintf(a->default_dir, sizeof a->default_dir, "runs/%s-seed%llu", a->workload, (unsigned long long)a->params.seed);
        a->out_dir = a->default_dir;
    }
    return 0;
}

/* The numeric options. Returns 0, or -1 after printing what is wrong. */
static int parse_numbers(int opt, const char *arg, RunArgs *a) {
    long v;
    double d;
    switch (opt) {
    case O_WORKFLOWS: if (bench_parse_int("run", "--workflows", arg, 1, 1000000, &v)) return -1; a->params.n_workflows = (int)v; return 0;
    case O_CONC: return bench_parse_int("run", "--concurrency", arg, 1, 4096, &a->concurrency);
    case O_SEED: if (bench_parse_int("run", "--seed", arg, 0, LONG_MAX, &v)) return -1; a->params.seed = (uint64_t)v; return 0;
    case O_CONTEXT: if (bench_parse_int("run", "--context-tokens", arg, 1, 1 << 24, &v)) return -1; a->params.context_tokens = (int)v; return 0;
    case O_FANOUT: if (bench_parse_int("run", "--fanout", arg, 1, WORKLOAD_MAX_FANOUT, &v)) return -1; a->params.fanout = (int)v; return 0;
    case O_SCALE: if (bench_parse_float("run", "--scale", arg, 1e-3, 1e3, &d)) return -1; a->params.scale = d; return 0;
    case O_BLOCK: return bench_parse_int("run", "--block-size", arg, 1, 1024, &a->block_size);
    case O_RETRIES: return bench_parse_int("run", "--max-retries", arg, 0, 1000000, &a->max_retries);
    case O_CAP: return bench_parse_int("run", "--max-tokens-cap", arg, 1, 1 << 24, &a->max_tokens_cap);
    case O_SLO_TTFT: return bench_slo_parse("run", "--slo-ttft-ms", arg, &a->slo);
    case O_SLO_ITL: return bench_slo_parse("run", "--slo-itl-ms", arg, &a->slo);
    case O_SLO_E2EL: return bench_slo_parse("run", "--slo-e2el-ms", arg, &a->slo);
    case O_NOISE: {
        int on;
        if (bench_parse_on_off("run", "--noise", arg, &on)) return -1;
        a->params.noise_free = !on;
        return 0;
    }
    }
    return -1;
}

/* ---- set-up ---- */

/* mkdir -p */
static int make_dirs(const char *path, BraidError *err) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return braid_error_set(err, "path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return braid_error_set(err, "cannot create directory %s: %s", buf, strerror(errno));
        *p = saved;
        if (saved == '\0') break;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return braid_error_set(err, "%s is not a directory", path);
    return 0;
}

static PromptTrace *open_trace(const RunArgs *a, BraidError *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/trace.jsonl", a->out_dir);
    return prompt_trace_open(cli_model_path(a->model), path, (int)a->block_size, err);
}

/* Whether the run went cleanly; says why not on stderr. */
static bool run_was_clean(const RunOutcome *o) {
    if (o->records.errors > 0) fprintf(stderr, "braid-bench run: %d of %d requests failed\n", o->records.errors, o->records.n_requests);
    if (o->workflow_end_errors > 0) fprintf(stderr, "braid-bench run: %d workflow ends were not accepted\n", o->workflow_end_errors);
    if (o->trace_errors > 0) fprintf(stderr, "braid-bench run: %d trace lines could not be written\n", o->trace_errors);
    return o->records.errors == 0 && o->workflow_end_errors == 0 && o->trace_errors == 0;
}

static int execute(const RunArgs *a, Workload *w, PromptTrace *trace) {
    RunDriverConfig cfg = {.url = a->url, .max_retries = (int)a->max_retries, .concurrency = (int)a->concurrency,
                           .max_tokens_cap = (int)a->max_tokens_cap, .fixed_output = a->fixed_output, .workload = w,
                           .trace = trace};
    RunOutcome outcome;
    BraidError err;
    int rc = run_driver_execute(&cfg, &outcome, &err);
    if (rc) fprintf(stderr, "braid-bench run: %s\n", err.msg);
    RunReportContext ctx = {.workload = a->workload, .url = a->url, .model = trace ? cli_model_path(a->model) : "",
                            .dir = a->out_dir, .params = a->params, .concurrency = (int)a->concurrency, .max_tokens_cap = (int)a->max_tokens_cap,
                            .block_size = (int)a->block_size, .slo = a->slo, .result_json = a->result_json};
    if (run_report_write(&ctx, &outcome, &err)) {
        fprintf(stderr, "braid-bench run: %s\n", err.msg);
        rc = -1;
    }
    run_report_print(&ctx, &outcome);
    if (!run_was_clean(&outcome)) rc = -1;
    run_records_free(&outcome.records);
    return rc ? 1 : 0;
}

int run_main(int argc, char **argv) {
    RunArgs a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    BraidError err;
    if (make_dirs(a.out_dir, &err)) {
        fprintf(stderr, "braid-bench run: %s\n", err.msg);
        return 1;
    }
    PromptTrace *trace = a.trace ? open_trace(&a, &err) : NULL;
    if (a.trace && !trace) {
        fprintf(stderr, "braid-bench run: %s (--model names the served GGUF; --no-trace skips the trace)\n", err.msg);
        return 1;
    }
    Workload *w = workload_create(a.workload, &a.params, &err);
    if (!w) {
        fprintf(stderr, "braid-bench run: workload %s: %s\n", a.workload, err.msg);
        prompt_trace_close(trace, &err);
        return 2;
    }
    rc = execute(&a, w, trace);
    workload_free(w);
    if (prompt_trace_close(trace, &err)) {
        fprintf(stderr, "braid-bench run: %s\n", err.msg);
        rc = 1;
    }
    return rc;
}
