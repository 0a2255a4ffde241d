#include "kernels/cpu/quant.h"

#include <assert.h>
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
    case TENSOR_Q8_0: dequant_q8_0(row, out, n / QK8_0); break;
    case TENSOR_Q4_K: dequant_q4_k(row, out, n / QK_K); break;
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

float quant_dot_row(uint32_t type, const void *row, const float *x, const float *xs, int64_t n) {
    switch (type) {
    case TENSOR_F32: return vec_dot_f32(row, x, n);
    case TENSOR_Q4_0: return dot_q4_0(row, x, n / QK4_0);
#ifdef QUANT_AVX2
    case TENSOR_Q4_1: case TENSOR_Q8_0: {
        float out;
        quant_dot_row_tokens(type, row, x, 0, xs, 0, 1, n, &out);
        return out;
    }
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
    for (int t = 0; t < n_tokens; t++) out[t] = quant_dot_row(type, row, x + t * x_stride, x_block_sums + t * sums_stride, n);
}
