/*
 * Dequantization per GGUF type against values computed here from the format definitions, and the
 * fused dot products (AVX2 paths) against a double-precision dot of the dequantized row.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quant.h"
#include "model/tensor_types.h"

static uint64_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float rnd_float(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() % 1000000) / 1000000.0f; }

static void test_half_conversions(void **state) {
    (void)state;
    assert_true(fp16_to_fp32(0x3C00) == 1.0f);
    assert_true(fp16_to_fp32(0xC000) == -2.0f);
    assert_true(fp16_to_fp32(0x7BFF) == 65504.0f);
    assert_true(fp16_to_fp32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    assert_true(fp16_to_fp32(0x03FF) == ldexpf(1023.0f, -24));
    assert_true(isinf(fp16_to_fp32(0x7C00)));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_fp32((uint16_t)h);
        if (isnan(f)) {
            assert_true(isnan(fp16_to_fp32(fp32_to_fp16(f))));
            continue;
        }
        assert_int_equal(fp32_to_fp16(f), h); /* every half survives the round trip exactly */
    }
    assert_true(bf16_to_fp32(0x3F80) == 1.0f);
    assert_true(bf16_to_fp32(0xC040) == -3.0f);
}

static void test_q4_0_q4_1_q8_0_values(void **state) {
    (void)state;
    BlockQ4_0 b0 = {.d = fp32_to_fp16(0.5f)};
    BlockQ4_1 b1 = {.d = fp32_to_fp16(0.25f), .m = fp32_to_fp16(-1.0f)};
    BlockQ8_0 b8 = {.d = fp32_to_fp16(0.125f)};
    for (int j = 0; j < 16; j++) {
        b0.qs[j] = (uint8_t)(j | ((15 - j) << 4));
        b1.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    }
    for (int j = 0; j < 32; j++) b8.qs[j] = (int8_t)(j * 8 - 128);
    float y[32];
    quant_dequantize_row(TENSOR_Q4_0, &b0, y, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == (float)(j - 8) * 0.5f);          /* low nibbles: elements 0..15 */
        assert_true(y[j + 16] == (float)(15 - j - 8) * 0.5f); /* high nibbles: elements 16..31 */
    }
    quant_dequantize_row(TENSOR_Q4_1, &b1, y, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == (float)j * 0.25f - 1.0f);
        assert_true(y[j + 16] == (float)(15 - j) * 0.25f - 1.0f);
    }
    quant_dequantize_row(TENSOR_Q8_0, &b8, y, 32);
    for (int j = 0; j < 32; j++) assert_true(y[j] == (float)(j * 8 - 128) * 0.125f);
}

