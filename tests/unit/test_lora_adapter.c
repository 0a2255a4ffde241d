/*
 * test_lora_adapter.c — the LoRA adapter loader (model/lora_adapter.h) and the per-sequence LoRA
 * delta of the CPU forward (worker/lora_forward.h), on small adapters written in memory.
 *
 * Loader: a well-formed file loads (F32 and F16 tensors, rank and scale = alpha / rank, values
 * widened exactly); every kind of malformed or mismatched file is refused with a message that
 * names the file and, where one is at fault, the tensor. Delta: a mixed batch (base, adapter 1,
 * adapter 2) gets exactly y += scale · B·(A·x) on the adapted sequences' tokens and nothing on
 * the base sequence's.
 */
#include <math.h>
#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf_writer.h"
#include "model/lora_adapter.h"
#include "model/tensor_types.h"
#include "worker/lora_forward.h"

/* A tiny base model: dim 8, 2 query heads and 1 KV head of 4, so Q is 8 wide, K/V 4. */
static ModelConfig tiny_config(void) {
    ModelConfig c = {.n_layers = 2, .dim = 8, .ff_dim = 16, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .vocab_size = 32};
    snprintf(c.arch, sizeof c.arch, "llama");
    return c;
}

#define RANK 2

/* Deterministic test values in [-1, 1). */
static void fill(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((seed * 2654435761u + (unsigned)i * 40503u) % 2000u) / 1000.0f - 1.0f;
}

/* Adds the pair of projection stem in layer l: A (rank, in) and B (out, rank), as F32. */
static void add_pair(GgufWriter *w, int layer, const char *stem, int in, int out, int rank_a, int rank_b, unsigned seed) {
    char name[96];
    float a[64 * 8], b[64 * 8];
    fill(a, (size_t)rank_a * in, seed);
    fill(b, (size_t)out * rank_b, seed + 7);
    uint64_t ne_a[2] = {(uint64_t)in, (uint64_t)rank_a}, ne_b[2] = {(uint64_t)rank_b, (uint64_t)out};
    snprintf(name, sizeof name, "blk.%d.%s.weight.lora_a", layer, stem);
    gw_tensor(w, name, TENSOR_F32, 2, ne_a, a, (size_t)rank_a * in * sizeof(float));
    snprintf(name, sizeof name, "blk.%d.%s.weight.lora_b", layer, stem);
    gw_tensor(w, name, TENSOR_F32, 2, ne_b, b, (size_t)out * rank_b * sizeof(float));
}

static void adapter_header(GgufWriter *w, const char *type, const char *adapter_type, float alpha) {
    gw_init(w);
    gw_kv_str(w, "general.architecture", "llama");
    if (type) gw_kv_str(w, "general.type", type);
    if (adapter_type) gw_kv_str(w, "adapter.type", adapter_type);
    if (alpha != 0) gw_kv_f32(w, "adapter.lora.alpha", alpha);
}

