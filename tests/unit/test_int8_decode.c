/*
 * The int8 matmul path (kernels/cpu/act_quant.h, quant_int8.h, matmul_int8.h):
 *   - activations quantize to the documented values and layouts;
 *   - every kernel (8 / 16 tokens in lanes, one token at a time, the portable reference) equals,
 *     bit for bit, the canonical sequence computed here from integer block sums taken straight from
 *     the GGUF formats, including extreme weights and activations;
 *   - the result stays within the activation-rounding bound of the fp32 dot product;
 *   - cpu_matmul in int8 gives each token the same bits whatever batch it is in;
 *   - on the real model, the engine with int8 stays close to the engine with fp32 (logits and
 *     greedy continuations of the golden prompts).
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

#include "golden_io.h"
#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_int8.h"
#include "model/tensor_types.h"
#include "worker/backend.h"
#include "worker/engine.h"

static uint64_t rng_state = 2026;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float rnd_float(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() % 1000000) / 1000000.0f; }

static const uint32_t TYPES[] = {TENSOR_Q4_0, TENSOR_Q4_1, TENSOR_Q8_0};
#define N_TYPES 3

/* ---- helpers: the formats, decoded here independently of the kernels ---------------------------- */

/* Integer weight j of block b and the block's fp32 scale and offset. */
static int weight_int(uint32_t type, const uint8_t *row, int64_t b, int j, float *d, float *m) {
    *m = 0.0f;
    if (type == TENSOR_Q8_0) {
        const BlockQ8_0 *blk = (const BlockQ8_0 *)row + b;
        *d = fp16_to_fp32(blk->d);
        return blk->qs[j];
    }
    const uint8_t *qs;
    if (type == TENSOR_Q4_0) {
        const BlockQ4_0 *blk = (const BlockQ4_0 *)row + b;
        *d = fp16_to_fp32(blk->d);
        qs = blk->qs;
    } else {
        const BlockQ4_1 *blk = (const BlockQ4_1 *)row + b;
        *d = fp16_to_fp32(blk->d);
        *m = fp16_to_fp32(blk->m);
        qs = blk->qs;
    }
    int nib = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
    return type == TENSOR_Q4_0 ? nib - 8 : nib;
}

/* A random row of `type`; `extreme` uses only the largest magnitudes the format allows. */
static void random_row(uint32_t type, uint8_t *row, int64_t n, bool extreme) {
    for (int64_t b = 0; b < n / 32; b++) {
        uint16_t d = fp32_to_fp16(rnd_float(0.001f, 0.05f)), m = fp32_to_fp16(rnd_float(-0.5f, 0.5f));
        if (type == TENSOR_Q8_0) {
            BlockQ8_0 *blk = (BlockQ8_0 *)row + b;
            blk->d = d;
            for (int j = 0; j < 32; j++) blk->qs[j] = (int8_t)(extreme ? (rnd() % 2 ? 127 : -128) : (int)(rnd() % 256) - 128);
        } else {
            uint8_t *qs;
            if (type == TENSOR_Q4_0) {
                BlockQ4_0 *blk = (BlockQ4_0 *)row + b;
                blk->d = d;
                qs = blk->qs;
            } else {
                BlockQ4_1 *blk = (BlockQ4_1 *)row + b;
                blk->d = d;
                blk->m = m;
                qs = blk->qs;
            }
            for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(extreme ? (rnd() % 2 ? 0xFF : 0x00) : rnd() % 256);
        }
    }
}

/* Activations with varied block magnitudes, an all-zero block, and (extreme) ±max values. */
static void random_activations(float *x, int n_tokens, int64_t cols, bool extreme) {
    for (int t = 0; t < n_tokens; t++)
        for (int64_t b = 0; b < cols / 32; b++) {
            float scale = b == 1 ? 0.0f : rnd_float(0.01f, 4.0f);
            for (int j = 0; j < 32; j++)
                x[t * cols + b * 32 + j] = extreme ? (rnd() % 2 ? scale : -scale) : scale * rnd_float(-1.0f, 1.0f);
        }
}

