/*
 * The qwen2 and qwen3 architectures against HF transformers on the same weights: tiny synthetic
 * models (the .gguf files in tests/golden/arch, random weights, 2 layers, GQA) whose reference logits
 * transformers computed (tools/golden/make_arch_golden.py). Variants: qwen2 in F32 (Q/K/V bias,
 * NEOX RoPE, tied head), qwen3 in F16 (per-head Q/K RMSNorm, head_dim 64 ≠ 64 / 4 heads), qwen3 in
 * Q8_0 (the int8 kernels' type, one KV head), qwen2 with Q5_K matrices, a Q8_0 V and head and a
 * Q5_0 embedding (the mix of a Q4_K_M file). Per variant and CPU arithmetic, every prompt's top-20
 * reference logits at every position agree within the bounds below, and the greedy continuation
 * (teacher-forced) matches wherever the reference's top-2 margin is clear. A prompt of 150 tokens
 * takes RoPE well past position 0.
 * Also: the qwen2 pre-tokenizer against HF tokenizers' split of the tokenizer corpus
 * (pretokenize_qwen2.jsonl), the same model under tensor parallelism (2 in-process ranks: the
 * biases follow their rows), ROTATE against a forward at shifted positions (the NEOX pairing), and
 * the refusal of an unknown architecture by name.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "golden_io.h"
#include "kernels/cpu/matmul.h"
#include "model/model.h"
#include "model/pretokenize.h"
#include "model/tensor_types.h"
#include "model/weight_shard.h"
#include "test_paths.h"
#include "transport/tp_collective.h"
#include "worker/backend.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

typedef struct {
    const char *name;
    CpuMatmulMath math;
    double max_diff, mean_diff; /* over the top-20 logits of every prompt position */
    double clear_margin;        /* argmax (prompt positions, greedy steps) must match wherever the reference's top-2 margin is at least this */
    double min_top1;            /* share of all prompt positions whose argmax is the reference's top-1 */
} Bounds;

/* fp32: the fp16 KV cache's rounding only: measured worst 4.4e-2 (mean 5.4e-3) on qwen2-tiny-f32,
 * whose logits reach 25 (fp16 keeps ~3 decimal digits of K and V), under 1e-2 on the others. int8
 * rounds the inputs of the Q8_0 matrices (the q8_0 and q5_k variants) to 8 bits per block. */
static const Bounds FP32 = {"fp32", CPU_MATMUL_FP32, 8e-2, 1e-2, 0.05, 0.98};
static const Bounds INT8 = {"int8", CPU_MATMUL_INT8, 0.8, 0.12, 0.5, 0.93};

static const char *const VARIANTS[] = {"qwen2-tiny-f32", "qwen3-tiny-f16", "qwen3-tiny-q8_0", "qwen2-tiny-q5_k"};

static char *arch_path(const char *variant, const char *ext) {
    static char path[4][1024];
    static int next;
    char name[256];
    snprintf(name, sizeof name, "arch/%s.%s", variant, ext);
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s", test_golden_path(name));
    return p;
}

