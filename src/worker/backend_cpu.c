/*
 * backend_cpu.c — the CPU backend: fp16 paged KV pool and the forward pass of worker/forward.c in
 * the configured matmul arithmetic (fp32 or int8 activations), with argmax taken on the host.
 * Q5_0 matrices are re-encoded exactly as Q8_0 first (kernels/cpu/weight_widen.h); a synthetic
 * model's matrices (model/synthetic_model.h) are generated as host bf16 first.
 * The host KV tier is a second KvPool in ordinary memory; cache operations are block copies
 * between the two pools, or a rotation of one device block's keys in place (ROTATE, with the
 * forward's own RoPE angles: cpu_rope_angles of the position difference), done synchronously, so
 * they are complete before the next forward. Overlapped lists (backend.h; the prefetch's STOREs
 * and LOADs) of block copies only go to a copy thread (worker/copy_thread.h) that runs them while
 * the forward computes other blocks; backend_sync waits for it. Every LOAD is timed (the measured
 * bandwidth of PBKV's S_bw).
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/int8_pack.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"
#include "kernels/cpu/weight_widen.h"
#include "model/synthetic_model.h"
#include "common/timeutil.h"
#include "worker/backend.h"
#include "worker/copy_thread.h"
#include "worker/forward.h"
#include "worker/kv_pool.h"
#include "worker/residual_pool.h"
#include "worker/sampler.h"

typedef struct {
    ModelWeights synthetic; /* a synthetic model's matrices generated as host bf16 (model/synthetic_model.h);
                               zero for a model read from a file */
    ModelWeights widened; /* the weights with their Q5_0 matrices re-encoded as Q8_0, the same values
                             (kernels/cpu/weight_widen.h); zero when the model has none */
    ModelWeights packed; /* int8 arithmetic: the weights with their matrices packed for the int8
                            kernels (kernels/cpu/int8_pack.h); zero in fp32 */
    KvPool kv;
    KvPool host; /* host tier (n_blocks == 0 when there is none) */
    ResidualPool res; /* ForkKV residuals (n_blocks == 0 when --lora-cache is not shared) */
    ForwardContext fwd;
    float *logits; /* (cap_logits, vocab) when the caller wants fewer rows than computed */
    int cap_logits;
    float *rot_cos, *rot_sin; /* (rope_dim/2) angles of the ROTATE being applied */
    CopyThread copier;        /* started with a host tier unless cfg.sync_copies */
    CacheOp *overlapped;      /* the list the copy thread runs (a private copy) */
    int n_overlapped, cap_overlapped;
    double thread_load_bytes, thread_load_seconds; /* the copy thread's LOADs, folded into the Backend at sync */
    size_t load_block_bytes; /* bytes one LOAD moves (kv_pool_block_bytes) */
} CpuBackend;

static int cpu_reserve_logits(CpuBackend *cb, int rows, int vocab, BraidError *err) {
    if (rows <= cb->cap_logits) return 0;
    float *p = realloc(cb->logits, (size_t)rows * vocab * sizeof(float));
    if (!p) return braid_error_set(err, "cpu backend: out of memory for %d logit rows", rows);
    cb->logits = p;
    cb->cap_logits = rows;
    return 0;
}

static int cpu_forward(Backend *b, const ForwardBatch *batch, ForwardOutput *out, BraidError *err) {
    CpuBackend *cb = b->impl;
    int vocab = b->weights->cfg.vocab_size;
    bool direct = out->logits && !out->want_logits;
    float *logits = out->logits;
    if (!direct) {
        if (cpu_reserve_logits(cb, batch->n_logits, vocab, err)) return -1;
        logits = cb->logits;
    }
    if (forward_run(&cb->fwd, batch, logits, err)) return -1;
    /* Rows are independent; a decode step's many vocabulary-wide scans share the cores. */
#pragma omp parallel for schedule(static) if (batch->n_logits >= 4)
    for (int i = 0; i < batch->n_logits; i++) {
        const float *row = logits + (size_t)i * vocab;
        out->argmax[i] = out->want_mask && out->want_mask[i]
                             ? sampler_argmax_masked(row, vocab, out->mask + (size_t)i * out->mask_words)
                             : sampler_argmax(row, vocab);
        if (!direct && out->logits && out->want_logits[i]) memcpy(out->logits + (size_t)i * vocab, row, (size_t)vocab * sizeof(float));
    }
    size_t dim = (size_t)b->weights->cfg.dim;
    for (int i = 0; out->want_hidden && i < batch->n_logits; i++)
        if (out->want_hidden[i]) memcpy(out->hidden + i * dim, cb->fwd.final_hidden + i * dim, dim * sizeof(float));
    return 0;
}