/* Writes the file to a temporary path (static buffer). */
static const char *save(GgufWriter *w) {
    static char path[64];
    size_t size;
    uint8_t *bytes = gw_finish(w, &size);
    snprintf(path, sizeof path, "/tmp/braid_lora_test_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, bytes, size), (ssize_t)size);
    close(fd);
    free(bytes);
    return path;
}

/* Loads the file and expects a refusal whose message holds every given fragment. */
static void expect_refused(GgufWriter *w, const char *fragment, const char *fragment2) {
    ModelConfig c = tiny_config();
    const char *path = save(w);
    LoraAdapter ad;
    BraidError err = {{0}};
    assert_int_equal(lora_adapter_load(path, "t", &c, &ad, &err), -1);
    if (!strstr(err.msg, fragment) || (fragment2 && !strstr(err.msg, fragment2)) || !strstr(err.msg, path))
        fail_msg("message '%s' lacks '%s' / '%s' / the path", err.msg, fragment, fragment2 ? fragment2 : "");
    unlink(path);
}

static void test_loads_a_valid_adapter(void **state) {
    (void)state;
    GgufWriter w;
    adapter_header(&w, "adapter", "lora", 4.0f);
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    add_pair(&w, 0, "attn_v", 8, 4, RANK, RANK, 2);
    /* an F16 pair: values exactly representable, so the widening is checked bit for bit */
    uint16_t a16[RANK * 8], b16[8 * RANK];
    for (int i = 0; i < RANK * 8; i++) a16[i] = fp32_to_fp16(0.25f * (float)(i - 8));
    for (int i = 0; i < 8 * RANK; i++) b16[i] = fp32_to_fp16(-0.5f * (float)i);
    uint64_t ne_a[2] = {8, RANK}, ne_b[2] = {RANK, 8};
    gw_tensor(&w, "blk.1.attn_output.weight.lora_a", TENSOR_F16, 2, ne_a, a16, sizeof a16);
    gw_tensor(&w, "blk.1.attn_output.weight.lora_b", TENSOR_F16, 2, ne_b, b16, sizeof b16);
    const char *path = save(&w);
    ModelConfig c = tiny_config();
    LoraAdapter ad;
    BraidError err;
    if (lora_adapter_load(path, "coder", &c, &ad, &err)) fail_msg("%s", err.msg);
    unlink(path);
    assert_string_equal(ad.name, "coder");
    assert_int_equal(ad.rank, RANK);
    assert_float_equal(ad.alpha, 4.0f, 0);
    assert_float_equal(ad.scale, 2.0f, 0);
    const LoraPair *q0 = &ad.pairs[0 * LORA_PROJ_COUNT + LORA_PROJ_Q], *k0 = &ad.pairs[LORA_PROJ_K];
    const LoraPair *o1 = &ad.pairs[1 * LORA_PROJ_COUNT + LORA_PROJ_O];
    float want[RANK * 8];
    fill(want, RANK * 8, 1);
    assert_memory_equal(q0->a, want, sizeof want);
    assert_null(k0->a);
    assert_null(k0->b);
    assert_float_equal(o1->a[3], 0.25f * (3 - 8), 0);
    assert_float_equal(o1->b[5], -2.5f, 0);
    lora_adapter_free(&ad);
}

static void test_refuses_wrong_metadata(void **state) {
    (void)state;
    GgufWriter w;
    adapter_header(&w, "model", "lora", 4.0f);
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    expect_refused(&w, "general.type", NULL);
    adapter_header(&w, "adapter", NULL, 4.0f);
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    expect_refused(&w, "adapter.type", NULL);
    adapter_header(&w, "adapter", "control_vector", 4.0f);
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    expect_refused(&w, "adapter.type", NULL);
    adapter_header(&w, "adapter", "lora", 0);
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    expect_refused(&w, "adapter.lora.alpha", NULL);
    adapter_header(&w, "adapter", "lora", -1.0f);
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    expect_refused(&w, "adapter.lora.alpha", NULL);
    gw_init(&w);
    gw_kv_str(&w, "general.architecture", "qwen2");
    gw_kv_str(&w, "general.type", "adapter");
    gw_kv_str(&w, "adapter.type", "lora");
    gw_kv_f32(&w, "adapter.lora.alpha", 4.0f);
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    expect_refused(&w, "qwen2", "llama");
    adapter_header(&w, "adapter", "lora", 4.0f);
    expect_refused(&w, "no LoRA tensor pair", NULL);
}

/* A qwen2 base (issue 36: the same adapters trained on Qwen2.5): grouped-query attention with 4 query
 * heads and 1 KV head of 2 (Q 8 wide, K/V 2, as Qwen2.5-0.5B's 14 : 2 at head_dim 64), an adapter
 * written by tools/train_lora.py for it (general.architecture qwen2, every projection) loads; the
 * same file against a llama base, a llama adapter against the qwen2 base, and a K pair of Q's width
 * are refused. */
static void test_loads_a_qwen2_adapter(void **state) {
    (void)state;
    ModelConfig q = {.n_layers = 2, .dim = 8, .ff_dim = 16, .n_heads = 4, .n_kv_heads = 1, .head_dim = 2, .vocab_size = 32};
    snprintf(q.arch, sizeof q.arch, "qwen2");
    GgufWriter w;
    gw_init(&w);
    gw_kv_str(&w, "general.architecture", "qwen2");
    gw_kv_str(&w, "general.type", "adapter");
    gw_kv_str(&w, "adapter.type", "lora");
    gw_kv_f32(&w, "adapter.lora.alpha", 4.0f);
    for (int l = 0; l < 2; l++) {
        add_pair(&w, l, "attn_q", 8, 8, RANK, RANK, 10 + l);
        add_pair(&w, l, "attn_k", 8, 2, RANK, RANK, 20 + l);
        add_pair(&w, l, "attn_v", 8, 2, RANK, RANK, 30 + l);
        add_pair(&w, l, "attn_output", 8, 8, RANK, RANK, 40 + l);
    }
    const char *path = save(&w);
    LoraAdapter ad;
    BraidError err = {{0}};
    if (lora_adapter_load(path, "coder", &q, &ad, &err)) fail_msg("%s", err.msg);
    assert_int_equal(ad.rank, RANK);
    assert_float_equal(ad.scale, 2.0f, 0);
    for (int l = 0; l < 2; l++)
        for (int p = 0; p < LORA_PROJ_COUNT; p++) assert_non_null(ad.pairs[l * LORA_PROJ_COUNT + p].b);
    float want[2 * RANK];
    fill(want, 2 * RANK, 21 + 7); /* layer 1's K: B is (out 2, rank), stored as written (no row permutation) */
    assert_memory_equal(ad.pairs[1 * LORA_PROJ_COUNT + LORA_PROJ_K].b, want, sizeof want);
    lora_adapter_free(&ad);
    ModelConfig llama = q;
    snprintf(llama.arch, sizeof llama.arch, "llama");
    assert_int_equal(lora_adapter_load(path, "coder", &llama, &ad, &err), -1);
    assert_non_null(strstr(err.msg, "'qwen2' does not match the base model's 'llama'"));
    unlink(path);
    adapter_header(&w, "adapter", "lora", 4.0f); /* general.architecture llama */
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    path = save(&w);
    assert_int_equal(lora_adapter_load(path, "coder", &q, &ad, &err), -1);
    assert_non_null(strstr(err.msg, "'llama' does not match the base model's 'qwen2'"));
    unlink(path);
    gw_init(&w);
    gw_kv_str(&w, "general.architecture", "qwen2");
    gw_kv_str(&w, "general.type", "adapter");
    gw_kv_str(&w, "adapter.type", "lora");
    gw_kv_f32(&w, "adapter.lora.alpha", 4.0f);
    add_pair(&w, 0, "attn_k", 8, 8, RANK, RANK, 1); /* K is 2 wide on this base, not 8 */
    path = save(&w);
    assert_int_equal(lora_adapter_load(path, "coder", &q, &ad, &err), -1);
    assert_non_null(strstr(err.msg, "blk.0.attn_k.weight.lora_b"));
    unlink(path);
}

static void test_refuses_mismatched_shapes(void **state) {
    (void)state;
    GgufWriter w;
    /* A's input width is not the model's dim */
    adapter_header(&w, "adapter", "lora", 4.0f);
    add_pair(&w, 0, "attn_q", 7, 8, RANK, RANK, 1);
    expect_refused(&w, "blk.0.attn_q.weight.lora_a", "shape");
    /* B's output width is Q's, not K's */
    adapter_header(&w, "adapter", "lora", 4.0f);
    add_pair(&w, 1, "attn_k", 8, 8, RANK, RANK, 1);
    expect_refused(&w, "blk.1.attn_k.weight.lora_b", "shape");
    /* A and B of one pair disagree on the rank */
    adapter_header(&w, "adapter", "lora", 4.0f);
    add_pair(&w, 0, "attn_v", 8, 4, RANK, RANK + 1, 1);
    expect_refused(&w, "blk.0.attn_v.weight.lora_b", "rank");
    /* two pairs of different ranks */
    adapter_header(&w, "adapter", "lora", 4.0f);
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    add_pair(&w, 1, "attn_q", 8, 8, RANK + 2, RANK + 2, 1);
    expect_refused(&w, "blk.1.attn_q.weight.lora_a", "rank");
    /* A stored transposed ([rank, in] instead of [in, rank]) */
    adapter_header(&w, "adapter", "lora", 4.0f);
    float t[8 * RANK] = {0};
    uint64_t ne_t[2] = {RANK, 8}, ne_b[2] = {RANK, 8};
    gw_tensor(&w, "blk.0.attn_q.weight.lora_a", TENSOR_F32, 2, ne_t, t, sizeof t);
    gw_tensor(&w, "blk.0.attn_q.weight.lora_b", TENSOR_F32, 2, ne_b, t, sizeof t);
    expect_refused(&w, "blk.0.attn_q.weight.lora_a", "[in, rank]");
}

static void test_refuses_bad_tensor_sets(void **state) {
    (void)state;
    GgufWriter w;
    float a[RANK * 8] = {0};
    uint64_t ne_a[2] = {8, RANK};
    /* half a pair */
    adapter_header(&w, "adapter", "lora", 4.0f);
    gw_tensor(&w, "blk.0.attn_q.weight.lora_a", TENSOR_F32, 2, ne_a, a, sizeof a);
    expect_refused(&w, "blk.0.attn_q.weight.lora_b", "missing");
    /* a layer the model does not have */
    adapter_header(&w, "adapter", "lora", 4.0f);
    add_pair(&w, 2, "attn_q", 8, 8, RANK, RANK, 1);
    expect_refused(&w, "blk.2.attn_q.weight.lora_a", "2-layer");
    /* a projection Braid does not adapt (it would be silently ignored otherwise) */
    adapter_header(&w, "adapter", "lora", 4.0f);
    add_pair(&w, 0, "ffn_up", 8, 16, RANK, RANK, 1);
    expect_refused(&w, "blk.0.ffn_up.weight.lora_a", "not an attention LoRA tensor");
    /* a quantized tensor */
    adapter_header(&w, "adapter", "lora", 4.0f);
    BlockQ8_0 q[RANK] = {{0}};
    uint64_t ne_q[2] = {32, RANK};
    gw_tensor(&w, "blk.0.attn_q.weight.lora_a", TENSOR_Q8_0, 2, ne_q, q, sizeof q);
    expect_refused(&w, "blk.0.attn_q.weight.lora_a", "Q8_0");
    /* a NaN weight (an F16 half the fuzzer made): it would poison every sequence using the adapter */
    adapter_header(&w, "adapter", "lora", 4.0f);
    uint16_t a16[RANK * 8] = {0}, b16[8 * RANK] = {0};
    b16[5] = 0x7E00; /* F16 NaN */
    uint64_t ne_b[2] = {RANK, 8};
    gw_tensor(&w, "blk.0.attn_q.weight.lora_a", TENSOR_F16, 2, ne_a, a16, sizeof a16);
    gw_tensor(&w, "blk.0.attn_q.weight.lora_b", TENSOR_F16, 2, ne_b, b16, sizeof b16);
    expect_refused(&w, "blk.0.attn_q.weight.lora_b", "non-finite");
}

static void test_set_specs_and_lookup(void **state) {
    (void)state;
    GgufWriter w;
    adapter_header(&w, "adapter", "lora", 2.0f);
    add_pair(&w, 0, "attn_q", 8, 8, RANK, RANK, 1);
    const char *path = save(&w);
    ModelConfig c = tiny_config();
    LoraSet set = {0};
    BraidError err;
    char spec[128];
    assert_int_equal(lora_set_add_spec(&set, "coder", &c, &err), -1);
    assert_non_null(strstr(err.msg, "NAME=PATH"));
    assert_int_equal(lora_set_add_spec(&set, "=x.gguf", &c, &err), -1);
    assert_int_equal(lora_set_add_spec(&set, "coder=/nonexistent/x.gguf", &c, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/x.gguf"));
    snprintf(spec, sizeof spec, "coder=%s", path);
    assert_int_equal(lora_set_add_spec(&set, spec, &c, &err), 0);
    snprintf(spec, sizeof spec, "tester=%s", path);
    assert_int_equal(lora_set_add_spec(&set, spec, &c, &err), 0);
    snprintf(spec, sizeof spec, "coder=%s", path);
    assert_int_equal(lora_set_add_spec(&set, spec, &c, &err), -1);
    assert_non_null(strstr(err.msg, "twice"));
    unlink(path);
    assert_int_equal(set.n, 2);
    assert_int_equal(lora_set_find(&set, NULL), 0);
    assert_int_equal(lora_set_find(&set, ""), 0);
    assert_int_equal(lora_set_find(&set, "coder"), 1);
    assert_int_equal(lora_set_find(&set, "tester"), 2);
    assert_int_equal(lora_set_find(&set, "planner"), -1);
    assert_int_equal(lora_set_find(NULL, "coder"), -1);
    assert_ptr_equal(lora_set_get(&set, 2), &set.adapters[1]);
    assert_null(lora_set_get(&set, 0));
    assert_null(lora_set_get(&set, 3));
    lora_set_free(&set);
}

/* y += scale · B·(A·x) per adapted sequence, in double for the reference. */
static void reference_delta(const LoraAdapter *ad, int layer, LoraProj p, const float *x, int in, double *y, int out) {
    const LoraPair *pair = &ad->pairs[(size_t)layer * LORA_PROJ_COUNT + p];
    for (int o = 0; o < out; o++) {
        double sum = 0;
        for (int r = 0; r < ad->rank; r++) {
            double u = 0;
            for (int i = 0; i < in; i++) u += (double)pair->a[(size_t)r * in + i] * x[i];
            sum += (double)pair->b[(size_t)o * ad->rank + r] * u;
        }
        y[o] += ad->scale * sum;
    }
}

static void test_mixed_batch_delta(void **state) {
    (void)state;
    ModelConfig c = tiny_config();
    LoraSet set = {0};
    BraidError err;
    char spec[128];
    const char *names[2] = {"one", "two"};
    for (int k = 0; k < 2; k++) {
        GgufWriter w;
        adapter_header(&w, "adapter", "lora", 3.0f + (float)k);
        add_pair(&w, 1, "attn_q", 8, 8, RANK, RANK, 10u + (unsigned)k);
        const char *path = save(&w);
        snprintf(spec, sizeof spec, "%s=%s", names[k], path);
        if (lora_set_add_spec(&set, spec, &c, &err)) fail_msg("%s", err.msg);
        unlink(path);
    }
    /* 3 sequences: adapter 2 (2 tokens), base (1 token), adapter 1 (3 tokens) */
    enum { N = 6 };
    int32_t seq_start[4] = {0, 2, 3, 6}, seq_adapter[3] = {2, 0, 1};
    ForwardBatch b = {.n_tokens = N, .n_seqs = 3, .seq_start = seq_start, .seq_adapter = seq_adapter};
    float x[N * 8], y[N * 8], y0[N * 8];
    fill(x, N * 8, 3);
    fill(y0, N * 8, 4);
    memcpy(y, y0, sizeof y);
    assert_int_equal(lora_forward_check_batch(&set, &b, &err), 0);
    lora_forward_add(&set, &b, &c, 0, LORA_PROJ_Q, x, y); /* layer 0 has no pair: nothing changes */
    assert_memory_equal(y, y0, sizeof y);
    lora_forward_add(&set, &b, &c, 1, LORA_PROJ_Q, x, y);
    for (int t = 0; t < N; t++) {
        double want[8];
        for (int o = 0; o < 8; o++) want[o] = y0[t * 8 + o];
        int id = seq_adapter[t < 2 ? 0 : t < 3 ? 1 : 2];
        if (id) reference_delta(lora_set_get(&set, id), 1, LORA_PROJ_Q, x + t * 8, 8, want, 8);
        for (int o = 0; o < 8; o++) assert_float_equal(y[t * 8 + o], want[o], 1e-5);
        if (!id) assert_memory_equal(y + t * 8, y0 + t * 8, 8 * sizeof(float));
        else assert_true(fabs(y[t * 8] - y0[t * 8]) + fabs(y[t * 8 + 1] - y0[t * 8 + 1]) > 1e-4);
    }
    seq_adapter[1] = 3;
    assert_int_equal(lora_forward_check_batch(&set, &b, &err), -1);
    assert_non_null(strstr(err.msg, "adapter id 3"));
    lora_set_free(&set);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loads_a_valid_adapter),  cmocka_unit_test(test_refuses_wrong_metadata),
        cmocka_unit_test(test_refuses_mismatched_shapes), cmocka_unit_test(test_refuses_bad_tensor_sets),
        cmocka_unit_test(test_set_specs_and_lookup),   cmocka_unit_test(test_mixed_batch_delta),
        cmocka_unit_test(test_loads_a_qwen2_adapter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
