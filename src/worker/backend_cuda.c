/*
 * backend_cuda.c — the CUDA backend: bf16 weights and paged KV pool on one GPU, cuBLAS GEMMs
 * (bf16 inputs, fp32 accumulation), Braid's kernels for the rest, decode steps replayed from
 * CUDA graphs.
 *
 * A step's metadata (token ids, positions, slots, sequence bounds, block tables, attention work
 * lists) is packed into one pinned host buffer with a layout fixed by the configured limits, so
 * one copy moves it and a captured graph always finds it at the same addresses. Pure decode steps
 * (one new token per sequence, every sequence sampled) replay the graph of the next ladder size,
 * padding the extra rows; other steps launch the same kernel sequence directly. Only the greedy
 * ids and the logit rows the caller asks for come back to the host.
 *
 * LoRA adapters and ForkKV (worker/cuda_lora.h): a step whose batch names an adapter or carries
 * residual tables adds the adapter launches to each layer (deltas after the QKV and O GEMMs, the
 * residual store, ResidualAttention for forked sequences, which the ordinary attention's work
 * lists leave out) and always launches directly, never from a graph: the graphs were captured
 * without those launches. A batch of base-model sequences only takes exactly the path it takes
 * without adapters.
 *
 * Cache operations (COPY, STORE to and LOAD from the host tier, which lives in pinned host memory
 * when it can) run as cudaMemcpyAsync calls on a copy stream; ROTATE runs as a kernel on the same
 * stream, so list order holds between it and the copies, with the RoPE shape and inverse
 * frequencies of the forward's own RoPE (rope_shape()). The copy stream first waits for the
 * compute stream's earlier work (the forward that wrote a block a STORE reads), and the compute
 * stream then waits for the copies' event, so the next forward never reads a block before its
 * LOAD lands nor overwrites one before its STORE has read it. Neither side blocks the host.
 *
 * Tensor parallelism (cfg.tp, the weights a worker/weight_shard.h shard): the O and down GEMMs of
 * each rank write partial sums into tp_partial, the group's all-reduce (transport/tp_collective.h:
 * NCCL between distinct GPUs, host-staged MPI when ranks share one) sums them on the compute
 * stream, and one axpy adds the sum to the residual stream. A host-staged reduction waits on the
 * host, so its steps are never replayed from a graph. Adapters are not sharded (refused, as on
 * the CPU).
 */
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/log.h"
#include "kernels/cuda/cuda_kernels.h"
#include "transport/tp_collective.h"
#include "worker/backend.h"
#include "worker/cuda_kv_ipc.h"
#include "worker/cuda_lora.h"
#include "worker/cuda_weights.h"
#include "worker/graph_ladder.h"

#define PREFILL_TILE 64
#define CUBLAS_WORKSPACE_BYTES (32u << 20)

/* Offsets (in int32 elements) of each array inside the metadata buffer. */
typedef struct {
    size_t tokens, positions, slots, logit_rows, seq_start, seq_ctx, dec_seqs, tiles, tables, total;
    int table_stride, max_tiles;
} MetaLayout;

typedef struct {
    cudaGraphExec_t exec;
    int n_splits;
} DecodeGraph;

/* The host KV tier: one allocation, pinned unless pinning failed. */
typedef struct {
    void *mem;
    size_t bytes;
    bool pinned;
    uint16_t **k, **v; /* per layer (host_blocks, n_kv_heads, block_size, head_dim) bf16, inside mem */
    int32_t *slot_pos; /* (host_blocks, block_size), inside mem */
} CudaHostTier;

typedef struct {
    int device, n_sms;
    bool prefill_wmma; /* the shared-memory prefill kernel (default) rather than the flash one (BRAID_CUDA_PREFILL=flash) */
    cudaStream_t stream;
    cudaStream_t copy_stream;            /* cache operations */
    cudaEvent_t compute_done, copies_done; /* copy stream waits on the first, compute stream on the second */
    CudaHostTier host;
    cublasHandle_t blas;
    void *blas_workspace;
    CudaWeights w;
    uint16_t *kv_base;             /* the device pool, one allocation (so one CUDA IPC handle lends it all):
                                      every layer's K, then every layer's V, (n_blocks, block elems) each */
    uint16_t **k_cache, **v_cache; /* per layer, into kv_base */
    uint16_t **k_layers_dev, **v_layers_dev; /* (n_layers) device copies of k_cache / v_cache, for kernels that span layers */
    int32_t *slot_pos;
    /* activations, sized for max_batch_tokens rows */
    float *x, *qkv, *logits, *partials;
    float *tp_partial; /* (max_batch_tokens, dim) this rank's O / down partial sums; NULL without TP */
    uint16_t *xb, *q, *att, *gate_up, *h, *final_h;
    int32_t *argmax_dev, *argmax_host;
    void *argmax_scratch;
    MetaLayout meta;
    int32_t *meta_host, *meta_dev;
    GraphLadder ladder;
    DecodeGraph graphs[GRAPH_LADDER_MAX];
    CudaLora lora; /* adapters and the ForkKV residual pool (n_ids == 0: none loaded) */
    /* Grammar masks (made at the first step that has any): (cap_masks, mask_words) bitmasks and
     * their logit rows, on the device and pinned on the host for the upload. */
    uint32_t *mask_dev, *mask_host;
    int32_t *mask_rows_dev, *mask_rows_host;
    int cap_masks, mask_words;
} CudaBackend;

/* What one launch of the kernel sequence covers. */
typedef struct {
    int n_tokens, n_seqs, n_dec, n_tiles, n_splits, n_logits;
    bool adapted; /* the step has adapter work (cuda_lora_prepare done); never in a graph */
} StepShape;

#define CUDA_TRY(call, what)                                                                                        \
    do {                                                                                                            \
        cudaError_t e_ = (call);                                                                                    \
        if (e_ != cudaSuccess) return braid_error_set(err, "cuda backend: %s: %s", (what), cudaGetErrorString(e_)); \
    } while (0)

#define CUBLAS_TRY(call, what)                                                                                      \
    do {                                                                                                            \
        cublasStatus_t s_ = (call);                                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) return braid_error_set(err, "cuda backend: %s: cuBLAS status %d", (what), (int)s_); \
    } while (0)