/* ROTATE: the angles of the position difference, from the forward's own angle code. */
static void cpu_rotate_block(CpuBackend *cb, const ModelWeights *w, int32_t block, int32_t delta) {
    const ModelConfig *c = &w->cfg;
    cpu_rope_angles(delta, c->rope_dim, c->rope_base, c->rope_position_scale, w->rope_freq_factors, cb->rot_cos, cb->rot_sin);
    kv_pool_rotate_block(&cb->kv, block, delta, c->rope_dim, c->rope_pairing, cb->rot_cos, cb->rot_sin);
}

/* COPY_SLOTS: a segment's slots land at another offset, keys turned by the same angles as ROTATE. */
static void cpu_copy_slots(CpuBackend *cb, const ModelWeights *w, const CacheOp *op) {
    const ModelConfig *c = &w->cfg;
    if (op->delta != 0)
        cpu_rope_angles(op->delta, c->rope_dim, c->rope_base, c->rope_position_scale, w->rope_freq_factors, cb->rot_cos, cb->rot_sin);
    kv_pool_copy_slots(&cb->kv, op->src, op->src_slot, op->dst, op->dst_slot, op->n_slots, op->delta, c->rope_dim, c->rope_pairing,
                       cb->rot_cos, cb->rot_sin);
}

/* A LOAD, timed: its bytes and seconds go to *bytes and *seconds. */
static void cpu_load_block(CpuBackend *cb, const CacheOp *op, double *bytes, double *seconds) {
    double t0 = braid_now_seconds();
    kv_pool_copy_block(&cb->host, op->src, &cb->kv, op->dst);
    *seconds += braid_now_seconds() - t0;
    *bytes += (double)cb->load_block_bytes;
}

static int cpu_apply_cache_ops(Backend *b, const CacheOp *ops, int n, BraidError *err) {
    CpuBackend *cb = b->impl;
    for (int i = 0; i < n; i++) {
        const CacheOp *op = &ops[i];
        if (op->kind == CACHE_OP_COPY) kv_pool_copy_block(&cb->kv, op->src, &cb->kv, op->dst);
        else if (op->kind == CACHE_OP_STORE) kv_pool_copy_block(&cb->kv, op->src, &cb->host, op->dst);
        else if (op->kind == CACHE_OP_LOAD) cpu_load_block(cb, op, &b->load_bytes, &b->load_seconds);
        else if (op->kind == CACHE_OP_ROTATE) cpu_rotate_block(cb, b->weights, op->src, op->delta);
        else if (op->kind == CACHE_OP_COPY_SLOTS) cpu_copy_slots(cb, b->weights, op);
        else return braid_error_set(err, "cache op %d: %s is not supported", i, cache_op_name(op->kind));
    }
    return 0;
}

/* The copy thread's job: the overlapped list, block copies only (checked at submission). */
static void cpu_copy_job(void *ctx) {
    CpuBackend *cb = ctx;
    for (int i = 0; i < cb->n_overlapped; i++) {
        const CacheOp *op = &cb->overlapped[i];
        if (op->kind == CACHE_OP_COPY) kv_pool_copy_block(&cb->kv, op->src, &cb->kv, op->dst);
        else if (op->kind == CACHE_OP_STORE) kv_pool_copy_block(&cb->kv, op->src, &cb->host, op->dst);
        else cpu_load_block(cb, op, &cb->thread_load_bytes, &cb->thread_load_seconds);
    }
}

static bool only_block_copies(const CacheOp *ops, int n) {
    for (int i = 0; i < n; i++)
        if (ops[i].kind != CACHE_OP_COPY && ops[i].kind != CACHE_OP_STORE && ops[i].kind != CACHE_OP_LOAD) return false;
    return true;
}

static int cpu_sync(Backend *b, BraidError *err) {
    (void)err;
    CpuBackend *cb = b->impl;
    copy_thread_wait(&cb->copier);
    b->load_bytes += cb->thread_load_bytes;
    b->load_seconds += cb->thread_load_seconds;
    cb->thread_load_bytes = cb->thread_load_seconds = 0.0;
    return 0;
}

/* Block copies go to the copy thread (after the previous overlapped list); anything else, or no
 * thread, runs inline. */
static int cpu_apply_cache_ops_overlapped(Backend *b, const CacheOp *ops, int n, BraidError *err) {
    CpuBackend *cb = b->impl;
    if (!cb->copier.started || !only_block_copies(ops, n)) {
        if (cpu_sync(b, err)) return -1;
        return cpu_apply_cache_ops(b, ops, n, err);
    }
    if (cpu_sync(b, err)) return -1; /* the thread's list is free to refill */
    if (n > cb->cap_overlapped) {
        CacheOp *p = realloc(cb->overlapped, (size_t)n * sizeof *p);
        if (!p) return braid_error_set(err, "cpu backend: out of memory for %d overlapped cache operations", n);
        cb->overlapped = p;
        cb->cap_overlapped = n;
    }
    memcpy(cb->overlapped, ops, (size_t)n * sizeof *ops);
    cb->n_overlapped = n;
    b->overlapped_ops += (uint64_t)n;
    copy_thread_submit(&cb->copier, cpu_copy_job, cb);
    return 0;
}

