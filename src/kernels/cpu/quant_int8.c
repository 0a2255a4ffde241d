#include "kernels/cpu/quant_int8.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/int8_pack.h"
#include "kernels/cpu/vec.h"
#include "model/tensor_types.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INT8_AVX2 1
/* dpbusd (u8 × s8, four products summed into each int32 lane, no saturation) where the build has
 * it; otherwise maddubs + madd compute the same integers. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define INT8_DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(__AVXVNNI__)
#define INT8_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#endif
#endif

#define INLINE static inline __attribute__((always_inline))

bool quant_int8_supported(uint32_t type) {
    return type == TENSOR_Q4_0 || type == TENSOR_Q4_1 || type == TENSOR_Q8_0;
}

/* ---- the canonical sequence in portable C ------------------------------------------------------ */

Int8Row quant_int8_row(uint32_t type, const void *row) {
    return (Int8Row){.base = row, .block_stride = tensor_type_block_bytes(type), .d_at = 0, .m_at = 2,
                     .run_at = type == TENSOR_Q4_1 ? 4 : 2, .run_stride = 4};
}

static float row_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return vec_half_to_float(h);
}

/* Byte j of block b's quantized values, through the row view's runs. */
static uint8_t row_qs(Int8Row row, const uint8_t *blk, int j) { return blk[row.run_at + (uint32_t)(j / 4) * row.run_stride + (uint32_t)(j % 4)]; }

/* Σ (nibble − bias) · x over one 4-bit block: element j in the low nibble of byte j, j+16 in the high. */
static int32_t q4_block_isum(Int8Row row, const uint8_t *blk, const int8_t *x, int bias) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += ((row_qs(row, blk, j) & 0x0F) - bias) * x[j] + ((row_qs(row, blk, j) >> 4) - bias) * x[j + 16];
    return s;
}

static int32_t q8_block_isum(Int8Row row, const uint8_t *blk, const int8_t *x) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int8_t)row_qs(row, blk, j) * x[j];
    return s;
}

float quant_int8_dot_reference_row(uint32_t type, Int8Row row, const Int8Activations *a, int token) {
    assert(quant_int8_supported(type));
    float acc = 0.0f, off = 0.0f;
    for (int b = 0; b < a->nb; b++) {
        const int8_t *x = a->rows + (size_t)token * a->cols + (size_t)b * ACT_QUANT_BLOCK;
        const uint8_t *blk = row.base + (size_t)b * row.block_stride;
        size_t m = act_quant_meta_index(a, token, b);
        int32_t isum = type == TENSOR_Q8_0 ? q8_block_isum(row, blk, x) : q4_block_isum(row, blk, x, type == TENSOR_Q4_0 ? 8 : 0);
        acc = fmaf((float)isum, row_half(blk + row.d_at) * a->d[m], acc);
        if (type == TENSOR_Q4_1) off = fmaf(row_half(blk + row.m_at), a->dsum[m], off);
    }
    return type == TENSOR_Q4_1 ? acc + off : acc;
}

float quant_int8_dot_reference(uint32_t type, const void *row, const Int8Activations *a, int token) {
    return quant_int8_dot_reference_row(type, quant_int8_row(type, row), a, token);
}

#ifdef INT8_AVX2
/* ---- AVX2: shared pieces ------------------------------------------------------------------------ */

INLINE int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* Four consecutive weight bytes repeated in all eight 32-bit lanes. */
INLINE __m256i broadcast_run(const void *p) {
    int32_t w;
    memcpy(&w, p, 4);
    return _mm256_set1_epi32(w);
}

/* Int32 lanes of Σ u·s over each lane's four byte pairs; u unsigned, s signed, and every pair sum
 * within int16 (the 4-bit weights guarantee it). */
INLINE __m256i dot_u4_s8(__m256i acc, __m256i u, __m256i s) {
#ifdef INT8_DPBUSD
    return INT8_DPBUSD(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* Int32 lanes of Σ w·s for signed weights w. VNNI: w + 128 is unsigned, and the caller subtracts
 * 128·Σs. Otherwise |w| times s with w's sign; one pair of 8-bit products fits int16 (at most
 * 2·128·127) but two do not, so each maddubs result is widened at once. */
#ifdef INT8_DPBUSD
#define Q8_BIAS_SHIFT 7
#define Q8_BIAS 128
INLINE __m256i q8_prepare(__m256i w) { return _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)); }
INLINE __m256i dot_q8_s8(__m256i acc, __m256i w_prepared, __m256i w_raw, __m256i s) {
    (void)w_raw;
    return INT8_DPBUSD(acc, w_prepared, s);
}
#else
#define Q8_BIAS_SHIFT 0
#define Q8_BIAS 0
INLINE __m256i q8_prepare(__m256i w) { return _mm256_abs_epi8(w); }
INLINE __m256i dot_q8_s8(__m256i acc, __m256i w_abs, __m256i w_raw, __m256i s) {
    __m256i p = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(s, w_raw));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
