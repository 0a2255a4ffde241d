#include "kernels/cpu/attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/vec.h"

/* The vector paths read the fp16 cache with F16C (eight halves per 128-bit load, widened to fp32);
 * every AVX2 CPU has it. */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ATTN_SIMD 1
#endif

/* Requests the `bytes` at p into L1 (or L2) ahead of use. Decode attention over many sequences
 * streams the whole KV cache from DRAM. A block's keys (or values) are contiguous, and so are
 * consecutive blocks, but a sequence's blocks can be scattered through the pool, where the
 * hardware prefetcher loses the stream: the score pass asks for the next block's keys at such a
 * jump, and for the values the second pass will weigh (into L2). */
static inline void prefetch_span_l1(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
}
static inline void prefetch_span_l2(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
}

/* dst (n) = src (n) as halves, rounded to nearest even; the vector and scalar conversions give the
 * same bits, so where a row splits between them does not matter. */
static void store_half_row(uint16_t *dst, const float *src, int n) {
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = vec_float_to_half(src[i]);
}

void cpu_kv_store(const KvLayerView *kv, const int32_t *slot_mapping, const float *k_new, const float *v_new,
                  int n_tokens) {
    int hd = kv->head_dim, bs = kv->block_size, kv_dim = kv->n_kv_heads * hd;
    for (int t = 0; t < n_tokens; t++) {
        int32_t slot = slot_mapping[t];
        if (slot < 0) continue;
        int32_t block = slot / bs, off = slot % bs;
        for (int h = 0; h < kv->n_kv_heads; h++) {
            size_t dst = (((size_t)block * kv->n_kv_heads + h) * bs + off) * hd;
            store_half_row(kv->k + dst, k_new + (size_t)t * kv_dim + h * hd, hd);
            store_half_row(kv->v + dst, v_new + (size_t)t * kv_dim + h * hd, hd);
        }
    }
}

#if defined(ATTN_SIMD)
/* Eight halves at p as fp32 (exact). */
static inline __m256 load_half8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* out[0..64) = Σ_j p_j · V_j[c0..c0+64): all 64 lanes in eight registers, one pass over the slots. */
static void weighted_sum_v64(const uint16_t *v_head0, size_t block_stride, const int32_t *block_table, int bs, int hd,
                             int n_ctx, const float *p, float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int b = 0, j = 0; j < n_ctx; b++) {
        const uint16_t *v = v_head0 + (size_t)block_table[b] * block_stride;
        for (int off = 0; off < bs && j < n_ctx; off++, j++, v += hd) {
            if (p[j] == 0.0f) continue;
            __m256 w = _mm256_set1_ps(p[j]);
            a0 = _mm256_fmadd_ps(w, load_half8(v + 0), a0);
            a1 = _mm256_fmadd_ps(w, load_half8(v + 8), a1);
            a2 = _mm256_fmadd_ps(w, load_half8(v + 16), a2);
            a3 = _mm256_fmadd_ps(w, load_half8(v + 24), a3);
            a4 = _mm256_fmadd_ps(w, load_half8(v + 32), a4);
            a5 = _mm256_fmadd_ps(w, load_half8(v + 40), a5);
            a6 = _mm256_fmadd_ps(w, load_half8(v + 48), a6);
            a7 = _mm256_fmadd_ps(w, load_half8(v + 56), a7);
        }
    }
    _mm256_storeu_ps(out + 0, a0); _mm256_storeu_ps(out + 8, a1);
    _mm256_storeu_ps(out + 16, a2); _mm256_storeu_ps(out + 24, a3);
    _mm256_storeu_ps(out + 32, a4); _mm256_storeu_ps(out + 40, a5);
    _mm256_storeu_ps(out + 48, a6); _mm256_storeu_ps(out + 56, a7);
}
#endif

/* q (n) · k (n halves), in vec_dot_f32's order. For head sizes the vector score path does not take. */
static inline float dot_f32_half(const float *q, const uint16_t *k, int n) {
    int i = 0;
    float sum = 0.0f;
#if defined(ATTN_SIMD)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load_half8(k + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load_half8(k + i + 8), acc1);
    }
    sum = vec_hsum256(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) sum += q[i] * vec_half_to_float(k[i]);
    return sum;
}

