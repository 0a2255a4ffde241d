/* The run's files and summary table; the contract is in run_report.h. */
#include "run_report.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stats.h"

typedef struct {
    char agent[32];
    int requests, errors, with_ttft;
    double ttft_sum_ms, latency_sum_ms;
} AgentSummary;

typedef struct {
    int workflows, requests, errors, retries;
    double wall_s, wf_mean_s, wf_p50_s, wf_p90_s;
    long long prompt, cached, completion;
    double hit_rate, tok_s, req_s, ttft_mean_ms;
    AgentSummary *agents;
    int n_agents;
} RunSummary;

/* ---- summarizing ---- */

/* The serving metrics over the run's requests (their timings borrowed, not copied). */
static BenchMetrics run_metrics(const RunReportContext *ctx, const RunOutcome *o, BenchSample **samples_out) {
    const RunRecords *rec = &o->records;
    BenchSample *samples = malloc(((size_t)rec->n_requests + 1) * sizeof *samples);
    int n = samples ? rec->n_requests : 0;
    for (int i = 0; i < n; i++) samples[i] = rec->requests[i].timing;
    BenchMetrics m = bench_metrics_compute(samples, n, o->wall_s, &ctx->slo);
    if (samples_out) *samples_out = samples;
    else free(samples);
    return m;
}

static json_t *dist_json(const BenchDist *d) {
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "mean", d->mean, "median", d->median, "std", d->std, "p50", d->p50, "p90",
                     d->p90, "p99", d->p99);
}

/* summary.json's "metrics": times in ms from each request's own send. */
static json_t *metrics_json(const BenchMetrics *m) {
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:f, s:f, s:f, s:i}", "ttft_ms", dist_json(&m->ttft), "tpot_ms", dist_json(&m->tpot),
                     "itl_ms", dist_json(&m->itl), "e2el_ms", dist_json(&m->e2el), "request_goodput",
                     m->has_goodput ? json_real(m->request_goodput) : json_null(), "request_throughput", m->request_throughput,
                     "output_throughput", m->output_throughput, "total_token_throughput", m->total_token_throughput,
                     "connection_retries", m->connection_retries);
}

static AgentSummary *agent_slot(RunSummary *s, const char *agent) {
    for (int i = 0; i < s->n_agents; i++)
        if (strcmp(s->agents[i].agent, agent) == 0) return &s->agents[i];
    AgentSummary *grown = realloc(s->agents, ((size_t)s->n_agents + 1) * sizeof *grown);
    if (!grown) return NULL;
    s->agents = grown;
    AgentSummary *a = &s->agents[s->n_agents++];
    *a = (AgentSummary){0};
    snprintf(a->agent, sizeof a->agent, "%s", agent);
    return a;
}

static void add_request(RunSummary *s, const RequestRecord *r, double *ttft, int *n_ttft) {
    s->requests++;
    s->retries += r->retries;
    AgentSummary *a = agent_slot(s, r->agent);
    if (a) a->requests++;
    if (r->error[0]) {
        s->errors++;
        if (a) a->errors++;
        return;
    }
    s->prompt += r->prompt_tokens;
    s->cached += r->cached_tokens;
    s->completion += r->completion_tokens;
    if (a) a->latency_sum_ms += r->latency_ms;
    if (!r->has_ttft) return;
    if (ttft) ttft[(*n_ttft)++] = r->ttft_ms;
    if (a) a->with_ttft++, a->ttft_sum_ms += r->ttft_ms;
}

