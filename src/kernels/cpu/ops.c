#include "kernels/cpu/ops.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/vec.h"

void cpu_rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * weight[i];
}

void cpu_add_inplace(float *x, const float *y, int n) {
    for (int i = 0; i < n; i++) x[i] += y[i];
}

#if defined(__AVX2__) && defined(__FMA__)
/* out[0..8) = silu(g) · u through the SIMD exp. */
static inline void swiglu8(const float *g, const float *u, float *out) {
    __m256 gv = _mm256_loadu_ps(g);
    __m256 e = vec_exp256(_mm256_xor_ps(gv, _mm256_set1_ps(-0.0f)));
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), _mm256_loadu_ps(u)));
}

void cpu_swiglu(float *gate, const float *up, int n) {
    int full = n / 8 * 8;
    /* A batch's worth (tens of thousands of elements) is worth the second core. */
#pragma omp parallel for schedule(static) if (n >= 8192)
    for (int i = 0; i < full; i += 8) swiglu8(gate + i, up + i, gate + i);
    int i = full;
    if (i == n) return;
    /* The tail through the same SIMD exp, so an element's value never depends on where it sits. */
    float g[8] = {0}, u[8] = {0};
    memcpy(g, gate + i, (size_t)(n - i) * sizeof(float));
    memcpy(u, up + i, (size_t)(n - i) * sizeof(float));
    swiglu8(g, u, g);
    memcpy(gate + i, g, (size_t)(n - i) * sizeof(float));
}
#else
void cpu_swiglu(float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
#endif

float cpu_rope_inv_freq(int i, int rope_dim, float base, const float *freq_factors) {
    float inv_freq = 1.0f / powf(base, (float)(2 * i) / (float)rope_dim);
    return freq_factors ? inv_freq / freq_factors[i] : inv_freq;
}

void cpu_rope_angles(int32_t pos, int rope_dim, float base, float position_scale, const float *freq_factors,
                     float *cos_out, float *sin_out) {
    float p = (float)pos * position_scale;
    for (int i = 0; i < rope_dim / 2; i++) {
        float angle = p * cpu_rope_inv_freq(i, rope_dim, base, freq_factors);
        cos_out[i] = cosf(angle);
        sin_out[i] = sinf(angle);
    }
}

void cpu_rope_apply(float *x, int n_heads, int head_dim, int rope_dim, RopePairing pairing, const float *cos_v,
                    const float *sin_v) {
    int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + h * head_dim;
        for (int i = 0; i < half; i++) {
            int a = pairing == ROPE_PAIRING_INTERLEAVED ? 2 * i : i;
            int b = pairing == ROPE_PAIRING_INTERLEAVED ? 2 * i + 1 : i + half;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cos_v[i] - x1 * sin_v[i];
            v[b] = x0 * sin_v[i] + x1 * cos_v[i];
        }
    }
}

/* One row the portable way: widen (exact), rotate like the forward, round back once. */
static void rotate_row_f16_scalar(uint16_t *row, int head_dim, int rope_dim, RopePairing pairing, const float *cos_v,
                                  const float *sin_v) {
    float x[CPU_ROPE_MAX_HEAD_DIM];
    for (int d = 0; d < rope_dim; d++) x[d] = vec_half_to_float(row[d]);
    cpu_rope_apply(x, 1, head_dim, rope_dim, pairing, cos_v, sin_v);
    for (int d = 0; d < rope_dim; d++) row[d] = vec_float_to_half(x[d]);
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* The same rotation 8 lanes at a time, F16C widening and rounding (the bits vec_float_to_half
 * gives). Interleaved pairs sit side by side: swap neighbours and use cos/sin duplicated per pair,
 * with sin negated in even lanes. Needs rope_dim % 8 == 0 (interleaved) or % 16 == 0 (half-split). */
static void rotate_row_f16_avx2(uint16_t *row, int rope_dim, RopePairing pairing, const float *cos_v, const float *sin_v) {
    if (pairing == ROPE_PAIRING_INTERLEAVED) {
        const __m256 even_sign = _mm256_setr_ps(-0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f);
        for (int d = 0; d < rope_dim; d += 8) {
            __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + d)));
            __m128 c4 = _mm_loadu_ps(cos_v + d / 2), s4 = _mm_loadu_ps(sin_v + d / 2);
            __m256 c = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
            __m256 sn = _mm256_xor_ps(_mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4)), even_sign);
            __m256 r = _mm256_fmadd_ps(_mm256_permute_ps(x, 0xB1), sn, _mm256_mul_ps(x, c));
            _mm_storeu_si128((__m128i *)(row + d), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
        }
        return;
    }
    int half = rope_dim / 2;
    for (int i = 0; i < half; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + i)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + i + half)));
        __m256 c = _mm256_loadu_ps(cos_v + i), sn = _mm256_loadu_ps(sin_v + i);
        __m256 ra = _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, sn)), rb = _mm256_fmadd_ps(a, sn, _mm256_mul_ps(b, c));
        _mm_storeu_si128((__m128i *)(row + i), _mm256_cvtps_ph(ra, _MM_FROUND_TO_NEAREST_INT));
        _mm_storeu_si128((__m128i *)(row + i + half), _mm256_cvtps_ph(rb, _MM_FROUND_TO_NEAREST_INT));
    }
}
#endif

void cpu_rope_rotate_f16(uint16_t *rows, int n_rows, int head_dim, int rope_dim, RopePairing pairing, const float *cos_v,
                         const float *sin_v) {
    assert(head_dim <= CPU_ROPE_MAX_HEAD_DIM && rope_dim <= head_dim);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    bool vector = rope_dim % (pairing == ROPE_PAIRING_INTERLEAVED ? 8 : 16) == 0;
#else
    bool vector = false;
#endif
    for (int r = 0; r < n_rows; r++) {
        uint16_t *row = rows + (size_t)r * head_dim;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
        if (vector) {
            rotate_row_f16_avx2(row, rope_dim, pairing, cos_v, sin_v);
            continue;
        }
#endif
        rotate_row_f16_scalar(row, head_dim, rope_dim, pairing, cos_v, sin_v);
    }
}

void cpu_softmax(float *x, int n) {
    float max = -INFINITY;
    for (int i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}
