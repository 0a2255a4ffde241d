#include "kernels/cpu/quant.h"

#include <assert.h>
#include <stdbool.h>
#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QUANT_AVX2 1
#endif

#include "kernels/cpu/vec.h"
#include "model/tensor_types.h"

static void dequant_q4_0(const BlockQ4_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        float d = vec_half_to_float(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((b[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const BlockQ4_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        float d = vec_half_to_float(b[i].d), m = vec_half_to_float(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(b[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void dequant_q5_0(const BlockQ5_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        float d = vec_half_to_float(b[i].d);
        uint32_t qh = (uint32_t)b[i].qh[0] | (uint32_t)b[i].qh[1] << 8 | (uint32_t)b[i].qh[2] << 16 | (uint32_t)b[i].qh[3] << 24;
        for (int j = 0; j < QK5_0 / 2; j++) {
            int lo = (int)((b[i].qs[j] & 0x0F) | ((qh >> j) & 1) << 4);
            int hi = (int)((b[i].qs[j] >> 4) | ((qh >> (j + QK5_0 / 2)) & 1) << 4);
            y[j] = (float)(lo - 16) * d;
            y[j + QK5_0 / 2] = (float)(hi - 16) * d;
        }
    }
}

static void dequant_q8_0(const BlockQ8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        float d = vec_half_to_float(b[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

/* Q4_K packs eight 6-bit scales and eight 6-bit mins into 12 bytes. */
static void q4_k_scale_min(int j, const uint8_t *q, uint8_t *scale, uint8_t *min) {
    if (j < 4) {
        *scale = q[j] & 63;
        *min = q[j + 4] & 63;
    } else {
        *scale = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *min = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void dequant_q4_k(const BlockQ4_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = vec_half_to_float(b[i].d), dmin = vec_half_to_float(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
            uint8_t sc, m;
            q4_k_scale_min(is, b[i].scales, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            q4_k_scale_min(is + 1, b[i].scales, &sc, &m);
            float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

/* Q5_K: Q4_K with a fifth bit per element, bit i of qh[l] for element 32i + l. */
static void dequant_q5_k(const BlockQ5_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = vec_half_to_float(b[i].d), dmin = vec_half_to_float(b[i].dmin);
        const uint8_t *q = b[i].qs, *qh = b[i].qh;
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
            uint8_t sc, m;
            q4_k_scale_min(is, b[i].scales, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            q4_k_scale_min(is + 1, b[i].scales, &sc, &m);
            float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((q[l] & 0xF) | ((qh[l] >> is) & 1) << 4) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((q[l] >> 4) | ((qh[l] >> (is + 1)) & 1) << 4) - m2;
        }
    }
}

static void dequant_q6_k(const BlockQ6_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = vec_half_to_float(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * (float)q1;
                y[l + 32] = d * sc[is + 2] * (float)q2;
                y[l + 64] = d * sc[is + 4] * (float)q3;
                y[l + 96] = d * sc[is + 6] * (float)q4;
            }
        }
    }
}

void quant_dequantize_row(uint32_t type, const void *row, float *out, int64_t n) {
    const uint8_t *p = row;
    switch (type) {
    case TENSOR_F32: memcpy(out, row, (size_t)n * sizeof(float)); break;
    case TENSOR_F16:
        for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = vec_half_to_float(h); }
        break;
    case TENSOR_BF16:
        for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = bf16_to_fp32(h); }
        break;
    case TENSOR_Q4_0: dequant_q4_0(row, out, n / QK4_0); break;
    case TENSOR_Q4_1: dequant_q4_1(row, out, n / QK4_1); break;
    case TENSOR_Q5_0: dequant_q5_0(row, out, n / QK5_0); break;
    case TENSOR_Q8_0: dequant_q8_0(row, out, n / QK8_0); break;
    case TENSOR_Q4_K: dequant_q4_k(row, out, n / QK_K); break;
    case TENSOR_Q5_K: dequant_q5_k(row, out, n / QK_K); break;
    case TENSOR_Q6_K: dequant_q6_k(row, out, n / QK_K); break;
    default: assert(!"quant_dequantize_row: unsupported type (the GGUF reader rejects these)");
    }
}

void quant_block_sums(const float *x, int64_t n, float *sums) {
    for (int64_t b = 0; b < n / 32; b++) {
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += x[32 * b + j];
        sums[b] = s;
    }
}

#ifdef QUANT_AVX2
/* Σ q_i·x_i for one 4-bit block whose 16 bytes hold elements j (low nibble) and j+16 (high);
 * nibbles are offset by -bias (8 for Q4_0, none for Q4_1). Two independent product chains keep
 * the FMA latency off the critical path. */
static inline __m256 nibble_block_dot(const uint8_t *qs, const float *x, int bias) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m128i lo = _mm_and_si128(raw, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    if (bias) {
        lo = _mm_sub_epi8(lo, _mm_set1_epi8((char)bias));
        hi = _mm_sub_epi8(hi, _mm_set1_epi8((char)bias));
    }
    __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    __m256 s01 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(x + 8), _mm256_mul_ps(q0, _mm256_loadu_ps(x)));
    __m256 s23 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(x + 24), _mm256_mul_ps(q2, _mm256_loadu_ps(x + 16)));
    return _mm256_add_ps(s01, s23);
}
#endif

#ifndef QUANT_AVX2 /* the AVX2 build uses the shared row-tokens kernels below */
static float dot_q4_1(const BlockQ4_1 *b, const float *x, const float *xs, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        float s = 0.0f;
        for (int j = 0; j < QK4_1 / 2; j++)
            s += (float)(b[i].qs[j] & 0x0F) * x[j] + (float)(b[i].qs[j] >> 4) * x[j + QK4_1 / 2];
        sum += vec_half_to_float(b[i].d) * s + vec_half_to_float(b[i].m) * xs[i];
    }
    return sum;
}
#endif

static float dot_q4_0(const BlockQ4_0 *b, const float *x, int64_t nb) {
#ifdef QUANT_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += QK4_0)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(vec_half_to_float(b[i].d)), nibble_block_dot(b[i].qs, x, 8), acc);
    return vec_hsum256(acc);
#else
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        float s = 0.0f;
        for (int j = 0; j < QK4_0 / 2; j++)
            s += (float)((b[i].qs[j] & 0x0F) - 8) * x[j] + (float)((b[i].qs[j] >> 4) - 8) * x[j + QK4_0 / 2];
        sum += vec_half_to_float(b[i].d) * s;
    }
    return sum;
#endif
}

#ifndef QUANT_AVX2 /* the AVX2 build uses the shared row-tokens kernels below */
static float dot_q8_0(const BlockQ8_0 *b, const float *x, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        float s = 0.0f;
        for (int j = 0; j < QK8_0; j++) s += (float)b[i].qs[j] * x[j];
        sum += vec_half_to_float(b[i].d) * s;
    }
    return sum;
}
#endif

#ifdef QUANT_AVX2
/* Σ v_i·x_i over 32 byte values (unsigned, or signed when is_signed) and 32 floats. */
static inline __m256 bytes32_dot(__m256i v, const float *x, int is_signed) {
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    __m256 acc;
#define WIDEN(b) _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b))
    acc = _mm256_mul_ps(WIDEN(lo), _mm256_loadu_ps(x));
    acc = _mm256_fmadd_ps(WIDEN(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), acc);
    acc = _mm256_fmadd_ps(WIDEN(hi), _mm256_loadu_ps(x + 16), acc);
    acc = _mm256_fmadd_ps(WIDEN(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), acc);
#undef WIDEN
    return acc;
}

/* Q4_K / Q5_K (fifth bits from qh when given): per 32-element sub-block j,
 * d·sc_j·Σ q·x − dmin·m_j·Σ x, the second sum from the activation's block sums. */
static float dot_q45_k(const uint8_t *row, int five, const float *x, const float *xs, int64_t nb) {
    const __m256i nib = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    float sum = 0.0f;
    size_t bb = five ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    for (int64_t i = 0; i < nb; i++, x += QK_K, xs += QK_K / 32) {
        const uint8_t *blk = row + (size_t)i * bb;
        uint16_t dh, mh;
        memcpy(&dh, blk, 2);
        memcpy(&mh, blk + 2, 2);
        const uint8_t *scales = blk + 4, *qh = five ? blk + 16 : NULL, *qs = five ? blk + 48 : blk + 16;
        float d = vec_half_to_float(dh), dmin = vec_half_to_float(mh);
        __m256i hbits = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        float acc = 0.0f, off = 0.0f;
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(raw, nib), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
            if (qh) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c + 1), one), 4));
            }
            uint8_t sc1, m1, sc2, m2;
            q4_k_scale_min(2 * c, scales, &sc1, &m1);
            q4_k_scale_min(2 * c + 1, scales, &sc2, &m2);
            acc += (float)sc1 * vec_hsum256(bytes32_dot(lo, x + 64 * c, 0)) + (float)sc2 * vec_hsum256(bytes32_dot(hi, x + 64 * c + 32, 0));
            off += (float)m1 * xs[2 * c] + (float)m2 * xs[2 * c + 1];
        }
        sum += d * acc - dmin * off;
    }
    return sum;
}