/* Widens one block of every layer of a K or V cache into out (n_layers, block_elems). */
static void widen_block(uint16_t *const *layers, int n_layers, size_t block_elems, int32_t block, float *out) {
    for (int l = 0; l < n_layers; l++) {
        const uint16_t *src = layers[l] + (size_t)block * block_elems;
        for (size_t i = 0; i < block_elems; i++) out[(size_t)l * block_elems + i] = vec_half_to_float(src[i]);
    }
}

static int cpu_read_block(Backend *b, int32_t block, float *keys, float *values, int32_t *positions, BraidError *err) {
    (void)err;
    const KvPool *kv = &((CpuBackend *)b->impl)->kv;
    size_t block_elems = (size_t)kv->n_kv_heads * kv->block_size * kv->head_dim;
    if (keys) widen_block(kv->k, kv->n_layers, block_elems, block, keys);
    if (values) widen_block(kv->v, kv->n_layers, block_elems, block, values);
    if (positions) memcpy(positions, kv->slot_pos + (size_t)block * kv->block_size, (size_t)kv->block_size * sizeof *positions);
    return 0;
}

static int cpu_kv_memory(Backend *b, int tier, BackendKvMemory *out) {
    CpuBackend *cb = b->impl;
    const KvPool *p = tier == 0 ? &cb->kv : tier == 1 ? &cb->host : NULL;
    if (!p || p->n_blocks == 0) return -1;
    size_t block_elems = (size_t)p->n_kv_heads * p->block_size * p->head_dim;
    *out = (BackendKvMemory){.kv = p->k[0], .kv_bytes = 2 * (size_t)p->n_layers * p->n_blocks * block_elems * sizeof **p->k,
                             .slot_pos = p->slot_pos, .slot_pos_bytes = (size_t)p->n_blocks * p->block_size * sizeof *p->slot_pos,
                             .n_layers = p->n_layers, .n_blocks = p->n_blocks, .block_size = p->block_size,
                             .block_layer_bytes = block_elems * sizeof **p->k};
    return 0;
}

static void cpu_destroy(Backend *b) {
    CpuBackend *cb = b->impl;
    if (!cb) return;
    copy_thread_stop(&cb->copier); /* finishes the list in flight first */
    free(cb->overlapped);
    forward_free(&cb->fwd);
    model_weights_free(&cb->packed);
    model_weights_free(&cb->widened);
    model_weights_free(&cb->synthetic);
    kv_pool_destroy(&cb->kv);
    kv_pool_destroy(&cb->host);
    residual_pool_destroy(&cb->res);
    free(cb->logits);
    free(cb->rot_cos);
    free(cb->rot_sin);
    free(cb);
    b->impl = NULL;
}

static const BackendOps CPU_OPS = {
    .name = "cpu", .forward = cpu_forward, .apply_cache_ops = cpu_apply_cache_ops,
    .apply_cache_ops_overlapped = cpu_apply_cache_ops_overlapped, .sync = cpu_sync, .read_block = cpu_read_block,
    .kv_memory = cpu_kv_memory, .destroy = cpu_destroy};

static int cpu_create_host_tier(CpuBackend *cb, const Backend *b, BraidError *err) {
    const ModelConfig *c = &b->weights->cfg;
    int n = b->cfg.host_blocks;
    if (n == 0) return 0;
    if (kv_pool_create(&cb->host, c, n, b->cfg.block_size, err))
        return braid_error_wrap(err, "cpu backend: host KV tier of %d blocks (%.2f GiB) does not fit in memory "
                                     "(use fewer --host-kv-blocks or a smaller --host-kv-gib)",
                                n, (double)kv_pool_block_bytes(c, b->cfg.block_size) * n / (1u << 30));
    return 0;
}

/* Whether every matrix that was Q5_0 in src (and so widened) is packed in packed. */
static bool widened_all_packed(const ModelWeights *src, const ModelWeights *packed) {
    if (weight_widen_applies(&src->output) && packed->output.layout != WEIGHT_LAYOUT_ROWS8) return false;
    for (int l = 0; l < src->cfg.n_layers; l++) {
        const LayerWeights *S = &src->layers[l], *P = &packed->layers[l];
        const WeightMatrix *s[] = {&S->wq, &S->wk, &S->wv, &S->wo, &S->w_gate, &S->w_up, &S->w_down};
        const WeightMatrix *p[] = {&P->wq, &P->wk, &P->wv, &P->wo, &P->w_gate, &P->w_up, &P->w_down};
        for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
            if (weight_widen_applies(s[i]) && p[i]->layout != WEIGHT_LAYOUT_ROWS8) return false;
    }
    return true;
}

