#include "kernels/cpu/ops.h"

#include <math.h>
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

void cpu_rope_angles(int32_t pos, int rope_dim, float base, float position_scale, const float *freq_factors,
                     float *cos_out, float *sin_out) {
    float p = (float)pos * position_scale;
    for (int i = 0; i < rope_dim / 2; i++) {
        float inv_freq = 1.0f / powf(base, (float)(2 * i) / (float)rope_dim);
        if (freq_factors) inv_freq /= freq_factors[i];
        float angle = p * inv_freq;
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