/* The canonical sequence of quant_int8.h, from integer sums computed here. */
static float expected_value(uint32_t type, const uint8_t *row, const Int8Activations *a, int t) {
    float acc = 0.0f, off = 0.0f;
    for (int b = 0; b < a->nb; b++) {
        const int8_t *x = a->rows + (size_t)t * a->cols + (size_t)b * 32;
        size_t mi = act_quant_meta_index(a, t, b);
        int64_t isum = 0;
        float d_w, m_w;
        for (int j = 0; j < 32; j++) isum += (int64_t)weight_int(type, row, b, j, &d_w, &m_w) * x[j];
        float s = d_w * a->d[mi];
        acc = fmaf((float)isum, s, acc);
        off = fmaf(m_w, a->dsum[mi], off);
    }
    return type == TENSOR_Q4_1 ? acc + off : acc;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ---- activation quantization ------------------------------------------------------------------- */

static void test_activation_quantization(void **state) {
    (void)state;
    const int cols = 96, n_tokens = 11; /* 2 groups: the second has 5 padding tokens */
    float x[11 * 96];
    random_activations(x, n_tokens, cols, false);
    x[3 * cols + 5] = 1e-30f; /* a tiny value among large ones rounds to 0 */
    Int8Activations a = {0};
    assert_int_equal(act_quant_fill(&a, x, n_tokens, cols), 0);
    assert_int_equal(a.n_groups, 2);
    for (int t = 0; t < 16; t++)
        for (int b = 0; b < cols / 32; b++) {
            size_t mi = act_quant_meta_index(&a, t, b);
            float amax = 0.0f;
            for (int j = 0; t < n_tokens && j < 32; j++) amax = fmaxf(amax, fabsf(x[t * cols + b * 32 + j]));
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int32_t sum = 0;
            for (int j = 0; j < 32; j++) {
                int want = t < n_tokens ? (int)nearbyintf(x[t * cols + b * 32 + j] * inv) : 0;
                int8_t got = a.rows[t * cols + b * 32 + j];
                assert_int_equal(got, want);
                assert_true(got >= -127);
                /* lane t % 8 of run j / 4 in the token's group */
                int8_t il = a.interleaved[((size_t)((t / 8) * a.nb + b) * 8 + j / 4) * 32 + 4 * (t % 8) + j % 4];
                assert_int_equal(il, got);
                sum += got;
            }
            assert_true(same_bits(a.d[mi], t < n_tokens ? amax / 127.0f : 0.0f));
            assert_int_equal(a.sum[mi], sum);
            assert_true(same_bits(a.dsum[mi], a.d[mi] * (float)sum));
        }
    act_quant_free(&a);
}

/* ---- the kernels against the canonical sequence ------------------------------------------------ */

/* Every token of a batch through the lane kernels (1 and 2 groups; one row, and two rows in either order), the one-token kernel (1..4 at
 * a time) and the reference, each compared bit for bit with expected_value. */
static void check_all_kernels(uint32_t type, const uint8_t *row, const uint8_t *other_row, const Int8Activations *a) {
    float out[QUANT_INT8_MAX_GROUPS * 8], out_first[QUANT_INT8_MAX_GROUPS * 8], out_second[QUANT_INT8_MAX_GROUPS * 8];
    float out_other[QUANT_INT8_MAX_GROUPS * 8], out_other2[QUANT_INT8_MAX_GROUPS * 8];
    for (int g = 0; g < a->n_groups; g++)
        for (int ng = 1; ng <= QUANT_INT8_MAX_GROUPS && g + ng <= a->n_groups; ng++) {
            quant_int8_dot_groups(type, row, a, g, ng, out);
            /* the two-row kernel, with the row in either place */
            quant_int8_dot_groups_rows2(type, row, other_row, a, g, ng, out_first, out_other);
            quant_int8_dot_groups_rows2(type, other_row, row, a, g, ng, out_other2, out_second);
            for (int l = 0; l < 8 * ng; l++) {
                int t = g * 8 + l;
                float want = t < a->n_tokens ? expected_value(type, row, a, t) : 0.0f;
                float want_other = t < a->n_tokens ? expected_value(type, other_row, a, t) : 0.0f;
                if (!same_bits(out[l], want))
                    fail_msg("%s groups(%d) token %d: %.9g, expected %.9g", tensor_type_name(type), ng, t, out[l], want);
                if (!same_bits(out_first[l], want) || !same_bits(out_second[l], want) || !same_bits(out_other[l], want_other) ||
                    !same_bits(out_other2[l], want_other))
                    fail_msg("%s groups_rows2(%d) token %d: %.9g / %.9g / %.9g / %.9g, expected %.9g and %.9g",
                             tensor_type_name(type), ng, t, out_first[l], out_second[l], out_other[l], out_other2[l], want,
                             want_other);
            }
        }
    for (int nt = 1; nt <= 4; nt++)
        for (int t0 = 0; t0 + nt <= a->n_tokens; t0 += nt) {
            quant_int8_dot_tokens(type, row, a, t0, nt, out);
            for (int i = 0; i < nt; i++) {
                float want = expected_value(type, row, a, t0 + i);
                if (!same_bits(out[i], want))
                    fail_msg("%s tokens(%d) token %d: %.9g, expected %.9g", tensor_type_name(type), nt, t0 + i, out[i], want);
                assert_true(same_bits(quant_int8_dot_reference(type, row, a, t0 + i), want));
            }
        }
}

static void test_kernels_match_canonical_sequence(void **state) {
    (void)state;
    const int64_t cols = 256;
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = TYPES[ti];
        uint8_t *row = malloc(tensor_row_bytes(type, cols)), *other_row = malloc(tensor_row_bytes(type, cols));
        float *x = malloc(19 * cols * sizeof *x);
        assert_non_null(row);
        assert_non_null(other_row);
        assert_non_null(x);
        Int8Activations a = {0};
        for (int trial = 0; trial < 12; trial++) {
            bool extreme = trial % 3 == 2; /* saturation limits: ±127 activations, 0/15 nibbles, -128/127 bytes */
            int n_tokens = 1 + (int)(rnd() % 19);
            random_row(type, row, cols, extreme);
            random_row(type, other_row, cols, trial % 2 == 0);
            random_activations(x, n_tokens, cols, extreme);
            assert_int_equal(act_quant_fill(&a, x, n_tokens, (int)cols), 0);
            check_all_kernels(type, row, other_row, &a);
        }
        act_quant_free(&a);
        free(row);
        free(other_row);
        free(x);
    }
}