int backend_cpu_create(Backend *b, BraidError *err) {
    const ModelConfig *c = &b->weights->cfg;
    if (c->head_dim > CPU_ROPE_MAX_HEAD_DIM)
        return braid_error_set(err, "cpu backend: head_dim %d exceeds the %d the KV rotation supports", c->head_dim,
                               CPU_ROPE_MAX_HEAD_DIM);
    if (b->cfg.residual_blocks > 0 && c->qk_norm)
        return braid_error_set(err, "cpu backend: ForkKV (--lora-cache shared) cannot split %s's normalized keys into base and "
                                    "residual parts (per-head K norm); use --lora-cache separate", c->arch);
    if (b->cfg.lora && b->cfg.lora->n > 0 && b->cfg.tp && b->cfg.tp->size > 1)
        return braid_error_set(err, "cpu backend: LoRA adapters (--lora) are not sharded for tensor parallelism yet; use --tp 1");
    CpuBackend *cb = calloc(1, sizeof *cb);
    if (!cb) return braid_error_set(err, "cpu backend: out of memory");
    b->impl = cb; /* from here on, cpu_destroy undoes whatever part was made */
    cb->rot_cos = malloc(((size_t)c->rope_dim / 2 + 1) * sizeof *cb->rot_cos);
    cb->rot_sin = malloc(((size_t)c->rope_dim / 2 + 1) * sizeof *cb->rot_sin);
    int rc = !cb->rot_cos || !cb->rot_sin ? braid_error_set(err, "cpu backend: out of memory") : 0;
    if (rc == 0) rc = kv_pool_create(&cb->kv, c, b->cfg.n_blocks, b->cfg.block_size, err);
    if (rc == 0) rc = cpu_create_host_tier(cb, b, err);
    cb->load_block_bytes = kv_pool_block_bytes(c, b->cfg.block_size);
    if (rc == 0 && b->cfg.host_blocks > 0 && !b->cfg.sync_copies && copy_thread_start(&cb->copier, err))
        rc = braid_error_wrap(err, "cpu backend");
    if (rc == 0 && b->cfg.residual_blocks > 0)
        rc = residual_pool_create(&cb->res, c, b->cfg.residual_blocks, b->cfg.block_size, b->cfg.residual_rank, err);
    /* A synthetic model's matrices have no data: generated here, the same bits the CUDA backend makes. */
    if (rc == 0 && synthetic_model_has_unmaterialized(b->weights) && synthetic_model_materialize(b->weights, &cb->synthetic, err))
        rc = braid_error_wrap(err, "cpu backend");
    const ModelWeights *source = cb->synthetic.layers ? &cb->synthetic : b->weights;
    /* Q5_0 matrices have no fast kernels: re-encoded exactly as Q8_0, they take Q8_0's (both arithmetics). */
    if (rc == 0 && weight_widen_model(source, &cb->widened, err))
        rc = braid_error_wrap(err, "cpu backend: re-encoding Q5_0 weights as Q8_0");
    const ModelWeights *base = cb->widened.layers ? &cb->widened : source;
    /* The int8 kernels read their own packing of the weights: a private copy of the matrices they
     * take (the file's mapping stays for the embedding and anything else). */
    if (rc == 0 && b->cfg.cpu_matmul == CPU_MATMUL_INT8 && int8_pack_model(base, &cb->packed, err))
        rc = braid_error_wrap(err, "cpu backend: packing the weights for the int8 arithmetic");
    /* Packed, the widened copies are read no more (every one is a packable Q8_0 matrix). */
    if (rc == 0 && cb->packed.layers && cb->widened.layers && widened_all_packed(b->weights, &cb->packed))
        model_weights_free(&cb->widened);
    if (rc) {
        cpu_destroy(b);
        return -1;
    }
    forward_init(&cb->fwd, cb->packed.layers ? &cb->packed : base, &cb->kv);
    cb->fwd.between_layers = b->cfg.step_pulse;
    cb->fwd.between_layers_ctx = b->cfg.step_pulse_ctx;
    cb->fwd.tp = b->cfg.tp;
    cb->fwd.math = b->cfg.cpu_matmul;
    cb->fwd.lora = b->cfg.lora;
    cb->fwd.res = b->cfg.residual_blocks > 0 ? &cb->res : NULL;
    b->ops = &CPU_OPS;
    b->kv_bytes = cb->kv.bytes;
    b->host_kv_bytes = cb->host.bytes;
    b->residual_kv_bytes = cb->res.bytes;
    b->copier = cb->copier.started ? &cb->copier : NULL;
    return 0;
}
