/*
 * vec.h — small fp32 vector primitives shared by the CPU kernels (dot, axpy), AVX2 when built for it.
 * Header-only so they inline into the hot loops. Pure functions, thread-safe.
 */
#ifndef BRAID_KERNELS_CPU_VEC_H
#define BRAID_KERNELS_CPU_VEC_H

#include <stdint.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float vec_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

static inline float vec_dot_f32(const float *a, const float *b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    float sum = vec_hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* y (n) += alpha · x (n) */
static inline void vec_axpy_f32(float *y, float alpha, const float *x, int64_t n) {
    __m256 a = _mm256_set1_ps(alpha);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += alpha * x[i];
}
#else
static inline float vec_dot_f32(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static inline void vec_axpy_f32(float *y, float alpha, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}
#endif

#endif