#endif

/* ---- AVX2 lane kernels (lanes = tokens): per-block steps they share ---------------------------- */

/* Accumulates one block's contribution into the lanes of acc: the canonical fmaf step per lane. */
INLINE __m256 scale_step(__m256i isum, __m256 d_w, const float *d_x, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d_w, _mm256_loadu_ps(d_x)), acc);
}

/* Subtracts bias · Σx (bias = 2^shift) per lane: the unsigned storage of signed weights. */
INLINE __m256i unbias(__m256i isum, const int32_t *sum, int shift) {
    if (!shift) return isum;
    return _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)sum), shift));
}

/* An fp16 block scale, converted and repeated in all eight lanes. */
INLINE __m256 broadcast_half(const void *p) {
    int16_t h;
    memcpy(&h, p, 2);
    return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

/* ---- AVX2, two rows × 8 tokens per vector (lanes = tokens) -------------------------------------- */

/* Two weight rows share every activation load (the interleaved runs are read once for both rows),
 * and each weight run is broadcast to the 8 lanes and unpacked once for every token group. Integer
 * partial sums run in two chains per (row, group), low and high nibble runs; the float steps per
 * row and group are the canonical fmaf sequence, one block after another. */
#ifdef INT8_DPBUSD
INLINE __m256i u4_acc_add(__m256i acc, __m256i u, __m256i x) { return INT8_DPBUSD(acc, u, x); }
INLINE __m256i u4_acc_finish(__m256i lo, __m256i hi) { return _mm256_add_epi32(lo, hi); }
INLINE __m256i u4_acc_finish1(__m256i acc) { return acc; }
#else
/* int16 lanes: a pair of 4-bit products is at most 2·15·127 = 3810, four of them per chain fit */
INLINE __m256i u4_acc_add(__m256i acc, __m256i u, __m256i x) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, x)); }
INLINE __m256i u4_acc_finish(__m256i lo, __m256i hi) {
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
}
/* one chain of up to eight runs (at most 8 · 3810 = 30480 per int16 lane) */
INLINE __m256i u4_acc_finish1(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
#endif

INLINE void q4_groups_rows2(Int8Row row0, Int8Row row1, bool has_min, int bias_shift, const Int8Activations *a, int g0,
                            int ng, float *out0, float *out1) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256 acc0[QUANT_INT8_MAX_GROUPS], acc1[QUANT_INT8_MAX_GROUPS], off0[QUANT_INT8_MAX_GROUPS], off1[QUANT_INT8_MAX_GROUPS];
    for (int i = 0; i < ng; i++) acc0[i] = acc1[i] = off0[i] = off1[i] = _mm256_setzero_ps();
    for (int b = 0; b < a->nb; b++) {
        const uint8_t *blk0 = row0.base + (size_t)b * row0.block_stride, *blk1 = row1.base + (size_t)b * row1.block_stride;
        const int8_t *x[QUANT_INT8_MAX_GROUPS];
        size_t m[QUANT_INT8_MAX_GROUPS];
        __m256i lo0[QUANT_INT8_MAX_GROUPS], hi0[QUANT_INT8_MAX_GROUPS], lo1[QUANT_INT8_MAX_GROUPS], hi1[QUANT_INT8_MAX_GROUPS];
        for (int i = 0; i < ng; i++) {
            m[i] = ((size_t)(g0 + i) * (size_t)a->nb + (size_t)b) * ACT_QUANT_GROUP;
            x[i] = a->interleaved + m[i] * ACT_QUANT_BLOCK;
            lo0[i] = hi0[i] = lo1[i] = hi1[i] = _mm256_setzero_si256();
        }
        for (int k = 0; k < 4; k++) {
            __m256i v0 = broadcast_run(blk0 + row0.run_at + k * row0.run_stride);
            __m256i v1 = broadcast_run(blk1 + row1.run_at + k * row1.run_stride);
            __m256i l0 = _mm256_and_si256(v0, mask), h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), mask);
            __m256i l1 = _mm256_and_si256(v1, mask), h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), mask);
            for (int i = 0; i < ng; i++) {
                __m256i xl = _mm256_loadu_si256((const __m256i *)(x[i] + 32 * k));
                __m256i xh = _mm256_loadu_si256((const __m256i *)(x[i] + 32 * (k + 4)));
                lo0[i] = u4_acc_add(lo0[i], l0, xl);
                lo1[i] = u4_acc_add(lo1[i], l1, xl);
                hi0[i] = u4_acc_add(hi0[i], h0, xh);
                hi1[i] = u4_acc_add(hi1[i], h1, xh);
            }
        }
        const __m256 d0 = broadcast_half(blk0 + row0.d_at), d1 = broadcast_half(blk1 + row1.d_at);
        for (int i = 0; i < ng; i++) {
            acc0[i] = scale_step(unbias(u4_acc_finish(lo0[i], hi0[i]), a->sum + m[i], bias_shift), d0, a->d + m[i], acc0[i]);
            acc1[i] = scale_step(unbias(u4_acc_finish(lo1[i], hi1[i]), a->sum + m[i], bias_shift), d1, a->d + m[i], acc1[i]);
            if (has_min) {
                const __m256 dsum = _mm256_loadu_ps(a->dsum + m[i]);
                off0[i] = _mm256_fmadd_ps(broadcast_half(blk0 + row0.m_at), dsum, off0[i]);
                off1[i] = _mm256_fmadd_ps(broadcast_half(blk1 + row1.m_at), dsum, off1[i]);
            }
        }
    }
    for (int i = 0; i < ng; i++) {
        _mm256_storeu_ps(out0 + 8 * i, has_min ? _mm256_add_ps(acc0[i], off0[i]) : acc0[i]);
        _mm256_storeu_ps(out1 + 8 * i, has_min ? _mm256_add_ps(acc1[i], off1[i]) : acc1[i]);
    }
}