static RunSummary summarize(const RunOutcome *o) {
    const RunRecords *rec = &o->records;
    RunSummary s = {.wall_s = o->wall_s > 1e-9 ? o->wall_s : 1e-9, .workflows = rec->n_workflows};
    double *ttft = malloc(((size_t)rec->n_requests + 1) * sizeof *ttft);
    double *wf = malloc(((size_t)rec->n_workflows + 1) * sizeof *wf);
    int n_ttft = 0;
    for (int i = 0; i < rec->n_requests; i++) add_request(&s, &rec->requests[i], ttft, &n_ttft);
    for (int i = 0; wf && i < rec->n_workflows; i++) wf[i] = rec->workflows[i].t_end_s - rec->workflows[i].t_start_s;
    int n_wf = wf ? rec->n_workflows : 0;
    s.wf_mean_s = stats_mean(wf, n_wf);
    s.wf_p50_s = stats_percentile(wf, n_wf, 50);
    s.wf_p90_s = stats_percentile(wf, n_wf, 90);
    s.ttft_mean_ms = ttft ? stats_mean(ttft, n_ttft) : 0;
    s.hit_rate = s.prompt > 0 ? (double)s.cached / (double)s.prompt : 0;
    s.tok_s = (double)s.completion / s.wall_s;
    s.req_s = (s.requests - s.errors) / s.wall_s;
    free(ttft);
    free(wf);
    return s;
}

/* ---- files ---- */

static int compare_send_time(const void *a, const void *b) {
    double x = ((const RequestRecord *)a)->t_send_s, y = ((const RequestRecord *)b)->t_send_s;
    return (x > y) - (x < y);
}

/* Writes one compact JSON line and takes the object. Returns 0 or -1. */
static int put_line(FILE *f, json_t *o) {
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    int rc = line && fprintf(f, "%s\n", line) > 0 ? 0 : -1;
    free(line);
    json_decref(o);
    return rc;
}

static json_t *request_json(const RequestRecord *r) {
    json_t *o = json_pack("{s:s, s:s, s:f, s:o, s:f, s:i, s:i, s:i, s:i, s:i}", "workflow", r->workflow, "agent", r->agent,
                          "t_send_s", r->t_send_s, "ttft_ms", r->has_ttft ? json_real(r->ttft_ms) : json_null(), "latency_ms",
                          r->latency_ms, "prompt_tokens", r->prompt_tokens, "cached_tokens", r->cached_tokens,
                          "completion_tokens", r->completion_tokens, "status", r->status, "retries", r->retries);
    if (o && r->error[0]) json_object_set_new(o, "error", json_string(r->error));
    if (o && !r->error[0]) {
        double itl = 0;
        for (int k = 0; k < r->timing.n_itls; k++) itl += r->timing.itls_s[k];
        json_object_set_new(o, "itl_ms", r->timing.n_itls ? json_real(1e3 * itl / r->timing.n_itls) : json_null());
        json_object_set_new(o, "tpot_ms", json_real(1e3 * r->timing.tpot_s));
    }
    if (o) json_object_set_new(o, "connection_retries", json_integer(r->connection_retries));
    return o;
}

static json_t *workflow_json(const WorkflowRecord *w) {
    return json_pack("{s:s, s:f, s:f, s:f, s:i, s:i}", "workflow", w->workflow, "t_start_s", w->t_start_s, "t_end_s", w->t_end_s,
                     "latency_s", w->t_end_s - w->t_start_s, "requests", w->requests, "errors", w->errors);
}

static FILE *open_in_dir(const char *dir, const char *name, char *path, size_t cap, BraidError *err) {
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) braid_error_set(err, "cannot write %s", path);
    return f;
}

static int close_checked(FILE *f, int rc, const char *path, BraidError *err) {
    if (fclose(f) != 0 || rc) return braid_error_set(err, "error writing %s", path);
    return 0;
}

static int write_requests(const char *dir, const RunRecords *rec, BraidError *err) {
    char path[4096];
    FILE *f = open_in_dir(dir, "requests.jsonl", path, sizeof path, err);
    if (!f) return -1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < rec->n_requests; i++) rc = put_line(f, request_json(&rec->requests[i]));
    return close_checked(f, rc, path, err);
}

static int write_workflows(const char *dir, const RunRecords *rec, BraidError *err) {
    char path[4096];
    FILE *f = open_in_dir(dir, "workflows.jsonl", path, sizeof path, err);
    if (!f) return -1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < rec->n_workflows; i++) rc = put_line(f, workflow_json(&rec->workflows[i]));
    return close_checked(f, rc, path, err);
}

