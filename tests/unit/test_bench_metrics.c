/* Unit tests of bench/driver/bench_metrics.c: per-request timings from each request's own send,
 * vLLM's TPOT / ITL / goodput definitions, and the keys of its result JSON. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench_metrics.h"

#define NEAR(a, b) assert_true(fabs((a) - (b)) < 1e-9)

/* A request sent at t_send whose text chunks came at the given times, ending at t_end. */
static HttpResult finished(double t_send, const double *chunks, int n, double t_end, int out_tokens) {
    HttpResult r = {.t_send = t_send, .t_end = t_end, .status = 200, .prompt_tokens = 10, .completion_tokens = out_tokens,
                    .cached_tokens = 0};
    r.chunk_times = malloc((size_t)n * sizeof *r.chunk_times);
    memcpy(r.chunk_times, chunks, (size_t)n * sizeof *chunks);
    r.n_chunks = n;
    r.t_first_text = n ? chunks[0] : 0;
    return r;
}

static void test_sample_times_from_own_send(void **state) {
    (void)state;
    const double chunks[] = {100.1, 100.15, 100.25, 100.3};
    HttpResult r = finished(100.0, chunks, 4, 100.4, 4);
    BenchSample s;
    assert_int_equal(bench_sample_from_result(&r, &s), 0);
    assert_true(s.ok);
    NEAR(s.ttft_s, 0.1);
    NEAR(s.e2el_s, 0.4);
    NEAR(s.tpot_s, (0.4 - 0.1) / 3);
    assert_int_equal(s.n_itls, 3);
    NEAR(s.itls_s[0], 0.05);
    NEAR(s.itls_s[1], 0.1);
    NEAR(s.itls_s[2], 0.05);
    bench_sample_free(&s);
    free(r.chunk_times);
}

static void test_failed_sample_has_no_times(void **state) {
    (void)state;
    HttpResult r = {.t_send = 5, .t_end = 6, .prompt_tokens = -1, .completion_tokens = -1, .cached_tokens = -1};
    snprintf(r.error, sizeof r.error, "HTTP 500: boom");
    BenchSample s;
    assert_int_equal(bench_sample_from_result(&r, &s), 0);
    assert_false(s.ok);
    assert_int_equal(s.n_itls, 0);
    assert_int_equal(s.output_tokens, 0);
    assert_string_equal(s.error, "HTTP 500: boom");
    bench_sample_free(&s);
}

static void make_run(BenchSample *s) {
    const double a[] = {0.1, 0.2, 0.3}, b[] = {10.5, 10.6};
    HttpResult ra = finished(0, a, 3, 0.3, 3), rb = finished(10, b, 2, 10.7, 2), rc = {.prompt_tokens = -1};
    snprintf(rc.error, sizeof rc.error, "timeout");
    assert_int_equal(bench_sample_from_result(&ra, &s[0]), 0);
    assert_int_equal(bench_sample_from_result(&rb, &s[1]), 0);
    assert_int_equal(bench_sample_from_result(&rc, &s[2]), 0);
    free(ra.chunk_times);
    free(rb.chunk_times);
}

static void test_metrics_and_goodput(void **state) {
    (void)state;
    BenchSample s[3];
    make_run(s);
    BenchSlo slo = {.ttft_ms = 200}; /* a: TTFT 100 ms meets it; b: 500 ms does not */
    BenchMetrics m = bench_metrics_compute(s, 3, 2.0, &slo);
    assert_int_equal(m.completed, 2);
    assert_int_equal(m.failed, 1);
    assert_int_equal(m.total_output, 5);
    assert_int_equal(m.total_input, 20);
    NEAR(m.request_throughput, 1.0);
    NEAR(m.output_throughput, 2.5);
    NEAR(m.total_token_throughput, 12.5);
    assert_true(m.has_goodput);
    assert_int_equal(m.good, 1);
    NEAR(m.request_goodput, 0.5);
    NEAR(m.ttft.mean, 300);   /* (100 + 500) / 2 ms */
    NEAR(m.ttft.median, 300);
    NEAR(m.ttft.std, 200);    /* population std, as numpy */
    NEAR(m.itl.mean, 100);    /* ITLs flattened over requests: 100, 100, 100 ms */
    NEAR(m.e2el.p99, 300 + 0.99 * (700 - 300));
    /* TPOT: a (0.3 - 0.1) / 2 = 100 ms; b (0.7 - 0.5) / 1 = 200 ms; an ITL SLO of 150 ms keeps a only. */
    NEAR(m.tpot.mean, 150);
    BenchSlo itl = {.itl_ms = 150};
    assert_int_equal(bench_metrics_compute(s, 3, 2.0, &itl).good, 1);
    assert_false(bench_metrics_compute(s, 3, 2.0, NULL).has_goodput);
    for (int i = 0; i < 3; i++) bench_sample_free(&s[i]);
}

static void test_vllm_json_keys(void **state) {
    (void)state;
    BenchSample s[3];
    make_run(s);
    BenchMetrics m = bench_metrics_compute(s, 3, 2.0, NULL);
    BenchRunInfo info = {.backend = "braid-bench", .base_url = "http://x", .max_concurrency = 2, .num_prompts = 3};
    json_t *o = bench_metrics_vllm_json(&info, &m, s, 3, NULL);
    assert_non_null(o);
    const char *keys[] = {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
                          "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
                          "itls", "errors", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                          "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) assert_non_null(json_object_get(o, keys[i]));
    assert_true(json_is_null(json_object_get(o, "request_goodput")));
    const json_t *ttfts = json_object_get(o, "ttfts"), *itls = json_object_get(o, "itls"), *errors = json_object_get(o, "errors");
    assert_int_equal(json_array_size(ttfts), 3);
    NEAR(json_real_value(json_array_get(ttfts, 1)), 0.5); /* seconds, from b's own send */
    assert_int_equal(json_array_size(json_array_get(itls, 0)), 2);
    assert_int_equal(json_array_size(json_array_get(itls, 2)), 0);
    assert_string_equal(json_string_value(json_array_get(errors, 2)), "timeout");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(o, "output_lens"), 2)), 0);
    json_decref(o);
    for (int i = 0; i < 3; i++) bench_sample_free(&s[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_times_from_own_send),
        cmocka_unit_test(test_failed_sample_has_no_times),
        cmocka_unit_test(test_metrics_and_goodput),
        cmocka_unit_test(test_vllm_json_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