static void check_variant(const char *variant, const Bounds *b) {
    BraidModel model;
    BraidError err;
    if (braid_model_load(arch_path(variant, "gguf"), &model, &err)) fail_msg("%s: %s", variant, err.msg);
    json_t *prompts = golden_read_jsonl(arch_path(variant, "jsonl"));
    assert_non_null(prompts);
    const ModelConfig *c = &model.weights.cfg;
    int vocab = c->vocab_size, top1 = 0, positions = 0, ties = 0, steps = 0;
    double worst = 0, worst_mean = 0;
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        json_t *p = json_array_get(prompts, i);
        const char *name = json_string_value(json_object_get(p, "name"));
        int n, n_greedy;
        int32_t *ids = golden_int_array(json_object_get(p, "ids"), &n);
        int32_t *greedy = golden_int_array(json_object_get(p, "greedy"), &n_greedy);
        SequenceRunner runner;
        assert_int_equal(sequence_runner_init_math(&runner, &model.weights, n + n_greedy + 1, BACKEND_CPU, b->math, &err), 0);
        float *logits = malloc((size_t)n * vocab * sizeof *logits), *scratch = malloc((size_t)vocab * sizeof *scratch);
        assert_true(logits && scratch);
        assert_int_equal(sequence_runner_eval(&runner, ids, n, true, logits, &err), 0);
        double mean, max_diff = golden_compare_top_logits(p, logits, n, vocab, &mean);
        /* Prompt positions: the argmax is the reference's top-1 wherever its top-2 margin is clear. */
        json_t *top_ids = json_object_get(p, "top_ids"), *top_logits = json_object_get(p, "top_logits");
        for (int pos = 0; pos < n; pos++) {
            json_t *vals = json_array_get(top_logits, (size_t)pos);
            double gap = json_number_value(json_array_get(vals, 0)) - json_number_value(json_array_get(vals, 1));
            int agree = sampler_argmax(logits + (size_t)pos * vocab, vocab) ==
                        (int)json_integer_value(json_array_get(json_array_get(top_ids, (size_t)pos), 0));
            top1 += agree;
            if (!agree && gap >= b->clear_margin) fail_msg("%s %s %s: position %d's argmax differs (margin %.3g)", variant, b->name, name, pos, gap);
        }
        positions += n;
        char label[128];
        snprintf(label, sizeof label, "%s %s %s", variant, b->name, name);
        int t = 0, t_agree = 0;
        int mismatches = golden_greedy_mismatches(&runner, p, logits + (size_t)(n - 1) * vocab, scratch, vocab, b->clear_margin,
                                                  label, &t, &t_agree);
        fprintf(stderr, "arch golden %-34s %4d tokens, max |diff| %.2e, mean %.2e; greedy %d/%d match, %d near-ties (%d agree)\n",
                label, n, max_diff, mean, n_greedy - mismatches - t, n_greedy, t, t_agree);
        if (max_diff > worst) worst = max_diff;
        if (mean > worst_mean) worst_mean = mean;
        ties += t;
        steps += n_greedy;
        assert_true(max_diff <= b->max_diff);
        assert_true(mean <= b->mean_diff);
        assert_int_equal(mismatches, 0);
        sequence_runner_free(&runner);
        free(logits);
        free(scratch);
        free(ids);
        free(greedy);
    }
    fprintf(stderr, "arch golden %s %s (%s, %s pairing%s%s): worst |diff| %.2e (mean %.2e), top-1 %d/%d, %d of %d greedy near-ties\n",
            variant, b->name, c->arch, rope_pairing_name(c->rope_pairing), c->qkv_bias ? ", QKV bias" : "",
            c->qk_norm ? ", Q/K norm" : "", worst, worst_mean, top1, positions, ties, steps);
    assert_true(top1 >= b->min_top1 * positions);
    json_decref(prompts);
    braid_model_free(&model);
}

static void test_fp32_logits_and_greedy(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof VARIANTS / sizeof VARIANTS[0]; i++) check_variant(VARIANTS[i], &FP32);
}

static void test_int8_logits_and_greedy(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof VARIANTS / sizeof VARIANTS[0]; i++) check_variant(VARIANTS[i], &INT8);
}

/* What each architecture's config says about its structure. */
static void test_arch_configs(void **state) {
    (void)state;
    BraidModel m;
    BraidError err;
    assert_int_equal(braid_model_load(arch_path("qwen2-tiny-q5_k", "gguf"), &m, &err), 0);
    assert_string_equal(m.weights.cfg.arch, "qwen2");
    assert_int_equal(m.weights.cfg.rope_pairing, ROPE_PAIRING_HALF_SPLIT);
    assert_true(m.weights.cfg.qkv_bias && !m.weights.cfg.qk_norm);
    assert_non_null(m.weights.layers[1].bk);
    assert_int_equal(m.weights.layers[0].wq.type, TENSOR_Q5_K);
    assert_int_equal(m.weights.token_embd.type, TENSOR_Q5_0);
    assert_string_equal(m.tokenizer.pre_name, "qwen2");
    braid_model_free(&m);
    assert_int_equal(braid_model_load(arch_path("qwen3-tiny-f16", "gguf"), &m, &err), 0);
    assert_int_equal(m.weights.cfg.head_dim, 64);
    assert_int_equal(m.weights.cfg.dim, 64);
    assert_true(m.weights.cfg.qk_norm && !m.weights.cfg.qkv_bias);
    assert_null(m.weights.layers[0].bq);
    assert_non_null(m.weights.layers[1].k_norm);
    braid_model_free(&m);
}