bool backend_cuda_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static void layout_meta(MetaLayout *m, const BackendConfig *c) {
    size_t t = (size_t)c->max_batch_tokens, s = (size_t)c->max_seqs, at = 0;
    m->table_stride = (c->max_context + c->block_size - 1) / c->block_size;
    if (m->table_stride > c->n_blocks) m->table_stride = c->n_blocks;
    m->max_tiles = c->max_batch_tokens / PREFILL_TILE + c->max_seqs;
    m->tokens = at; at += t;
    m->positions = at; at += t;
    m->slots = at; at += t;
    m->logit_rows = at; at += t;
    m->seq_start = at; at += s + 1;
    m->seq_ctx = at; at += s;
    m->dec_seqs = at; at += s;
    m->tiles = at; at += 2 * (size_t)m->max_tiles;
    m->tables = at; at += s * (size_t)m->table_stride;
    m->total = at;
}

static int alloc_dev(void **p, size_t bytes, const char *what, BraidError *err) {
    CUDA_TRY(cudaMalloc(p, bytes ? bytes : 1), what);
    return 0;
}

static int alloc_kv(CudaBackend *cb, const Backend *b, BraidError *err) {
    const ModelConfig *c = &b->weights->cfg;
    size_t slots = (size_t)b->cfg.n_blocks * b->cfg.block_size, layer_elems = slots * c->n_kv_heads * c->head_dim;
    cb->k_cache = calloc((size_t)c->n_layers, sizeof *cb->k_cache);
    cb->v_cache = calloc((size_t)c->n_layers, sizeof *cb->v_cache);
    if (!cb->k_cache || !cb->v_cache) return braid_error_set(err, "cuda backend: out of memory");
    size_t pool_bytes = 2 * (size_t)c->n_layers * layer_elems * 2;
    if (alloc_dev((void **)&cb->kv_base, pool_bytes, "KV pool", err))
        return braid_error_wrap(err, "%d blocks of %d tokens do not fit on the GPU (use fewer --kv-blocks)", b->cfg.n_blocks,
                                b->cfg.block_size);
    /* Zeroed so masked keys never bring NaN garbage into a product. */
    CUDA_TRY(cudaMemset(cb->kv_base, 0, pool_bytes), "clearing the KV pool");
    for (int l = 0; l < c->n_layers; l++) {
        cb->k_cache[l] = cb->kv_base + (size_t)l * layer_elems;
        cb->v_cache[l] = cb->kv_base + (size_t)(c->n_layers + l) * layer_elems;
    }
    if (alloc_dev((void **)&cb->k_layers_dev, (size_t)c->n_layers * sizeof *cb->k_layers_dev, "KV layer table", err)) return -1;
    CUDA_TRY(cudaMemcpy(cb->k_layers_dev, cb->k_cache, (size_t)c->n_layers * sizeof *cb->k_cache, cudaMemcpyHostToDevice),
             "uploading the KV layer table");
    if (alloc_dev((void **)&cb->v_layers_dev, (size_t)c->n_layers * sizeof *cb->v_layers_dev, "KV layer table", err)) return -1;
    CUDA_TRY(cudaMemcpy(cb->v_layers_dev, cb->v_cache, (size_t)c->n_layers * sizeof *cb->v_cache, cudaMemcpyHostToDevice),
             "uploading the KV layer table");
    if (alloc_dev((void **)&cb->slot_pos, slots * sizeof(int32_t), "slot positions", err)) return -1;
    CUDA_TRY(cudaMemset(cb->slot_pos, 0, slots * sizeof(int32_t)), "clearing slot positions");
    return 0;
}

/* bf16 elements one block takes in one layer's K (or V) cache. */
static size_t kv_block_elems(const Backend *b) {
    const ModelConfig *c = &b->weights->cfg;
    return (size_t)c->n_kv_heads * b->cfg.block_size * c->head_dim;
}

/* Pinned memory for the whole tier, or pageable memory (with a warning) when pinning fails. */
static int alloc_host_memory(CudaHostTier *h, size_t bytes, const Backend *b, BraidError *err) {
    double gib = (double)bytes / (1u << 30);
    cudaError_t e = cudaHostAlloc(&h->mem, bytes, cudaHostAllocDefault);
    if (e == cudaSuccess) {
        h->pinned = true;
        memset(h->mem, 0, bytes); /* zeroed, like the device pool, so a stray load never brings NaN */
        return 0;
    }
    h->mem = NULL;
    (void)cudaGetLastError(); /* clear it, or the next kernel launch would report this failure */
    LOG_WARN("cuda", "host KV tier: pinning %.2f GiB failed (%s); using pageable memory, so loads and stores are slower",
             gib, cudaGetErrorString(e));
    h->mem = calloc(1, bytes);
    if (!h->mem)
        return braid_error_set(err, "cuda backend: the host KV tier of %d blocks (%.2f GiB) fits neither in pinned nor in "
                                    "pageable memory (use fewer --host-kv-blocks or a smaller --host-kv-gib)",
                               b->cfg.host_blocks, gib);
    return 0;
}

/* Lays out the host tier as slot positions, then per layer K and V, in one allocation. */
static int alloc_host_tier(CudaBackend *cb, const Backend *b, BraidError *err) {
    const ModelConfig *c = &b->weights->cfg;
    CudaHostTier *h = &cb->host;
    size_t n = (size_t)b->cfg.host_blocks;
    if (n == 0) return 0;
    size_t pos_bytes = n * b->cfg.block_size * sizeof(int32_t), layer_bytes = n * kv_block_elems(b) * sizeof(uint16_t);
    size_t total = pos_bytes + 2 * layer_bytes * c->n_layers;
    h->k = calloc((size_t)c->n_layers, sizeof *h->k);
    h->v = calloc((size_t)c->n_layers, sizeof *h->v);
    if (!h->k || !h->v) return braid_error_set(err, "cuda backend: out of memory");
    if (alloc_host_memory(h, total, b, err)) return -1;
    uint8_t *p = h->mem;
    h->slot_pos = (int32_t *)p;
    p += pos_bytes;
    for (int l = 0; l < c->n_layers; l++, p += 2 * layer_bytes) {
        h->k[l] = (uint16_t *)p;
        h->v[l] = (uint16_t *)(p + layer_bytes);
    }
    h->bytes = total;
    return 0;
}

