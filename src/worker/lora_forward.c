#include "worker/lora_forward.h"

#include <stddef.h>

int lora_forward_check_batch(const LoraSet *set, const ForwardBatch *b, BraidError *err) {
    int n_adapters = set ? set->n : 0;
    for (int s = 0; b->seq_adapter && s < b->n_seqs; s++)
        if (b->seq_adapter[s] < 0 || b->seq_adapter[s] > n_adapters)
            return braid_error_set(err, "forward: sequence %d names LoRA adapter id %d, but %d adapter(s) are loaded", s,
                                   b->seq_adapter[s], n_adapters);
    return 0;
}

/* The sequence token t belongs to: the last s with seq_start[s] <= t. */
static int sequence_of(const ForwardBatch *b, int t) {
    int lo = 0, hi = b->n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->seq_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* y (out) += scale · B (out, rank) · (A (rank, in) · x (in)). */
static void add_delta(const LoraPair *pair, int rank, float scale, const float *x, int in, float *y, int out) {
    float u[LORA_MAX_RANK];
    for (int r = 0; r < rank; r++) {
        const float *a = pair->a + (size_t)r * in;
        float sum = 0;
        for (int i = 0; i < in; i++) sum += a[i] * x[i];
        u[r] = scale * sum;
    }
    for (int o = 0; o < out; o++) {
        const float *brow = pair->b + (size_t)o * rank;
        float sum = 0;
        for (int r = 0; r < rank; r++) sum += brow[r] * u[r];
        y[o] += sum;
    }
}

void lora_forward_add(const LoraSet *set, const ForwardBatch *b, const ModelConfig *c, int layer, LoraProj proj, const float *x,
                      float *y) {
    if (!set || set->n == 0 || !b->seq_adapter) return;
    int in, out;
    lora_proj_dims(c, proj, &in, &out);
#pragma omp parallel for schedule(static) if (b->n_tokens >= 8)
    for (int t = 0; t < b->n_tokens; t++) {
        int seq = sequence_of(b, t);
        const LoraAdapter *ad = lora_set_get(set, b->seq_adapter[seq]);
        if (!ad) continue; /* the base model */
        /* A ForkKV sequence keeps its K/V deltas as residuals (lora_forward_residual) */
        if ((proj == LORA_PROJ_K || proj == LORA_PROJ_V) && lora_forward_has_residual(b, seq)) continue;
        const LoraPair *pair = &ad->pairs[(size_t)layer * LORA_PROJ_COUNT + proj];
        if (pair->a) add_delta(pair, ad->rank, ad->scale, x + (size_t)t * in, in, y + (size_t)t * out, out);
    }
}

bool lora_forward_has_residual(const ForwardBatch *b, int seq) { return b->res_block_tables && b->res_block_tables[seq]; }

/* u (rank) = A (rank, in) · x (in); zero when the projection is not adapted. */
static void down_project(const LoraPair *pair, int rank, const float *x, int in, float *u) {
    for (int r = 0; r < rank; r++) {
        float sum = 0;
        if (pair->a) {
            const float *a = pair->a + (size_t)r * in;
            for (int i = 0; i < in; i++) sum += a[i] * x[i];
        }
        u[r] = sum;
    }
}

void lora_forward_residual(const LoraSet *set, const ForwardBatch *b, const ModelConfig *c, int layer, const float *x, int width,
                           float *k_res, float *v_res) {
    if (!set || !b->seq_adapter || !b->res_block_tables) return;
#pragma omp parallel for schedule(static) if (b->n_tokens >= 8)
    for (int t = 0; t < b->n_tokens; t++) {
        int seq = sequence_of(b, t);
        float *kr = k_res + (size_t)t * width, *vr = v_res + (size_t)t * width;
        const LoraAdapter *ad = lora_forward_has_residual(b, seq) ? lora_set_get(set, b->seq_adapter[seq]) : NULL;
        int rank = ad ? ad->rank : 0;
        if (ad) {
            const LoraPair *pairs = &ad->pairs[(size_t)layer * LORA_PROJ_COUNT];
            down_project(&pairs[LORA_PROJ_K], rank, x + (size_t)t * c->dim, c->dim, kr);
            down_project(&pairs[LORA_PROJ_V], rank, x + (size_t)t * c->dim, c->dim, vr);
        }
        for (int r = rank; r < width; r++) kr[r] = vr[r] = 0;
    }
}