/* A minimal GGUF of architecture `arch` with the llama keys under that prefix. */
static uint8_t *arch_file(const char *arch, size_t *size) {
    GgufWriter w;
    gw_init(&w);
    char key[128];
    gw_kv_str(&w, "general.architecture", arch);
    snprintf(key, sizeof key, "%s.block_count", arch);
    gw_kv_u32(&w, key, 1);
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    gw_kv_u32(&w, key, 32);
    snprintf(key, sizeof key, "%s.feed_forward_length", arch);
    gw_kv_u32(&w, key, 64);
    snprintf(key, sizeof key, "%s.attention.head_count", arch);
    gw_kv_u32(&w, key, 2);
    snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
    gw_kv_u32(&w, key, 1024);
    gw_kv_array_begin(&w, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, 2);
    gw_arr_str(&w, "a");
    gw_arr_str(&w, "b");
    return gw_finish(&w, size);
}

static void test_unknown_architecture_refused(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = arch_file("gemma3", &size);
    GgufFile *f = NULL;
    BraidError err;
    assert_int_equal(gguf_open_memory(bytes, size, &f, &err), 0);
    ModelConfig cfg;
    assert_int_equal(model_config_from_gguf(f, &cfg, &err), -1);
    assert_non_null(strstr(err.msg, "'gemma3'"));
    assert_non_null(strstr(err.msg, "qwen2"));
    gguf_close(f);
    free(bytes);
    /* A llama file with a sliding window (Mistral 7B v0.1) keeps its context within the window. */
    bytes = arch_file("llama", &size);
    assert_int_equal(gguf_open_memory(bytes, size, &f, &err), 0);
    assert_int_equal(model_config_from_gguf(f, &cfg, &err), 0);
    assert_int_equal(cfg.sliding_window, 1024);
    assert_int_equal(cfg.context_length, 1024);
    assert_int_equal(cfg.rope_pairing, ROPE_PAIRING_INTERLEAVED);
    gguf_close(f);
    free(bytes);
}

/* ---- the qwen2 pre-tokenizer against HF tokenizers ---- */

typedef struct {
    json_t *words;
    size_t at;
    int bad;
} SplitCheck;

static int check_word(void *user, const char *word, size_t len) {
    SplitCheck *s = user;
    json_t *want = json_array_get(s->words, s->at++);
    if (!want || json_string_length(want) != len || memcmp(json_string_value(want), word, len) != 0) s->bad = 1;
    return 0;
}

static void test_qwen2_pretokenizer_matches_hf(void **state) {
    (void)state;
    json_t *lines = golden_read_jsonl(test_golden_path("arch/pretokenize_qwen2.jsonl"));
    assert_non_null(lines);
    assert_true(json_array_size(lines) >= 80);
    int failures = 0;
    for (size_t i = 0; i < json_array_size(lines); i++) {
        json_t *l = json_array_get(lines, i);
        json_t *text = json_object_get(l, "text");
        SplitCheck s = {.words = json_object_get(l, "words")};
        assert_int_equal(pretokenize(PRETOKENIZER_QWEN2, json_string_value(text), json_string_length(text), check_word, &s), 0);
        if (s.bad || s.at != json_array_size(s.words)) {
            fprintf(stderr, "  qwen2 split differs from HF for \"%s\"\n", json_string_value(text));
            failures++;
        }
    }
    fprintf(stderr, "qwen2 pre-tokenizer: %zu strings, %d differ from HF tokenizers\n", json_array_size(lines), failures);
    assert_int_equal(failures, 0);
    json_decref(lines);
}

/* ---- tensor parallelism: two ranks in threads, summing through shared memory ---- */

typedef struct {
    pthread_barrier_t barrier;
    float *parts[2];
} SharedSum;

typedef struct {
    SharedSum *shared;
} ThreadSum;