/* Q6_K: 16-element sub-blocks with signed 8-bit scales, values q − 32. */
static float dot_q6_k(const BlockQ6_K *b, const float *x, int64_t nb) {
    const __m256i nib = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3), bias = _mm256_set1_epi8(32);
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        float acc = 0.0f;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i hv = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, nib), _mm256_slli_epi16(_mm256_and_si256(hv, three), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, nib), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2), three), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nib),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 4), three), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nib),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 6), three), 4));
            for (int g = 0; g < 4; g++) {
                __m256i v = _mm256_sub_epi8(q[g], bias);
                const float *xg = x + 128 * h + 32 * g;
                __m128i v0 = _mm256_castsi256_si128(v), v1 = _mm256_extracti128_si256(v, 1);
                __m256 s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))), _mm256_loadu_ps(xg + 8),
                                            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), _mm256_loadu_ps(xg)));
                __m256 s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))), _mm256_loadu_ps(xg + 24),
                                            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), _mm256_loadu_ps(xg + 16)));
                acc += (float)sc[2 * g] * vec_hsum256(s0) + (float)sc[2 * g + 1] * vec_hsum256(s1);
            }
        }
        sum += vec_half_to_float(b[i].d) * acc;
    }
    return sum;
}
#endif

/* Types without a fused path: dequantize one superblock at a time and dot in fp32. */
static float dot_by_blocks(uint32_t type, const uint8_t *row, const float *x, int64_t n) {
    float buf[QK_K];
    size_t be = tensor_type_block_elems(type), bb = tensor_type_block_bytes(type);
    size_t chunk = be >= QK_K ? be : QK_K - QK_K % be;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += (int64_t)chunk) {
        int64_t len = n - i < (int64_t)chunk ? n - i : (int64_t)chunk;
        quant_dequantize_row(type, row + (size_t)(i / (int64_t)be) * bb, buf, len);
        sum += vec_dot_f32(buf, x + i, len);
    }
    return sum;
}

