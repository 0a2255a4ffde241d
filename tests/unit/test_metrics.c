/* Coordinator metrics registry: exact rendered values, label escaping, exposition-format syntax of
 * every line, bounded label tables, and exact totals under concurrent recording. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/metrics.h"

/* 1 when `line` is one whole line of text. */
static int has_line(const char *text, const char *line) {
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
        int starts = p == text || p[-1] == '\n';
        if (starts && p[n] == '\n') return 1;
    }
    return 0;
}

static void assert_line(const char *text, const char *line) {
    if (!has_line(text, line)) fail_msg("missing line: %s\n--- rendered ---\n%s", line, text);
}

static int is_number(const char *s) {
    if (strcmp(s, "+Inf") == 0 || strcmp(s, "-Inf") == 0 || strcmp(s, "NaN") == 0) return 1;
    char *end;
    strtod(s, &end);
    return end != s && *end == '\0';
}

/* Family a sample belongs to: its name less a histogram suffix. */
static void family_of(const char *sample, char *family, size_t cap) {
    size_t n = strcspn(sample, "{ ");
    snprintf(family, cap, "%.*s", (int)n, sample);
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (size_t i = 0; i < 3; i++) {
        size_t fl = strlen(family), sl = strlen(suffixes[i]);
        if (fl <= sl || strcmp(family + fl - sl, suffixes[i]) != 0) continue;
        family[fl - sl] = '\0';
        return;
    }
}

/* Checks the whole text against the exposition format: `name{labels} value` or `name value`,
 * a numeric value, every sample preceded by its family's TYPE (histogram samples by their base
 * name's), HELP and TYPE for every family, no duplicate series, trailing newline. */
static void assert_valid_exposition(const char *text) {
    regex_t re;
    const char *label = "[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\"";
    char pattern[512];
    snprintf(pattern, sizeof pattern, "^[a-zA-Z_:][a-zA-Z0-9_:]*(\\{%s(,%s)*\\})? ([^ ]+)$", label, label);
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED), 0);
    assert_true(strlen(text) > 0 && text[strlen(text) - 1] == '\n');

    char *copy = strdup(text);
    assert_non_null(copy);
    char *save = NULL, *seen_series = calloc(1, strlen(text) + 2);
    assert_non_null(seen_series);
    char current_type[256] = "", current_help[256] = "";
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[256];
        if (sscanf(line, "# HELP %255s", name) == 1) {
            snprintf(current_help, sizeof current_help, "%s", name);
            continue;
        }
        if (sscanf(line, "# TYPE %255s", name) == 1) {
            assert_string_equal(name, current_help); /* HELP comes right before its TYPE */
            snprintf(current_type, sizeof current_type, "%s", name);
            continue;
        }
        assert_true(line[0] != '#');
        regmatch_t match[6];
        if (regexec(&re, line, 6, match, 0) != 0) fail_msg("malformed sample line: %s", line);
        assert_true(is_number(strrchr(line, ' ') + 1));
        char family[256];
        family_of(line, family, sizeof family);
        if (strcmp(family, current_type) != 0) fail_msg("sample %s outside its family's TYPE (%s)", line, current_type);

        /* Series identity is everything before the value; seen_series holds "\n<id>\n" entries. */
        size_t id_len = (size_t)(strrchr(line, ' ') - line);
        char needle[1024];
        snprintf(needle, sizeof needle, "\n%.*s\n", (int)id_len, line);
        if (strstr(seen_series, needle)) fail_msg("duplicate series: %s", line);
        strcat(seen_series, needle + (seen_series[0] ? 1 : 0));
    }
    free(seen_series);
    free(copy);
    regfree(&re);
}