/* The same for Q8_0: each weight run is broadcast and prepared (q8_prepare) once for every group;
 * two chains per (row, group) by run parity. */
INLINE void q8_groups_rows2(Int8Row row0, Int8Row row1, const Int8Activations *a, int g0, int ng, float *out0, float *out1) {
    __m256 acc0[QUANT_INT8_MAX_GROUPS], acc1[QUANT_INT8_MAX_GROUPS];
    for (int i = 0; i < ng; i++) acc0[i] = acc1[i] = _mm256_setzero_ps();
    for (int b = 0; b < a->nb; b++) {
        const uint8_t *blk0 = row0.base + (size_t)b * row0.block_stride, *blk1 = row1.base + (size_t)b * row1.block_stride;
        const int8_t *x[QUANT_INT8_MAX_GROUPS];
        size_t m[QUANT_INT8_MAX_GROUPS];
        __m256i s0[QUANT_INT8_MAX_GROUPS][2], s1[QUANT_INT8_MAX_GROUPS][2];
        for (int i = 0; i < ng; i++) {
            m[i] = ((size_t)(g0 + i) * (size_t)a->nb + (size_t)b) * ACT_QUANT_GROUP;
            x[i] = a->interleaved + m[i] * ACT_QUANT_BLOCK;
            s0[i][0] = s0[i][1] = s1[i][0] = s1[i][1] = _mm256_setzero_si256();
        }
        for (int k = 0; k < 8; k++) {
            __m256i w0 = broadcast_run(blk0 + row0.run_at + k * row0.run_stride);
            __m256i w1 = broadcast_run(blk1 + row1.run_at + k * row1.run_stride);
            __m256i p0 = q8_prepare(w0), p1 = q8_prepare(w1);
            for (int i = 0; i < ng; i++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[i] + 32 * k));
                s0[i][k & 1] = dot_q8_s8(s0[i][k & 1], p0, w0, xv);
                s1[i][k & 1] = dot_q8_s8(s1[i][k & 1], p1, w1, xv);
            }
        }
        const __m256 d0 = broadcast_half(blk0 + row0.d_at), d1 = broadcast_half(blk1 + row1.d_at);
        for (int i = 0; i < ng; i++) {
            __m256i isum0 = unbias(_mm256_add_epi32(s0[i][0], s0[i][1]), a->sum + m[i], Q8_BIAS_SHIFT);
            __m256i isum1 = unbias(_mm256_add_epi32(s1[i][0], s1[i][1]), a->sum + m[i], Q8_BIAS_SHIFT);
            acc0[i] = scale_step(isum0, d0, a->d + m[i], acc0[i]);
            acc1[i] = scale_step(isum1, d1, a->d + m[i], acc1[i]);
        }
    }
    for (int i = 0; i < ng; i++) {
        _mm256_storeu_ps(out0 + 8 * i, acc0[i]);
        _mm256_storeu_ps(out1 + 8 * i, acc1[i]);
    }
}

