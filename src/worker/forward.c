#include "worker/forward.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "worker/lora_forward.h"

void forward_init(ForwardContext *ctx, const ModelWeights *weights, KvPool *kv) {
    memset(ctx, 0, sizeof *ctx);
    ctx->weights = weights;
    ctx->kv = kv;
}

static void free_activations(ForwardContext *ctx) {
    float **bufs[] = {&ctx->x,  &ctx->xb,  &ctx->q,        &ctx->k,        &ctx->v,     &ctx->att,
                      &ctx->hb, &ctx->hb2, &ctx->rope_cos, &ctx->rope_sin, &ctx->k_res, &ctx->v_res};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    ctx->capacity = 0;
}

void forward_free(ForwardContext *ctx) {
    free_activations(ctx);
    free(ctx->final_hidden);
    free(ctx->rope_by_pos_cos);
    free(ctx->rope_by_pos_sin);
    cpu_scratch_free(&ctx->scratch);
    memset(ctx, 0, sizeof *ctx);
}

static int reserve(ForwardContext *ctx, int n_tokens, int n_logits, BraidError *err) {
    const ModelConfig *c = &ctx->weights->cfg;
    if (n_tokens > ctx->capacity) {
        free_activations(ctx);
        size_t n = (size_t)n_tokens, q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
        size_t widest = (size_t)c->dim > q_dim ? (size_t)c->dim : q_dim;
        ctx->x = malloc(n * c->dim * sizeof(float));
        ctx->xb = malloc(n * widest * sizeof(float));
        ctx->q = malloc(n * q_dim * sizeof(float));
        ctx->k = malloc(n * kv_dim * sizeof(float));
        ctx->v = malloc(n * kv_dim * sizeof(float));
        ctx->att = malloc(n * q_dim * sizeof(float));
        ctx->hb = malloc(n * c->ff_dim * sizeof(float));
        ctx->hb2 = malloc(n * c->ff_dim * sizeof(float));
        ctx->rope_cos = malloc(n * (c->rope_dim / 2 + 1) * sizeof(float));
        ctx->rope_sin = malloc(n * (c->rope_dim / 2 + 1) * sizeof(float));
        size_t res_width = ctx->res ? (size_t)ctx->res->rank : 1;
        ctx->k_res = malloc(n * res_width * sizeof(float));
        ctx->v_res = malloc(n * res_width * sizeof(float));
        if (!ctx->k_res || !ctx->v_res || !ctx->x || !ctx->xb || !ctx->q || !ctx->k || !ctx->v || !ctx->att || !ctx->hb || !ctx->hb2 || !ctx->rope_cos ||
            !ctx->rope_sin) {
            free_activations(ctx);
            return braid_error_set(err, "forward: out of memory for a batch of %d tokens", n_tokens);
        }
        ctx->capacity = n_tokens;
    }
    if (n_logits > ctx->logits_capacity) {
        float *h = realloc(ctx->final_hidden, (size_t)n_logits * c->dim * sizeof(float));
        if (!h) return braid_error_set(err, "forward: out of memory for %d logit rows", n_logits);
        ctx->final_hidden = h;
        ctx->logits_capacity = n_logits;
    }
    return 0;
}

static int validate_batch(const ForwardContext *ctx, const ForwardBatch *b, BraidError *err) {
    const ModelConfig *c = &ctx->weights->cfg;
    int total_slots = ctx->kv->n_blocks * ctx->kv->block_size;
    if (b->n_tokens <= 0 || b->n_seqs <= 0 || b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens)
        return braid_error_set(err, "forward: malformed batch (%d tokens, %d sequences)", b->n_tokens, b->n_seqs);
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= c->vocab_size)
            return braid_error_set(err, "forward: token id %d at index %d is outside the vocabulary (%d)", b->tokens[t], t, c->vocab_size);
        if (b->slot_mapping[t] >= total_slots)
            return braid_error_set(err, "forward: slot %d outside the pool (%d slots)", b->slot_mapping[t], total_slots);
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return braid_error_set(err, "forward: logit row %d outside the batch", b->logit_rows[i]);
    if (b->res_block_tables) {
        if (!ctx->res || !ctx->lora || !b->res_slot_mapping)
            return braid_error_set(err, "forward: a ForkKV batch (residual tables) on a backend without a residual pool");
        int res_slots = ctx->res->n_blocks * ctx->res->block_size;
        for (int t = 0; t < b->n_tokens; t++)
            if (b->res_slot_mapping[t] >= res_slots)
                return braid_error_set(err, "forward: residual slot %d outside the pool (%d slots)", b->res_slot_mapping[t], res_slots);
    }
    return lora_forward_check_batch(ctx->lora, b, err);
}

