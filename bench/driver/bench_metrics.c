/* Serving metrics in vLLM's terms; the contract is in bench_metrics.h.
 *
 * Source of the definitions and field names: vLLM's vllm/benchmarks/serve.py (`vllm bench serve`,
 * formerly benchmarks/benchmark_serving.py): calculate_metrics (TPOT = (latency - ttft) /
 * (output_len - 1), ITLs flattened over requests, goodput = requests meeting all of the "ttft",
 * "tpot", "e2el" SLOs / duration) and the result dict saved with --save-result ("duration",
 * "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
 * "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens",
 * "ttfts", "itls", "generated_texts", "errors", and mean_/median_/std_/pNN_ + ttft|tpot|itl|e2el +
 * _ms). As there, the per-request lists are in seconds and the summary figures in milliseconds. */
#include "bench_metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_args.h"
#include "stats.h"
#include "text_copy.h"

/* ---- samples ---- */

int bench_sample_from_result(const HttpResult *r, BenchSample *s) {
    *s = (BenchSample){.ok = r->error[0] == '\0', .retries = r->retries, .connection_retries = r->connection_retries};
    text_copy(s->error, sizeof s->error, r->error);
    if (!s->ok) return 0;
    s->e2el_s = r->t_end - r->t_send;
    s->ttft_s = r->t_first_text > 0 ? r->t_first_text - r->t_send : 0;
    s->input_tokens = r->prompt_tokens > 0 ? r->prompt_tokens : 0;
    s->output_tokens = r->completion_tokens > 0 ? r->completion_tokens : 0;
    s->cached_tokens = r->cached_tokens > 0 ? r->cached_tokens : 0;
    if (s->output_tokens > 1) s->tpot_s = (s->e2el_s - s->ttft_s) / (s->output_tokens - 1);
    if (r->n_chunks < 2) return 0;
    s->itls_s = malloc((size_t)(r->n_chunks - 1) * sizeof *s->itls_s);
    if (!s->itls_s) return -1;
    for (int i = 1; i < r->n_chunks; i++) s->itls_s[i - 1] = r->chunk_times[i] - r->chunk_times[i - 1];
    s->n_itls = r->n_chunks - 1;
    return 0;
}

void bench_sample_free(BenchSample *s) {
    if (!s) return;
    free(s->itls_s);
    s->itls_s = NULL;
    s->n_itls = 0;
}

bool bench_sample_meets(const BenchSample *s, const BenchSlo *slo) {
    if (!s->ok) return false;
    if (!slo) return true;
    /* As vLLM: a request of one token has TPOT 0 for goodput. */
    return (slo->ttft_ms <= 0 || s->ttft_s * 1e3 <= slo->ttft_ms) && (slo->itl_ms <= 0 || s->tpot_s * 1e3 <= slo->itl_ms) &&
           (slo->e2el_ms <= 0 || s->e2el_s * 1e3 <= slo->e2el_ms);
}

/* ---- metrics ---- */

static BenchDist distribution_ms(const double *x_s, int n) {
    if (n <= 0) return (BenchDist){0};
    double *ms = calloc((size_t)n, sizeof *ms);
    if (!ms) return (BenchDist){0};
    for (int i = 0; i < n; i++) ms[i] = x_s[i] * 1e3;
    BenchDist d = {.mean = stats_mean(ms, n), .median = stats_percentile(ms, n, 50), .p50 = stats_percentile(ms, n, 50),
                   .p90 = stats_percentile(ms, n, 90), .p99 = stats_percentile(ms, n, 99)};
    double var = 0;
    for (int i = 0; i < n; i++) var += (ms[i] - d.mean) * (ms[i] - d.mean);
    d.std = sqrt(var / n); /* numpy's std: the population form */
    free(ms);
    return d;
}

static bool slo_set(const BenchSlo *slo) { return slo && (slo->ttft_ms > 0 || slo->itl_ms > 0 || slo->e2el_ms > 0); }