/* ---- AVX2, one token at a time (lanes = the 32 elements of a block) ---------------------------- */

/* A 4-bit block as 32 unsigned bytes in element order: low nibbles, then high nibbles. */
INLINE __m256i q4_block_bytes(const uint8_t *qs) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
}

INLINE void q4_tokens(const uint8_t *row, size_t block_bytes, bool has_min, int bias, const Int8Activations *a, int t0,
                      int nt, float *out) {
    float acc[4] = {0, 0, 0, 0}, off[4] = {0, 0, 0, 0};
    for (int b = 0; b < a->nb; b++) {
        const uint8_t *blk = row + (size_t)b * block_bytes;
        uint16_t dh, mh = 0;
        memcpy(&dh, blk, 2);
        if (has_min) memcpy(&mh, blk + 2, 2);
        const float d_w = vec_half_to_float(dh), m_w = vec_half_to_float(mh);
        const __m256i u = q4_block_bytes(blk + (has_min ? 4 : 2));
        for (int i = 0; i < nt; i++) {
            const int8_t *x = a->rows + (size_t)(t0 + i) * a->cols + (size_t)b * ACT_QUANT_BLOCK;
            size_t m = act_quant_meta_index(a, t0 + i, b);
            int32_t isum = hsum_epi32(dot_u4_s8(_mm256_setzero_si256(), u, _mm256_loadu_si256((const __m256i *)x)));
            isum -= bias * a->sum[m];
            acc[i] = fmaf((float)isum, d_w * a->d[m], acc[i]);
            if (has_min) off[i] = fmaf(m_w, a->dsum[m], off[i]);
        }
    }
    for (int i = 0; i < nt; i++) out[i] = has_min ? acc[i] + off[i] : acc[i];
}

INLINE void q8_tokens(const BlockQ8_0 *row, const Int8Activations *a, int t0, int nt, float *out) {
    float acc[4] = {0, 0, 0, 0};
    for (int b = 0; b < a->nb; b++) {
        const float d_w = vec_half_to_float(row[b].d);
        const __m256i raw = _mm256_loadu_si256((const __m256i *)row[b].qs), prep = q8_prepare(raw);
        for (int i = 0; i < nt; i++) {
            const int8_t *x = a->rows + (size_t)(t0 + i) * a->cols + (size_t)b * ACT_QUANT_BLOCK;
            size_t m = act_quant_meta_index(a, t0 + i, b);
            int32_t isum = hsum_epi32(dot_q8_s8(_mm256_setzero_si256(), prep, raw, _mm256_loadu_si256((const __m256i *)x)));
            isum -= Q8_BIAS * a->sum[m];
            acc[i] = fmaf((float)isum, d_w * a->d[m], acc[i]);
        }
    }
    for (int i = 0; i < nt; i++) out[i] = acc[i];
}

/* ---- AVX2, one token × eight rows (lanes = rows) -------------------------------------------------- */

/* lane r = Σ of the eight int32 lanes of v[r]: exact integer sums, three levels of pairwise adds. */
INLINE __m256i sum_lanes8_epi32(const __m256i v[8]) {
    __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
    /* each 128-bit half now holds partial sums of rows 0-3 (h0123) and 4-7 (h4567) */
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20), _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