/* bf16 weights (synthetic models' matrices, model/synthetic_model.h): widened in registers, eight
 * independent sums so the compiler vectorizes the loop. */
static float dot_bf16(const uint16_t *row, const float *x, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            uint32_t bits = (uint32_t)row[i + k] << 16;
            float w;
            memcpy(&w, &bits, sizeof w);
            acc[k] += w * x[i + k];
        }
    float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) sum += bf16_to_fp32(row[i]) * x[i];
    return sum;
}

/* The types quant_dot_row sends to dot_by_blocks. */
static bool uses_dot_by_blocks(uint32_t type) {
#ifdef QUANT_AVX2
    if (type == TENSOR_Q4_K || type == TENSOR_Q5_K || type == TENSOR_Q6_K) return false;
#endif
    return type != TENSOR_F32 && type != TENSOR_Q4_0 && type != TENSOR_Q4_1 && type != TENSOR_Q8_0 && type != TENSOR_BF16;
}

/* dot_by_blocks for nt tokens with each chunk dequantized once: per token the same operations in
 * the same order as dot_by_blocks, so the values are bit-identical to one token at a time. */
static void dot_by_blocks_tokens(uint32_t type, const uint8_t *row, const float *x, size_t x_stride, int nt, int64_t n,
                                 float *out) {
    float buf[QK_K];
    size_t be = tensor_type_block_elems(type), bb = tensor_type_block_bytes(type);
    size_t chunk = be >= QK_K ? be : QK_K - QK_K % be;
    for (int t = 0; t < nt; t++) out[t] = 0.0f;
    for (int64_t i = 0; i < n; i += (int64_t)chunk) {
        int64_t len = n - i < (int64_t)chunk ? n - i : (int64_t)chunk;
        quant_dequantize_row(type, row + (size_t)(i / (int64_t)be) * bb, buf, len);
        for (int t = 0; t < nt; t++) out[t] += vec_dot_f32(buf, x + (size_t)t * x_stride + i, len);
    }
}

