#include "kernels/cpu/act_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#define ACT_QUANT_AVX2 1
#endif

/* Scale and its reciprocal from the block's largest magnitude. Both builds share this scalar code
 * so the SIMD and scalar paths multiply by the same factor. */
static inline void block_scales(float amax, float *d, float *inv) {
    *d = amax / 127.0f;
    *inv = amax > 0.0f ? 127.0f / amax : 0.0f;
}

#ifdef ACT_QUANT_AVX2
static inline float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline int32_t hsum256_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

void act_quant_block(const float *x, int8_t *q, float *d, int32_t *sum) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 v[4];
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
    __m256 m01 = _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask));
    __m256 m23 = _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask));
    float inv;
    block_scales(hmax256(_mm256_max_ps(m01, m23)), d, &inv);
    const __m256 scale = _mm256_set1_ps(inv);
    __m256i iv[4];
    for (int i = 0; i < 4; i++)
        iv[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    *sum = hsum256_epi32(_mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3])));
    /* The packs work per 128-bit lane; the final permute puts the four 8-byte pieces back in order. */
    __m256i w01 = _mm256_packs_epi32(iv[0], iv[1]), w23 = _mm256_packs_epi32(iv[2], iv[3]);
    __m256i b = _mm256_packs_epi16(w01, w23);
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, b);
}
#else
void act_quant_block(const float *x, int8_t *q, float *d, int32_t *sum) {
    float amax = 0.0f;
    for (int j = 0; j < ACT_QUANT_BLOCK; j++) amax = fmaxf(amax, fabsf(x[j]));
    float inv;
    block_scales(amax, d, &inv);
    int32_t s = 0;
    for (int j = 0; j < ACT_QUANT_BLOCK; j++) {
        float scaled = x[j] * inv; /* a separate statement: never fused with anything */
        q[j] = (int8_t)nearbyintf(scaled);
        s += q[j];
    }
    *sum = s;
}
#endif

void act_quant_free(Int8Activations *a) {
    free(a->rows);
    free(a->interleaved);
    free(a->d);
    free(a->dsum);
    free(a->sum);
    memset(a, 0, sizeof *a);
}

/* Every 32-byte run the kernels load must sit inside one cache line. */
#define ACT_QUANT_ALIGN 64

static int8_t *alloc_values(size_t values) {
    return aligned_alloc(ACT_QUANT_ALIGN, (values + ACT_QUANT_ALIGN - 1) / ACT_QUANT_ALIGN * ACT_QUANT_ALIGN);
}

static int reserve(Int8Activations *a, size_t values, size_t blocks) {
    if (values > a->cap_values) {
        int8_t *r = alloc_values(values), *il = alloc_values(values);
        if (!r || !il) {
            free(r);
            free(il);
            return -1;
        }
        free(a->rows);
        free(a->interleaved);
        a->rows = r;
        a->interleaved = il;
        a->cap_values = values;
    }
    if (blocks > a->cap_blocks) {
        float *d = realloc(a->d, blocks * sizeof *d), *ds = realloc(a->dsum, blocks * sizeof *ds);
        if (d) a->d = d;
        if (ds) a->dsum = ds;
        int32_t *s = realloc(a->sum, blocks * sizeof *s);
        if (s) a->sum = s;
        if (!d || !ds || !s) return -1;
        a->cap_blocks = blocks;
    }
    return 0;
}

/* Quantizes token t's row and scatters it into both layouts. */
static void fill_token(Int8Activations *a, const float *x, int t) {
    int8_t *row = a->rows + (size_t)t * a->cols;
    int g = t / ACT_QUANT_GROUP, lane = t % ACT_QUANT_GROUP;
    for (int b = 0; b < a->nb; b++) {
        int8_t *q = row + (size_t)b * ACT_QUANT_BLOCK;
        size_t m = act_quant_meta_index(a, t, b);
        act_quant_block(x + (size_t)b * ACT_QUANT_BLOCK, q, &a->d[m], &a->sum[m]);
        a->dsum[m] = a->d[m] * (float)a->sum[m];
        if (a->rows_only) continue;
        int8_t *dst = a->interleaved + ((size_t)g * a->nb + b) * ACT_QUANT_GROUP * ACT_QUANT_BLOCK + 4 * lane;
        for (int k = 0; k < ACT_QUANT_BLOCK / 4; k++) memcpy(dst + k * 32, q + 4 * k, 4);
    }
}

/* Padding tokens are all zeros, so their lanes compute 0 and never produce NaN or subnormals. */
static void zero_token(Int8Activations *a, int t) {
    int g = t / ACT_QUANT_GROUP, lane = t % ACT_QUANT_GROUP;
    memset(a->rows + (size_t)t * a->cols, 0, (size_t)a->cols);
    for (int b = 0; b < a->nb; b++) {
        size_t m = act_quant_meta_index(a, t, b);
        a->d[m] = a->dsum[m] = 0.0f;
        a->sum[m] = 0;
        int8_t *dst = a->interleaved + ((size_t)g * a->nb + b) * ACT_QUANT_GROUP * ACT_QUANT_BLOCK + 4 * lane;
        for (int k = 0; k < ACT_QUANT_BLOCK / 4; k++) memset(dst + k * 32, 0, 4);
    }
}

int act_quant_reserve(Int8Activations *a, int n_tokens, int cols) {
    int n_groups = (n_tokens + ACT_QUANT_GROUP - 1) / ACT_QUANT_GROUP, padded = n_groups * ACT_QUANT_GROUP;
    if (reserve(a, (size_t)padded * (size_t)cols, (size_t)padded * (size_t)(cols / ACT_QUANT_BLOCK))) return -1;
    a->n_tokens = n_tokens;
    a->cols = cols;
    a->nb = cols / ACT_QUANT_BLOCK;
    a->n_groups = n_groups;
    a->rows_only = false;
    return 0;
}

int act_quant_reserve_rows(Int8Activations *a, int n_tokens, int cols) {
    if (act_quant_reserve(a, n_tokens, cols)) return -1;
    a->rows_only = true;
    return 0;
}

void act_quant_token(Int8Activations *a, const float *x, int t) {
    if (t < a->n_tokens) fill_token(a, x + (size_t)t * a->cols, t);
    else zero_token(a, t);
}

int act_quant_fill(Int8Activations *a, const float *x, int n_tokens, int cols) {
    if (act_quant_reserve(a, n_tokens, cols)) return -1;
    for (int t = 0; t < a->n_groups * ACT_QUANT_GROUP; t++) act_quant_token(a, x, t);
    return 0;
}