/* The fp16 at byte offset `at` of each of eight rows `stride` bytes apart, as eight floats. */
INLINE __m256 gather_half8(const uint8_t *p, size_t stride) {
    uint16_t h[8];
    for (int r = 0; r < 8; r++) memcpy(&h[r], p + (size_t)r * stride, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* Q4_0 / Q4_1: per block, each row's 32 nibbles against the token's 32 int8 (lanes = elements),
 * the eight rows' integer sums gathered into one vector, then the canonical fmaf steps with all
 * eight rows in the lanes. */
INLINE void q4_rows8(const uint8_t *row0, size_t row_bytes, size_t block_bytes, bool has_min, int bias_shift,
                     const Int8Activations *a, int token, float *out) {
    __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
    const int qs = has_min ? 4 : 2;
    for (int b = 0; b < a->nb; b++) {
        const uint8_t *blk = row0 + (size_t)b * block_bytes;
        const __m256i x = _mm256_load_si256((const __m256i *)(a->rows + (size_t)token * a->cols + (size_t)b * ACT_QUANT_BLOCK));
        size_t m = act_quant_meta_index(a, token, b);
        __m256i part[8];
        for (int r = 0; r < 8; r++) part[r] = dot_u4_s8(_mm256_setzero_si256(), q4_block_bytes(blk + (size_t)r * row_bytes + qs), x);
        __m256i isum = sum_lanes8_epi32(part);
        if (bias_shift) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(a->sum[m] * (1 << bias_shift)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(gather_half8(blk, row_bytes), _mm256_set1_ps(a->d[m])), acc);
        if (has_min) off = _mm256_fmadd_ps(gather_half8(blk + 2, row_bytes), _mm256_set1_ps(a->dsum[m]), off);
    }
    _mm256_storeu_ps(out, has_min ? _mm256_add_ps(acc, off) : acc);
}

INLINE void q8_rows8(const uint8_t *row0, size_t row_bytes, const Int8Activations *a, int token, float *out) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < a->nb; b++) {
        const uint8_t *blk = row0 + (size_t)b * sizeof(BlockQ8_0);
        const __m256i x = _mm256_load_si256((const __m256i *)(a->rows + (size_t)token * a->cols + (size_t)b * ACT_QUANT_BLOCK));
        size_t m = act_quant_meta_index(a, token, b);
        __m256i part[8];
        for (int r = 0; r < 8; r++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + (size_t)r * row_bytes + 2));
            part[r] = dot_q8_s8(_mm256_setzero_si256(), q8_prepare(raw), raw, x);
        }
        __m256i isum = sum_lanes8_epi32(part);
        if (Q8_BIAS_SHIFT) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(a->sum[m] * Q8_BIAS));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(gather_half8(blk, row_bytes), _mm256_set1_ps(a->d[m])), acc);
    }
    _mm256_storeu_ps(out, acc);
}

void quant_int8_dot_rows8(uint32_t type, const void *row0, size_t row_bytes, const Int8Activations *a, int token, float *out) {
    switch (type) {
    case TENSOR_Q4_0: q4_rows8(row0, row_bytes, sizeof(BlockQ4_0), false, 3, a, token, out); return;
    case TENSOR_Q4_1: q4_rows8(row0, row_bytes, sizeof(BlockQ4_1), true, 0, a, token, out); return;
    case TENSOR_Q8_0: q8_rows8(row0, row_bytes, a, token, out); return;
    default: assert(!"quant_int8_dot_rows8: unsupported type"); return;
    }
}

/* ---- AVX2, one token × a packed group of eight rows (lanes = rows, int8_pack.h) ------------------- */

/* The token's run k of block b (four int8) repeated in all eight lanes. */
INLINE __m256i token_run(const int8_t *x, int k) { return broadcast_run(x + 4 * k); }

/* Q4_0 / Q4_1, NT tokens (1..4) from t0: per block, run k of the eight rows is one load, unpacked
 * once for all NT tokens; its low nibbles meet each token's elements 4k..4k+3 and its high nibbles
 * 16+4k..19+4k, each lane summing its own row in one int16 chain (eight runs of pairs of 4-bit
 * products stay within int16: 8 · 3810). The eight rows' scales are one load. Q4_1's offset chain
 * runs in a second pass over the blocks (the same fmaf sequence; fewer registers in the main loop). */