/* |int8 − fp32| is bounded by the activation rounding: each x moves by at most d_x/2, so the dot
 * moves by at most Σ_b d_x[b]/2 · Σ_j |w_j| (plus fp32 rounding in both). */
static void test_close_to_fp32(void **state) {
    (void)state;
    const int64_t cols = 576;
    float x[576], sums[576 / 32];
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = TYPES[ti];
        uint8_t *row = malloc(tensor_row_bytes(type, cols));
        assert_non_null(row);
        Int8Activations a = {0};
        double worst_ratio = 0.0;
        for (int trial = 0; trial < 200; trial++) {
            random_row(type, row, cols, false);
            random_activations(x, 1, cols, false);
            assert_int_equal(act_quant_fill(&a, x, 1, (int)cols), 0);
            quant_block_sums(x, cols, sums);
            float fp32 = quant_dot_row(type, row, x, sums, cols), got;
            quant_int8_dot_tokens(type, row, &a, 0, 1, &got);
            double bound = 0.0, magnitude = 0.0;
            for (int b = 0; b < a.nb; b++) {
                double w_abs = 0.0;
                for (int j = 0; j < 32; j++) {
                    float d_w, m_w;
                    float w = (float)weight_int(type, row, b, j, &d_w, &m_w) * d_w + m_w;
                    w_abs += fabs(w);
                    magnitude += fabs((double)w * x[b * 32 + j]);
                }
                bound += a.d[act_quant_meta_index(&a, 0, b)] / 2.0 * w_abs;
            }
            double diff = fabs((double)got - fp32), allowed = bound + 1e-5 * magnitude + 1e-6;
            if (diff > allowed)
                fail_msg("%s trial %d: int8 %.7g vs fp32 %.7g, beyond %.3g", tensor_type_name(type), trial, got, fp32, allowed);
            if (bound > 0.0 && diff / bound > worst_ratio) worst_ratio = diff / bound;
        }
        fprintf(stderr, "int8 vs fp32 %s: worst |diff| = %.2f of the rounding bound\n", tensor_type_name(type), worst_ratio);
        act_quant_free(&a);
        free(row);
    }
}