static json_t *agents_json(const RunSummary *s) {
    json_t *agents = json_object();
    for (int i = 0; agents && i < s->n_agents; i++) {
        const AgentSummary *a = &s->agents[i];
        int ok = a->requests - a->errors;
        json_object_set_new(agents, a->agent[0] ? a->agent : "(none)",
                            json_pack("{s:i, s:i, s:f, s:f}", "requests", a->requests, "errors", a->errors, "mean_ttft_ms",
                                      a->with_ttft ? a->ttft_sum_ms / a->with_ttft : 0.0, "mean_latency_ms",
                                      ok > 0 ? a->latency_sum_ms / ok : 0.0));
    }
    return agents;
}

static json_t *params_json(const RunReportContext *ctx) {
    /* context_tokens and fanout 0 mean the workload's defaults; max_tokens_cap 0 means none. */
    return json_pack("{s:i, s:I, s:i, s:i, s:f, s:s, s:i, s:i, s:i}", "workflows", ctx->params.n_workflows, "seed",
                     (json_int_t)ctx->params.seed, "context_tokens", ctx->params.context_tokens, "fanout", ctx->params.fanout,
                     "scale", ctx->params.scale, "noise", ctx->params.noise_free ? "off" : "on", "concurrency", ctx->concurrency,
                     "block_size", ctx->block_size, "max_tokens_cap", ctx->max_tokens_cap);
}

static json_t *summary_json(const RunReportContext *ctx, const RunOutcome *o, const RunSummary *s) {
    json_t *j = json_pack("{s:s, s:s, s:s, s:o, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "workload", ctx->workload, "url",
                          ctx->url, "model", ctx->model, "params", params_json(ctx), "workflows", s->workflows, "requests",
                          s->requests, "errors", s->errors, "retries", s->retries, "wall_s", s->wall_s,
                          "mean_workflow_latency_s", s->wf_mean_s, "p50_workflow_latency_s", s->wf_p50_s,
                          "p90_workflow_latency_s", s->wf_p90_s, "mean_ttft_ms", s->ttft_mean_ms);
    json_t *more = json_pack("{s:I, s:I, s:I, s:f, s:f, s:f, s:i, s:i, s:i, s:o}", "prompt_tokens", (json_int_t)s->prompt,
                             "cached_tokens", (json_int_t)s->cached, "completion_tokens", (json_int_t)s->completion, "hit_rate",
                             s->hit_rate, "generated_tok_s", s->tok_s, "req_s", s->req_s, "workflow_end_errors",
                             o->workflow_end_errors, "trace_errors", o->trace_errors, "token_mismatches", o->token_mismatches,
                             "agents", agents_json(s));
    BenchMetrics m = run_metrics(ctx, o, NULL);
    if (more) json_object_set_new(more, "metrics", metrics_json(&m));
    if (more) json_object_set_new(more, "workflow_ends_supported", json_boolean(!o->workflow_end_unsupported));
    if (!j || !more || json_object_update(j, more)) {
        json_decref(j);
        j = NULL;
    }
    json_decref(more);
    return j;
}

static int write_summary(const RunReportContext *ctx, const RunOutcome *o, const RunSummary *s, BraidError *err) {
    char path[4096];
    FILE *f = open_in_dir(ctx->dir, "summary.json", path, sizeof path, err);
    if (!f) return -1;
    json_t *j = summary_json(ctx, o, s);
    int rc = j && json_dumpf(j, f, JSON_INDENT(2)) == 0 && fputc('\n', f) != EOF ? 0 : -1;
    json_decref(j);
    return close_checked(f, rc, path, err);
}