static void test_request_counters_and_histograms(void **state) {
    (void)state;
    Metrics *m = metrics_create(2, "SmolLM2");
    assert_non_null(m);
    /* Latencies and TTFTs are binary fractions so the sums print exactly. */
    metrics_record_request(m, "chat", 200, 0.5, 0.125, 10, 4, 5);
    metrics_record_request(m, "chat", 200, 1.5, 0.25, 20, 0, 7); /* 0.25 lands in le="0.25": le is inclusive */
    metrics_record_request(m, "chat", 500, 0.03125, -1, 3, 0, 0);
    metrics_record_request(m, "chat", 400, 0.03125, 0.5, 1, 0, 0); /* an error's TTFT is not observed */
    metrics_record_request(m, "completions", 200, 200, 0.004, 6, 2, 9);
    metrics_set_inflight(m, 3);
    metrics_set_queued(m, 2);
    metrics_count_rejected(m);
    metrics_count_rejected(m);
    char *text = metrics_render(m);
    assert_non_null(text);

    assert_line(text, "# HELP braid_requests_total Finished HTTP requests by endpoint and status code.");
    assert_line(text, "# TYPE braid_requests_total counter");
    assert_line(text, "braid_requests_total{endpoint=\"chat\",status=\"200\"} 2");
    assert_line(text, "braid_requests_total{endpoint=\"chat\",status=\"500\"} 1");
    assert_line(text, "braid_requests_total{endpoint=\"chat\",status=\"400\"} 1");
    assert_line(text, "braid_requests_total{endpoint=\"completions\",status=\"200\"} 1");

    assert_line(text, "# TYPE braid_request_latency_seconds histogram");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"chat\",le=\"0.025\"} 0");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"chat\",le=\"0.05\"} 2");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"chat\",le=\"0.25\"} 2");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"chat\",le=\"0.5\"} 3");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"chat\",le=\"1\"} 3");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"chat\",le=\"2.5\"} 4");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"chat\",le=\"120\"} 4");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"chat\",le=\"+Inf\"} 4");
    assert_line(text, "braid_request_latency_seconds_sum{endpoint=\"chat\"} 2.0625");
    assert_line(text, "braid_request_latency_seconds_count{endpoint=\"chat\"} 4");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"completions\",le=\"120\"} 0");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"completions\",le=\"+Inf\"} 1");
    assert_line(text, "braid_request_latency_seconds_sum{endpoint=\"completions\"} 200");
    assert_line(text, "braid_request_latency_seconds_count{endpoint=\"completions\"} 1");

    assert_line(text, "# TYPE braid_time_to_first_token_seconds histogram");
    assert_line(text, "braid_time_to_first_token_seconds_bucket{endpoint=\"chat\",le=\"0.1\"} 0");
    assert_line(text, "braid_time_to_first_token_seconds_bucket{endpoint=\"chat\",le=\"0.25\"} 2");
    assert_line(text, "braid_time_to_first_token_seconds_bucket{endpoint=\"chat\",le=\"+Inf\"} 2");
    assert_line(text, "braid_time_to_first_token_seconds_sum{endpoint=\"chat\"} 0.375");
    assert_line(text, "braid_time_to_first_token_seconds_count{endpoint=\"chat\"} 2");
    assert_line(text, "braid_time_to_first_token_seconds_bucket{endpoint=\"completions\",le=\"0.005\"} 1");
    assert_line(text, "braid_time_to_first_token_seconds_count{endpoint=\"completions\"} 1");

    assert_line(text, "braid_prompt_tokens_total 40");
    assert_line(text, "braid_cached_prompt_tokens_total 6");
    assert_line(text, "braid_completion_tokens_total 21");
    assert_line(text, "# TYPE braid_requests_inflight gauge");
    assert_line(text, "braid_requests_inflight 3");
    assert_line(text, "braid_requests_queued 2");
    assert_line(text, "# TYPE braid_requests_rejected_total counter");
    assert_line(text, "braid_requests_rejected_total 2");
    assert_line(text, "# TYPE braid_model_info gauge");
    assert_line(text, "braid_model_info{model=\"SmolLM2\"} 1");
    assert_valid_exposition(text);
    free(text);
    metrics_destroy(m);
}

