/*
 * Synthetic models (model/synthetic_model.h) on the CPU:
 * - every known shape builds with its published sizes; an unknown name is refused with the list;
 *   a vocabulary override resizes both heads;
 * - the element generator is deterministic, bounded by its scale, and has the variance of a
 *   uniform [-scale, scale) (scale^2 / 3);
 * - a tensor-parallel slice (weight_shard) holds exactly the whole matrix's elements: row slices
 *   of Q/K and gate, column slices of O and down, for both ranks of 2;
 * - braid_model_load("synthetic:smollm2-135m:<gguf>") takes the GGUF's tokenizer and sizes the
 *   vocabulary to it, and the CPU backend runs it: finite, non-constant logits, the same on a second
 *   run, and a greedy continuation whose ids all decode.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/synthetic_model.h"
#include "model/tensor_types.h"
#include "model/weight_shard.h"
#include "test_paths.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

static void test_shapes(void **state) {
    (void)state;
    ModelWeights w;
    BraidError err;
    assert_int_equal(synthetic_model_create("synthetic:llama3-8b", 0, &w, &err), 0);
    assert_int_equal(w.cfg.n_layers, 32);
    assert_int_equal(w.cfg.dim, 4096);
    assert_int_equal(w.cfg.vocab_size, 128256);
    assert_int_equal(w.layers[31].w_down.cols, 14336);
    assert_null(w.layers[0].wq.data);
    assert_true(w.layers[0].wq.synth_seed != 0 && w.layers[0].wq.synth_seed != w.layers[0].wk.synth_seed);
    assert_true(synthetic_model_has_unmaterialized(&w));
    /* 8.03 billion parameters in bf16, untied heads */
    assert_true(w.total_bytes > 16000000000ull && w.total_bytes < 16100000000ull);
    synthetic_model_free(&w);

    assert_int_equal(synthetic_model_create("llama3-1b", 49152, &w, &err), 0);
    assert_int_equal(w.cfg.vocab_size, 49152);
    assert_int_equal(w.token_embd.rows, 49152);
    assert_true(w.output_tied);
    assert_true(strstr(w.cfg.name, "49152") != NULL);
    synthetic_model_free(&w);

    assert_int_equal(synthetic_model_create("synthetic:smollm2-135m:some/tokenizer.gguf", 0, &w, &err), 0);
    assert_int_equal(w.cfg.n_kv_heads, 3);
    synthetic_model_free(&w);

    assert_int_equal(synthetic_model_create("synthetic:gpt-17", 0, &w, &err), -1);
    assert_non_null(strstr(err.msg, "gpt-17"));
    assert_non_null(strstr(err.msg, "llama3-8b"));

    char path[256];
    unsetenv("BRAID_MODEL"); /* it would name the default tokenizer */
    assert_int_equal(synthetic_model_tokenizer_path("synthetic:llama3-8b", path, sizeof path, &err), 0);
    assert_string_equal(path, SYNTHETIC_TOKENIZER_DEFAULT);
    assert_int_equal(synthetic_model_tokenizer_path("synthetic:llama3-8b:/x/y.gguf", path, sizeof path, &err), 0);
    assert_string_equal(path, "/x/y.gguf");
}

static void test_values(void **state) {
    (void)state;
    const float scale = 0.05f;
    const int n = 200000;
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++) {
        uint16_t h = synthetic_weight_bf16(0x1234, (uint64_t)i, scale);
        assert_int_equal(h, synthetic_weight_bf16(0x1234, (uint64_t)i, scale));
        float v = bf16_to_fp32(h);
        assert_true(fabsf(v) <= scale * 1.004f); /* bf16 rounding may cross the bound by half an ulp */
        sum += v;
        sq += (double)v * v;
    }
    double mean = sum / n, var = sq / n - mean * mean;
    assert_true(fabs(mean) < 0.01 * scale);
    assert_true(fabs(var / (scale * scale / 3.0) - 1.0) < 0.02);
    /* another seed gives other values */
    int same = 0;
    for (int i = 0; i < 1000; i++) same += synthetic_weight_bf16(1, (uint64_t)i, scale) == synthetic_weight_bf16(2, (uint64_t)i, scale);
    assert_true(same < 50);
}

static uint16_t *fill(const WeightMatrix *m) {
    uint16_t *out = malloc((size_t)m->rows * m->cols * 2);
    assert_non_null(out);
    synthetic_matrix_fill_bf16(m, out);
    return out;
}