/* y (n) += alpha · x (n halves) */
static inline void axpy_half(float *y, float alpha, const uint16_t *x, int n) {
    int i = 0;
#if defined(ATTN_SIMD)
    __m256 a = _mm256_set1_ps(alpha);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, load_half8(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += alpha * vec_half_to_float(x[i]);
}

/* out (head_dim) = Σ_j p_j · V_j. Running sums stay in registers across slots (a load/store of
 * out per slot would serialize on store forwarding). */
static void weighted_sum_v(const KvLayerView *kv, const int32_t *block_table, int n_ctx, int kv_head, const float *p,
                           float *out) {
    int hd = kv->head_dim, bs = kv->block_size;
    size_t head_stride = (size_t)bs * hd, block_stride = (size_t)kv->n_kv_heads * head_stride;
    const uint16_t *v_head0 = kv->v + (size_t)kv_head * head_stride;
    int c0 = 0;
#if defined(ATTN_SIMD)
    for (; c0 + 64 <= hd; c0 += 64) weighted_sum_v64(v_head0 + c0, block_stride, block_table, bs, hd, n_ctx, p, out + c0);
#endif
    if (c0 == hd) return;
    memset(out + c0, 0, (size_t)(hd - c0) * sizeof(float));
    for (int b = 0, j = 0; j < n_ctx; b++) {
        const uint16_t *v = v_head0 + (size_t)block_table[b] * block_stride;
        for (int off = 0; off < bs && j < n_ctx; off++, j++)
            if (p[j] != 0.0f) axpy_half(out + c0, p[j], v + (size_t)off * hd + c0, hd - c0);
    }
}

#if defined(ATTN_SIMD)
/* The eight lanes of each of a[0..8) summed, as one vector: lane s = ((a_s0 + a_s1) + (a_s2 + a_s3))
 * + ((a_s4 + a_s5) + (a_s6 + a_s7)), the same tree for every slot. */
static inline __m256 sum_lanes8(const __m256 a[8]) {
    __m256 h0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 h4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(h0123, h4567, 0x20), _mm256_permute2f128_ps(h0123, h4567, 0x31));
}

/* out[0..8) = (Σ lanes of acc[s]) · scale, −inf for slots whose position is after q_pos; returns
 * max(max_v, out) per lane. */
static inline __m256 finish_scores8(const __m256 acc[8], const int32_t *pos, int32_t q_pos, float scale, float *out,
                                    __m256 max_v) {
    __m256 sc = _mm256_mul_ps(sum_lanes8(acc), _mm256_set1_ps(scale));
    __m256i later = _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)pos), _mm256_set1_epi32(q_pos));
    sc = _mm256_blendv_ps(sc, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(later));
    _mm256_storeu_ps(out, sc);
    return _mm256_max_ps(max_v, sc);
}

/* Scores of eight consecutive slot rows k (head_dim a multiple of 8) into out[0..8), through
 * finish_scores8. Each dot is one FMA chain over head_dim in eight lanes, then sum_lanes8. */
static inline __attribute__((always_inline)) __m256 scores8(const float *q, const uint16_t *k, const int32_t *pos,
                                                            int32_t q_pos, int hd, float scale, float *out, __m256 max_v) {
    __m256 acc[8];
    for (int s = 0; s < 8; s++) acc[s] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) {
        __m256 qv = _mm256_loadu_ps(q + c);
        for (int s = 0; s < 8; s++) acc[s] = _mm256_fmadd_ps(qv, load_half8(k + (size_t)s * hd + c), acc[s]);
    }
    return finish_scores8(acc, pos, q_pos, scale, out, max_v);
}

/* The same for the last m (< 8) slots of a block: each of them gets the same FMA chain and lane
 * sum as in scores8; the missing slots count as masked. */
static __m256 scores_tail(const float *q, const uint16_t *k, const int32_t *pos, int m, int32_t q_pos, int hd, float scale,
                          float *out, __m256 max_v) {
    __m256 acc[8];
    float tmp[8];
    int32_t pos_pad[8] = {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX};
    for (int s = 0; s < 8; s++) acc[s] = _mm256_setzero_ps();
    for (int c = 0; c < hd; c += 8) {
        __m256 qv = _mm256_loadu_ps(q + c);
        for (int s = 0; s < m; s++) acc[s] = _mm256_fmadd_ps(qv, load_half8(k + (size_t)s * hd + c), acc[s]);
    }
    memcpy(pos_pad, pos, (size_t)m * sizeof(int32_t));
    max_v = finish_scores8(acc, pos_pad, q_pos, scale, tmp, max_v);
    memcpy(out, tmp, (size_t)m * sizeof(float));
    return max_v;
}