static void test_instance_stats_replace(void **state) {
    (void)state;
    Metrics *m = metrics_create(2, "m");
    assert_non_null(m);
    char *text = metrics_render(m); /* before any report: zeros, not missing series */
    assert_non_null(text);
    assert_line(text, "braid_instance_waiting_requests{instance=\"1\"} 0");
    assert_line(text, "braid_instance_generated_tokens_total{instance=\"0\"} 0");
    free(text);

    InstanceStats a = {.waiting = 1, .running = 2, .pool_used_blocks = 3, .pool_total_blocks = 100, .host_used_blocks = 7,
                       .host_total_blocks = 400, .cached_prompt_tokens_device = 10, .cached_prompt_tokens_host = 11,
                       .computed_prompt_tokens = 20, .demoted_blocks = 12, .loaded_blocks = 13, .host_evicted_blocks = 14,
                       .device_evicted_blocks = 30, .preemptions = 40, .generated_tokens = 50,
                       .segment_lsh_candidates = 6, .segment_lsh_admitted = 2, .segment_probes_ok = 3, .segment_probes_rejected = 1};
    InstanceStats b = {.waiting = 4, .running = 5, .pool_used_blocks = 60, .pool_total_blocks = 128, .host_used_blocks = 9,
                       .host_total_blocks = 512, .cached_prompt_tokens_device = 1000, .cached_prompt_tokens_host = 1100,
                       .computed_prompt_tokens = 2000, .demoted_blocks = 1200, .loaded_blocks = 1300, .host_evicted_blocks = 1400,
                       .device_evicted_blocks = 3000, .preemptions = 4000, .generated_tokens = 5000000000ULL};
    metrics_set_instance(m, 0, &a);
    metrics_set_instance(m, 1, &a);
    metrics_set_instance(m, 1, &b); /* replaces, does not add */
    metrics_set_instance(m, 2, &b); /* out of range: ignored */
    metrics_set_instance(m, -1, &b);
    metrics_set_instance(m, 0, NULL);
    text = metrics_render(m);
    assert_non_null(text);
    assert_line(text, "# TYPE braid_instance_waiting_requests gauge");
    assert_line(text, "braid_instance_waiting_requests{instance=\"0\"} 1");
    assert_line(text, "braid_instance_waiting_requests{instance=\"1\"} 4");
    assert_line(text, "braid_instance_running_sequences{instance=\"1\"} 5");
    assert_line(text, "braid_instance_kv_blocks_used{instance=\"0\"} 3");
    assert_line(text, "braid_instance_kv_blocks_used{instance=\"1\"} 60");
    assert_line(text, "braid_instance_kv_blocks_total{instance=\"1\"} 128");
    assert_line(text, "braid_instance_host_kv_blocks_used{instance=\"1\"} 9");
    assert_line(text, "braid_instance_host_kv_blocks_total{instance=\"0\"} 400");
    assert_line(text, "# TYPE braid_instance_cached_prompt_tokens_total counter");
    assert_line(text, "braid_instance_cached_prompt_tokens_total{instance=\"1\",tier=\"device\"} 1000");
    assert_line(text, "braid_instance_cached_prompt_tokens_total{instance=\"1\",tier=\"host\"} 1100");
    assert_line(text, "braid_instance_computed_prompt_tokens_total{instance=\"0\"} 20");
    assert_line(text, "braid_instance_kv_demoted_blocks_total{instance=\"0\"} 12");
    assert_line(text, "braid_instance_kv_loaded_blocks_total{instance=\"1\"} 1300");
    assert_line(text, "braid_instance_kv_host_evicted_blocks_total{instance=\"1\"} 1400");
    assert_line(text, "braid_instance_evicted_blocks_total{instance=\"1\"} 3000");
    assert_line(text, "braid_instance_preemptions_total{instance=\"0\"} 40");
    assert_line(text, "braid_instance_generated_tokens_total{instance=\"1\"} 5000000000");
    /* The cache families summed over the instances, counts per tier (no ratios). */
    assert_line(text, "# TYPE braid_prompt_tokens_cached_total counter");
    assert_line(text, "braid_prompt_tokens_cached_total{tier=\"device\"} 1010");
    assert_line(text, "braid_prompt_tokens_cached_total{tier=\"host\"} 1111");
    assert_line(text, "braid_prompt_tokens_computed_total 2020");
    assert_line(text, "braid_kv_demoted_blocks_total 1212");
    assert_line(text, "braid_kv_loaded_blocks_total 1313");
    assert_line(text, "braid_kv_host_evicted_blocks_total 1414");
    assert_line(text, "braid_kv_device_evicted_blocks_total 3030");
    assert_line(text, "# TYPE braid_kv_host_blocks_used gauge");
    assert_line(text, "braid_kv_host_blocks_used 16");
    assert_line(text, "braid_kv_host_blocks_total 912");
    /* Segment guards: LSH candidates / admissions and probes by result, per instance and summed. */
    assert_line(text, "braid_instance_segment_lsh_candidates_total{instance=\"0\"} 6");
    assert_line(text, "braid_segment_lsh_candidates_total 6");
    assert_line(text, "braid_segment_lsh_admitted_total 2");
    assert_line(text, "braid_segment_probe_total{result=\"admitted\"} 3");
    assert_line(text, "braid_segment_probe_total{result=\"rejected\"} 1");
    assert_null(strstr(text, "instance=\"2\""));
    assert_valid_exposition(text);
    free(text);
    metrics_destroy(m);
}