/* The shard's matrix equals rows [r0, r0 + part rows) x cols [c0, c0 + part cols) of the whole. */
static void assert_sub_matrix(const WeightMatrix *whole, const WeightMatrix *part, int64_t r0, int64_t c0) {
    uint16_t *a = fill(whole), *b = fill(part);
    for (int64_t r = 0; r < part->rows; r++)
        for (int64_t c = 0; c < part->cols; c++)
            if (a[(r0 + r) * whole->cols + c0 + c] != b[r * part->cols + c]) fail_msg("%s differs at (%lld, %lld)", part->name, (long long)r, (long long)c);
    free(a);
    free(b);
}

static void test_tp_slices(void **state) {
    (void)state;
    ModelWeights w;
    BraidError err;
    assert_int_equal(synthetic_model_create("synthetic:smollm2-135m", 0, &w, &err), 0);
    for (int rank = 0; rank < 2; rank++) {
        ModelWeights shard;
        TpShardRange r;
        if (model_weights_shard(&w, rank, 2, &shard, &err)) fail_msg("%s", err.msg);
        assert_int_equal(tp_shard_range(&w.cfg, TENSOR_BF16, rank, 2, &r, &err), 0);
        const LayerWeights *W = &w.layers[3], *S = &shard.layers[3];
        int hd = w.cfg.head_dim;
        assert_null(S->wq.data);
        assert_sub_matrix(&W->wq, &S->wq, (int64_t)r.head_lo * hd, 0);
        assert_sub_matrix(&W->wk, &S->wk, (int64_t)r.kv_head_lo * hd, 0);
        assert_sub_matrix(&W->w_gate, &S->w_gate, r.ff_lo, 0);
        assert_sub_matrix(&W->wo, &S->wo, 0, (int64_t)r.head_lo * hd);
        assert_sub_matrix(&W->w_down, &S->w_down, 0, r.ff_lo);
        model_weights_free(&shard);
    }
    synthetic_model_free(&w);
}

static void run_prompt(const BraidModel *m, const int32_t *ids, int n, float *logits) {
    SequenceRunner r;
    BraidError err;
    if (sequence_runner_init_math(&r, &m->weights, n + 8, BACKEND_CPU, CPU_MATMUL_FP32, &err)) fail_msg("%s", err.msg);
    if (sequence_runner_eval(&r, ids, n, false, logits, &err)) fail_msg("%s", err.msg);
    for (int s = 0; s < 4; s++) { /* a short greedy continuation through the decode path */
        int32_t next = sampler_argmax(logits, m->weights.cfg.vocab_size);
        assert_true(next >= 0 && next < m->tokenizer.n_vocab);
        if (sequence_runner_eval(&r, &next, 1, false, logits, &err)) fail_msg("%s", err.msg);
    }
    sequence_runner_free(&r);
}

static void test_load_and_run_on_cpu(void **state) {
    (void)state;
    char spec[4200];
    snprintf(spec, sizeof spec, "synthetic:smollm2-135m:%s", test_model_path());
    BraidModel m;
    BraidError err;
    if (braid_model_load(spec, &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.weights.cfg.vocab_size, m.tokenizer.n_vocab);
    assert_true(synthetic_model_has_unmaterialized(&m.weights));
    TokenList ids = {0};
    const char *text = "The synthetic model reads real tokens.";
    assert_int_equal(tokenizer_encode(&m.tokenizer, text, strlen(text), false, m.tokenizer.add_bos, &ids, &err), 0);
    int vocab = m.weights.cfg.vocab_size;
    float *a = malloc((size_t)vocab * sizeof *a), *b = malloc((size_t)vocab * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    run_prompt(&m, ids.ids, ids.n, a);
    run_prompt(&m, ids.ids, ids.n, b);
    double lo = a[0], hi = a[0];
    for (int v = 0; v < vocab; v++) {
        assert_false(isnan(a[v]) || isinf(a[v]));
        assert_true(a[v] == b[v]); /* deterministic: the same generated weights both times */
        lo = fmin(lo, a[v]);
        hi = fmax(hi, a[v]);
    }
    fprintf(stderr, "synthetic smollm2-135m: logits in [%.3f, %.3f]\n", lo, hi);
    assert_true(hi - lo > 1e-3);
    free(a);
    free(b);
    free(ids.ids);
    braid_model_free(&m);

    /* A missing tokenizer file is named in the error. */
    assert_int_equal(braid_model_load("synthetic:smollm2-135m:/nonexistent/tok.gguf", &m, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/tok.gguf"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_tp_slices),
        cmocka_unit_test(test_load_and_run_on_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