static inline float max_lanes(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* e[0..8) = exp(s − max) for eight scores, 0 where masked (−inf); returns them for the sum. */
static inline __m256 exp_masked8(const float *s, __m256 max, float *e) {
    __m256 v = _mm256_loadu_ps(s);
    __m256 ex = _mm256_andnot_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), vec_exp256(_mm256_sub_ps(v, max)));
    _mm256_storeu_ps(e, ex);
    return ex;
}

/* scores[j] = exp(scores[j] − max) / Σ, masked (−inf) slots 0. Eight slots per vector from j = 0,
 * the tail padded with masked slots, so a slot's terms land in the same lane of the same partial
 * sums whatever n_ctx is: more masked slots never change the result. */
static void softmax_masked(float *scores, int n_ctx, float max) {
    const __m256 mx = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n_ctx; j += 8) sum = _mm256_add_ps(sum, exp_masked8(scores + j, mx, scores + j));
    if (j < n_ctx) {
        float buf[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        memcpy(buf, scores + j, (size_t)(n_ctx - j) * sizeof(float));
        sum = _mm256_add_ps(sum, exp_masked8(buf, mx, buf));
        memcpy(scores + j, buf, (size_t)(n_ctx - j) * sizeof(float));
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    float total = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int k = 0; k < n_ctx; k++) scores[k] *= inv;
}
#endif

/* One token's query heads [h_lo, h_hi) against its sequence's slots
 * 0..n_ctx−1: scores[(h − h_lo)·n_ctx + j] = (q_h · K_j) · scale, −inf where the slot's position
 * is after q_pos, and max[h − h_lo] = each head's largest unmasked score. Walks the blocks in
 * order and, within a block, the KV heads in order, so the keys are read as one stream. */
static void head_scores(const KvLayerView *kv, const int32_t *block_table, int n_ctx, const float *q, int group, int h_lo,
                        int h_hi, int32_t q_pos, float *scores, float *max) {
    int hd = kv->head_dim, bs = kv->block_size;
    size_t head_stride = (size_t)bs * hd, block_stride = (size_t)kv->n_kv_heads * head_stride;
    int kv_lo = h_lo / group, kv_hi = (h_hi - 1) / group + 1; /* the KV heads these query heads read */
    size_t first = (size_t)kv_lo * head_stride, span = (size_t)(kv_hi - kv_lo) * head_stride * sizeof(uint16_t);
    float scale = 1.0f / sqrtf((float)hd);
    for (int h = 0; h < h_hi - h_lo; h++) max[h] = -INFINITY;
    prefetch_span_l1(kv->k + (size_t)block_table[0] * block_stride + first, span);
    for (int b = 0, j = 0; j < n_ctx; b++, j += bs) {
        const int32_t *pos = kv->slot_pos + (size_t)block_table[b] * bs;
        int n = n_ctx - j < bs ? n_ctx - j : bs;
        /* Consecutive blocks are one stream the hardware prefetcher follows; a jump is not. */
        if (j + bs < n_ctx && block_table[b + 1] != block_table[b] + 1)
            prefetch_span_l2(kv->k + (size_t)block_table[b + 1] * block_stride + first, span);
        prefetch_span_l2(kv->v + (size_t)block_table[b] * block_stride + first, span);
        for (int h = h_lo; h < h_hi; h++) {
            const uint16_t *k = kv->k + (size_t)block_table[b] * block_stride + (size_t)(h / group) * head_stride;
            const float *qh = q + (size_t)(h - h_lo) * hd;
            float *sh = scores + (size_t)(h - h_lo) * n_ctx + j, *mh = max + (h - h_lo);
#if defined(ATTN_SIMD)
            if (hd % 8 == 0) {
                __m256 max_v = _mm256_set1_ps(-INFINITY);
                int off = 0;
                for (; off + 8 <= n; off += 8)
                    max_v = scores8(qh, k + (size_t)off * hd, pos + off, q_pos, hd, scale, sh + off, max_v);
                if (off < n)
                    max_v = scores_tail(qh, k + (size_t)off * hd, pos + off, n - off, q_pos, hd, scale, sh + off, max_v);
                float block_max = max_lanes(max_v);
                if (block_max > *mh) *mh = block_max;
                continue;
            }
#endif
            for (int off = 0; off < n; off++) {
                sh[off] = pos[off] > q_pos ? -INFINITY : dot_f32_half(qh, k + (size_t)off * hd, hd) * scale;
                if (sh[off] > *mh) *mh = sh[off];
            }
        }
    }
}