static void test_label_escaping(void **state) {
    (void)state;
    Metrics *m = metrics_create(0, "we\"ird\\name\nv2\xff");
    assert_non_null(m);
    metrics_record_request(m, "a\"b\\c", 200, 0.1, 0.1, 0, 0, 0);
    /* 40 bytes: truncated to 32. */
    metrics_record_request(m, "0123456789012345678901234567890123456789", 200, 0.1, 0.1, 0, 0, 0);
    /* 31 ASCII bytes then a 2-byte character straddling the cut: the whole character goes. */
    metrics_record_request(m, "abcdefghijklmnopqrstuvwxyz01234\xc3\xa9", 404, 0.1, -1, 0, 0, 0);
    metrics_record_request(m, NULL, 200, 0.1, 0.1, 0, 0, 0);
    char *text = metrics_render(m);
    assert_non_null(text);
    /* Invalid UTF-8 (0xff) becomes U+FFFD so the scrape stays valid UTF-8. */
    assert_line(text, "braid_model_info{model=\"we\\\"ird\\\\name\\nv2\xef\xbf\xbd\"} 1");
    assert_line(text, "braid_requests_total{endpoint=\"a\\\"b\\\\c\",status=\"200\"} 1");
    assert_line(text, "braid_request_latency_seconds_count{endpoint=\"a\\\"b\\\\c\"} 1");
    assert_line(text, "braid_requests_total{endpoint=\"01234567890123456789012345678901\",status=\"200\"} 1");
    assert_line(text, "braid_requests_total{endpoint=\"abcdefghijklmnopqrstuvwxyz01234\",status=\"404\"} 1");
    assert_line(text, "braid_requests_total{endpoint=\"unknown\",status=\"200\"} 1");
    assert_valid_exposition(text);
    free(text);
    metrics_destroy(m);
}