static int thread_allreduce(TpCollective *c, float *buf, size_t n, BraidError *err) {
    (void)err;
    SharedSum *s = ((ThreadSum *)c->impl)->shared;
    s->parts[c->rank] = buf;
    pthread_barrier_wait(&s->barrier);
    float *mine = malloc(n * sizeof *mine);
    for (size_t i = 0; i < n; i++) mine[i] = s->parts[0][i] + s->parts[1][i];
    pthread_barrier_wait(&s->barrier); /* both have read both parts */
    memcpy(buf, mine, n * sizeof *mine);
    free(mine);
    return 0;
}

static void thread_destroy(TpCollective *c) { (void)c; }
static const TpCollectiveOps THREAD_OPS = {"threads", thread_allreduce, thread_destroy};

typedef struct {
    const ModelWeights *shard;
    TpCollective tp;
    const int32_t *ids;
    int n;
    float *logits; /* (n, vocab) */
    int rc;
    char msg[512];
} RankRun;

static void *run_rank(void *arg) {
    RankRun *r = arg;
    BraidError err;
    BackendConfig cfg = backend_config_default(BACKEND_CPU, &r->shard->cfg, 32, 16, 256);
    cfg.tp = &r->tp;
    cfg.cpu_matmul = CPU_MATMUL_FP32;
    Backend b;
    r->rc = backend_create(&b, r->shard, &cfg, &err);
    if (r->rc == 0) {
        int32_t pos[256], slots[256], rows[256], start[2] = {0, r->n}, ctx = r->n, argmax[256];
        int32_t table[32];
        for (int i = 0; i < 32; i++) table[i] = i + 1 < 32 ? i + 1 : 0;
        for (int t = 0; t < r->n; t++) {
            pos[t] = t;
            slots[t] = 16 + t; /* block 1 onward */
            rows[t] = t;
        }
        const int32_t *tables[1] = {table};
        ForwardBatch fb = {.n_tokens = r->n, .n_seqs = 1, .tokens = r->ids, .positions = pos, .slot_mapping = slots,
                           .seq_start = start, .seq_n_ctx = &ctx, .block_tables = tables, .n_logits = r->n, .logit_rows = rows};
        ForwardOutput out = {.argmax = argmax, .logits = r->logits};
        r->rc = backend_forward(&b, &fb, &out, &err);
        backend_destroy(&b);
    }
    if (r->rc) snprintf(r->msg, sizeof r->msg, "%s", err.msg);
    return NULL;
}