static int alloc_activations(CudaBackend *cb, const Backend *b, BraidError *err) {
    const ModelConfig *c = &b->weights->cfg;
    size_t t = (size_t)b->cfg.max_batch_tokens, q_dim = (size_t)c->n_heads * c->head_dim;
    size_t qkv_dim = q_dim + 2 * (size_t)c->n_kv_heads * c->head_dim;
    size_t partial_floats = (size_t)b->cfg.max_seqs * c->n_heads * CUDA_DECODE_MAX_SPLITS * (c->head_dim + 2);
    if (alloc_dev((void **)&cb->x, t * c->dim * 4, "activations", err) ||
        alloc_dev((void **)&cb->qkv, t * qkv_dim * 4, "activations", err) ||
        alloc_dev((void **)&cb->logits, t * c->vocab_size * 4, "logits", err) ||
        alloc_dev((void **)&cb->partials, partial_floats * 4, "attention partials", err) ||
        alloc_dev((void **)&cb->xb, t * c->dim * 2, "activations", err) ||
        alloc_dev((void **)&cb->q, t * q_dim * 2, "activations", err) ||
        alloc_dev((void **)&cb->att, t * q_dim * 2, "activations", err) ||
        alloc_dev((void **)&cb->gate_up, t * 2 * c->ff_dim * 2, "activations", err) ||
        alloc_dev((void **)&cb->h, t * c->ff_dim * 2, "activations", err) ||
        alloc_dev((void **)&cb->final_h, t * c->dim * 2, "activations", err) ||
        alloc_dev((void **)&cb->argmax_dev, t * 4, "argmax", err) ||
        alloc_dev(&cb->argmax_scratch, t * CUDA_ARGMAX_PARTS * 8, "argmax", err) ||
        alloc_dev((void **)&cb->meta_dev, cb->meta.total * 4, "step metadata", err))
        return -1;
    if (b->cfg.tp && b->cfg.tp->size > 1 && alloc_dev((void **)&cb->tp_partial, t * c->dim * 4, "TP partial sums", err)) return -1;
    CUDA_TRY(cudaMallocHost((void **)&cb->meta_host, cb->meta.total * 4), "pinned step metadata");
    CUDA_TRY(cudaMallocHost((void **)&cb->argmax_host, t * 4), "pinned argmax");
    memset(cb->meta_host, 0, cb->meta.total * 4);
    return 0;
}

/* Y (n, out) = X (n, in) · Wᵀ (+ Y when accumulate), X and W bf16, Y fp32 or bf16. A few tokens
 * (decode) stream W through Braid's GEMV kernel; more go to cuBLAS. */