static void test_label_tables_bounded(void **state) {
    (void)state;
    Metrics *m = metrics_create(1, "m");
    assert_non_null(m);
    char endpoint[32];
    for (int i = 0; i < 100; i++) {
        snprintf(endpoint, sizeof endpoint, "ep%d", i);
        metrics_record_request(m, endpoint, 200, 1, 0.5, 1, 0, 1);
    }
    for (int status = 100; status < 200; status++) metrics_record_request(m, "chat", status, 1, -1, 0, 0, 0);
    metrics_record_request(m, METRICS_OVERFLOW_LABEL, 0, 1, -1, 0, 0, 0); /* merges with the overflow row */
    char *text = metrics_render(m);
    assert_non_null(text);
    assert_valid_exposition(text); /* includes: no duplicate series */

    /* Every request is counted exactly once across the bounded rows. */
    unsigned long long total = 0, rows = 0, latency_total = 0;
    for (const char *p = text; (p = strstr(p, "\nbraid_requests_total{")) != NULL; p++) {
        total += strtoull(strchr(strchr(p, '}'), ' ') + 1, NULL, 10);
        rows++;
    }
    for (const char *p = text; (p = strstr(p, "\nbraid_request_latency_seconds_count{")) != NULL; p++)
        latency_total += strtoull(strchr(strchr(p, '}'), ' ') + 1, NULL, 10);
    assert_int_equal(total, 201);
    assert_int_equal(latency_total, 201);
    assert_true(rows <= METRICS_MAX_STATUS_PAIRS);
    assert_true(has_line(text, "braid_prompt_tokens_total 100"));
    free(text);
    metrics_destroy(m);
}

enum { N_THREADS = 4, RECORDS_PER_THREAD = 10000 };

typedef struct {
    Metrics *m;
    int id;
} WorkerArg;

static void *record_worker(void *p) {
    WorkerArg *arg = p;
    for (int i = 0; i < RECORDS_PER_THREAD; i++) {
        if (i % 2 == 0) metrics_record_request(arg->m, "chat", 200, 0.5, 0.25, 3, 1, 2);
        else metrics_record_request(arg->m, "completions", 503, 2, -1, 1, 0, 0);
        metrics_count_rejected(arg->m);
        if (i % 1000 == 0) {
            InstanceStats s = {.waiting = i, .generated_tokens = (unsigned long long)i};
            metrics_set_instance(arg->m, arg->id, &s);
            metrics_set_inflight(arg->m, i);
        }
    }
    return NULL;
}

/* Scrapes while the recorders run, so the snapshot path is exercised under contention too. */
static void *render_worker(void *p) {
    Metrics *m = p;
    for (int i = 0; i < 50; i++) {
        char *text = metrics_render(m);
        if (!text) return (void *)1;
        free(text);
    }
    return NULL;
}

static void test_concurrent_recording(void **state) {
    (void)state;
    Metrics *m = metrics_create(N_THREADS, "m");
    assert_non_null(m);
    pthread_t threads[N_THREADS], renderer;
    WorkerArg args[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        args[t] = (WorkerArg){m, t};
        assert_int_equal(pthread_create(&threads[t], NULL, record_worker, &args[t]), 0);
    }
    assert_int_equal(pthread_create(&renderer, NULL, render_worker, m), 0);
    for (int t = 0; t < N_THREADS; t++) assert_int_equal(pthread_join(threads[t], NULL), 0);
    void *render_result;
    assert_int_equal(pthread_join(renderer, &render_result), 0);
    assert_null(render_result);

    char *text = metrics_render(m);
    assert_non_null(text);
    assert_line(text, "braid_requests_total{endpoint=\"chat\",status=\"200\"} 20000");
    assert_line(text, "braid_requests_total{endpoint=\"completions\",status=\"503\"} 20000");
    assert_line(text, "braid_request_latency_seconds_count{endpoint=\"chat\"} 20000");
    assert_line(text, "braid_request_latency_seconds_sum{endpoint=\"chat\"} 10000");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"chat\",le=\"0.5\"} 20000");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"completions\",le=\"1\"} 0");
    assert_line(text, "braid_request_latency_seconds_bucket{endpoint=\"completions\",le=\"2.5\"} 20000");
    assert_line(text, "braid_request_latency_seconds_sum{endpoint=\"completions\"} 40000");
    assert_line(text, "braid_time_to_first_token_seconds_count{endpoint=\"chat\"} 20000");
    assert_line(text, "braid_time_to_first_token_seconds_sum{endpoint=\"chat\"} 5000");
    assert_line(text, "braid_time_to_first_token_seconds_count{endpoint=\"completions\"} 0");
    assert_line(text, "braid_prompt_tokens_total 80000");
    assert_line(text, "braid_cached_prompt_tokens_total 20000");
    assert_line(text, "braid_completion_tokens_total 40000");
    assert_line(text, "braid_requests_rejected_total 40000");
    assert_line(text, "braid_requests_inflight 9000");
    for (int t = 0; t < N_THREADS; t++) {
        char line[128];
        snprintf(line, sizeof line, "braid_instance_waiting_requests{instance=\"%d\"} 9000", t);
        assert_line(text, line);
    }
    assert_valid_exposition(text);
    free(text);
    metrics_destroy(m);
}