BenchMetrics bench_metrics_compute(const BenchSample *samples, int n, double duration_s, const BenchSlo *slo) {
    BenchMetrics m = {.duration_s = duration_s > 1e-9 ? duration_s : 1e-9, .has_goodput = slo_set(slo)};
    int n_itl = 0;
    for (int i = 0; i < n; i++) n_itl += samples[i].ok ? samples[i].n_itls : 0;
    double *ttft = malloc(((size_t)n + 1) * sizeof *ttft), *tpot = malloc(((size_t)n + 1) * sizeof *tpot);
    double *e2el = malloc(((size_t)n + 1) * sizeof *e2el), *itl = malloc(((size_t)n_itl + 1) * sizeof *itl);
    int n_ttft = 0, n_tpot = 0, n_e2el = 0;
    n_itl = 0;
    for (int i = 0; i < n; i++) {
        const BenchSample *s = &samples[i];
        m.retries += s->retries;
        m.connection_retries += s->connection_retries;
        if (!s->ok) {
            m.failed++;
            continue;
        }
        m.completed++;
        m.good += m.has_goodput && bench_sample_meets(s, slo);
        m.total_input += s->input_tokens;
        m.total_output += s->output_tokens;
        m.total_cached += s->cached_tokens;
        if (ttft) ttft[n_ttft++] = s->ttft_s;
        if (e2el) e2el[n_e2el++] = s->e2el_s;
        if (tpot && s->output_tokens > 1) tpot[n_tpot++] = s->tpot_s;
        for (int k = 0; itl && k < s->n_itls; k++) itl[n_itl++] = s->itls_s[k];
    }
    m.ttft = distribution_ms(ttft, n_ttft);
    m.tpot = distribution_ms(tpot, n_tpot);
    m.itl = distribution_ms(itl, n_itl);
    m.e2el = distribution_ms(e2el, n_e2el);
    m.request_throughput = m.completed / m.duration_s;
    m.output_throughput = (double)m.total_output / m.duration_s;
    m.total_token_throughput = (double)(m.total_input + m.total_output) / m.duration_s;
    m.request_goodput = m.has_goodput ? m.good / m.duration_s : 0;
    free(ttft), free(tpot), free(e2el), free(itl);
    return m;
}

void bench_metrics_print(FILE *f, const char *tag, const BenchMetrics *m) {
    fprintf(f, "[%s] %d completed, %d failed in %.2f s: %.2f req/s, %.1f output tok/s, %.1f total tok/s; %d 429 retries, "
               "%d connection retries\n",
            tag, m->completed, m->failed, m->duration_s, m->request_throughput, m->output_throughput, m->total_token_throughput,
            m->retries, m->connection_retries);
    const struct {
        const char *name;
        const BenchDist *d;
    } rows[] = {{"TTFT", &m->ttft}, {"TPOT", &m->tpot}, {"ITL", &m->itl}, {"E2EL", &m->e2el}};
    fprintf(f, "[%s] ms (each from its own send)", tag);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        fprintf(f, "%s %s mean %.1f p50 %.1f p90 %.1f p99 %.1f", i ? ";" : "", rows[i].name, rows[i].d->mean, rows[i].d->p50,
                rows[i].d->p90, rows[i].d->p99);
    fputc('\n', f);
    if (m->has_goodput)
        fprintf(f, "[%s] goodput %.2f req/s (%d of %d completed requests met every SLO)\n", tag, m->request_goodput, m->good,
                m->completed);
}

/* ---- vLLM's result JSON ---- */

static int set_dist(json_t *o, const char *metric, const BenchDist *d) {
    const struct {
        const char *stat;
        double v;
    } stats[] = {{"mean", d->mean}, {"median", d->median}, {"std", d->std}, {"p50", d->p50}, {"p90", d->p90}, {"p99", d->p99}};
    for (size_t i = 0; i < sizeof stats / sizeof stats[0]; i++) {
        char key[48];
        snprintf(key, sizeof key, "%s_%s_ms", stats[i].stat, metric);
        if (json_object_set_new(o, key, json_real(stats[i].v))) return -1;
    }
    return 0;
}