static int gemm(CudaBackend *cb, const uint16_t *w, int out, int in, const uint16_t *x, int n, void *y, bool y_fp32,
                bool accumulate, BraidError *err) {
    if (n <= CUDA_GEMV_MAX_TOKENS) {
        CUDA_TRY(cuda_gemv_bf16(w, out, in, x, n, y, y_fp32, accumulate, cb->stream), "GEMV");
        return 0;
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    CUBLAS_TRY(cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, CUDA_R_16BF, in, x, CUDA_R_16BF, in,
                            &beta, y, y_fp32 ? CUDA_R_32F : CUDA_R_16BF, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "GEMM");
    return 0;
}

/* The model's RoPE as the kernels take it: the forward's RoPE and ROTATE both use this, so a
 * rotated key and a recomputed one can never be turned by different angles. */
static CudaRopeShape rope_shape(const CudaBackend *cb, const Backend *b) {
    const ModelConfig *c = &b->weights->cfg;
    return (CudaRopeShape){.n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                           .rope_dim = c->rope_dim, .interleaved = c->rope_pairing == ROPE_PAIRING_INTERLEAVED,
                           .position_scale = c->rope_position_scale, .inv_freq = cb->w.rope_inv_freq};
}

static CudaAttention attention_args(const CudaBackend *cb, const Backend *b, int layer) {
    const ModelConfig *c = &b->weights->cfg;
    const int32_t *m = cb->meta_dev;
    return (CudaAttention){
        .q = cb->q, .out = cb->att, .k_cache = cb->k_cache[layer], .v_cache = cb->v_cache[layer],
        .slot_pos = cb->slot_pos, .positions = m + cb->meta.positions, .seq_start = m + cb->meta.seq_start,
        .seq_n_ctx = m + cb->meta.seq_ctx, .block_tables = m + cb->meta.tables, .table_stride = cb->meta.table_stride,
        .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .block_size = b->cfg.block_size,
    };
}

/* x += W · in over this rank's slice: directly without TP; with it, the slice's partial sums
 * all-reduced across the group first (on the compute stream) and then added. */
static int row_parallel_gemm(CudaBackend *cb, const Backend *b, const uint16_t *w, int in_dim, const uint16_t *in, int n,
                             BraidError *err) {
    int dim = b->weights->cfg.dim;
    TpCollective *tp = b->cfg.tp;
    if (!tp || tp->size == 1) return gemm(cb, w, dim, in_dim, in, n, cb->x, true, true, err);
    if (gemm(cb, w, dim, in_dim, in, n, cb->tp_partial, true, false, err)) return -1;
    if (tp_allreduce_sum_f32(tp, cb->tp_partial, (size_t)n * dim, err)) return braid_error_wrap(err, "cuda backend");
    const float one = 1.0f;
    CUBLAS_TRY(cublasSaxpy(cb->blas, n * dim, &one, cb->tp_partial, 1, cb->x, 1), "adding the reduced partial sums");
    return 0;
}

static int encode_layer(CudaBackend *cb, const Backend *b, int l, const StepShape *s, BraidError *err) {
    const ModelConfig *c = &b->weights->cfg;
    const CudaLayerWeights *L = &cb->w.layers[l];
    const int32_t *m = cb->meta_dev;
    int n = s->n_tokens, q_dim = c->n_heads * c->head_dim, qkv_dim = q_dim + 2 * c->n_kv_heads * c->head_dim;
    cudaStream_t st = cb->stream;
    CudaRopeShape rope = rope_shape(cb, b);
    CudaAttention att = attention_args(cb, b, l);
    CUDA_TRY(cuda_rmsnorm(cb->x, NULL, n, c->dim, L->attn_norm, c->norm_eps, cb->xb, st), "attention norm");
    if (gemm(cb, L->wqkv, qkv_dim, c->dim, cb->xb, n, cb->qkv, true, false, err)) return -1;
    if (s->adapted && cuda_lora_project(&cb->lora, l, cb->xb, cb->qkv, st, err)) return -1;
    CUDA_TRY(cuda_qkv_bias_norm(cb->qkv, n, c->n_heads, c->n_kv_heads, c->head_dim, L->bqkv, L->q_norm, L->k_norm, c->norm_eps, st),
             "QKV bias and Q/K norm");
    CUDA_TRY(cuda_rope_kv_store(cb->qkv, m + cb->meta.positions, m + cb->meta.slots, n, &rope, cb->q, cb->k_cache[l],
                                cb->v_cache[l], b->cfg.block_size, st), "RoPE and KV store");
    CUDA_TRY((cb->prefill_wmma ? cuda_attention_prefill : cuda_attention_prefill_flash)(&att, m + cb->meta.tiles, s->n_tiles, st),
             "prefill attention");
    CUDA_TRY(cuda_attention_decode(&att, m + cb->meta.dec_seqs, s->n_dec, s->n_splits, cb->partials, st), "decode attention");
    if (s->adapted && cuda_lora_attend(&cb->lora, l, &att, &rope, st, err)) return -1;
    if (row_parallel_gemm(cb, b, L->wo, q_dim, cb->att, n, err)) return -1;
    if (s->adapted && cuda_lora_add_output(&cb->lora, l, cb->att, cb->x, st, err)) return -1;
    CUDA_TRY(cuda_rmsnorm(cb->x, NULL, n, c->dim, L->ffn_norm, c->norm_eps, cb->xb, st), "MLP norm");
    if (gemm(cb, L->w_gate_up, 2 * c->ff_dim, c->dim, cb->xb, n, cb->gate_up, false, false, err)) return -1;
    CUDA_TRY(cuda_swiglu(cb->gate_up, n, c->ff_dim, cb->h, st), "SwiGLU");
    return row_parallel_gemm(cb, b, L->w_down, c->ff_dim, cb->h, n, err);
}

/* Enqueues the whole forward pass for a step already described in meta_dev. */
static int encode_forward(CudaBackend *cb, const Backend *b, const StepShape *s, BraidError *err) {
    const ModelConfig *c = &b->weights->cfg;
    const int32_t *m = cb->meta_dev;
    cudaStream_t st = cb->stream;
    CUDA_TRY(cuda_embed(cb->w.token_embd, m + cb->meta.tokens, s->n_tokens, c->dim, cb->x, st), "embedding");
    CUDA_TRY(cuda_record_slot_positions(m + cb->meta.positions, m + cb->meta.slots, s->n_tokens, cb->slot_pos, st),
             "slot positions");
    for (int l = 0; l < c->n_layers; l++)
        if (encode_layer(cb, b, l, s, err)) return braid_error_wrap(err, "layer %d", l);
    if (s->n_logits == 0) return 0;
    CUDA_TRY(cuda_rmsnorm(cb->x, m + cb->meta.logit_rows, s->n_logits, c->dim, cb->w.output_norm, c->norm_eps, cb->final_h, st),
             "output norm");
    if (gemm(cb, cb->w.output, c->vocab_size, c->dim, cb->final_h, s->n_logits, cb->logits, true, false, err)) return -1;
    CUDA_TRY(cuda_argmax(cb->logits, s->n_logits, c->vocab_size, cb->argmax_scratch, cb->argmax_dev, st), "argmax");
    return 0;
}

/* Fills the pinned metadata from the batch; returns the step's shape. */
static StepShape pack_batch(CudaBackend *cb, const Backend *b, const ForwardBatch *fb) {
    MetaLayout *L = &cb->meta;
    int32_t *m = cb->meta_host;
    StepShape s = {.n_tokens = fb->n_tokens, .n_seqs = fb->n_seqs, .n_logits = fb->n_logits};
    memcpy(m + L->tokens, fb->tokens, (size_t)fb->n_tokens * 4);
    memcpy(m + L->positions, fb->positions, (size_t)fb->n_tokens * 4);
    memcpy(m + L->slots, fb->slot_mapping, (size_t)fb->n_tokens * 4);
    memcpy(m + L->logit_rows, fb->logit_rows, (size_t)fb->n_logits * 4);
    memcpy(m + L->seq_start, fb->seq_start, (size_t)(fb->n_seqs + 1) * 4);
    memcpy(m + L->seq_ctx, fb->seq_n_ctx, (size_t)fb->n_seqs * 4);
    int max_ctx = 0;
    for (int i = 0; i < fb->n_seqs; i++) {
        int n_q = fb->seq_start[i + 1] - fb->seq_start[i], n_blocks = (fb->seq_n_ctx[i] + b->cfg.block_size - 1) / b->cfg.block_size;
        memcpy(m + L->tables + (size_t)i * L->table_stride, fb->block_tables[i], (size_t)n_blocks * 4);
        /* A ForkKV sequence attends by ResidualAttention (cuda_lora_attend), not from these lists. */
        if (cuda_lora_seq_forked(fb, i)) continue;
        if (n_q == 1) {
            m[L->dec_seqs + s.n_dec++] = i;
            if (fb->seq_n_ctx[i] > max_ctx) max_ctx = fb->seq_n_ctx[i];
            continue;
        }
        for (int r0 = 0; r0 < n_q; r0 += PREFILL_TILE) {
            m[L->tiles + 2 * s.n_tiles] = i;
            m[L->tiles + 2 * s.n_tiles + 1] = r0;
            s.n_tiles++;
        }
    }
    s.n_splits = decode_split_count(s.n_dec, b->weights->cfg.n_kv_heads, cb->n_sms, max_ctx, CUDA_DECODE_MAX_SPLITS);
    return s;
}

/* Pads a pure-decode step of n sequences to `size` rows that write no slot and see no context. */
static void pad_decode(CudaBackend *cb, int n, int size) {
    MetaLayout *L = &cb->meta;
    int32_t *m = cb->meta_host;
    for (int i = n; i < size; i++) {
        m[L->tokens + i] = 0;
        m[L->positions + i] = 0;
        m[L->slots + i] = -1;
        m[L->logit_rows + i] = i;
        m[L->seq_start + i + 1] = i + 1;
        m[L->seq_ctx + i] = 0;
        m[L->dec_seqs + i] = i;
    }
}

static int upload_meta(CudaBackend *cb, int n_seqs, BraidError *err) {
    size_t ints = cb->meta.tables + (size_t)n_seqs * cb->meta.table_stride;
    CUDA_TRY(cudaMemcpyAsync(cb->meta_dev, cb->meta_host, ints * 4, cudaMemcpyHostToDevice, cb->stream), "metadata upload");
    return 0;
}

static bool is_pure_decode(const ForwardBatch *fb) {
    if (fb->n_tokens != fb->n_seqs || fb->n_logits != fb->n_seqs) return false;
    for (int i = 0; i < fb->n_logits; i++)
        if (fb->logit_rows[i] != i) return false;
    return true;
}

static int capture_graph(CudaBackend *cb, const Backend *b, int idx, BraidError *err) {
    int size = cb->ladder.sizes[idx];
    int splits = decode_split_count(size, b->weights->cfg.n_kv_heads, cb->n_sms, b->cfg.max_context, CUDA_DECODE_MAX_SPLITS);
    StepShape s = {.n_tokens = size, .n_seqs = size, .n_dec = size, .n_tiles = 0, .n_splits = splits, .n_logits = size};
    cudaGraph_t graph;
    CUDA_TRY(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal), "starting graph capture");
    int rc = encode_forward(cb, b, &s, err);
    cudaError_t end = cudaStreamEndCapture(cb->stream, &graph);
    if (rc) return braid_error_wrap(err, "capturing the decode graph for %d sequences", size);
    CUDA_TRY(end, "ending graph capture");
    cudaError_t inst = cudaGraphInstantiate(&cb->graphs[idx].exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_TRY(inst, "instantiating a decode graph");
    cb->graphs[idx].n_splits = splits;
    return 0;
}

/* Runs a pure-decode step through its graph; returns 1 when no graph applies. */
static int run_decode_graph(CudaBackend *cb, const Backend *b, const ForwardBatch *fb, BraidError *err) {
    int idx = graph_ladder_pick(&cb->ladder, fb->n_seqs);
    bool tp_host_waits = b->cfg.tp && b->cfg.tp->size > 1 && !b->cfg.tp->graph_capturable;
    if (!b->cfg.cuda_graphs || tp_host_waits || idx < 0 || !is_pure_decode(fb)) return 1;
    int size = cb->ladder.sizes[idx];
    if (size > b->cfg.max_batch_tokens) return 1;
    pad_decode(cb, fb->n_seqs, size);
    if (!cb->graphs[idx].exec && capture_graph(cb, b, idx, err)) return -1;
    if (upload_meta(cb, size, err)) return -1;
    CUDA_TRY(cudaGraphLaunch(cb->graphs[idx].exec, cb->stream), "launching a decode graph");
    return 0;
}

static float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The flagged rows of the final norm's output (bf16 on the device) as fp32; rare (one row per
 * prompt, when asked), so a synchronous copy through pageable memory is fine. */