static void test_tensor_parallel_qwen2(void **state) {
    (void)state;
    BraidModel m;
    BraidError err;
    assert_int_equal(braid_model_load(arch_path("qwen2-tiny-f32", "gguf"), &m, &err), 0);
    json_t *prompts = golden_read_jsonl(arch_path("qwen2-tiny-f32", "jsonl"));
    json_t *p = json_array_get(prompts, 1);
    int n, vocab = m.weights.cfg.vocab_size;
    int32_t *ids = golden_int_array(json_object_get(p, "ids"), &n);
    ModelWeights shards[2];
    SharedSum shared;
    pthread_barrier_init(&shared.barrier, NULL, 2);
    ThreadSum impl = {&shared};
    RankRun runs[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        assert_int_equal(model_weights_shard(&m.weights, r, 2, &shards[r], &err), 0);
        runs[r] = (RankRun){.shard = &shards[r], .tp = {.ops = &THREAD_OPS, .rank = r, .size = 2, .impl = &impl}, .ids = ids, .n = n,
                            .logits = malloc((size_t)n * vocab * sizeof(float))};
        /* The shard's bias is its own heads' slice of the whole bias. */
        assert_true(shards[r].layers[0].bk == m.weights.layers[0].bk + (size_t)r * m.weights.cfg.head_dim);
    }
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, run_rank, &runs[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        if (runs[r].rc) fail_msg("rank %d: %s", r, runs[r].msg);
    double mean, max_diff = golden_compare_top_logits(p, runs[0].logits, n, vocab, &mean);
    fprintf(stderr, "arch golden qwen2-tiny-f32 fp32 --tp 2: %d tokens, max |diff| %.2e, mean %.2e\n", n, max_diff, mean);
    assert_true(max_diff <= FP32.max_diff && mean <= FP32.mean_diff);
    assert_memory_equal(runs[0].logits, runs[1].logits, (size_t)n * vocab * sizeof(float));
    for (int r = 0; r < 2; r++) {
        free(runs[r].logits);
        model_weights_free(&shards[r]);
    }
    pthread_barrier_destroy(&shared.barrier);
    free(ids);
    json_decref(prompts);
    braid_model_free(&m);
}

/* ---- ROTATE with the architecture's pairing: a block's keys turned by Δ are the keys a forward
 * at positions shifted by Δ stores (RoPE attention depends on relative positions only, so every
 * layer's unrotated keys agree up to rounding) ---- */

static void forward_into_block(Backend *b, const int32_t *ids, int n, int32_t pos0, int32_t block) {
    int32_t pos[16], slots[16], argmax[16], row = n - 1, start[2] = {0, n}, ctx = n;
    for (int t = 0; t < n; t++) {
        pos[t] = pos0 + t;
        slots[t] = block * 16 + t;
    }
    const int32_t *tables[1] = {&block};
    ForwardBatch fb = {.n_tokens = n, .n_seqs = 1, .tokens = ids, .positions = pos, .slot_mapping = slots, .seq_start = start,
                       .seq_n_ctx = &ctx, .block_tables = tables, .n_logits = 1, .logit_rows = &row};
    ForwardOutput out = {.argmax = argmax};
    BraidError err;
    if (backend_forward(b, &fb, &out, &err)) fail_msg("%s", err.msg);
}

static void check_rotate(const char *variant) {
    BraidModel m;
    BraidError err;
    assert_int_equal(braid_model_load(arch_path(variant, "gguf"), &m, &err), 0);
    BackendConfig cfg = backend_config_default(BACKEND_CPU, &m.weights.cfg, 8, 16, 64);
    cfg.cpu_matmul = CPU_MATMUL_FP32;
    Backend b;
    if (backend_create(&b, &m.weights, &cfg, &err)) fail_msg("%s", err.msg);
    int32_t ids[16];
    for (int t = 0; t < 16; t++) ids[t] = (t * 37 + 11) % (m.weights.cfg.vocab_size - 3);
    const int32_t delta = 173;
    forward_into_block(&b, ids, 16, 5, 1);
    forward_into_block(&b, ids, 16, 5 + delta, 2);
    CacheOp op = {.kind = CACHE_OP_ROTATE, .src = 1, .dst = 0, .delta = delta};
    assert_int_equal(backend_apply_cache_ops(&b, &op, 1, &err), 0);
    const ModelConfig *c = &m.weights.cfg;
    size_t n = (size_t)c->n_layers * c->n_kv_heads * 16 * c->head_dim;
    float *rotated = malloc(n * sizeof *rotated), *shifted = malloc(n * sizeof *shifted);
    int32_t pos_r[16], pos_s[16];
    assert_int_equal(backend_read_block(&b, 1, rotated, NULL, pos_r, &err), 0);
    assert_int_equal(backend_read_block(&b, 2, shifted, NULL, pos_s, &err), 0);
    assert_memory_equal(pos_r, pos_s, sizeof pos_r);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)rotated[i] - shifted[i]));
        scale = fmax(scale, fabs((double)shifted[i]));
    }
    fprintf(stderr, "arch golden %s: ROTATE by %d vs a forward %d positions later (%s pairing): max |diff| %.2e of max |K| %.2f\n",
            variant, delta, delta, rope_pairing_name(c->rope_pairing), worst, scale);
    assert_true(worst <= 1e-2 * scale);
    free(rotated);
    free(shifted);
    backend_destroy(&b);
    braid_model_free(&m);
}

static void test_rotate_matches_shifted_forward(void **state) {
    (void)state;
    check_rotate("qwen2-tiny-f32");
    check_rotate("qwen3-tiny-f16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arch_configs),
        cmocka_unit_test(test_unknown_architecture_refused),
        cmocka_unit_test(test_qwen2_pretokenizer_matches_hf),
        cmocka_unit_test(test_fp32_logits_and_greedy),
        cmocka_unit_test(test_int8_logits_and_greedy),
        cmocka_unit_test(test_tensor_parallel_qwen2),
        cmocka_unit_test(test_rotate_matches_shifted_forward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