/* The per-request lists, in request order; a failed request has 0 lengths, TTFT 0 and no ITLs. */
static int set_lists(json_t *o, const BenchSample *samples, int n) {
    json_t *in = json_array(), *out = json_array(), *ttfts = json_array(), *itls = json_array(), *errors = json_array();
    json_t *e2els = json_array();
    int rc = in && out && ttfts && itls && errors && e2els ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        const BenchSample *s = &samples[i];
        json_t *gaps = json_array();
        for (int k = 0; gaps && k < s->n_itls; k++) json_array_append_new(gaps, json_real(s->itls_s[k]));
        rc |= json_array_append_new(in, json_integer(s->input_tokens));
        rc |= json_array_append_new(out, json_integer(s->output_tokens));
        rc |= json_array_append_new(ttfts, json_real(s->ttft_s));
        rc |= json_array_append_new(itls, gaps ? gaps : json_array());
        rc |= json_array_append_new(errors, json_string(s->error));
        rc |= json_array_append_new(e2els, json_real(s->e2el_s));
    }
    rc |= json_object_set_new(o, "input_lens", in);
    rc |= json_object_set_new(o, "output_lens", out);
    rc |= json_object_set_new(o, "ttfts", ttfts);
    rc |= json_object_set_new(o, "itls", itls);
    rc |= json_object_set_new(o, "errors", errors);
    rc |= json_object_set_new(o, "e2els", e2els); /* braid-bench's addition: vLLM keeps only the summary */
    return rc ? -1 : 0;
}

json_t *bench_metrics_vllm_json(const BenchRunInfo *info, const BenchMetrics *m, const BenchSample *samples, int n,
                                const BenchSlo *slo) {
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:i, s:s, s:i, s:f, s:i, s:i, s:I, s:I, s:f, s:f, s:f}", "date", date, "backend",
                          info->backend ? info->backend : "braid-bench", "base_url", info->base_url ? info->base_url : "",
                          "model_id", info->model ? info->model : "", "num_prompts", info->num_prompts, "request_rate", "inf",
                          "max_concurrency", info->max_concurrency, "duration", m->duration_s, "completed", m->completed,
                          "failed", m->failed, "total_input_tokens", (json_int_t)m->total_input, "total_output_tokens",
                          (json_int_t)m->total_output, "request_throughput", m->request_throughput, "output_throughput",
                          m->output_throughput, "total_token_throughput", m->total_token_throughput);
    if (!o) return NULL;
    int rc = json_object_set_new(o, "request_goodput", m->has_goodput ? json_real(m->request_goodput) : json_null());
    if (m->has_goodput && slo) {
        json_t *cfg = json_object(); /* vLLM keeps these as args.goodput "ttft:MS tpot:MS e2el:MS" */
        if (slo->ttft_ms > 0) json_object_set_new(cfg, "ttft", json_real(slo->ttft_ms));
        if (slo->itl_ms > 0) json_object_set_new(cfg, "tpot", json_real(slo->itl_ms));
        if (slo->e2el_ms > 0) json_object_set_new(cfg, "e2el", json_real(slo->e2el_ms));
        rc |= json_object_set_new(o, "goodput_config", cfg);
    }
    rc |= json_object_set_new(o, "total_cached_tokens", json_integer(m->total_cached));
    rc |= json_object_set_new(o, "retries_429", json_integer(m->retries));
    rc |= json_object_set_new(o, "connection_retries", json_integer(m->connection_retries));
    rc |= set_dist(o, "ttft", &m->ttft) | set_dist(o, "tpot", &m->tpot) | set_dist(o, "itl", &m->itl) | set_dist(o, "e2el", &m->e2el);
    rc |= set_lists(o, samples, n);
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int bench_metrics_write_vllm_json(const char *path, const BenchRunInfo *info, const BenchMetrics *m, const BenchSample *samples,
                                  int n, const BenchSlo *slo, BraidError *err) {
    json_t *o = bench_metrics_vllm_json(info, m, samples, n, slo);
    if (!o) return braid_error_set(err, "out of memory building the result JSON for %s", path);
    int rc = json_dump_file(o, path, JSON_INDENT(2));
    json_decref(o);
    return rc ? braid_error_set(err, "cannot write %s", path) : 0;
}

int bench_slo_parse(const char *cmd, const char *flag, const char *text, BenchSlo *slo) {
    double v;
    if (bench_parse_float(cmd, flag, text, 1e-3, 1e9, &v)) return -1;
    if (strcmp(flag, "--slo-ttft-ms") == 0) slo->ttft_ms = v;
    else if (strcmp(flag, "--slo-itl-ms") == 0) slo->itl_ms = v;
    else slo->e2el_ms = v;
    return 0;
}