INLINE void q4_packed8(const uint8_t *group, bool has_min, int bias_shift, const Int8Activations *a, int t0, int NT,
                       float *out, size_t out_stride) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const size_t chunk = INT8_PACK_ROWS * (has_min ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0));
    const size_t runs_at = int8_pack_scale_bytes(has_min ? TENSOR_Q4_1 : TENSOR_Q4_0);
    __m256 acc[4];
    for (int i = 0; i < NT; i++) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < a->nb; b++) {
        const uint8_t *c = group + (size_t)b * chunk;
        __m256i lo[4], hi[4];
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(c + runs_at + 32 * (size_t)k));
            lo[k] = _mm256_and_si256(v, mask);
            hi[k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
        }
        const __m256 d_w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)c));
        for (int i = 0; i < NT; i++) {
            const int8_t *x = a->rows + (size_t)(t0 + i) * a->cols + (size_t)b * ACT_QUANT_BLOCK;
            size_t m = act_quant_meta_index(a, t0 + i, b);
            __m256i s = _mm256_setzero_si256();
            for (int k = 0; k < 4; k++) s = u4_acc_add(u4_acc_add(s, lo[k], token_run(x, k)), hi[k], token_run(x, k + 4));
            __m256i isum = u4_acc_finish1(s);
            if (bias_shift) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(a->sum[m] * (1 << bias_shift)));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d_w, _mm256_set1_ps(a->d[m])), acc[i]);
        }
    }
    for (int i = 0; i < NT; i++) {
        if (has_min) {
            __m256 off = _mm256_setzero_ps();
            for (int b = 0; b < a->nb; b++)
                off = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + (size_t)b * chunk + 2 * INT8_PACK_ROWS))),
                                      _mm256_set1_ps(a->dsum[act_quant_meta_index(a, t0 + i, b)]), off);
            acc[i] = _mm256_add_ps(acc[i], off);
        }
        _mm256_storeu_ps(out + (size_t)i * out_stride, acc[i]);
    }
}

/* Q8_0, one token: eight runs per block, two chains by run parity. */
INLINE void q8_packed8(const uint8_t *group, const Int8Activations *a, int token, float *out) {
    const size_t chunk = INT8_PACK_ROWS * sizeof(BlockQ8_0), runs_at = int8_pack_scale_bytes(TENSOR_Q8_0);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < a->nb; b++) {
        const uint8_t *c = group + (size_t)b * chunk;
        const int8_t *x = a->rows + (size_t)token * a->cols + (size_t)b * ACT_QUANT_BLOCK;
        size_t m = act_quant_meta_index(a, token, b);
        __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int k = 0; k < 8; k++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(c + runs_at + 32 * (size_t)k));
            s[k & 1] = dot_q8_s8(s[k & 1], q8_prepare(w), w, token_run(x, k));
        }
        __m256i isum = _mm256_add_epi32(s[0], s[1]);
        if (Q8_BIAS_SHIFT) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(a->sum[m] * Q8_BIAS));
        const __m256 d_w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)c));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d_w, _mm256_set1_ps(a->d[m])), acc);
    }
    _mm256_storeu_ps(out, acc);
}

void quant_int8_dot_packed8(uint32_t type, const uint8_t *group, const Int8Activations *a, int first_token, int n_tokens,
                            float *out, size_t out_stride) {
    for (int t = first_token, end = first_token + n_tokens; t < end;) {
        int nt = end - t < 4 ? end - t : 4;
        float *o = out + (size_t)(t - first_token) * out_stride;
#define Q4(HAS_MIN, SHIFT)                                                                                             \
    switch (nt) {                                                                                                      \
    case 1: q4_packed8(group, HAS_MIN, SHIFT, a, t, 1, o, out_stride); break;                                         \
    case 2: q4_packed8(group, HAS_MIN, SHIFT, a, t, 2, o, out_stride); break;                                         \
    case 3: q4_packed8(group, HAS_MIN, SHIFT, a, t, 3, o, out_stride); break;                                         \
    default: q4_packed8(group, HAS_MIN, SHIFT, a, t, 4, o, out_stride); break;                                        \
    }
        switch (type) {
        case TENSOR_Q4_0: Q4(false, 3) break;
        case TENSOR_Q4_1: Q4(true, 0) break;
        case TENSOR_Q8_0:
            for (int i = 0; i < nt; i++) q8_packed8(group, a, t + i, o + (size_t)i * out_stride);
            break;
        default: assert(!"quant_int8_dot_packed8: unsupported type"); return;
        }
#undef Q4
        t += nt;
    }
}