/* RoPE angles of every position, for ResidualAttention's deferred RoPE of cached key residuals
 * (the same angles the forward gives a token at that position). Built once. */
static int ensure_rope_by_position(ForwardContext *ctx, BraidError *err) {
    if (ctx->rope_by_pos_cos) return 0;
    const ModelConfig *c = &ctx->weights->cfg;
    size_t half = (size_t)c->rope_dim / 2, n = (size_t)c->context_length;
    float *cs = malloc(n * half * sizeof *cs), *sn = malloc(n * half * sizeof *sn);
    if (!cs || !sn) {
        free(cs);
        free(sn);
        return braid_error_set(err, "forward: out of memory for the RoPE table of %zu positions", n);
    }
    for (size_t p = 0; p < n; p++)
        cpu_rope_angles((int32_t)p, c->rope_dim, c->rope_base, c->rope_position_scale, ctx->weights->rope_freq_factors,
                        cs + p * half, sn + p * half);
    ctx->rope_by_pos_cos = cs;
    ctx->rope_by_pos_sin = sn;
    return 0;
}

/* The ResidualAttention operands of sequence s's adapter at `layer`. */
static ResidualAdapter residual_adapter(const ForwardContext *ctx, const ForwardBatch *b, int s, int layer) {
    const LoraAdapter *ad = lora_set_get(ctx->lora, b->seq_adapter[s]);
    if (!ad) return (ResidualAdapter){.rank = 0, .scale = 0};
    const LoraPair *pairs = &ad->pairs[(size_t)layer * LORA_PROJ_COUNT];
    return (ResidualAdapter){.b_k = pairs[LORA_PROJ_K].a ? pairs[LORA_PROJ_K].b : NULL,
                             .b_v = pairs[LORA_PROJ_V].a ? pairs[LORA_PROJ_V].b : NULL, .rank = ad->rank, .scale = ad->scale};
}

/* Attention of a batch holding ForkKV sequences: each sequence by its own kernel. A decode step's
 * sequences (one token each) run side by side, each kernel on one thread: a lone decode query has
 * only n_kv_heads work items, too few to share the cores well; a sequence with several tokens
 * runs alone with the cores inside its kernel. */
static int attend_by_sequence(ForwardContext *ctx, const ForwardBatch *b, const KvLayerView *kv, int layer) {
    const ModelConfig *c = &ctx->weights->cfg;
    size_t q_dim = (size_t)c->n_heads * c->head_dim;
    ResidualLayerView res = residual_pool_layer(ctx->res, layer);
    RopeTable rope = {.cos = ctx->rope_by_pos_cos, .sin = ctx->rope_by_pos_sin, .n_positions = c->context_length,
                      .rope_dim = c->rope_dim, .head_dim = c->head_dim, .pairing = c->rope_pairing};
    bool all_decode = b->n_seqs > 1 && b->n_tokens == b->n_seqs;
    int failed = 0;
#pragma omp parallel for schedule(dynamic) if (all_decode) reduction(| : failed)
    for (int s = 0; s < b->n_seqs; s++) {
        int start = b->seq_start[s], n = b->seq_start[s + 1] - start;
        const float *q = ctx->q + (size_t)start * q_dim;
        float *out = ctx->att + (size_t)start * q_dim;
        int rc;
        if (lora_forward_has_residual(b, s)) {
            ResidualAdapter ad = residual_adapter(ctx, b, s, layer);
            rc = cpu_residual_attention(kv, b->block_tables[s], &res, b->res_block_tables[s], b->seq_n_ctx[s], &ad, &rope, q,
                                        b->positions + start, n, c->n_heads, out);
        } else {
            rc = cpu_attention(kv, b->block_tables[s], b->seq_n_ctx[s], q, b->positions + start, n, c->n_heads, out);
        }
        failed |= rc != 0;
    }
    return failed ? -1 : 0;
}

/* out (n, dim) = RMSNorm of each token's row of x. Tokens are independent, so a decode step's
 * batch shares the cores instead of leaving one waiting. */
static void rmsnorm_rows(float *out, const float *x, const float *weight, int n, const ModelConfig *c) {
#pragma omp parallel for schedule(static) if (n >= 8)
    for (int t = 0; t < n; t++) cpu_rmsnorm(out + (size_t)t * c->dim, x + (size_t)t * c->dim, weight, c->dim, c->norm_eps);
}