static void test_q4_k_values(void **state) {
    (void)state;
    BlockQ4_K b;
    memset(&b, 0, sizeof b);
    b.d = fp32_to_fp16(0.5f);
    b.dmin = fp32_to_fp16(0.25f);
    /* Sub-block scales 1..8 and mins 8..1, packed: j<4 in the low 6 bits of bytes j (scale) and
     * j+4 (min); j>=4 split between the low/high nibbles of byte j+4 and the top 2 bits of j-4 / j. */
    int sc[8] = {1, 2, 3, 4, 45, 50, 61, 63}, mn[8] = {8, 7, 6, 5, 33, 40, 17, 62};
    for (int j = 0; j < 4; j++) {
        b.scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        b.scales[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        b.scales[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
    for (int i = 0; i < QK_K / 2; i++) b.qs[i] = (uint8_t)((i % 16) | ((15 - i % 16) << 4));
    float y[QK_K];
    quant_dequantize_row(TENSOR_Q4_K, &b, y, QK_K);
    /* Each 64 elements: 32 low nibbles with sub-block 2k, then 32 high nibbles with sub-block 2k+1. */
    for (int chunk = 0; chunk < 4; chunk++)
        for (int l = 0; l < 32; l++) {
            int q_lo = (chunk * 32 + l) % 16, q_hi = 15 - q_lo;
            float lo = 0.5f * sc[2 * chunk] * q_lo - 0.25f * mn[2 * chunk];
            float hi = 0.5f * sc[2 * chunk + 1] * q_hi - 0.25f * mn[2 * chunk + 1];
            assert_float_equal(y[chunk * 64 + l], lo, 1e-6);
            assert_float_equal(y[chunk * 64 + 32 + l], hi, 1e-6);
        }
}

/* Q5_K: Q4_K's scales and nibbles plus a fifth bit per element from qh. Values chosen per
 * element; each must decode to d·scale_j·q − dmin·min_j of its 32-element sub-block j. */
static void test_q5_k_values(void **state) {
    (void)state;
    BlockQ5_K b;
    memset(&b, 0, sizeof b);
    b.d = fp32_to_fp16(0.25f);
    b.dmin = fp32_to_fp16(0.125f);
    int sc[8] = {1, 9, 17, 33, 40, 47, 62, 63}, mn[8] = {0, 63, 5, 31, 16, 2, 48, 7};
    for (int j = 0; j < 4; j++) {
        b.scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        b.scales[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        b.scales[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
    /* Element e = 64c + 32h + l (chunk c, half h): low 4 bits in qs[32c + l] (low nibble for h = 0,
     * high for h = 1), 5th bit as bit 2c + h of qh[l]. */
    int q[QK_K];
    for (int e = 0; e < QK_K; e++) q[e] = (e * 13 + 5) % 32;
    for (int c = 0; c < 4; c++)
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                int v = q[64 * c + 32 * h + l];
                b.qs[32 * c + l] |= (uint8_t)(h == 0 ? (v & 0xF) : (v & 0xF) << 4);
                b.qh[l] |= (uint8_t)((v >> 4) << (2 * c + h));
            }
    float y[QK_K];
    quant_dequantize_row(TENSOR_Q5_K, &b, y, QK_K);
    for (int e = 0; e < QK_K; e++) {
        int j = e / 32;
        float expect = 0.25f * (float)sc[j] * (float)q[e] - 0.125f * (float)mn[j];
        if (fabsf(y[e] - expect) > 1e-6f) fail_msg("Q5_K element %d: %g, expected %g", e, y[e], expect);
    }
    /* The same block through the dot product, against a double-precision dot of those values. */
    float x[QK_K], sums[QK_K / 32];
    double ref = 0;
    for (int e = 0; e < QK_K; e++) {
        x[e] = (float)((e % 7) - 3) * 0.5f;
        ref += (0.25 * sc[e / 32] * q[e] - 0.125 * mn[e / 32]) * x[e];
    }
    quant_block_sums(x, QK_K, sums);
    assert_float_equal(quant_dot_row(TENSOR_Q5_K, &b, x, sums, QK_K), ref, 1e-3);
}

/* Q5_0: nibbles as Q4_0, the fifth bit of element j is bit j of the little-endian qh; q − 16. */
static void test_q5_0_values(void **state) {
    (void)state;
    BlockQ5_0 b[2];
    memset(b, 0, sizeof b);
    int q[64];
    for (int e = 0; e < 64; e++) q[e] = (e * 11 + 3) % 32;
    for (int k = 0; k < 2; k++) {
        b[k].d = fp32_to_fp16(k ? -0.5f : 0.125f);
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) {
            int v = q[32 * k + j];
            b[k].qs[j % 16] |= (uint8_t)(j < 16 ? (v & 0xF) : (v & 0xF) << 4);
            qh |= (uint32_t)(v >> 4) << j;
        }
        for (int i = 0; i < 4; i++) b[k].qh[i] = (uint8_t)(qh >> (8 * i));
    }
    float y[64];
    quant_dequantize_row(TENSOR_Q5_0, b, y, 64);
    for (int e = 0; e < 64; e++) {
        float expect = (e < 32 ? 0.125f : -0.5f) * (float)(q[e] - 16);
        if (y[e] != expect) fail_msg("Q5_0 element %d: %g, expected %g", e, y[e], expect);
    }
    assert_int_equal(tensor_row_bytes(TENSOR_Q5_0, 64), 44);
    assert_int_equal(tensor_row_bytes(TENSOR_Q5_K, 512), 352);
    assert_string_equal(tensor_type_name(TENSOR_Q5_K), "Q5_K");
}

static void test_q6_k_values(void **state) {
    (void)state;
    BlockQ6_K b;
    memset(&b, 0, sizeof b);
    b.d = fp32_to_fp16(0.5f);
    for (int i = 0; i < 16; i++) b.scales[i] = (int8_t)(i - 8);
    /* Element e of 128-half h: l = e % 32, group g = e / 32 (0..3); its low 4 bits come from
     * ql[64h + l + 32*(g&1)] (low nibble for g<2, high for g>=2) and its high 2 bits from
     * qh[32h + l] >> 2g; value = d * scale[8h + l/16 + 2g] * (q - 32). */
    int q[QK_K];
    for (int e = 0; e < QK_K; e++) q[e] = (e * 7 + 3) % 64;
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int v = q[128 * h + 32 * g + l];
                uint8_t *ql = &b.ql[64 * h + l + 32 * (g & 1)];
                *ql |= (uint8_t)(g < 2 ? (v & 0xF) : (v & 0xF) << 4);
                b.qh[32 * h + l] |= (uint8_t)(((v >> 4) & 3) << (2 * g));
            }
    float y[QK_K];
    quant_dequantize_row(TENSOR_Q6_K, &b, y, QK_K);
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int e = 128 * h + 32 * g + l;
                float expect = 0.5f * (float)b.scales[8 * h + l / 16 + 2 * g] * (float)(q[e] - 32);
                assert_float_equal(y[e], expect, 1e-6);
            }
}

static void test_float_types(void **state) {
    (void)state;
    uint16_t h[4] = {fp32_to_fp16(1.5f), fp32_to_fp16(-0.25f), 0x3C00, 0};
    uint16_t bf[4] = {0x3FC0, 0xBE80, 0x3F80, 0};
    float f[4] = {1, 2, 3, 4}, y[4];
    quant_dequantize_row(TENSOR_F16, h, y, 4);
    assert_true(y[0] == 1.5f && y[1] == -0.25f && y[2] == 1.0f && y[3] == 0.0f);
    quant_dequantize_row(TENSOR_BF16, bf, y, 4);
    assert_true(y[0] == 1.5f && y[1] == -0.25f && y[2] == 1.0f);
    quant_dequantize_row(TENSOR_F32, f, y, 4);
    assert_memory_equal(f, y, sizeof f);
}

/* Random blocks of each type; the fused dot must match a double dot of the dequantized row. */
static void fill_random(uint32_t type, uint8_t *row, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) row[i] = (uint8_t)rnd();
    size_t bb = tensor_type_block_bytes(type);
    for (size_t b = 0; b < bytes / bb; b++) {
        uint8_t *blk = row + b * bb;
        uint16_t d = fp32_to_fp16(rnd_float(-0.05f, 0.05f)), m = fp32_to_fp16(rnd_float(-0.1f, 0.1f));
        switch (type) {
        case TENSOR_Q4_0: case TENSOR_Q8_0: memcpy(blk, &d, 2); break;
        case TENSOR_Q4_1: memcpy(blk, &d, 2); memcpy(blk + 2, &m, 2); break;
        case TENSOR_Q4_K: case TENSOR_Q5_K: memcpy(blk, &d, 2); memcpy(blk + 2, &m, 2); break;
        case TENSOR_Q5_0: memcpy(blk, &d, 2); break;
        case TENSOR_Q6_K: memcpy(blk + offsetof(BlockQ6_K, d), &d, 2); break;
        default: break;
        }
    }
    if (type == TENSOR_F16 || type == TENSOR_BF16)
        for (size_t i = 0; i < bytes / 2; i++) {
            uint16_t v = type == TENSOR_F16 ? fp32_to_fp16(rnd_float(-1, 1)) : (uint16_t)(rnd() & 0x3FFF);
            memcpy(row + 2 * i, &v, 2);
        }
    if (type == TENSOR_F32)
        for (size_t i = 0; i < bytes / 4; i++) {
            float v = rnd_float(-1, 1);
            memcpy(row + 4 * i, &v, 4);
        }
}

static void test_dot_matches_dequantized(void **state) {
    (void)state;
    const uint32_t types[] = {TENSOR_F32, TENSOR_F16, TENSOR_BF16, TENSOR_Q4_0, TENSOR_Q4_1, TENSOR_Q5_0,
                              TENSOR_Q8_0, TENSOR_Q4_K, TENSOR_Q5_K, TENSOR_Q6_K};
    const int lengths[] = {32, 64, 256, 576, 1536, 2048};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            int n = lengths[li];
            size_t row_bytes = tensor_row_bytes(types[ti], (uint64_t)n);
            if (row_bytes == 0) continue; /* K-quants need multiples of 256 */
            uint8_t *rows = malloc(4 * row_bytes);
            float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w), *sums = malloc((size_t)n / 32 * sizeof *sums);
            for (int i = 0; i < n; i++) x[i] = rnd_float(-2, 2);
            quant_block_sums(x, n, sums);
            fill_random(types[ti], rows, 4 * row_bytes);
            /* the same row against four activation vectors: x, then three shifted copies */
            float *xb = malloc(4 * (size_t)n * sizeof *xb), *sb = malloc(4 * (size_t)n / 32 * sizeof *sb), four[4];
            for (int t = 0; t < 4; t++) {
                for (int i = 0; i < n; i++) xb[t * n + i] = t == 0 ? x[i] : x[(i + t) % n];
                quant_block_sums(xb + t * n, n, sb + t * (n / 32));
            }
            for (int r = 0; r < 4; r++) {
                quant_dequantize_row(types[ti], rows + r * row_bytes, w, n);
                double ref = 0, mag = 0;
                for (int i = 0; i < n; i++) {
                    ref += (double)w[i] * x[i];
                    mag += fabs((double)w[i] * x[i]);
                }
                float got = quant_dot_row(types[ti], rows + r * row_bytes, x, sums, n);
                double tol = 1e-5 * mag + 1e-6;
                if (fabs(got - ref) > tol) fail_msg("%s n=%d row %d: dot %g, reference %g", tensor_type_name(types[ti]), n, r, got, ref);
                /* batched: every token count gives bit-identical results to the single-token dot */
                for (int nt = 1; nt <= 4; nt++) {
                    quant_dot_row_tokens(types[ti], rows + r * row_bytes, xb, (size_t)n, sb, (size_t)n / 32, nt, n, four);
                    for (int t = 0; t < nt; t++) {
                        float single = quant_dot_row(types[ti], rows + r * row_bytes, xb + t * n, sb + t * (n / 32), n);
                        if (four[t] != single) fail_msg("%s n=%d: token %d of %d differs from the single-token dot", tensor_type_name(types[ti]), n, t, nt);
                    }
                }
            }
            free(rows); free(x); free(w); free(sums); free(xb); free(sb);
        }
    }
}

static void test_block_sums(void **state) {
    (void)state;
    float x[96], s[3];
    for (int i = 0; i < 96; i++) x[i] = (float)i;
    quant_block_sums(x, 96, s);
    assert_true(s[0] == 496.0f && s[1] == 1520.0f && s[2] == 2544.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_conversions), cmocka_unit_test(test_q4_0_q4_1_q8_0_values),
        cmocka_unit_test(test_q4_k_values),      cmocka_unit_test(test_q5_k_values), cmocka_unit_test(test_q5_0_values), cmocka_unit_test(test_q6_k_values),
        cmocka_unit_test(test_float_types),      cmocka_unit_test(test_dot_matches_dequantized),
        cmocka_unit_test(test_block_sums),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
