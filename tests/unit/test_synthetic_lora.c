/*
 * test_synthetic_lora.c — `--lora NAME=synthetic:RANK[:SEED]` (model/synthetic_lora.h) through the
 * ordinary loader (lora_adapter_load): shapes of every pair for a GQA base, values inside their
 * documented ranges and not constant, determinism (same name and seed, same values; another seed
 * or name, other values), scale alpha / rank = 1, and malformed specs refused with the spec named.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "model/lora_adapter.h"
#include "model/synthetic_lora.h"

static ModelConfig small_gqa(void) {
    ModelConfig c;
    memset(&c, 0, sizeof c);
    c.n_layers = 3, c.dim = 64, c.ff_dim = 128, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
    return c;
}

static void test_shapes_ranges_scale(void **state) {
    (void)state;
    ModelConfig base = small_gqa();
    LoraAdapter ad;
    BraidError err;
    assert_int_equal(lora_adapter_load("synthetic:8:5", "coder", &base, &ad, &err), 0);
    assert_string_equal(ad.name, "coder");
    assert_int_equal(ad.rank, 8);
    assert_int_equal(ad.n_layers, 3);
    assert_true(fabsf(ad.scale - 1.0f) < 1e-6f);
    size_t bytes = 0;
    for (int l = 0; l < base.n_layers; l++)
        for (int p = 0; p < LORA_PROJ_COUNT; p++) {
            int in, out;
            lora_proj_dims(&base, (LoraProj)p, &in, &out);
            const LoraPair *pair = &ad.pairs[l * LORA_PROJ_COUNT + p];
            assert_non_null(pair->a);
            assert_non_null(pair->b);
            double a_range = sqrt(3.0 / in), b_range = 0.02 * sqrt(3.0 / 8);
            float a_min = 1e9f, a_max = -1e9f;
            for (int i = 0; i < 8 * in; i++) {
                assert_true(fabs(pair->a[i]) <= a_range);
                a_min = fminf(a_min, pair->a[i]), a_max = fmaxf(a_max, pair->a[i]);
            }
            for (int i = 0; i < out * 8; i++) assert_true(fabs(pair->b[i]) <= b_range);
            assert_true(a_max - a_min > a_range); /* spread over the range, not a constant */
            bytes += ((size_t)8 * in + (size_t)out * 8) * sizeof(float);
        }
    assert_int_equal(ad.bytes, bytes);
    lora_adapter_free(&ad);
}

static void test_deterministic_by_seed_and_name(void **state) {
    (void)state;
    ModelConfig base = small_gqa();
    LoraAdapter a, b, c, d, e;
    BraidError err;
    assert_int_equal(lora_adapter_load("synthetic:4:1", "x", &base, &a, &err), 0);
    assert_int_equal(lora_adapter_load("synthetic:4:1", "y", &base, &b, &err), 0); /* explicit seed: name ignored */
    assert_int_equal(lora_adapter_load("synthetic:4:2", "x", &base, &c, &err), 0);
    assert_int_equal(lora_adapter_load("synthetic:4", "x", &base, &d, &err), 0);  /* seed from the name */
    assert_int_equal(lora_adapter_load("synthetic:4", "z", &base, &e, &err), 0);
    size_t n = (size_t)4 * base.dim * sizeof(float);
    assert_memory_equal(a.pairs[5].a, b.pairs[5].a, n);
    assert_memory_not_equal(a.pairs[5].a, c.pairs[5].a, n);
    assert_memory_not_equal(d.pairs[5].a, e.pairs[5].a, n);
    lora_adapter_free(&a), lora_adapter_free(&b), lora_adapter_free(&c), lora_adapter_free(&d), lora_adapter_free(&e);
}

static void test_malformed_specs_refused(void **state) {
    (void)state;
    ModelConfig base = small_gqa();
    static const char *const bad[] = {"synthetic:", "synthetic:0", "synthetic:abc", "synthetic:16x", "synthetic:16:", "synthetic:16:-1z",
                                      "synthetic:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        LoraAdapter ad;
        BraidError err;
        assert_int_not_equal(lora_adapter_load(bad[i], "n", &base, &ad, &err), 0);
        assert_non_null(strstr(err.msg, bad[i]));
        assert_null(ad.pairs);
    }
    assert_true(synthetic_lora_spec("synthetic:16"));
    assert_false(synthetic_lora_spec("adapters/coder.gguf"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes_ranges_scale),
        cmocka_unit_test(test_deterministic_by_seed_and_name),
        cmocka_unit_test(test_malformed_specs_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