/* An instance whose last request finished drops its request gauges at once; counters and totals stay. */
static void test_instance_idle(void **state) {
    (void)state;
    Metrics *m = metrics_create(2, "m");
    assert_non_null(m);
    InstanceStats busy = {.waiting = 3, .running = 8, .pool_used_blocks = 40, .pool_total_blocks = 511, .host_used_blocks = 5,
                          .host_total_blocks = 2047, .generated_tokens = 900};
    metrics_set_instance(m, 0, &busy);
    metrics_set_instance(m, 1, &busy);
    metrics_instance_idle(m, 1);
    metrics_instance_idle(m, 2); /* out of range: ignored */
    metrics_instance_idle(m, -1);
    char *text = metrics_render(m);
    assert_non_null(text);
    assert_line(text, "braid_instance_running_sequences{instance=\"0\"} 8");
    assert_line(text, "braid_instance_running_sequences{instance=\"1\"} 0");
    assert_line(text, "braid_instance_waiting_requests{instance=\"1\"} 0");
    assert_line(text, "braid_instance_kv_blocks_used{instance=\"1\"} 0");
    assert_line(text, "braid_instance_kv_blocks_total{instance=\"1\"} 511");
    assert_line(text, "braid_instance_host_kv_blocks_used{instance=\"1\"} 5");
    assert_line(text, "braid_instance_generated_tokens_total{instance=\"1\"} 900");
    free(text);
    metrics_destroy(m);
}

/* Re-warms of restarted instances add up across instances; an unknown instance counts nothing. */
static void test_rewarm_counters(void **state) {
    (void)state;
    Metrics *m = metrics_create(2, "m");
    assert_non_null(m);
    char *text = metrics_render(m);
    assert_non_null(text);
    assert_line(text, "braid_instance_rewarms_total 0");
    assert_line(text, "braid_instance_rewarm_heads_total 0");
    free(text);
    metrics_count_rewarm(m, 1, 3, 420);
    metrics_count_rewarm(m, 0, 0, 0); /* a re-warm that found no hot head still finished */
    metrics_count_rewarm(m, 2, 5, 100); /* out of range: ignored */
    text = metrics_render(m);
    assert_non_null(text);
    assert_line(text, "braid_instance_rewarms_total 2");
    assert_line(text, "braid_instance_rewarm_heads_total 3");
    assert_line(text, "braid_instance_rewarm_prompt_tokens_total 420");
    free(text);
    metrics_destroy(m);
}

/* The vLLM-named families: one engine per instance with model_name, engine gauges and counters from
 * the instance stats, request histograms and finished_reason counts from recorded generations. */