/* y (n, w->rows) = x (n, w->cols) · Wᵀ in the context's arithmetic. */
static int matmul(ForwardContext *ctx, const WeightMatrix *w, const float *x, int n, float *y) {
    return cpu_matmul(w, x, n, y, ctx->math, &ctx->scratch);
}

/* Row-parallel projections leave each TP rank a partial sum; the all-reduce completes it. */
static int tp_reduce(ForwardContext *ctx, float *partial, int n, BraidError *err) {
    if (!ctx->tp || ctx->tp->size == 1) return 0;
    return tp_allreduce_sum_f32(ctx->tp, partial, (size_t)n * ctx->weights->cfg.dim, err);
}

/* Between the projections (and any LoRA deltas) and RoPE: the Q/K/V biases (qwen2), then RMSNorm
 * over head_dim of every Q and K head (qwen3), as HF's Qwen2/Qwen3 attention orders them. */
static void qkv_bias_and_norm(ForwardContext *ctx, const LayerWeights *L, int n) {
    const ModelConfig *c = &ctx->weights->cfg;
    if (!L->bq && !L->bk && !L->bv && !L->q_norm && !L->k_norm) return;
    int hd = c->head_dim, q_dim = c->n_heads * hd, kv_dim = c->n_kv_heads * hd;
#pragma omp parallel for schedule(static) if (n >= 8)
    for (int t = 0; t < n; t++) {
        float *q = ctx->q + (size_t)t * q_dim, *k = ctx->k + (size_t)t * kv_dim, *v = ctx->v + (size_t)t * kv_dim;
        if (L->bq) cpu_add_inplace(q, L->bq, q_dim);
        if (L->bk) cpu_add_inplace(k, L->bk, kv_dim);
        if (L->bv) cpu_add_inplace(v, L->bv, kv_dim);
        for (int h = 0; L->q_norm && h < c->n_heads; h++) cpu_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, c->norm_eps);
        for (int h = 0; L->k_norm && h < c->n_kv_heads; h++) cpu_rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, c->norm_eps);
    }
}

static int attention_block(ForwardContext *ctx, const ForwardBatch *b, int layer, BraidError *err) {
    const ModelWeights *w = ctx->weights;
    const ModelConfig *c = &w->cfg;
    const LayerWeights *L = &w->layers[layer];
    int n = b->n_tokens, q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim, half = c->rope_dim / 2;
    rmsnorm_rows(ctx->xb, ctx->x, L->attn_norm, n, c);
    const WeightMatrix *qkv[3] = {&L->wq, &L->wk, &L->wv};
    float *qkv_out[3] = {ctx->q, ctx->k, ctx->v};
    if (cpu_matmul_shared_input(qkv, qkv_out, 3, ctx->xb, n, ctx->math, &ctx->scratch))
        return braid_error_set(err, "forward: out of memory in layer %d QKV", layer);
    for (int p = LORA_PROJ_Q; p <= LORA_PROJ_V; p++) lora_forward_add(ctx->lora, b, c, layer, (LoraProj)p, ctx->xb, qkv_out[p]);
    qkv_bias_and_norm(ctx, L, n);
    if (b->res_block_tables) {
        lora_forward_residual(ctx->lora, b, c, layer, ctx->xb, ctx->res->rank, ctx->k_res, ctx->v_res);
        ResidualLayerView res = residual_pool_layer(ctx->res, layer);
        cpu_residual_store(&res, b->res_slot_mapping, ctx->k_res, ctx->v_res, ctx->res->rank, n);
    }
#pragma omp parallel for schedule(static) if (n >= 8)
    for (int t = 0; t < n; t++) {
        const float *cs = ctx->rope_cos + (size_t)t * half, *sn = ctx->rope_sin + (size_t)t * half;
        cpu_rope_apply(ctx->q + (size_t)t * q_dim, c->n_heads, c->head_dim, c->rope_dim, c->rope_pairing, cs, sn);
        cpu_rope_apply(ctx->k + (size_t)t * kv_dim, c->n_kv_heads, c->head_dim, c->rope_dim, c->rope_pairing, cs, sn);
    }
    KvLayerView kv = kv_pool_layer(ctx->kv, layer);
    cpu_kv_store(&kv, b->slot_mapping, ctx->k, ctx->v, n);
    const AttentionSeqs seqs = {.n_seqs = b->n_seqs, .seq_start = b->seq_start, .block_tables = b->block_tables, .n_ctx = b->seq_n_ctx};
    int rc = b->res_block_tables ? attend_by_sequence(ctx, b, &kv, layer)
                                 : cpu_attention_batch(&kv, &seqs, ctx->q, b->positions, n, c->n_heads, ctx->att);
    if (rc)
        return braid_error_set(err, "forward: out of memory in attention");
    if (matmul(ctx, &L->wo, ctx->att, n, ctx->xb))
        return braid_error_set(err, "forward: out of memory in layer %d output projection", layer);
    lora_forward_add(ctx->lora, b, c, layer, LORA_PROJ_O, ctx->att, ctx->xb);
    if (tp_reduce(ctx, ctx->xb, n, err)) return -1;
    cpu_add_inplace(ctx->x, ctx->xb, n * c->dim);
    return 0;
}