static int copy_hidden(CudaBackend *cb, const Backend *b, const ForwardBatch *fb, ForwardOutput *out, BraidError *err) {
    size_t dim = (size_t)b->weights->cfg.dim;
    uint16_t *row = NULL;
    for (int i = 0; out->want_hidden && i < fb->n_logits; i++) {
        if (!out->want_hidden[i]) continue;
        if (!row && !(row = malloc(dim * sizeof *row))) return braid_error_set(err, "out of memory for a hidden state");
        cudaError_t e = cudaMemcpyAsync(row, cb->final_h + i * dim, dim * 2, cudaMemcpyDeviceToHost, cb->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
        if (e != cudaSuccess) {
            free(row);
            return braid_error_set(err, "copying a hidden state: %s", cudaGetErrorString(e));
        }
        for (size_t c = 0; c < dim; c++) out->hidden[i * dim + c] = bf16_to_float(row[c]);
    }
    free(row);
    return 0;
}

/* Grammar masks: the flagged rows' bitmasks go up, their disallowed logits become -inf, and the
 * argmax runs again over the rows (after the raw logits were queued for copying, so the host
 * still gets the model's own). */
static int apply_masks(CudaBackend *cb, const Backend *b, const ForwardBatch *fb, const ForwardOutput *out, BraidError *err) {
    int n = 0, words = out->mask_words, vocab = b->weights->cfg.vocab_size;
    for (int i = 0; out->want_mask && i < fb->n_logits; i++) n += out->want_mask[i] != 0;
    if (n == 0) return 0;
    if (n > cb->cap_masks || words != cb->mask_words) {
        cudaStreamSynchronize(cb->stream);
        cudaFree(cb->mask_dev);
        cudaFree(cb->mask_rows_dev);
        cudaFreeHost(cb->mask_host);
        cudaFreeHost(cb->mask_rows_host);
        cb->mask_dev = NULL, cb->mask_rows_dev = NULL, cb->mask_host = NULL, cb->mask_rows_host = NULL, cb->cap_masks = 0;
        int cap = n > b->cfg.max_seqs ? n : b->cfg.max_seqs;
        CUDA_TRY(cudaMalloc((void **)&cb->mask_dev, (size_t)cap * words * 4), "grammar masks");
        CUDA_TRY(cudaMalloc((void **)&cb->mask_rows_dev, (size_t)cap * 4), "grammar masks");
        CUDA_TRY(cudaMallocHost((void **)&cb->mask_host, (size_t)cap * words * 4), "pinned grammar masks");
        CUDA_TRY(cudaMallocHost((void **)&cb->mask_rows_host, (size_t)cap * 4), "pinned grammar masks");
        cb->cap_masks = cap;
        cb->mask_words = words;
    }
    for (int i = 0, k = 0; i < fb->n_logits; i++) {
        if (!out->want_mask[i]) continue;
        memcpy(cb->mask_host + (size_t)k * words, out->mask + (size_t)i * words, (size_t)words * 4);
        cb->mask_rows_host[k++] = i;
    }
    cudaStream_t st = cb->stream;
    CUDA_TRY(cudaMemcpyAsync(cb->mask_dev, cb->mask_host, (size_t)n * words * 4, cudaMemcpyHostToDevice, st), "grammar mask upload");
    CUDA_TRY(cudaMemcpyAsync(cb->mask_rows_dev, cb->mask_rows_host, (size_t)n * 4, cudaMemcpyHostToDevice, st), "grammar mask upload");
    CUDA_TRY(cuda_apply_token_mask(cb->logits, vocab, cb->mask_dev, words, cb->mask_rows_dev, n, st), "grammar mask");
    CUDA_TRY(cuda_argmax(cb->logits, fb->n_logits, vocab, cb->argmax_scratch, cb->argmax_dev, st), "masked argmax");
    return 0;
}

static int copy_results(CudaBackend *cb, const Backend *b, const ForwardBatch *fb, ForwardOutput *out, BraidError *err) {
    size_t vocab = (size_t)b->weights->cfg.vocab_size;
    cudaStream_t st = cb->stream;
    if (fb->n_logits == 0) return 0;
    if (out->logits && !out->want_logits) {
        CUDA_TRY(cudaMemcpyAsync(out->logits, cb->logits, (size_t)fb->n_logits * vocab * 4, cudaMemcpyDeviceToHost, st),
                 "copying logits");
    } else if (out->logits) {
        for (int i = 0; i < fb->n_logits; i++)
            if (out->want_logits[i])
                CUDA_TRY(cudaMemcpyAsync(out->logits + i * vocab, cb->logits + i * vocab, vocab * 4, cudaMemcpyDeviceToHost, st),
                         "copying logits");
    }
    if (apply_masks(cb, b, fb, out, err)) return -1;
    CUDA_TRY(cudaMemcpyAsync(cb->argmax_host, cb->argmax_dev, (size_t)fb->n_logits * 4, cudaMemcpyDeviceToHost, st),
             "copying token ids");
    if (copy_hidden(cb, b, fb, out, err)) return -1;
    CUDA_TRY(cudaStreamSynchronize(st), "finishing the step");
    memcpy(out->argmax, cb->argmax_host, (size_t)fb->n_logits * 4);
    return 0;
}

/* A step with adapter work: its adapter metadata, then the direct launch with the adapter kernels. */
static int run_adapted(CudaBackend *cb, const Backend *b, const ForwardBatch *fb, StepShape *s, BraidError *err) {
    if (cuda_lora_prepare(&cb->lora, fb, cb->stream, err)) return -1;
    s->adapted = true;
    return upload_meta(cb, fb->n_seqs, err) || encode_forward(cb, b, s, err) ? -1 : 0;
}

static int cuda_forward(Backend *b, const ForwardBatch *fb, ForwardOutput *out, BraidError *err) {
    CudaBackend *cb = b->impl;
    CUDA_TRY(cudaSetDevice(cb->device), "selecting the device");
    StepShape s = pack_batch(cb, b, fb);
    if (cuda_lora_batch_adapted(fb)) return run_adapted(cb, b, fb, &s, err) || copy_results(cb, b, fb, out, err) ? -1 : 0;
    int graph = run_decode_graph(cb, b, fb, err);
    if (graph < 0) return -1;
    if (graph > 0 && (upload_meta(cb, fb->n_seqs, err) || encode_forward(cb, b, &s, err))) return -1;
    return copy_results(cb, b, fb, out, err);
}

/* How many operations from ops[0] form one run: same kind, consecutive source and target blocks,
 * and, within one tier, source and target ranges that stay apart, so one copy per array does them. */
static int run_length(const CacheOp *ops, int n) {
    int len = 1;
    if (ops[0].kind == CACHE_OP_ROTATE || ops[0].kind == CACHE_OP_COPY_SLOTS) return 1; /* one kernel per operation */
    for (; len < n; len++) {
        const CacheOp *o = &ops[len];
        if (o->kind != ops[0].kind || o->src != ops[0].src + len || o->dst != ops[0].dst + len) break;
        bool overlap = ops[0].src < ops[0].dst + len + 1 && ops[0].dst < ops[0].src + len + 1;
        if (o->kind == CACHE_OP_COPY && overlap) break;
    }
    return len;
}

/* Enqueues one run of `len` operations like op on the copy stream. */
static int copy_run(CudaBackend *cb, const Backend *b, const CacheOp *op, int len, BraidError *err) {
    if (op->kind == CACHE_OP_ROTATE) {
        CudaRopeShape rope = rope_shape(cb, b);
        CUDA_TRY(cuda_rotate_block_keys(cb->k_layers_dev, b->weights->cfg.n_layers, cb->slot_pos, op->src, op->delta, &rope,
                                        b->cfg.block_size, cb->copy_stream),
                 "rotating a KV block");
        return 0;
    }
    if (op->kind == CACHE_OP_COPY_SLOTS) {
        CudaRopeShape rope = rope_shape(cb, b);
        CudaSlotCopy cp = {.src_block = op->src, .dst_block = op->dst, .delta = op->delta, .src_slot = op->src_slot,
                           .dst_slot = op->dst_slot, .n_slots = op->n_slots};
        CUDA_TRY(cuda_copy_slots(cb->k_layers_dev, cb->v_layers_dev, b->weights->cfg.n_layers, cb->slot_pos, &cp, &rope,
                                 b->cfg.block_size, cb->copy_stream),
                 "copying KV slots");
        return 0;
    }
    CudaKvTier dev = {.k = cb->k_cache, .v = cb->v_cache, .slot_pos = cb->slot_pos};
    CudaKvTier host = {.k = cb->host.k, .v = cb->host.v, .slot_pos = cb->host.slot_pos};
    const CudaKvTier *src = &dev, *dst = &dev;
    enum cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
    if (op->kind == CACHE_OP_STORE) dst = &host, kind = cudaMemcpyDeviceToHost;
    else if (op->kind == CACHE_OP_LOAD) src = &host, kind = cudaMemcpyHostToDevice;
    else if (op->kind != CACHE_OP_COPY) return braid_error_set(err, "%s is not supported", cache_op_name(op->kind));
    CUDA_TRY(cuda_memcpy_kv_blocks(src, op->src, dst, op->dst, len, b->weights->cfg.n_layers, kv_block_elems(b),
                                   b->cfg.block_size, kind, cb->copy_stream),
             "copying KV blocks");
    return 0;
}

/* Enqueues the list on the copy stream after the work already on the compute stream; with
 * `fence`, the compute stream then waits for the copies. */
static int cuda_enqueue_cache_ops(Backend *b, const CacheOp *ops, int n, bool fence, BraidError *err) {
    CudaBackend *cb = b->impl;
    CUDA_TRY(cudaSetDevice(cb->device), "selecting the device");
    /* Copies start after the work already on the compute stream (a STORE reads what it wrote)... */
    CUDA_TRY(cudaEventRecord(cb->compute_done, cb->stream), "recording the compute stream");
    CUDA_TRY(cudaStreamWaitEvent(cb->copy_stream, cb->compute_done, 0), "ordering copies after the compute stream");
    for (int i = 0, len; i < n; i += len) {
        len = run_length(ops + i, n - i);
        if (copy_run(cb, b, &ops[i], len, err))
            return braid_error_wrap(err, "cache ops %d..%d (%s of %d blocks from %d to %d)", i, i + len - 1,
                                    cache_op_name(ops[i].kind), len, ops[i].src, ops[i].dst);
    }
    /* ...and the next forward starts after the copies (a LOAD has landed, a STORE has read);
     * overlapped lists leave that to cuda_sync, so the forward runs beside them. */
    CUDA_TRY(cudaEventRecord(cb->copies_done, cb->copy_stream), "recording the copies");
    if (fence) CUDA_TRY(cudaStreamWaitEvent(cb->stream, cb->copies_done, 0), "ordering the next forward after the copies");
    return 0;
}

static int cuda_apply_cache_ops(Backend *b, const CacheOp *ops, int n, BraidError *err) {
    return cuda_enqueue_cache_ops(b, ops, n, true, err);
}

/* Overlapped (backend.h): the compute stream does not wait for these until cuda_sync. */
static int cuda_apply_cache_ops_overlapped(Backend *b, const CacheOp *ops, int n, BraidError *err) {
    return cuda_enqueue_cache_ops(b, ops, n, false, err);
}

/* Work queued on the compute stream from here on starts after every copy so far; the host does not block. */
static int cuda_sync(Backend *b, BraidError *err) {
    CudaBackend *cb = b->impl;
    CUDA_TRY(cudaSetDevice(cb->device), "selecting the device");
    CUDA_TRY(cudaStreamWaitEvent(cb->stream, cb->copies_done, 0), "ordering the next forward after the copies");
    return 0;
}

/* Copies one block of every layer of a bf16 K or V cache to out (n_layers, elems), widened exactly. */
static int read_layers(uint16_t *const *layers, int n_layers, size_t elems, int32_t block, uint16_t *bits, float *out,
                       BraidError *err) {
    for (int l = 0; l < n_layers; l++) {
        CUDA_TRY(cudaMemcpy(bits, layers[l] + (size_t)block * elems, elems * sizeof *bits, cudaMemcpyDeviceToHost),
                 "copying a KV block to the host");
        for (size_t i = 0; i < elems; i++) {
            uint32_t u = (uint32_t)bits[i] << 16;
            memcpy(&out[(size_t)l * elems + i], &u, sizeof u);
        }
    }
    return 0;
}

/* Waits for both streams, then copies the block's keys, values and positions. */
static int cuda_read_block(Backend *b, int32_t block, float *keys, float *values, int32_t *positions, BraidError *err) {
    CudaBackend *cb = b->impl;
    size_t elems = kv_block_elems(b);
    int n_layers = b->weights->cfg.n_layers;
    CUDA_TRY(cudaSetDevice(cb->device), "selecting the device");
    CUDA_TRY(cudaStreamSynchronize(cb->copy_stream), "finishing cache operations");
    CUDA_TRY(cudaStreamSynchronize(cb->stream), "finishing the compute stream");
    uint16_t *bits = malloc(elems * sizeof *bits);
    if (!bits) return braid_error_set(err, "cuda backend: out of memory");
    int rc = 0;
    if (keys) rc = read_layers(cb->k_cache, n_layers, elems, block, bits, keys, err);
    if (rc == 0 && values) rc = read_layers(cb->v_cache, n_layers, elems, block, bits, values, err);
    free(bits);
    if (rc) return -1;
    if (positions)
        CUDA_TRY(cudaMemcpy(positions, cb->slot_pos + (size_t)block * b->cfg.block_size, (size_t)b->cfg.block_size * sizeof *positions,
                            cudaMemcpyDeviceToHost),
                 "copying slot positions");
    return 0;
}

int backend_cuda_kv_pool(Backend *b, CudaKvPool *out, BraidError *err) {
    if (!b->ops || strcmp(b->ops->name, "cuda") != 0) return braid_error_set(err, "cuda KV IPC: the backend is %s, not cuda", b->ops ? b->ops->name : "none");
    CudaBackend *cb = b->impl;
    const ModelConfig *c = &b->weights->cfg;
    size_t block_layer_bytes = kv_block_elems(b) * sizeof(uint16_t);
    *out = (CudaKvPool){.kv = cb->kv_base, .kv_bytes = 2 * (size_t)c->n_layers * b->cfg.n_blocks * block_layer_bytes,
                        .slot_pos = cb->slot_pos, .slot_pos_bytes = (size_t)b->cfg.n_blocks * b->cfg.block_size * sizeof(int32_t),
                        .n_layers = c->n_layers, .n_blocks = b->cfg.n_blocks, .block_size = b->cfg.block_size,
                        .block_layer_bytes = block_layer_bytes, .stream = cb->stream, .device = cb->device,
                        .copy_stream = cb->copy_stream};
    if (b->cfg.host_blocks > 0 && cb->host.k) /* alloc_host_tier's layout: positions, then K_l V_l per layer */
        out->host_kv = cb->host.k[0], out->host_slot_pos = cb->host.slot_pos, out->host_blocks = b->cfg.host_blocks;
    return 0;
}

static void free_host_tier(CudaHostTier *h) {
    if (h->pinned) cudaFreeHost(h->mem);
    else free(h->mem);
    free(h->k);
    free(h->v);
    memset(h, 0, sizeof *h);
}

static void cuda_destroy(Backend *b) {
    CudaBackend *cb = b->impl;
    if (!cb) return;
    cudaSetDevice(cb->device);
    cudaDeviceSynchronize();
    for (int i = 0; i < GRAPH_LADDER_MAX; i++)
        if (cb->graphs[i].exec) cudaGraphExecDestroy(cb->graphs[i].exec);
    void *dev[] = {cb->tp_partial, cb->x, cb->qkv, cb->logits, cb->partials, cb->xb, cb->q, cb->att, cb->gate_up, cb->h, cb->final_h,
                   cb->argmax_dev, cb->argmax_scratch, cb->meta_dev, cb->slot_pos, cb->blas_workspace, cb->k_layers_dev, cb->v_layers_dev};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    cudaFreeHost(cb->meta_host);
    cudaFreeHost(cb->argmax_host);
    cudaFree(cb->mask_dev);
    cudaFree(cb->mask_rows_dev);
    cudaFreeHost(cb->mask_host);
    cudaFreeHost(cb->mask_rows_host);
    cudaFree(cb->kv_base);
    free(cb->k_cache);
    free(cb->v_cache);
    cuda_weights_free(&cb->w);
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    if (cb->copy_stream) cudaStreamDestroy(cb->copy_stream);
    if (cb->compute_done) cudaEventDestroy(cb->compute_done);
    if (cb->copies_done) cudaEventDestroy(cb->copies_done);
    free_host_tier(&cb->host);
    cuda_lora_destroy(&cb->lora);
    free(cb);
    b->impl = NULL;
}

static const BackendOps CUDA_OPS = {
    .name = "cuda", .forward = cuda_forward, .apply_cache_ops = cuda_apply_cache_ops,
    .apply_cache_ops_overlapped = cuda_apply_cache_ops_overlapped, .sync = cuda_sync, .read_block = cuda_read_block,
    .destroy = cuda_destroy};

static int check_shape(const Backend *b, BraidError *err) {
    const ModelConfig *c = &b->weights->cfg;
    if (!cuda_kernels_shape_supported(c->head_dim, c->n_heads, c->n_kv_heads))
        return braid_error_set(err, "cuda backend: unsupported attention shape (head_dim %d, %d heads, %d KV heads); "
                                    "supported: head_dim 64 or 128 with 1 to 8 query heads per KV head",
                               c->head_dim, c->n_heads, c->n_kv_heads);
    if (c->dim % 8 || c->ff_dim % 8)
        return braid_error_set(err, "cuda backend: model widths must be multiples of 8 (dim %d, ff %d)", c->dim, c->ff_dim);
    return 0;
}

/* BRAID_CUDA_PREFILL picks the prefill attention kernel: wmma (default: the shared-memory kernel
 * that has run on an H100) or flash (registers, attention_prefill_flash.cu). flash becomes the
 * default once a GPU visit has passed its test and measured it; until then it is opt-in, and the
 * visit's suite turns it on only after test_attention_prefill_cuda passes. */
static int select_prefill_kernel(CudaBackend *cb, BraidError *err) {
    const char *v = getenv("BRAID_CUDA_PREFILL");
    if (!v || !*v || strcmp(v, "wmma") == 0) cb->prefill_wmma = true;
    else if (strcmp(v, "flash") == 0) cb->prefill_wmma = false;
    else return braid_error_set(err, "cuda backend: BRAID_CUDA_PREFILL=%s: expected wmma or flash", v);
    if (!cb->prefill_wmma) LOG_INFO("cuda", "prefill attention: flash kernel (BRAID_CUDA_PREFILL=flash)");
    return 0;
}

static int setup_device(CudaBackend *cb, const Backend *b, BraidError *err) {
    int n_devices = 0;
    if (cudaGetDeviceCount(&n_devices) != cudaSuccess || n_devices == 0)
        return braid_error_set(err, "cuda backend: no CUDA GPU is visible (use --device cpu)");
    if (b->cfg.cuda_device < 0 || b->cfg.cuda_device >= n_devices)
        return braid_error_set(err, "cuda backend: device %d does not exist (%d visible)", b->cfg.cuda_device, n_devices);
    cb->device = b->cfg.cuda_device;
    CUDA_TRY(cudaSetDevice(cb->device), "selecting the device");
    CUDA_TRY(cudaDeviceGetAttribute(&cb->n_sms, cudaDevAttrMultiProcessorCount, cb->device), "reading the SM count");
    CUDA_TRY(cuda_kernels_init(), "configuring kernels");
    if (select_prefill_kernel(cb, err)) return -1;
    CUDA_TRY(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking), "creating a stream");
    CUDA_TRY(cudaStreamCreateWithFlags(&cb->copy_stream, cudaStreamNonBlocking), "creating the copy stream");
    CUDA_TRY(cudaEventCreateWithFlags(&cb->compute_done, cudaEventDisableTiming), "creating an event");
    CUDA_TRY(cudaEventCreateWithFlags(&cb->copies_done, cudaEventDisableTiming), "creating an event");
    CUBLAS_TRY(cublasCreate(&cb->blas), "creating a cuBLAS handle");
    CUBLAS_TRY(cublasSetStream(cb->blas, cb->stream), "binding cuBLAS to the stream");
    /* A fixed workspace keeps cuBLAS from allocating while a graph is being captured. */
    if (alloc_dev(&cb->blas_workspace, CUBLAS_WORKSPACE_BYTES, "cuBLAS workspace", err)) return -1;
    CUBLAS_TRY(cublasSetWorkspace(cb->blas, cb->blas_workspace, CUBLAS_WORKSPACE_BYTES), "setting the cuBLAS workspace");
    return 0;
}

