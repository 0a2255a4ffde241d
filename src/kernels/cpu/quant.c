#include "kernels/cpu/quant.h"

#include <assert.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QUANT_AVX2 1
#endif

#include "kernels/cpu/vec.h"
#include "model/tensor_types.h"

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return fp16_to_fp32(h);
#endif
}

static void dequant_q4_0(const BlockQ4_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        float d = half_to_float(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((b[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const BlockQ4_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        float d = half_to_float(b[i].d), m = half_to_float(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(b[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void dequant_q8_0(const BlockQ8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        float d = half_to_float(b[i].d);
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
        float d = half_to_float(b[i].d), dmin = half_to_float(b[i].dmin);
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
        float d = half_to_float(b[i].d);
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
        for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = half_to_float(h); }
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

static float dot_q4_1(const BlockQ4_1 *b, const float *x, const float *xs, int64_t nb) {
#ifdef QUANT_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float offset = 0.0f;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, x += 2 * QK4_1) {
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(b[i].d)), nibble_block_dot(b[i].qs, x, 0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(b[i + 1].d)), nibble_block_dot(b[i + 1].qs, x + QK4_1, 0), acc1);
        offset += half_to_float(b[i].m) * xs[i] + half_to_float(b[i + 1].m) * xs[i + 1];
    }
    for (; i < nb; i++, x += QK4_1) {
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(b[i].d)), nibble_block_dot(b[i].qs, x, 0), acc0);
        offset += half_to_float(b[i].m) * xs[i];
    }
    return vec_hsum256(_mm256_add_ps(acc0, acc1)) + offset;
#else
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        float s = 0.0f;
        for (int j = 0; j < QK4_1 / 2; j++)
            s += (float)(b[i].qs[j] & 0x0F) * x[j] + (float)(b[i].qs[j] >> 4) * x[j + QK4_1 / 2];
        sum += half_to_float(b[i].d) * s + half_to_float(b[i].m) * xs[i];
    }
    return sum;
#endif
}

#ifdef QUANT_AVX2
/* Σ q_i·x_i of one Q4_1 block against activations already in registers. */
static inline __m256 q4_1_block_dot_x(const uint8_t *qs, __m256 x0, __m256 x1, __m256 x2, __m256 x3) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    __m256 s01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), x1,
                                 _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), x0));
    __m256 s23 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), x3,
                                 _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), x2));
    return _mm256_add_ps(s01, s23);
}
#endif

/* Four Q4_1 rows against one activation vector: each activation block is loaded once for all four. */
static void dot4_q4_1(const uint8_t *rows, size_t row_bytes, const float *x, const float *xs, int64_t nb, float *out) {
    const BlockQ4_1 *r0 = (const BlockQ4_1 *)rows, *r1 = (const BlockQ4_1 *)(rows + row_bytes);
    const BlockQ4_1 *r2 = (const BlockQ4_1 *)(rows + 2 * row_bytes), *r3 = (const BlockQ4_1 *)(rows + 3 * row_bytes);
#ifdef QUANT_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    float o0 = 0, o1 = 0, o2 = 0, o3 = 0;
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8), x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(r0[i].d)), q4_1_block_dot_x(r0[i].qs, x0, x1, x2, x3), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(r1[i].d)), q4_1_block_dot_x(r1[i].qs, x0, x1, x2, x3), a1);
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(r2[i].d)), q4_1_block_dot_x(r2[i].qs, x0, x1, x2, x3), a2);
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(r3[i].d)), q4_1_block_dot_x(r3[i].qs, x0, x1, x2, x3), a3);
        o0 += half_to_float(r0[i].m) * xs[i];
        o1 += half_to_float(r1[i].m) * xs[i];
        o2 += half_to_float(r2[i].m) * xs[i];
        o3 += half_to_float(r3[i].m) * xs[i];
    }
    out[0] = vec_hsum256(a0) + o0;
    out[1] = vec_hsum256(a1) + o1;
    out[2] = vec_hsum256(a2) + o2;
    out[3] = vec_hsum256(a3) + o3;
#else
    out[0] = dot_q4_1(r0, x, xs, nb);
    out[1] = dot_q4_1(r1, x, xs, nb);
    out[2] = dot_q4_1(r2, x, xs, nb);
    out[3] = dot_q4_1(r3, x, xs, nb);
#endif
}

static float dot_q4_0(const BlockQ4_0 *b, const float *x, int64_t nb) {
#ifdef QUANT_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += QK4_0)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(b[i].d)), nibble_block_dot(b[i].qs, x, 8), acc);
    return vec_hsum256(acc);
#else
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        float s = 0.0f;
        for (int j = 0; j < QK4_0 / 2; j++)
            s += (float)((b[i].qs[j] & 0x0F) - 8) * x[j] + (float)((b[i].qs[j] >> 4) - 8) * x[j + QK4_0 / 2];
        sum += half_to_float(b[i].d) * s;
    }
    return sum;
#endif
}

static float dot_q8_0(const BlockQ8_0 *b, const float *x, int64_t nb) {
#ifdef QUANT_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        __m128i q01 = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m128i q23 = _mm_loadu_si128((const __m128i *)(b[i].qs + 16));
        __m256 s01 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q01)), _mm256_loadu_ps(x));
        s01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q01, 8))), _mm256_loadu_ps(x + 8), s01);
        __m256 s23 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q23)), _mm256_loadu_ps(x + 16));
        s23 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q23, 8))), _mm256_loadu_ps(x + 24), s23);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(b[i].d)), _mm256_add_ps(s01, s23), acc);
    }
    return vec_hsum256(acc);
#else
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        float s = 0.0f;
        for (int j = 0; j < QK8_0; j++) s += (float)b[i].qs[j] * x[j];
        sum += half_to_float(b[i].d) * s;
    }
    return sum;
#endif
}

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
    case TENSOR_Q4_1: return dot_q4_1(row, x, xs, n / QK4_1);
    case TENSOR_Q8_0: return dot_q8_0(row, x, n / QK8_0);
    default: return dot_by_blocks(type, row, x, n);
    }
}

void quant_dot_rows4(uint32_t type, const void *rows, size_t row_bytes, const float *x, const float *x_block_sums, int64_t n,
                     float *out) {
    if (type == TENSOR_Q4_1) {
        dot4_q4_1(rows, row_bytes, x, x_block_sums, n / QK4_1, out);
        return;
    }
    for (int r = 0; r < 4; r++) out[r] = quant_dot_row(type, (const uint8_t *)rows + r * row_bytes, x, x_block_sums, n);
}