static int mlp_block(ForwardContext *ctx, int n, int layer, BraidError *err) {
    const ModelConfig *c = &ctx->weights->cfg;
    const LayerWeights *L = &ctx->weights->layers[layer];
    rmsnorm_rows(ctx->xb, ctx->x, L->ffn_norm, n, c);
    const WeightMatrix *gate_up[2] = {&L->w_gate, &L->w_up};
    float *gate_up_out[2] = {ctx->hb, ctx->hb2};
    if (cpu_matmul_shared_input(gate_up, gate_up_out, 2, ctx->xb, n, ctx->math, &ctx->scratch))
        return braid_error_set(err, "forward: out of memory in layer %d MLP", layer);
    cpu_swiglu(ctx->hb, ctx->hb2, n * c->ff_dim);
    if (matmul(ctx, &L->w_down, ctx->hb, n, ctx->xb))
        return braid_error_set(err, "forward: out of memory in layer %d MLP", layer);
    if (tp_reduce(ctx, ctx->xb, n, err)) return -1;
    cpu_add_inplace(ctx->x, ctx->xb, n * c->dim);
    return 0;
}

/* The int8 head's candidates recomputed exactly per token (cpu_matmul_refine_top): the fp32
 * winner of a near-tie is among int8's few largest logits, so 16 is ample and costs 16 row dots
 * against the head's 49 152 on the default model. */
#define FORWARD_INT8_HEAD_REFINE 16

int forward_run(ForwardContext *ctx, const ForwardBatch *b, float *logits, BraidError *err) {
    const ModelWeights *w = ctx->weights;
    const ModelConfig *c = &w->cfg;
    if (validate_batch(ctx, b, err) || reserve(ctx, b->n_tokens, b->n_logits, err)) return -1;
    if (b->res_block_tables && ensure_rope_by_position(ctx, err)) return -1;
    int n = b->n_tokens, half = c->rope_dim / 2;
    for (int t = 0; t < n; t++) {
        cpu_matrix_row(&w->token_embd, b->tokens[t], ctx->x + (size_t)t * c->dim);
        cpu_rope_angles(b->positions[t], c->rope_dim, c->rope_base, c->rope_position_scale, w->rope_freq_factors,
                        ctx->rope_cos + (size_t)t * half, ctx->rope_sin + (size_t)t * half);
        if (b->slot_mapping[t] >= 0) ctx->kv->slot_pos[b->slot_mapping[t]] = b->positions[t];
    }
    for (int l = 0; l < c->n_layers; l++) {
        if (ctx->layer_probe) ctx->layer_probe(ctx->probe_ctx, l, ctx->x, n, c->dim);
        if (attention_block(ctx, b, l, err) || mlp_block(ctx, n, l, err)) return -1;
        if (ctx->between_layers) ctx->between_layers(ctx->between_layers_ctx);
    }
    if (b->n_logits == 0) return 0;
    for (int i = 0; i < b->n_logits; i++)
        cpu_rmsnorm(ctx->final_hidden + (size_t)i * c->dim, ctx->x + (size_t)b->logit_rows[i] * c->dim, w->output_norm,
                    c->dim, c->norm_eps);
    if (matmul(ctx, &w->output, ctx->final_hidden, b->n_logits, logits))
        return braid_error_set(err, "forward: out of memory in the output head");
    if (cpu_matmul_takes_int8(&w->output, ctx->math))
        cpu_matmul_refine_top(&w->output, ctx->final_hidden, b->n_logits, logits, FORWARD_INT8_HEAD_REFINE);
    return 0;
}