/* The adapters of cfg.lora on the device and, in ForkKV mode, the residual pool. */
static int create_lora(CudaBackend *cb, const Backend *b, BraidError *err) {
    CudaLoraConfig lc = {.set = b->cfg.lora, .model = &b->weights->cfg, .max_batch_tokens = b->cfg.max_batch_tokens,
                         .max_seqs = b->cfg.max_seqs, .block_size = b->cfg.block_size, .table_stride = cb->meta.table_stride,
                         .residual_blocks = b->cfg.residual_blocks, .residual_rank = b->cfg.residual_rank, .n_sms = cb->n_sms};
    if (cuda_lora_create(&cb->lora, &lc, err)) return braid_error_wrap(err, "cuda backend");
    return 0;
}

int backend_cuda_create(Backend *b, BraidError *err) {
    if (check_shape(b, err)) return -1;
    if (b->cfg.residual_blocks > 0 && b->weights->cfg.qk_norm)
        return braid_error_set(err, "cuda backend: ForkKV (--lora-cache shared) cannot split %s's normalized keys into base and "
                                    "residual parts (per-head K norm); use --lora-cache separate", b->weights->cfg.arch);
    if (b->cfg.tp && b->cfg.tp->size > 1 && ((b->cfg.lora && b->cfg.lora->n > 0) || b->cfg.residual_blocks > 0))
        return braid_error_set(err, "cuda backend: LoRA adapters (--lora) are not sharded for tensor parallelism yet; use --tp 1");
    CudaBackend *cb = calloc(1, sizeof *cb);
    if (!cb) return braid_error_set(err, "cuda backend: out of memory");
    b->impl = cb;
    b->ops = &CUDA_OPS;
    layout_meta(&cb->meta, &b->cfg);
    graph_ladder_build(&cb->ladder, b->cfg.max_seqs);
    if (setup_device(cb, b, err) || cuda_weights_upload(&cb->w, b->weights, err) || alloc_kv(cb, b, err) ||
        alloc_host_tier(cb, b, err) || alloc_activations(cb, b, err) || create_lora(cb, b, err)) {
        cuda_destroy(b);
        b->ops = NULL;
        return -1;
    }
    if (b->cfg.tp) b->cfg.tp->stream = cb->stream; /* reductions ordered with the kernels around them */
    const ModelConfig *c = &b->weights->cfg;
    b->kv_bytes = 2 * (size_t)c->n_layers * b->cfg.n_blocks * b->cfg.block_size * c->n_kv_heads * c->head_dim * 2;
    b->weight_bytes = cb->w.bytes + cb->lora.adapter_bytes; /* adapters are weights on the device too */
    b->host_kv_bytes = cb->host.bytes;
    b->residual_kv_bytes = cb->lora.residual_bytes;
    return 0;
}
