/* Sampler: greedy, determinism under a seed, top-k / top-p filtering, and the sampled distribution. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>

#include "worker/sampler.h"

static void test_greedy(void **state) {
    (void)state;
    float logits[6] = {0.1f, 3.0f, -1.0f, 3.0f, 2.9f, 0.0f};
    assert_int_equal(sampler_argmax(logits, 6), 1); /* ties go to the lowest id */
    Sampler s;
    assert_int_equal(sampler_init(&s, 6, 1), 0);
    SamplingParams p = sampling_params_default();
    for (int i = 0; i < 10; i++) assert_int_equal(sampler_sample(&s, logits, &p), 1);
    p.temperature = 1.5f;
    p.top_k = 1;
    for (int i = 0; i < 50; i++) assert_int_equal(sampler_sample(&s, logits, &p), 1);
    p.top_k = 0;
    p.top_p = 1e-6f;
    for (int i = 0; i < 50; i++) assert_int_equal(sampler_sample(&s, logits, &p), 1);
    sampler_free(&s);
}

static void draw(uint64_t seed, int32_t *out, int n) {
    float logits[8] = {1, 1.1f, 0.9f, 1.05f, 0.95f, 1, 1.02f, 0.98f};
    Sampler s;
    assert_int_equal(sampler_init(&s, 8, seed), 0);
    SamplingParams p = {.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .seed = seed};
    for (int i = 0; i < n; i++) out[i] = sampler_sample(&s, logits, &p);
    sampler_free(&s);
}

static void test_seeded_determinism(void **state) {
    (void)state;
    int32_t a[200], b[200], c[200];
    draw(7, a, 200);
    draw(7, b, 200);
    draw(8, c, 200);
    assert_memory_equal(a, b, sizeof a);
    int differ = 0;
    for (int i = 0; i < 200; i++) differ += a[i] != c[i];
    assert_true(differ > 100);
}

static void test_top_k_and_top_p_sets(void **state) {
    (void)state;
    float logits[10] = {0, 5, 1, 4.5f, 2, 4.8f, 0.5f, 3, 1.5f, 2.5f}; /* top 3: ids 1, 5, 3 */
    Sampler s;
    assert_int_equal(sampler_init(&s, 10, 3), 0);
    SamplingParams p = {.temperature = 2.0f, .top_p = 1.0f, .top_k = 3};
    int seen[10] = {0};
    for (int i = 0; i < 3000; i++) seen[sampler_sample(&s, logits, &p)]++;
    for (int id = 0; id < 10; id++) {
        if (id == 1 || id == 5 || id == 3) assert_true(seen[id] > 0);
        else assert_int_equal(seen[id], 0);
    }
    /* top-p: at T=1 the probabilities of 1, 5, 3 are about .41, .30, .25 of the mass; p = 0.6
     * keeps exactly {1, 5}. */
    p = (SamplingParams){.temperature = 1.0f, .top_p = 0.6f, .top_k = 0};
    int seen2[10] = {0};
    for (int i = 0; i < 3000; i++) seen2[sampler_sample(&s, logits, &p)]++;
    for (int id = 0; id < 10; id++) {
        if (id == 1 || id == 5) assert_true(seen2[id] > 0);
        else assert_int_equal(seen2[id], 0);
    }
    sampler_free(&s);
}

static void test_distribution(void **state) {
    (void)state;
    float logits[5] = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f};
    const float t = 0.8f;
    double z = 0, expect[5];
    for (int i = 0; i < 5; i++) z += (expect[i] = exp(logits[i] / t));
    Sampler s;
    assert_int_equal(sampler_init(&s, 5, 2024), 0);
    SamplingParams p = {.temperature = t, .top_p = 1.0f, .top_k = 0};
    int counts[5] = {0};
    const int n = 20000;
    for (int i = 0; i < n; i++) counts[sampler_sample(&s, logits, &p)]++;
    for (int i = 0; i < 5; i++) assert_float_equal((double)counts[i] / n, expect[i] / z, 0.015);
    sampler_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seeded_determinism),
        cmocka_unit_test(test_top_k_and_top_p_sets),
        cmocka_unit_test(test_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