void quant_int8_dot_groups(uint32_t type, Int8Row row, const Int8Activations *a, int first_group, int n_groups, float *out) {
    /* The two-row kernel with the row twice: the models' row groups are even, so only an odd
     * remainder (and the tests) come here, and one kernel per type keeps one canonical sequence. */
    float same[QUANT_INT8_MAX_GROUPS * ACT_QUANT_GROUP];
    quant_int8_dot_groups_rows2(type, row, row, a, first_group, n_groups, out, same);
}

void quant_int8_dot_groups_rows2(uint32_t type, Int8Row row0, Int8Row row1, const Int8Activations *a, int first_group,
                                 int n_groups, float *out0, float *out1) {
    assert(n_groups >= 1 && n_groups <= QUANT_INT8_MAX_GROUPS);
#define ROWS2(NG)                                                                                                      \
    switch (type) {                                                                                                    \
    case TENSOR_Q4_0: q4_groups_rows2(row0, row1, false, 3, a, first_group, NG, out0, out1); return;                   \
    case TENSOR_Q4_1: q4_groups_rows2(row0, row1, true, 0, a, first_group, NG, out0, out1); return;                    \
    case TENSOR_Q8_0: q8_groups_rows2(row0, row1, a, first_group, NG, out0, out1); return;                             \
    default: assert(!"quant_int8_dot_groups_rows2: unsupported type"); return;                                         \
    }
    if (n_groups == 1) ROWS2(1) else ROWS2(2)
#undef ROWS2
}

void quant_int8_dot_tokens(uint32_t type, const void *row, const Int8Activations *a, int first_token, int n_tokens,
                           float *out) {
    assert(n_tokens >= 1 && n_tokens <= 4);
#define TOKENS(NT)                                                                                                     \
    switch (type) {                                                                                                    \
    case TENSOR_Q4_0: q4_tokens(row, sizeof(BlockQ4_0), false, 8, a, first_token, NT, out); return;                    \
    case TENSOR_Q4_1: q4_tokens(row, sizeof(BlockQ4_1), true, 0, a, first_token, NT, out); return;                     \
    case TENSOR_Q8_0: q8_tokens(row, a, first_token, NT, out); return;                                                 \
    default: assert(!"quant_int8_dot_tokens: unsupported type"); return;                                               \
    }
    switch (n_tokens) {
    case 1: TOKENS(1)
    case 2: TOKENS(2)
    case 3: TOKENS(3)
    default: TOKENS(4)
    }
#undef TOKENS
}

#else /* portable build: every kernel is the reference, one token at a time */

void quant_int8_dot_groups(uint32_t type, Int8Row row, const Int8Activations *a, int first_group, int n_groups, float *out) {
    for (int i = 0; i < n_groups * ACT_QUANT_GROUP; i++)
        out[i] = quant_int8_dot_reference_row(type, row, a, first_group * ACT_QUANT_GROUP + i);
}

void quant_int8_dot_groups_rows2(uint32_t type, Int8Row row0, Int8Row row1, const Int8Activations *a, int first_group,
                                 int n_groups, float *out0, float *out1) {
    quant_int8_dot_groups(type, row0, a, first_group, n_groups, out0);
    quant_int8_dot_groups(type, row1, a, first_group, n_groups, out1);
}

void quant_int8_dot_tokens(uint32_t type, const void *row, const Int8Activations *a, int first_token, int n_tokens,
                           float *out) {
    for (int i = 0; i < n_tokens; i++) out[i] = quant_int8_dot_reference(type, row, a, first_token + i);
}

void quant_int8_dot_rows8(uint32_t type, const void *row0, size_t row_bytes, const Int8Activations *a, int token, float *out) {
    for (int r = 0; r < 8; r++) out[r] = quant_int8_dot_reference(type, (const uint8_t *)row0 + (size_t)r * row_bytes, a, token);
}

void quant_int8_dot_packed8(uint32_t type, const uint8_t *group, const Int8Activations *a, int first_token, int n_tokens,
                            float *out, size_t out_stride) {
    WeightMatrix w = {.type = type, .rows = INT8_PACK_ROWS, .cols = (int64_t)a->cols, .row_bytes = (size_t)a->nb * tensor_type_block_bytes(type),
                      .data = group, .layout = WEIGHT_LAYOUT_ROWS8};
    for (int i = 0; i < n_tokens; i++)
        for (int r = 0; r < INT8_PACK_ROWS; r++)
            out[(size_t)i * out_stride + r] = quant_int8_dot_reference_row(type, int8_pack_row(&w, r), a, first_token + i);
}
#endif
