#include "kernels/cpu/attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/vec.h"

void cpu_kv_store(const KvLayerView *kv, const int32_t *slot_mapping, const float *k_new, const float *v_new,
                  int n_tokens) {
    int hd = kv->head_dim, bs = kv->block_size, kv_dim = kv->n_kv_heads * hd;
    for (int t = 0; t < n_tokens; t++) {
        int32_t slot = slot_mapping[t];
        if (slot < 0) continue;
        int32_t block = slot / bs, off = slot % bs;
        for (int h = 0; h < kv->n_kv_heads; h++) {
            size_t dst = (((size_t)block * kv->n_kv_heads + h) * bs + off) * hd;
            memcpy(kv->k + dst, k_new + (size_t)t * kv_dim + h * hd, (size_t)hd * sizeof(float));
            memcpy(kv->v + dst, v_new + (size_t)t * kv_dim + h * hd, (size_t)hd * sizeof(float));
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* out[0..64) = Σ_j p_j · V_j[c0..c0+64): all 64 lanes in eight registers, one pass over the slots. */
static void weighted_sum_v64(const float *v_head0, size_t block_stride, const int32_t *block_table, int bs, int hd, int n_ctx,
                             const float *p, float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int b = 0, j = 0; j < n_ctx; b++) {
        const float *v = v_head0 + (size_t)block_table[b] * block_stride;
        for (int off = 0; off < bs && j < n_ctx; off++, j++, v += hd) {
            if (p[j] == 0.0f) continue;
            __m256 w = _mm256_set1_ps(p[j]);
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 0), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), a3);
            a4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 32), a4);
            a5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 40), a5);
            a6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 48), a6);
            a7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 56), a7);
        }
    }
    _mm256_storeu_ps(out + 0, a0); _mm256_storeu_ps(out + 8, a1);
    _mm256_storeu_ps(out + 16, a2); _mm256_storeu_ps(out + 24, a3);
    _mm256_storeu_ps(out + 32, a4); _mm256_storeu_ps(out + 40, a5);
    _mm256_storeu_ps(out + 48, a6); _mm256_storeu_ps(out + 56, a7);
}
#endif

/* out (head_dim) = Σ_j p_j · V_j. Running sums stay in registers across slots (a load/store of
 * out per slot would serialize on store forwarding). */
static void weighted_sum_v(const KvLayerView *kv, const int32_t *block_table, int n_ctx, int kv_head, const float *p,
                           float *out) {
    int hd = kv->head_dim, bs = kv->block_size;
    size_t head_stride = (size_t)bs * hd, block_stride = (size_t)kv->n_kv_heads * head_stride;
    const float *v_head0 = kv->v + (size_t)kv_head * head_stride;
    int c0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; c0 + 64 <= hd; c0 += 64) weighted_sum_v64(v_head0 + c0, block_stride, block_table, bs, hd, n_ctx, p, out + c0);
#endif
    if (c0 == hd) return;
    memset(out + c0, 0, (size_t)(hd - c0) * sizeof(float));
    for (int b = 0, j = 0; j < n_ctx; b++) {
        const float *v = v_head0 + (size_t)block_table[b] * block_stride;
        for (int off = 0; off < bs && j < n_ctx; off++, j++)
            if (p[j] != 0.0f) vec_axpy_f32(out + c0, p[j], v + (size_t)off * hd + c0, hd - c0);
    }
}

/* One (token, head): scores into `scores` (n_ctx), then the weighted sum of V into out (head_dim).
 * Walks the block table block by block so no per-slot division is needed. */
static void attend_one(const KvLayerView *kv, const int32_t *block_table, int n_ctx, const float *q, int32_t q_pos,
                       int kv_head, float *scores, float *out) {
    int hd = kv->head_dim, bs = kv->block_size;
    size_t head_stride = (size_t)bs * hd, block_stride = (size_t)kv->n_kv_heads * head_stride;
    float scale = 1.0f / sqrtf((float)hd), max = -INFINITY;
    for (int b = 0, j = 0; j < n_ctx; b++) {
        const int32_t *pos = kv->slot_pos + (size_t)block_table[b] * bs;
        const float *k = kv->k + (size_t)block_table[b] * block_stride + (size_t)kv_head * head_stride;
        for (int off = 0; off < bs && j < n_ctx; off++, j++) {
            if (pos[off] > q_pos) {
                scores[j] = -INFINITY;
                continue;
            }
            scores[j] = vec_dot_f32(q, k + (size_t)off * hd, hd) * scale;
            if (scores[j] > max) max = scores[j];
        }
    }
    float sum = 0.0f;
    for (int j = 0; j < n_ctx; j++) {
        scores[j] = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - max);
        sum += scores[j];
    }
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = 0; j < n_ctx; j++) scores[j] *= inv;
    weighted_sum_v(kv, block_table, n_ctx, kv_head, scores, out);
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

int cpu_attention_batch(const KvLayerView *kv, const AttentionSeqs *seqs, const float *q, const int32_t *q_pos, int n_tokens,
                        int n_heads, float *out) {
    int hd = kv->head_dim, group = n_heads / kv->n_kv_heads, failed = 0, max_ctx = 1;
    for (int s = 0; s < seqs->n_seqs; s++)
        if (seqs->n_ctx[s] > max_ctx) max_ctx = seqs->n_ctx[s];
    /* One parallel region for every sequence's (token, head) pairs: contexts differ in length, so
     * the pairs are handed out dynamically. */
#pragma omp parallel
    {
        float *scores = malloc((size_t)max_ctx * sizeof *scores);
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 4)
        for (int64_t i = 0; i < (int64_t)n_tokens * n_heads; i++) {
            int t = (int)(i / n_heads), h = (int)(i % n_heads);
            int s = sequence_of(seqs->seq_start, seqs->n_seqs, t);
            if (scores)
                attend_one(kv, seqs->block_tables[s], seqs->n_ctx[s], q + (size_t)i * hd, q_pos[t], h / group, scores,
                           out + (size_t)i * hd);
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