int run_report_write(const RunReportContext *ctx, RunOutcome *outcome, BraidError *err) {
    RunRecords *rec = &outcome->records;
    if (rec->n_requests > 1) qsort(rec->requests, (size_t)rec->n_requests, sizeof *rec->requests, compare_send_time);
    RunSummary s = summarize(outcome);
    int rc = write_requests(ctx->dir, rec, err);
    if (rc == 0) rc = write_workflows(ctx->dir, rec, err);
    if (rc == 0) rc = write_summary(ctx, outcome, &s, err);
    free(s.agents);
    if (rc == 0 && ctx->result_json) {
        BenchSample *samples = NULL;
        BenchMetrics m = run_metrics(ctx, outcome, &samples);
        BenchRunInfo info = {.backend = "braid-bench", .base_url = ctx->url, .model = ctx->model, .max_concurrency = ctx->concurrency,
                             .num_prompts = samples ? rec->n_requests : 0};
        rc = bench_metrics_write_vllm_json(ctx->result_json, &info, &m, samples, info.num_prompts, &ctx->slo, err);
        free(samples);
    }
    return rc;
}

/* ---- the table ---- */

static void print_agents(const RunSummary *s) {
    fprintf(stderr, "  %-20s %9s %7s %15s %17s\n", "agent", "requests", "errors", "mean TTFT ms", "mean latency ms");
    for (int i = 0; i < s->n_agents; i++) {
        const AgentSummary *a = &s->agents[i];
        int ok = a->requests - a->errors;
        fprintf(stderr, "  %-20s %9d %7d %15.1f %17.1f\n", a->agent[0] ? a->agent : "(none)", a->requests, a->errors,
                a->with_ttft ? a->ttft_sum_ms / a->with_ttft : 0.0, ok > 0 ? a->latency_sum_ms / ok : 0.0);
    }
}

static void print_problems(const RunOutcome *o) {
    if (o->workflow_end_errors || o->trace_errors || o->token_mismatches)
        fprintf(stderr, "  problems: %d workflow-end POSTs failed, %d trace lines unwritten, %d prompt-length mismatches (first: %s)\n",
                o->workflow_end_errors, o->trace_errors, o->token_mismatches, o->first_note);
    const RunRecords *rec = &o->records;
    for (int i = 0; i < rec->n_requests; i++)
        if (rec->requests[i].error[0]) {
            fprintf(stderr, "  first failed request (workflow %s, agent %s): %s\n", rec->requests[i].workflow, rec->requests[i].agent,
                    rec->requests[i].error);
            break;
        }
}

void run_report_print(const RunReportContext *ctx, const RunOutcome *outcome) {
    RunSummary s = summarize(outcome);
    fprintf(stderr, "[run] workload %s against %s, %d at a time: results in %s/\n", ctx->workload, ctx->url, ctx->concurrency,
            ctx->dir);
    fprintf(stderr, "  %-34s %d\n", "workflows", s.workflows);
    fprintf(stderr, "  %-34s %d (%d errors, %d 429 retries)\n", "requests", s.requests, s.errors, s.retries);
    fprintf(stderr, "  %-34s %.2f s (p50 %.2f s, p90 %.2f s)\n", "mean end-to-end workflow latency", s.wf_mean_s, s.wf_p50_s,
            s.wf_p90_s);
    fprintf(stderr, "  %-34s %.1f ms\n", "mean TTFT", s.ttft_mean_ms);
    fprintf(stderr, "  %-34s %.1f%% (%lld of %lld prompt tokens cached)\n", "token-level hit rate", 100 * s.hit_rate, s.cached,
            s.prompt);
    fprintf(stderr, "  %-34s %.1f generated tok/s, %.2f req/s\n", "throughput", s.tok_s, s.req_s);
    fprintf(stderr, "  %-34s %.2f s\n", "wall time", s.wall_s);
    BenchMetrics m = run_metrics(ctx, outcome, NULL);
    bench_metrics_print(stderr, "run", &m);
    if (outcome->workflow_end_unsupported) fprintf(stderr, "  %-34s not supported by the server (404/405); not sent\n", "workflow ends");
    print_agents(&s);
    print_problems(outcome);
    free(s.agents);
}
