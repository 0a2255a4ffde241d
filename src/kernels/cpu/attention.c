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

/* One (token, head): scores into `scores` (n_ctx), then the weighted sum of V into out (head_dim). */
static void attend_one(const KvLayerView *kv, const int32_t *block_table, int n_ctx, const float *q, int32_t q_pos,
                       int kv_head, float *scores, float *out) {
    int hd = kv->head_dim, bs = kv->block_size;
    float scale = 1.0f / sqrtf((float)hd), max = -INFINITY;
    for (int j = 0; j < n_ctx; j++) {
        int32_t block = block_table[j / bs], off = j % bs;
        if (kv->slot_pos[(size_t)block * bs + off] > q_pos) {
            scores[j] = -INFINITY;
            continue;
        }
        const float *k = kv->k + (((size_t)block * kv->n_kv_heads + kv_head) * bs + off) * hd;
        scores[j] = vec_dot_f32(q, k, hd) * scale;
        if (scores[j] > max) max = scores[j];
    }
    float sum = 0.0f;
    for (int j = 0; j < n_ctx; j++) {
        scores[j] = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - max);
        sum += scores[j];
    }
    memset(out, 0, (size_t)hd * sizeof(float));
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = 0; j < n_ctx; j++) {
        if (scores[j] == 0.0f) continue;
        int32_t block = block_table[j / bs], off = j % bs;
        const float *v = kv->v + (((size_t)block * kv->n_kv_heads + kv_head) * bs + off) * hd;
        float p = scores[j] * inv;
        vec_axpy_f32(out, p, v, hd);
    }
}

int cpu_attention(const KvLayerView *kv, const int32_t *block_table, int n_ctx, const float *q, const int32_t *q_pos,
                  int n_tokens, int n_heads, float *out) {
    int hd = kv->head_dim, group = n_heads / kv->n_kv_heads, failed = 0;
#pragma omp parallel
    {
        float *scores = malloc((size_t)(n_ctx > 0 ? n_ctx : 1) * sizeof *scores);
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(2) schedule(static)
        for (int t = 0; t < n_tokens; t++)
            for (int h = 0; h < n_heads; h++)
                if (scores)
                    attend_one(kv, block_table, n_ctx, q + ((size_t)t * n_heads + h) * hd, q_pos[t], h / group, scores,
                               out + ((size_t)t * n_heads + h) * hd);
        free(scores);
    }
    return failed ? -1 : 0;
}