/* scores (n_ctx) = softmax of the unmasked scores, masked slots 0. */
static void softmax_scores(float *scores, int n_ctx, float max) {
#if defined(ATTN_SIMD)
    softmax_masked(scores, n_ctx, max);
#else
    float sum = 0.0f;
    for (int j = 0; j < n_ctx; j++) {
        scores[j] = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - max);
        sum += scores[j];
    }
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = 0; j < n_ctx; j++) scores[j] *= inv;
#endif
}

/* One token's query heads [h_lo, h_hi): softmax-weighted sums of V over the visible slots into out
 * ((h_hi − h_lo), head_dim). scores holds (h_hi − h_lo) · (n_ctx + 1) floats. A head's result does
 * not depend on which other heads share the call. */
static void attend_heads(const KvLayerView *kv, const int32_t *block_table, int n_ctx, const float *q, int group, int h_lo,
                         int h_hi, int32_t q_pos, float *scores, float *out) {
    float *max = scores + (size_t)(h_hi - h_lo) * n_ctx;
    head_scores(kv, block_table, n_ctx, q, group, h_lo, h_hi, q_pos, scores, max);
    for (int h = h_lo; h < h_hi; h++) {
        float *p = scores + (size_t)(h - h_lo) * n_ctx;
        softmax_scores(p, n_ctx, max[h - h_lo]);
        weighted_sum_v(kv, block_table, n_ctx, h / group, p, out + (size_t)(h - h_lo) * kv->head_dim);
    }
}

/* The sequence owning token t: seq_start is ascending, so a binary search. */
static int sequence_of(const int32_t *seq_start, int n_seqs, int t) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (seq_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Work items per token: all heads when the batch has tokens enough for every thread (one stream
 * over each token's keys), one head otherwise (a single decoding sequence still spreads evenly
 * over the cores). Either way each head computes the same values. */
#define ATTN_TOKENS_PER_ITEM_MIN 4

int cpu_attention_batch(const KvLayerView *kv, const AttentionSeqs *seqs, const float *q, const int32_t *q_pos, int n_tokens,
                        int n_heads, float *out) {
    int hd = kv->head_dim, group = n_heads / kv->n_kv_heads, failed = 0, max_ctx = 1;
    int heads_per_item = n_tokens >= ATTN_TOKENS_PER_ITEM_MIN ? n_heads : 1, items_per_token = n_heads / heads_per_item;
    for (int s = 0; s < seqs->n_seqs; s++)
        if (seqs->n_ctx[s] > max_ctx) max_ctx = seqs->n_ctx[s];
    /* One parallel region for every sequence's tokens; contexts differ in length, so the items are
     * handed out dynamically. */
#pragma omp parallel
    {
        float *scores = malloc((size_t)heads_per_item * (max_ctx + 1) * sizeof *scores);
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < (int64_t)n_tokens * items_per_token; i++) {
            int t = (int)(i / items_per_token), h_lo = (int)(i % items_per_token) * heads_per_item;
            int s = sequence_of(seqs->seq_start, seqs->n_seqs, t);
            size_t row = (size_t)t * n_heads + (size_t)h_lo;
            if (scores)
                attend_heads(kv, seqs->block_tables[s], seqs->n_ctx[s], q + row * hd, group, h_lo, h_lo + heads_per_item, q_pos[t],
                             scores, out + row * hd);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}

int cpu_attention(const KvLayerView *kv, const int32_t *block_table, int n_ctx, const float *q, const int32_t *q_pos,
                  int n_tokens, int n_heads, float *out) {
    int32_t seq_start[2] = {0, n_tokens};
    const AttentionSeqs one = {.n_seqs = 1, .seq_start = seq_start, .block_tables = &block_table, .n_ctx = &n_ctx};
    return cpu_attention_batch(kv, &one, q, q_pos, n_tokens, n_heads, out);
}
