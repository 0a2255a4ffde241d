/*
 * The int8 matmul path (kernels/cpu/act_quant.h, quant_int8.h, matmul_int8.h):
 *   - activations quantize to the documented values and layouts;
 *   - every kernel (8 / 16 tokens in lanes, one token at a time, one token against 8 rows in lanes,
 *     the portable reference) equals,
 *     bit for bit, the canonical sequence computed here from integer block sums taken straight from
 *     the GGUF formats, including extreme weights and activations;
 *   - the packed layout (int8_pack.h) keeps every value: its kernels and row views equal the
 *     canonical sequence of the GGUF rows, padding rows give 0, rows dequantize as before;
 *   - the result stays within the activation-rounding bound of the fp32 dot product, and
 *     cpu_matmul_refine_top restores the exact order of near-tied rows;
 *   - cpu_matmul in int8 gives each token the same bits whatever batch it is in, packed or not.
 * No model is loaded, so this runs under the sanitizers too; test_int8_engine.c compares the int8
 * engine with the fp32 one on the real model.
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

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/int8_pack.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_int8.h"
#include "model/tensor_types.h"

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
            Int8Row view = quant_int8_row(type, row), other_view = quant_int8_row(type, other_row);
            quant_int8_dot_groups(type, view, a, g, ng, out);
            /* the two-row kernel, with the row in either place */
            quant_int8_dot_groups_rows2(type, view, other_view, a, g, ng, out_first, out_other);
            quant_int8_dot_groups_rows2(type, other_view, view, a, g, ng, out_other2, out_second);
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