float quant_dot_row(uint32_t type, const void *row, const float *x, const float *xs, int64_t n) {
    switch (type) {
    case TENSOR_F32: return vec_dot_f32(row, x, n);
    case TENSOR_BF16: return dot_bf16(row, x, n);
    case TENSOR_Q4_0: return dot_q4_0(row, x, n / QK4_0);
#ifdef QUANT_AVX2
    case TENSOR_Q4_1: case TENSOR_Q8_0: {
        float out;
        quant_dot_row_tokens(type, row, x, 0, xs, 0, 1, n, &out);
        return out;
    }
    case TENSOR_Q4_K: return dot_q45_k(row, 0, x, xs, n / QK_K);
    case TENSOR_Q5_K: return dot_q45_k(row, 1, x, xs, n / QK_K);
    case TENSOR_Q6_K: return dot_q6_k(row, x, n / QK_K);
#else
    case TENSOR_Q4_1: return dot_q4_1(row, x, xs, n / QK4_1);
    case TENSOR_Q8_0: return dot_q8_0(row, x, n / QK8_0);
#endif
    default: return dot_by_blocks(type, row, x, n);
    }
}


#ifdef QUANT_AVX2
/* One Q4_1 row against nt (1..4) activation vectors x + t*x_stride. Each block is widened and
 * scaled by d once for all tokens; per token it then costs four multiply-adds and one scalar
 * offset term. Every (row, token) result follows the same sequence of operations whatever nt is,
 * so a token's logits do not depend on what else is in its batch. */
static inline __attribute__((always_inline)) void q4_1_row_tokens(const BlockQ4_1 *b, const float *x, size_t x_stride,
                                                                   const float *xs, size_t xs_stride, int nt, int64_t nb,
                                                                   float *out) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    /* Two chains per token (low and high nibble halves) keep FMA latency off the critical path. */
    __m256 lo_acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 hi_acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float offset[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < nb; i++) {
        __m128i raw = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
        __m256 d = _mm256_set1_ps(vec_half_to_float(b[i].d));
        __m256 w0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)));
        __m256 w1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))));
        __m256 w2 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)));
        __m256 w3 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))));
        float m = vec_half_to_float(b[i].m);
        for (int t = 0; t < nt; t++) {
            const float *xt = x + t * x_stride + i * QK4_1;
            lo_acc[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), lo_acc[t]));
            hi_acc[t] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), hi_acc[t]));
            offset[t] = fmaf(m, xs[t * xs_stride + i], offset[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = vec_hsum256(_mm256_add_ps(lo_acc[t], hi_acc[t])) + offset[t];
}

/* One Q8_0 row against nt (1..4) activation vectors, same contract as q4_1_row_tokens. */
static inline __attribute__((always_inline)) void q8_0_row_tokens(const BlockQ8_0 *b, const float *x, size_t x_stride, int nt,
                                                                   int64_t nb, float *out) {
    __m256 lo_acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 hi_acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++) {
        __m128i q01 = _mm_loadu_si128((const __m128i *)b[i].qs), q23 = _mm_loadu_si128((const __m128i *)(b[i].qs + 16));
        __m256 d = _mm256_set1_ps(vec_half_to_float(b[i].d));
        __m256 w0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q01)));
        __m256 w1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q01, 8))));
        __m256 w2 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q23)));
        __m256 w3 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q23, 8))));
        for (int t = 0; t < nt; t++) {
            const float *xt = x + t * x_stride + i * QK8_0;
            lo_acc[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), lo_acc[t]));
            hi_acc[t] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), hi_acc[t]));
        }
    }
    for (int t = 0; t < nt; t++) out[t] = vec_hsum256(_mm256_add_ps(lo_acc[t], hi_acc[t]));
}
#endif

void quant_dot_row_tokens(uint32_t type, const void *row, const float *x, size_t x_stride, const float *x_block_sums,
                          size_t sums_stride, int n_tokens, int64_t n, float *out) {
#ifdef QUANT_AVX2
    /* Constant token counts let the compiler keep the accumulators in registers. */
#define ROW_TOKENS(NT)                                                                                              \
    (type == TENSOR_Q4_1 ? q4_1_row_tokens(row, x, x_stride, x_block_sums, sums_stride, NT, n / QK4_1, out)       \
                         : q8_0_row_tokens(row, x, x_stride, NT, n / QK8_0, out))
    if (type == TENSOR_Q4_1 || type == TENSOR_Q8_0) {
        switch (n_tokens) {
        case 1: ROW_TOKENS(1); return;
        case 2: ROW_TOKENS(2); return;
        case 3: ROW_TOKENS(3); return;
        default: ROW_TOKENS(4); return;
        }
    }
#undef ROW_TOKENS
#endif
    if (n_tokens > 1 && uses_dot_by_blocks(type)) {
        dot_by_blocks_tokens(type, row, x, x_stride, n_tokens, n, out);
        return;
    }
    for (int t = 0; t < n_tokens; t++) out[t] = quant_dot_row(type, row, x + t * x_stride, x_block_sums + t * sums_stride, n);
}