/* ---- cpu_matmul: batch invariance -------------------------------------------------------------- */

static void test_matmul_batch_invariant(void **state) {
    (void)state;
    const int64_t rows = 37, cols = 128; /* rows not a multiple of the row group */
    const int max_tokens = 40;
    float *x = malloc((size_t)max_tokens * cols * sizeof *x), *y = malloc((size_t)max_tokens * rows * sizeof *y);
    float *alone = malloc((size_t)max_tokens * rows * sizeof *alone);
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(alone);
    random_activations(x, max_tokens, cols, false);
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = TYPES[ti];
        size_t row_bytes = tensor_row_bytes(type, cols);
        uint8_t *data = malloc(rows * row_bytes);
        assert_non_null(data);
        for (int64_t r = 0; r < rows; r++) random_row(type, data + r * row_bytes, cols, false);
        WeightMatrix w = {.type = type, .rows = rows, .cols = cols, .row_bytes = row_bytes, .data = data, .name = "test"};
        CpuScratch scratch = {0};
        for (int t = 0; t < max_tokens; t++)
            assert_int_equal(cpu_matmul(&w, x + t * cols, 1, alone + t * rows, CPU_MATMUL_INT8, &scratch), 0);
        static const int batches[] = {2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 31, 32, 33, 40};
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            int n = batches[bi], first = max_tokens - n; /* the batch's tokens sit at other places than alone */
            assert_int_equal(cpu_matmul(&w, x + first * cols, n, y, CPU_MATMUL_INT8, &scratch), 0);
            for (int t = 0; t < n; t++)
                for (int64_t r = 0; r < rows; r++)
                    if (!same_bits(y[t * rows + r], alone[(first + t) * rows + r]))
                        fail_msg("%s batch of %d: token %d row %lld differs from the token alone", tensor_type_name(type), n, t,
                                 (long long)r);
        }
        cpu_scratch_free(&scratch);
        free(data);
    }
    free(x);
    free(y);
    free(alone);
}

/* ---- the real model: int8 engine against fp32 engine ------------------------------------------- */

/* Bounds for the real-model comparison, about twice the values measured (see
 * test_engine_int8_close_to_fp32). */
#define MAX_LOGIT_DIFF 6.0   /* largest |int8 − fp32| logit over every prompt position */
#define MAX_MEAN_DIFF 0.5    /* mean |int8 − fp32| logit */
#define MIN_TOP1_AGREEMENT 0.9
#define TIE_GAP 1.0          /* int8 may pick another token only where fp32's top-2 gap is under this */

/* Prompt logits (n, vocab) of one sequence through a CPU backend with the given arithmetic. */
static void prompt_logits(const BraidModel *m, CpuMatmulMath math, const int32_t *ids, int n, float *logits) {
    const int bs = 16, n_blocks = n / bs + 1; /* the sequence's blocks; block 0 of the pool is the null block */
    BackendConfig bc = backend_config_default(BACKEND_CPU, &m->weights.cfg, n_blocks + 1, bs, n);
    bc.max_seqs = 1;
    bc.cpu_matmul = math;
    Backend be;
    BraidError err;
    if (backend_create(&be, &m->weights, &bc, &err)) fail_msg("%s", err.msg);
    int32_t *pos = malloc((size_t)n * sizeof *pos), *slots = malloc((size_t)n * sizeof *slots);
    int32_t *rows = malloc((size_t)n * sizeof *rows);
    int32_t *table = malloc((size_t)n_blocks * sizeof *table), *argmax = malloc((size_t)n * sizeof *argmax);
    assert_true(pos && slots && rows && table && argmax);
    for (int b = 0; b < n_blocks; b++) table[b] = b + 1;
    for (int i = 0; i < n; i++) {
        pos[i] = rows[i] = i;
        slots[i] = table[i / bs] * bs + i % bs;
    }
    int32_t seq_start[2] = {0, n}, n_ctx = n;
    const int32_t *tables[1] = {table};
    ForwardBatch batch = {.n_tokens = n, .tokens = ids, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                          .seq_start = seq_start, .block_tables = tables, .seq_n_ctx = &n_ctx,
                          .n_logits = n, .logit_rows = rows};
    ForwardOutput out = {.argmax = argmax, .logits = logits};
    if (backend_forward(&be, &batch, &out, &err)) fail_msg("%s", err.msg);
    backend_destroy(&be);
    free(pos); free(slots); free(rows); free(table); free(argmax);
}

