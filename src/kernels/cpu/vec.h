/*
 * vec.h — small fp32 vector primitives shared by the CPU kernels (dot, exp, fp16 scale loads,
 * fp32 → fp16 for the KV cache), AVX2 / F16C when built for them.
 * Header-only so they inline into the hot loops. Pure functions, thread-safe.
 */
#ifndef BRAID_KERNELS_CPU_VEC_H
#define BRAID_KERNELS_CPU_VEC_H

#include <stdint.h>

#include "model/tensor_types.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* A GGUF block's fp16 scale as fp32 (exact either way; F16C when the build has it). */
static inline float vec_half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return fp16_to_fp32(h);
#endif
}

/* fp32 → IEEE half, rounded to nearest even (subnormal halves included), ±inf beyond the range,
 * NaN quieted with its top payload bits: F16C's VCVTPS2PH where the build has it, else
 * fp32_to_fp16, which gives the same bits (test_ops holds them against each other), so a KV
 * cache written by either build holds the same values. */
static inline uint16_t vec_float_to_half(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return fp32_to_fp16(f);
#endif
}

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

/* e^x in every lane: 2^n · e^r with n = round(x·log2 e) and |r| <= ln2/2, e^r by its Taylor series
 * to r^7 (truncation under 1e-8 relative), so within a few ulp of expf. Arguments are clamped to
 * [-87.3, 88.3], where 2^n stays a normal float: far-negative x gives ~1e-38 instead of 0. */
static inline __m256 vec_exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* ln 2 in two parts: n · ln2_hi is exact, so r keeps its low bits */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606820309417e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}
#else
static inline float vec_dot_f32(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}
#endif

#endif