/* One token against eight rows (rows in the lanes) equals the canonical sequence of each row. */
static void test_rows8_match_canonical_sequence(void **state) {
    (void)state;
    const int64_t cols = 192;
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = TYPES[ti];
        size_t row_bytes = tensor_row_bytes(type, cols);
        uint8_t *rows = malloc(8 * row_bytes);
        float *x = malloc(5 * cols * sizeof *x);
        assert_non_null(rows);
        assert_non_null(x);
        Int8Activations a = {0};
        for (int trial = 0; trial < 9; trial++) {
            bool extreme = trial % 3 == 2;
            for (int r = 0; r < 8; r++) random_row(type, rows + r * row_bytes, cols, extreme && r % 2 == 0);
            random_activations(x, 5, cols, extreme);
            assert_int_equal(act_quant_fill(&a, x, 5, (int)cols), 0);
            for (int t = 0; t < 5; t++) {
                float out[8];
                quant_int8_dot_rows8(type, rows, row_bytes, &a, t, out);
                for (int r = 0; r < 8; r++) {
                    float want = expected_value(type, rows + r * row_bytes, &a, t);
                    if (!same_bits(out[r], want))
                        fail_msg("%s rows8 token %d row %d: %.9g, expected %.9g", tensor_type_name(type), t, r, out[r], want);
                }
            }
        }
        act_quant_free(&a);
        free(rows);
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

/* ---- the packed layout -------------------------------------------------------------------------- */

/* A matrix of 13 rows (one full group of 8 and one padded group) packed: the eight-row kernel and
 * the row views through the lane kernels equal the GGUF rows' canonical sequence, padding rows
 * give 0, and every row dequantizes to the GGUF row's floats. */
static void test_packed_layout_keeps_values(void **state) {
    (void)state;
    const int64_t rows = 13, cols = 96;
    const int n_tokens = 11;
    for (int ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = TYPES[ti];
        size_t row_bytes = tensor_row_bytes(type, cols);
        uint8_t *data = malloc(rows * row_bytes);
        float *x = malloc((size_t)n_tokens * cols * sizeof *x), got[96], want[96];
        assert_non_null(data);
        assert_non_null(x);
        Int8Activations a = {0};
        for (int trial = 0; trial < 6; trial++) {
            bool extreme = trial % 3 == 2;
            for (int64_t r = 0; r < rows; r++) random_row(type, data + r * row_bytes, cols, extreme && r % 2 == 0);
            random_activations(x, n_tokens, cols, extreme);
            assert_int_equal(act_quant_fill(&a, x, n_tokens, (int)cols), 0);
            WeightMatrix w = {.type = type, .rows = rows, .cols = cols, .row_bytes = row_bytes, .data = data, .name = "test"};
            WeightMatrix packed;
            uint8_t *buffer;
            BraidError err = {0};
            assert_int_equal(int8_pack_matrix(&w, &packed, &buffer, &err), 0);
            assert_int_equal(packed.layout, WEIGHT_LAYOUT_ROWS8);
            /* every token count the kernel takes at once (1..4, and longer runs it splits) */
            for (int64_t r0 = 0; r0 < rows; r0 += INT8_PACK_ROWS)
                for (int first = 0; first < n_tokens; first++)
                    for (int nt = 1; first + nt <= n_tokens; nt++) {
                        float out[11][9];
                        quant_int8_dot_packed8(type, int8_pack_group(&packed, r0), &a, first, nt, &out[0][0], 9);
                        for (int i = 0; i < nt; i++)
                            for (int k = 0; k < 8; k++) {
                                float expect = r0 + k < rows ? expected_value(type, data + (r0 + k) * row_bytes, &a, first + i) : 0.0f;
                                if (!same_bits(out[i][k], expect))
                                    fail_msg("%s packed8 (%d tokens from %d) token %d row %lld: %.9g, expected %.9g",
                                             tensor_type_name(type), nt, first, first + i, (long long)(r0 + k), out[i][k], expect);
                            }
                    }
            for (int64_t r = 0; r < rows; r++) {
                float lanes[16];
                quant_int8_dot_groups(type, int8_pack_row(&packed, r), &a, 0, 2, lanes);
                for (int t = 0; t < n_tokens; t++)
                    if (!same_bits(lanes[t], expected_value(type, data + r * row_bytes, &a, t)))
                        fail_msg("%s packed row view %lld token %d differs", tensor_type_name(type), (long long)r, t);
                int8_pack_dequantize_row(&packed, r, got);
                quant_dequantize_row(type, data + r * row_bytes, want, cols);
                assert_memory_equal(got, want, cols * sizeof *got);
            }
            free(buffer);
        }
        act_quant_free(&a);
        free(data);
        free(x);
    }
    /* a type without int8 kernels is refused with its name */
    WeightMatrix q4k = {.type = TENSOR_Q4_K, .rows = 8, .cols = 256, .row_bytes = tensor_row_bytes(TENSOR_Q4_K, 256), .name = "blk.0.ffn_down"};
    WeightMatrix out;
    uint8_t *buffer = NULL;
    BraidError err = {0};
    assert_int_equal(int8_pack_matrix(&q4k, &out, &buffer, &err), -1);
    assert_non_null(strstr(err.msg, "blk.0.ffn_down"));
}

/* ---- the int8 head's near-ties refined in fp32 ------------------------------------------------- */

/* A head whose 8 best rows differ from one another by a single quantized step (near-ties the
 * 8-bit rounding of x can reorder) among 40 unrelated rows: after cpu_matmul_refine_top(8) the
 * top values are the exact dots (double) and the argmax is the exact argmax, packed or not; the
 * int8 values alone get some argmaxes wrong, so the refinement is what makes this hold. */
static void test_refine_top_restores_near_ties(void **state) {
    (void)state;
    const int64_t rows = 48, cols = 256, near = 8;
    const int trials = 400;
    size_t row_bytes = tensor_row_bytes(TENSOR_Q8_0, cols);
    uint8_t *data = malloc(rows * row_bytes);
    float *x = malloc(cols * sizeof *x), *y = malloc(rows * sizeof *y), *deq = malloc(cols * sizeof *deq);
    double *exact = malloc(rows * sizeof *exact);
    assert_true(data && x && y && deq && exact);
    int int8_wrong = 0;
    for (int trial = 0; trial < trials; trial++) {
        random_activations(x, 1, cols, false);
        random_row(TENSOR_Q8_0, data, rows * cols, false);
        /* row 0 leans towards x, so it and its near copies outscore the unrelated rows */
        BlockQ8_0 *lead = (BlockQ8_0 *)data;
        for (int64_t j = 0; j < cols; j++) lead[j / 32].qs[j % 32] = (int8_t)((x[j] >= 0 ? 1 : -1) * (int)(20 + rnd() % 100));
        for (int64_t r = 1; r < near; r++) {
            memcpy(data + r * row_bytes, data, row_bytes);
            /* one step up on one element of block 0: copies r1, r2 differ by d·(x_j1 − x_j2), which
             * int8 sees as d·d_x·(q_j1 − q_j2) */
            BlockQ8_0 *blk = (BlockQ8_0 *)(data + r * row_bytes);
            int j = (int)(rnd() % 32);
            blk->qs[j] = (int8_t)(blk->qs[j] < 127 ? blk->qs[j] + 1 : blk->qs[j] - 1);
        }
        for (int64_t r = 0; r < rows; r++) {
            quant_dequantize_row(TENSOR_Q8_0, data + r * row_bytes, deq, cols);
            double sum = 0.0;
            for (int64_t j = 0; j < cols; j++) sum += (double)deq[j] * (double)x[j];
            exact[r] = sum;
        }
        int64_t want = 0;
        for (int64_t r = 1; r < rows; r++)
            if (exact[r] > exact[want]) want = r;
        WeightMatrix w = {.type = TENSOR_Q8_0, .rows = rows, .cols = cols, .row_bytes = row_bytes, .data = data, .name = "head"};
        WeightMatrix packed;
        uint8_t *buffer;
        BraidError err = {0};
        assert_int_equal(int8_pack_matrix(&w, &packed, &buffer, &err), 0);
        CpuScratch scratch = {0};
        for (int layout = 0; layout < 2; layout++) {
            const WeightMatrix *m = layout ? &packed : &w;
            assert_int_equal(cpu_matmul(m, x, 1, y, CPU_MATMUL_INT8, &scratch), 0);
            int64_t got = 0;
            for (int64_t r = 1; r < rows; r++)
                if (y[r] > y[got]) got = r;
            int8_wrong += (float)exact[got] != (float)exact[want];
            cpu_matmul_refine_top(m, x, 1, y, (int)near);
            got = 0;
            for (int64_t r = 1; r < rows; r++)
                if (y[r] > y[got]) got = r;
            /* exact dots closer than a float's resolution tie: any of them is right */
            if ((float)exact[got] != (float)exact[want])
                fail_msg("trial %d (%s): refined argmax %lld, exact %lld", trial, layout ? "packed" : "GGUF", (long long)got,
                         (long long)want);
            for (int64_t r = 0; r < near; r++) assert_true(same_bits(y[r], (float)exact[r]));
        }
        cpu_scratch_free(&scratch);
        free(buffer);
    }
    print_message("int8 head without refinement: %d of %d argmaxes wrong\n", int8_wrong, 2 * trials);
    assert_true(int8_wrong > 0);
    free(data);
    free(x);
    free(y);
    free(deq);
    free(exact);
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
        WeightMatrix packed;
        uint8_t *packed_data;
        BraidError err = {0};
        assert_int_equal(int8_pack_matrix(&w, &packed, &packed_data, &err), 0);
        CpuScratch scratch = {0};
        for (int t = 0; t < max_tokens; t++)
            assert_int_equal(cpu_matmul(&w, x + t * cols, 1, alone + t * rows, CPU_MATMUL_INT8, &scratch), 0);
        static const int batches[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 31, 32, 33, 40};
        for (int layout = 0; layout < 2; layout++)
            for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                int n = batches[bi], first = max_tokens - n; /* the batch's tokens sit at other places than alone */
                /* a packed matrix takes the int8 kernels whatever arithmetic is asked */
                assert_int_equal(cpu_matmul(layout ? &packed : &w, x + first * cols, n, y, layout ? CPU_MATMUL_FP32 : CPU_MATMUL_INT8,
                                            &scratch),
                                 0);
                for (int t = 0; t < n; t++)
                    for (int64_t r = 0; r < rows; r++)
                        if (!same_bits(y[t * rows + r], alone[(first + t) * rows + r]))
                            fail_msg("%s %s batch of %d: token %d row %lld differs from the token alone", tensor_type_name(type),
                                     layout ? "packed" : "GGUF", n, t, (long long)r);
            }
        cpu_scratch_free(&scratch);
        free(packed_data);
        free(data);
    }
    free(x);
    free(y);
    free(alone);
}
int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_activation_quantization),
        cmocka_unit_test(test_kernels_match_canonical_sequence),
        cmocka_unit_test(test_rows8_match_canonical_sequence),
        cmocka_unit_test(test_packed_layout_keeps_values),
        cmocka_unit_test(test_refine_top_restores_near_ties),
        cmocka_unit_test(test_close_to_fp32),
        cmocka_unit_test(test_matmul_batch_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