/* Greedy continuations of every prompt through one engine (all prompts in flight together). */
static void engine_greedy(const BraidModel *m, bool fp32, int32_t **prompts, const int *lens, int n_prompts, int n_gen,
                          int32_t *out /* (n_prompts, n_gen) */) {
    EngineConfig cfg = {.n_blocks = 512, .block_size = 16, .max_batch_tokens = 512, .max_running = 16, .cache_enabled = false,
                        .policy = &evict_policy_lru, .cpu_matmul_fp32 = fp32};
    Engine e;
    BraidError err;
    if (engine_init(&e, m, &cfg, &err)) fail_msg("%s", err.msg);
    SchedRequest *reqs = calloc((size_t)n_prompts, sizeof *reqs);
    assert_non_null(reqs);
    for (int i = 0; i < n_prompts; i++) {
        SchedRequest *r = &reqs[i];
        char id[16];
        snprintf(id, sizeof id, "p%d", i);
        r->id = strdup(id);
        r->cap_tokens = lens[i] + n_gen + 1;
        r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
        memcpy(r->tokens, prompts[i], (size_t)lens[i] * sizeof *r->tokens);
        r->n_tokens = r->n_prompt = lens[i];
        r->max_tokens = n_gen;
        r->ignore_eos = true;
        r->sampling = sampling_params_default();
        assert_int_equal(engine_submit(&e, r), 0);
    }
    while (!sched_idle(&e.sched))
        if (engine_step(&e, &err) < 0) fail_msg("%s", err.msg);
    for (int i = 0; i < n_prompts; i++) {
        assert_int_equal(reqs[i].n_tokens - reqs[i].n_prompt, n_gen);
        memcpy(out + (size_t)i * n_gen, reqs[i].tokens + reqs[i].n_prompt, (size_t)n_gen * sizeof *out);
        sched_request_free(&reqs[i]);
    }
    free(reqs);
    engine_free(&e);
}

/* fp32 top-2 gap after ids[0..n) (the last position's logits). */
static double fp32_gap_after(const BraidModel *m, const int32_t *ids, int n) {
    int vocab = m->weights.cfg.vocab_size;
    float *logits = malloc((size_t)n * vocab * sizeof *logits);
    assert_non_null(logits);
    prompt_logits(m, CPU_MATMUL_FP32, ids, n, logits);
    double gap = golden_top2_gap(logits + (size_t)(n - 1) * vocab, vocab);
    free(logits);
    return gap;
}

/* Compares prompt logits position by position; returns the largest |diff|, adds to the totals. */
static double compare_prompt(const BraidModel *m, const int32_t *ids, int n, double *diff_sum, long *count, int *top1_same,
                             double *worst_gap) {
    int vocab = m->weights.cfg.vocab_size;
    float *a = malloc((size_t)n * vocab * sizeof *a), *b = malloc((size_t)n * vocab * sizeof *b);
    assert_true(a && b);
    prompt_logits(m, CPU_MATMUL_FP32, ids, n, a);
    prompt_logits(m, CPU_MATMUL_INT8, ids, n, b);
    double worst = 0.0;
    for (int p = 0; p < n; p++) {
        const float *ra = a + (size_t)p * vocab, *rb = b + (size_t)p * vocab;
        int best_a = 0, best_b = 0;
        for (int v = 0; v < vocab; v++) {
            double d = fabs((double)ra[v] - rb[v]);
            *diff_sum += d;
            if (d > worst) worst = d;
            if (ra[v] > ra[best_a]) best_a = v;
            if (rb[v] > rb[best_b]) best_b = v;
        }
        *count += vocab;
        if (best_a == best_b) (*top1_same)++;
        else if (golden_top2_gap(ra, vocab) > *worst_gap) *worst_gap = golden_top2_gap(ra, vocab);
    }
    free(a);
    free(b);
    return worst;
}