static void test_vllm_families(void **state) {
    (void)state;
    Metrics *m = metrics_create(2, "qwen");
    assert_non_null(m);
    InstanceStats s = {.waiting = 2, .running = 5, .pool_used_blocks = 25, .pool_total_blocks = 100, .cached_prompt_tokens_device = 30,
                       .cached_prompt_tokens_host = 10, .computed_prompt_tokens = 60, .generated_tokens = 7};
    metrics_set_instance(m, 1, &s);
    MetricsGeneration g = {.instance = 1, .finished_reason = METRICS_FINISHED_LENGTH, .e2e_s = 2.0, .ttft_s = 0.05, .decode_s = 0.9,
                           .generation_tokens = 10};
    metrics_record_generation(m, &g);
    g.finished_reason = METRICS_FINISHED_ABORT, g.generation_tokens = 0, g.ttft_s = -1;
    metrics_record_generation(m, &g);
    g.instance = -1; /* never dispatched: ignored */
    metrics_record_generation(m, &g);
    char *text = metrics_render(m);
    assert_non_null(text);
    assert_valid_exposition(text);
    assert_line(text, "# TYPE vllm:num_requests_running gauge");
    assert_line(text, "vllm:num_requests_running{engine=\"1\",model_name=\"qwen\"} 5");
    assert_line(text, "vllm:num_requests_waiting{engine=\"1\",model_name=\"qwen\"} 2");
    assert_line(text, "vllm:num_requests_waiting{engine=\"0\",model_name=\"qwen\"} 0");
    assert_line(text, "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"qwen\"} 0.25");
    assert_line(text, "# TYPE vllm:prefix_cache_queries_total counter");
    assert_line(text, "vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"qwen\"} 100");
    assert_line(text, "vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"qwen\"} 40");
    assert_line(text, "vllm:prompt_tokens_total{engine=\"1\",model_name=\"qwen\"} 100");
    assert_line(text, "vllm:generation_tokens_total{engine=\"1\",model_name=\"qwen\"} 7");
    assert_line(text, "vllm:request_success_total{engine=\"1\",model_name=\"qwen\",finished_reason=\"length\"} 1");
    assert_line(text, "vllm:request_success_total{engine=\"1\",model_name=\"qwen\",finished_reason=\"abort\"} 1");
    assert_line(text, "vllm:request_success_total{engine=\"0\",model_name=\"qwen\",finished_reason=\"stop\"} 0");
    assert_line(text, "# TYPE vllm:time_to_first_token_seconds histogram");
    assert_line(text, "vllm:time_to_first_token_seconds_bucket{engine=\"1\",model_name=\"qwen\",le=\"0.04\"} 0");
    assert_line(text, "vllm:time_to_first_token_seconds_bucket{engine=\"1\",model_name=\"qwen\",le=\"0.06\"} 1");
    assert_line(text, "vllm:time_to_first_token_seconds_count{engine=\"1\",model_name=\"qwen\"} 1");
    /* 9 gaps of 0.1 s: the mean gap observed 9 times */
    assert_line(text, "vllm:inter_token_latency_seconds_count{engine=\"1\",model_name=\"qwen\"} 9");
    assert_line(text, "vllm:inter_token_latency_seconds_bucket{engine=\"1\",model_name=\"qwen\",le=\"0.1\"} 9");
    assert_line(text, "vllm:time_per_output_token_seconds_count{engine=\"1\",model_name=\"qwen\"} 9");
    assert_line(text, "vllm:e2e_request_latency_seconds_count{engine=\"1\",model_name=\"qwen\"} 2");
    assert_line(text, "vllm:e2e_request_latency_seconds_sum{engine=\"1\",model_name=\"qwen\"} 4");
    assert_line(text, "vllm:e2e_request_latency_seconds_bucket{engine=\"1\",model_name=\"qwen\",le=\"+Inf\"} 2");
    free(text);
    metrics_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm_families),
        cmocka_unit_test(test_request_counters_and_histograms),
        cmocka_unit_test(test_instance_stats_replace),
        cmocka_unit_test(test_instance_idle),
        cmocka_unit_test(test_rewarm_counters),
        cmocka_unit_test(test_label_escaping),
        cmocka_unit_test(test_label_tables_bounded),
        cmocka_unit_test(test_concurrent_recording),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