/* Measured on SmolLM2-135M-Instruct.Q4_1 over the 9 golden prompts (1282 positions), 2026-11-23:
 *   prompt logits, int8 vs fp32: max |diff| 3.14, mean |diff| 0.17; top-1 agrees at 1232 of 1282
 *   positions (96.1%), and where it does not, fp32's top-2 gap is at most 0.70;
 *   engine greedy continuations of 32 tokens: 3 of 9 identical; the other 6 part (after 0, 0, 16,
 *   17, 22 and 24 tokens) where fp32's top-2 gap is at most 0.15, then run on from different text.
 * Rounding activations to 8 bits moves logits by tenths and so flips near-ties; a kernel bug moves
 * them by far more, or flips clear choices, which the bounds catch. */
static void test_engine_int8_close_to_fp32(void **state) {
    (void)state;
    GoldenModel g;
    if (golden_model_load(&g)) fail_msg("cannot load the model and golden prompts");
    const int n_gen = 32;
    int n_prompts = (int)json_array_size(g.prompts);
    int32_t **ids = calloc((size_t)n_prompts, sizeof *ids);
    int *lens = calloc((size_t)n_prompts, sizeof *lens);
    assert_true(ids && lens);
    double worst = 0.0, diff_sum = 0.0, worst_tie = 0.0;
    long count = 0;
    int top1_same = 0, positions = 0;
    for (int i = 0; i < n_prompts; i++) {
        ids[i] = golden_int_array(json_object_get(json_array_get(g.prompts, (size_t)i), "ids"), &lens[i]);
        double w = compare_prompt(&g.model, ids[i], lens[i], &diff_sum, &count, &top1_same, &worst_tie);
        if (w > worst) worst = w;
        positions += lens[i];
    }
    int32_t *greedy_fp32 = malloc((size_t)n_prompts * n_gen * sizeof(int32_t));
    int32_t *greedy_int8 = malloc((size_t)n_prompts * n_gen * sizeof(int32_t));
    assert_true(greedy_fp32 && greedy_int8);
    engine_greedy(&g.model, true, ids, lens, n_prompts, n_gen, greedy_fp32);
    engine_greedy(&g.model, false, ids, lens, n_prompts, n_gen, greedy_int8);
    int identical = 0;
    double worst_part_gap = 0.0;
    for (int i = 0; i < n_prompts; i++) {
        int k = 0;
        while (k < n_gen && greedy_fp32[i * n_gen + k] == greedy_int8[i * n_gen + k]) k++;
        if (k == n_gen) {
            identical++;
            continue;
        }
        int32_t *seq = malloc((size_t)(lens[i] + k) * sizeof *seq);
        assert_non_null(seq);
        memcpy(seq, ids[i], (size_t)lens[i] * sizeof *seq);
        memcpy(seq + lens[i], greedy_fp32 + (size_t)i * n_gen, (size_t)k * sizeof *seq);
        double gap = fp32_gap_after(&g.model, seq, lens[i] + k);
        free(seq);
        fprintf(stderr, "int8 vs fp32 prompt %d: greedy continuations part at token %d, where fp32's top-2 gap is %.3f\n", i,
                k, gap);
        if (gap > worst_part_gap) worst_part_gap = gap;
    }
    double mean = diff_sum / (double)count;
    fprintf(stderr, "int8 vs fp32: logits max |diff| %.3f, mean %.3f; top-1 agrees at %d of %d positions (disagreements at "
                    "fp32 gaps <= %.3f); %d of %d greedy continuations identical (the others part at gaps <= %.3f)\n",
            worst, mean, top1_same, positions, worst_tie, identical, n_prompts, worst_part_gap);
    assert_true(worst <= MAX_LOGIT_DIFF);
    assert_true(mean <= MAX_MEAN_DIFF);
    assert_true(top1_same >= MIN_TOP1_AGREEMENT * positions);
    assert_true(worst_tie < TIE_GAP);
    assert_true(worst_part_gap < TIE_GAP);
    for (int i = 0; i < n_prompts; i++) free(ids[i]);
    free(ids);
    free(lens);
    free(greedy_fp32);
    free(greedy_int8);
    golden_model_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_activation_quantization),
        cmocka_unit_test(test_kernels_match_canonical_sequence),
        cmocka_unit_test(test_close_to_fp32),
        cmocka_unit_test(test_matmul_batch_invariant),
        cmocka_unit_test(test_engine_int8_close_to_fp32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
