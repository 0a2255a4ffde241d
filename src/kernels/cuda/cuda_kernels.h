/*
 * cuda_kernels.h — plain C entry points of Braid's CUDA kernels (the .cu files beside it).
 *
 * Every function enqueues work on `stream` and returns the launch status; none synchronizes.
 * Tensors are raw device pointers: bf16 values travel as uint16_t bit patterns so that C code
 * needs no CUDA C++ headers. Layouts match the CPU backend: activations are row-major
 * (token, feature); a layer's K and V caches are (n_blocks, n_kv_heads, block_size, head_dim);
 * slot s of the pool is block s / block_size, offset s % block_size; slot -1 means "write nowhere".
 * Accumulation is fp32 everywhere.
 * Thread-safety: launches on one stream are ordered; the kernels hold no state.
 */
#ifndef BRAID_KERNELS_CUDA_KERNELS_H
#define BRAID_KERNELS_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Raises the shared-memory limits the attention kernels need; call once per device before use. */
cudaError_t cuda_kernels_init(void);
/* True when the kernels support this attention shape (head_dim 64 or 128; query heads per KV
 * head 1 to 8). */
int cuda_kernels_shape_supported(int head_dim, int n_heads, int n_kv_heads);

/* x[t, :] = fp32(table[tokens[t], :]) for t < n. */
cudaError_t cuda_embed(const uint16_t *table, const int32_t *tokens, int n, int dim, float *x, cudaStream_t stream);

/* out[r, :] = bf16(x[row(r), :] / rms(x[row(r), :]) * weight), row(r) = rows ? rows[r] : r. */
cudaError_t cuda_rmsnorm(const float *x, const int32_t *rows, int n, int dim, const float *weight, float eps,
                         uint16_t *out, cudaStream_t stream);

/* out[t, i] = bf16(silu(gate_up[t, i]) * gate_up[t, ff + i]) for i < ff. */
cudaError_t cuda_swiglu(const uint16_t *gate_up, int n, int ff, uint16_t *out, cudaStream_t stream);

/* In place on qkv (n, (n_heads + 2 n_kv_heads) head_dim) fp32, between the fused projection and
 * RoPE: adds bias (the fused (q | k | v) bias, or NULL: qwen2), then normalizes each Q head with
 * q_norm and each K head with k_norm (RMSNorm over head_dim, weights (head_dim) or NULL: qwen3). */
cudaError_t cuda_qkv_bias_norm(float *qkv, int n, int n_heads, int n_kv_heads, int head_dim, const float *bias,
                               const float *q_norm, const float *k_norm, float eps, cudaStream_t stream);

typedef struct {
    int n_heads, n_kv_heads, head_dim, rope_dim;
    int interleaved;          /* 1: pairs (2i, 2i+1); 0: pairs (i, i + rope_dim/2) */
    float position_scale;     /* linear RoPE scaling */
    const float *inv_freq;    /* (rope_dim/2) device: angle = pos * position_scale * inv_freq[i] */
} CudaRopeShape;

/* qkv (n, (n_heads + 2 n_kv_heads) head_dim) fp32 from the fused projection. Rotates Q and K,
 * writes Q as bf16 to q_out (n, n_heads head_dim) and K/V as bf16 into the caches at slots[t]. */
cudaError_t cuda_rope_kv_store(const float *qkv, const int32_t *positions, const int32_t *slots, int n,
                               const CudaRopeShape *shape, uint16_t *q_out, uint16_t *k_cache, uint16_t *v_cache,
                               int block_size, cudaStream_t stream);

/* The ROTATE cache operation: turns the first rope_dim dimensions of every key of device block
 * `block` (all n_kv_heads and block_size slots) in each of n_layers layers by the RoPE angles of
 * delta positions (fp32: angle = (delta * position_scale) * inv_freq[i], as cuda_rope_kv_store
 * forms a position's; stored bf16 widened, rotated, rounded back once), and adds delta to the
 * block's block_size entries of slot_pos. k_layers is a device array of per-layer K cache
 * pointers; shape's n_heads is not used. Values are untouched. */
cudaError_t cuda_rotate_block_keys(uint16_t *const *k_layers, int n_layers, int32_t *slot_pos, int32_t block, int32_t delta,
                                   const CudaRopeShape *shape, int block_size, cudaStream_t stream);

/* The COPY_SLOTS cache operation (cache_ops.h): n_slots slots of device block src_block from
 * src_slot to dst_block at dst_slot, every layer and KV head; keys turned by delta positions with
 * the same angles as cuda_rotate_block_keys, values copied, positions copied plus delta. head_dim
 * must be even (RoPE pairs); the dimensions past rope_dim are copied unturned. */
typedef struct {
    int32_t src_block, dst_block, delta;
    int src_slot, dst_slot, n_slots;
} CudaSlotCopy;
cudaError_t cuda_copy_slots(uint16_t *const *k_layers, uint16_t *const *v_layers, int n_layers, int32_t *slot_pos,
                            const CudaSlotCopy *copy, const CudaRopeShape *shape, int block_size, cudaStream_t stream);

/* slot_pos[slots[t]] = positions[t] for slots >= 0. */
cudaError_t cuda_record_slot_positions(const int32_t *positions, const int32_t *slots, int n, int32_t *slot_pos,
                                       cudaStream_t stream);

/* Where attention reads a step's sequences (all device pointers). Query token t of sequence s is
 * row seq_start[s] + r; its context is slots [0, seq_n_ctx[s]) of block table row s, and key j is
 * visible when slot_pos[key j] <= positions[t]. */
typedef struct {
    const uint16_t *q;            /* (n_tokens, n_heads head_dim) bf16, after RoPE */
    uint16_t *out;                /* (n_tokens, n_heads head_dim) bf16 */
    const uint16_t *k_cache, *v_cache;
    const int32_t *slot_pos;
    const int32_t *positions;
    const int32_t *seq_start;     /* (n_seqs + 1) */
    const int32_t *seq_n_ctx;     /* (n_seqs) */
    const int32_t *block_tables;  /* (n_seqs, table_stride) */
    int table_stride;
    int n_heads, n_kv_heads, head_dim, block_size;
} CudaAttention;

/* Tiled causal attention for multi-token queries: tiles is (n_tiles, 2) = (sequence, first query
 * row of a 64-row tile). Tensor-core (bf16 WMMA) products, online softmax in fp32. */
cudaError_t cuda_attention_prefill(const CudaAttention *a, const int32_t *tiles, int n_tiles, cudaStream_t stream);
/* The same attention with the same tiles, S, P and O kept in registers (mma.sync, flash-attention
 * 2 order; attention_prefill_flash.cu). Opt-in (BRAID_CUDA_PREFILL=flash) until a GPU run has
 * tested it; cuda_attention_prefill above is the backend's default. */
cudaError_t cuda_attention_prefill_flash(const CudaAttention *a, const int32_t *tiles, int n_tiles, cudaStream_t stream);

/* One query token per listed sequence (its row is seq_start[s]); the context is split into
 * n_splits parts computed in parallel and merged. partials holds
 * n_dec * n_heads * n_splits * (head_dim + 2) floats. */
cudaError_t cuda_attention_decode(const CudaAttention *a, const int32_t *dec_seqs, int n_dec, int n_splits,
                                  float *partials, cudaStream_t stream);
/* Largest n_splits cuda_attention_decode accepts. */
#define CUDA_DECODE_MAX_SPLITS 32

/* y (n, out) = x (n, in) · wᵀ for 1 <= n <= CUDA_GEMV_MAX_TOKENS, w (out, in) and x bf16, in a
 * multiple of 8; y fp32 (added to when accumulate) or bf16. The decode-step product. */
#define CUDA_GEMV_MAX_TOKENS 8
cudaError_t cuda_gemv_bf16(const uint16_t *w, int out, int in, const uint16_t *x, int n, void *y, int y_fp32,
                           int accumulate, cudaStream_t stream);

/* out[r] = index of the largest value of logits row r (lowest index on ties; NaN never wins).
 * scratch holds n * CUDA_ARGMAX_PARTS * 8 bytes. */
#define CUDA_ARGMAX_PARTS 32
cudaError_t cuda_argmax(const float *logits, int n, int vocab, void *scratch, int32_t *out, cudaStream_t stream);

/* Grammar masks (grammar/grammar.h): for j < n_masks, logits row rows[j] (vocab floats) gets -inf
 * wherever bit v of mask + j * words (word v / 32, bit v % 32) is clear. */
cudaError_t cuda_apply_token_mask(float *logits, int vocab, const uint32_t *mask, int words, const int32_t *rows,
                                  int n_masks, cudaStream_t stream);

/* For each pair i: copies block src[i] to block dst[i] in every layer's K and V cache and in
 * slot_pos. k_layers/v_layers are device arrays of per-layer cache pointers. */
cudaError_t cuda_copy_blocks(uint16_t *const *k_layers, uint16_t *const *v_layers, int n_layers, int32_t *slot_pos,
                             const int32_t *src, const int32_t *dst, int n_pairs, int block_elems, int block_size,
                             cudaStream_t stream);

/* One KV tier's memory, on the device or in host memory: per layer K and V (n_blocks, n_kv_heads,
 * block_size, head_dim) bf16, and slot positions (n_blocks, block_size). k and v are host arrays of
 * per-layer pointers. */
typedef struct {
    uint16_t *const *k;
    uint16_t *const *v;
    int32_t *slot_pos;
} CudaKvTier;

/* Copies blocks [src_block, src_block + n) of src onto [dst_block, dst_block + n) of dst, in every
 * layer's K and V and in the slot positions: 2 n_layers + 1 cudaMemcpyAsync calls of `kind`
 * (device-to-device, device-to-host or host-to-device) on stream. block_elems is n_kv_heads *
 * block_size * head_dim. Within one tier the two ranges must not overlap. */
cudaError_t cuda_memcpy_kv_blocks(const CudaKvTier *src, int src_block, const CudaKvTier *dst, int dst_block, int n,
                                  int n_layers, size_t block_elems, int block_size, enum cudaMemcpyKind kind,
                                  cudaStream_t stream);

/* ---- LoRA and ForkKV (lora_delta.cu, residual_attention.cu; driven by worker/cuda_lora.c) ---- */

/* Largest adapter rank (and residual pool width) the LoRA and residual kernels take: ForkKV's
 * adapters are rank 8..64, and the residual kernels keep per-row rank-wide state on chip. */
#define CUDA_LORA_MAX_RANK 64

/* One projection (Q, K, V or O) of one layer across every loaded adapter, indexed by adapter id
 * (0 = the base model, whose entries are never read): a, b, rank and scale are device arrays of
 * n_ids entries; a[k]/b[k] are device pointers to fp32 matrices, NULL when adapter k does not
 * adapt this projection. max_rank (host) is the widest rank[k], <= CUDA_LORA_MAX_RANK. */
typedef struct {
    const float *const *a;  /* (n_ids) -> (rank, in) fp32 row-major, or NULL */
    const float *const *b;  /* (n_ids) -> (out, rank) fp32 row-major, or NULL */
    const int32_t *rank;    /* (n_ids) */
    const float *scale;     /* (n_ids) alpha / rank */
    int n_ids, max_rank;
} CudaLoraProjection;

/* y[t, :out] += scale_k · B_k · (A_k · x[t]) for every token t whose adapter k = token_adapter[t]
 * is in [1, n_ids) and adapts the projection; every other row of y is left untouched (base-model
 * tokens of a mixed batch). x (n, in) bf16 is the projection's input, y fp32 with row stride
 * y_stride floats (so y may point into the fused QKV output at a projection's first column).
 * scratch holds n * proj->max_rank floats (the per-token A·x). fp32 accumulation throughout. */
cudaError_t cuda_lora_delta(const CudaLoraProjection *proj, const int32_t *token_adapter, const uint16_t *x, int n, int in,
                            float *y, int y_stride, int out, float *scratch, cudaStream_t stream);

/* One layer of the ForkKV residual pool on the device: per slot, rank bf16 lanes of K_res = x·A_k
 * and, apart, of V_res = x·A_v (no RoPE). Slot s is block s / block_size, offset s % block_size of
 * the residual pool's own block ids. An adapter of rank r < rank uses lanes [0, r), the rest are 0. */
typedef struct {
    uint16_t *k;  /* (n_blocks, block_size, rank) bf16 */
    uint16_t *v;  /* (n_blocks, block_size, rank) bf16 */
    int block_size, rank;
} CudaResidualLayer;

/* The ForkKV residual projection: for every token t with adapter k = token_adapter[t] in
 * [1, n_ids) and slots[t] >= 0, writes bf16(A_k · x[t]) of k_proj into res->k and of v_proj into
 * res->v at slot slots[t] (lanes past the adapter's rank zeroed; a NULL A writes zeros). Slot -1
 * and base-model tokens are skipped. x (n, in) bf16 is the K/V projections' input. */
cudaError_t cuda_lora_residual_store(const CudaLoraProjection *k_proj, const CudaLoraProjection *v_proj,
                                     const int32_t *token_adapter, const uint16_t *x, int n, int in, const int32_t *slots,
                                     const CudaResidualLayer *res, cudaStream_t stream);

/* ForkKV's ResidualAttention (paper 002 § 5.3, Algorithm 1) over the base KV cache of `base` and
 * the residual layer `res`, for sequences whose adapter (seq_adapter[s]) owns residuals:
 *     K_j = K_base_j + scale · RoPE_pos_j(B_k · K_res_j)      V_j = V_base_j + scale · B_v · V_res_j
 * with pos_j the slot's recorded position (angles formed as cuda_rope_kv_store forms them, from
 * rope). Queries, causality (slot_pos <= query position), GQA and the sequence description are
 * base's, exactly as for cuda_attention_prefill/decode. A sequence of adapter 0, or an adapter with
 * NULL B (k_proj.b / v_proj.b), attends over the base K (or V) alone. */
typedef struct {
    CudaAttention base;
    CudaResidualLayer res;              /* block_size == base.block_size; read only */
    const int32_t *res_block_tables;    /* (n_seqs, base.table_stride) residual block ids, same token order */
    const int32_t *seq_adapter;         /* (n_seqs) adapter id per sequence */
    CudaLoraProjection k_proj, v_proj;  /* their b, rank and scale (B_k, B_v fp32 (n_kv_heads head_dim, rank)) */
    CudaRopeShape rope;                 /* its rope_dim, interleaved, position_scale and inv_freq */
} CudaResidualAttention;

/* Largest query tile and GQA group of cuda_residual_attention. */
#define CUDA_RESIDUAL_MAX_TILE_QUERIES 4
#define CUDA_RESIDUAL_MAX_GROUP 8

/* Runs ResidualAttention for n_tiles work items tiles (n_tiles, 2) = (sequence, first query row
 * within the sequence): each covers min(tile_queries, rows left) query tokens. Decode: one tile
 * (s, 0) per sequence and tile_queries 1; prefill: tiles every tile_queries rows. Each tile's
 * context is split into n_splits parts (1..CUDA_DECODE_MAX_SPLITS) computed in parallel, then
 * merged, and only then is V's up-projection applied (once per query head). partials holds
 * cuda_residual_partials_floats(...) floats. head_dim even and <= 128; group <= 8;
 * res.rank <= CUDA_LORA_MAX_RANK. Needs cuda_kernels_init (its shared-memory limit). */
cudaError_t cuda_residual_attention(const CudaResidualAttention *a, const int32_t *tiles, int n_tiles, int tile_queries,
                                    int n_splits, float *partials, cudaStream_t stream);
size_t cuda_residual_partials_floats(int n_tiles, int n_heads, int tile_queries, int n_splits, int head_dim, int rank);

/* A synthetic matrix region (model/synthetic_model.h): p[r * cols + c] for r < rows, c < cols gets
 * the pseudo-random bf16 value of element index index0 + r * stride + c, uniform in [-scale, scale),
 * bit-identical to synthetic_weight_bf16 on the host. */
cudaError_t cuda_fill_random_bf16(uint16_t *p, int64_t rows, int64_t cols, uint64_t seed, uint64_t index0, int64_t stride,
                                  float scale, cudaStream_t stream);
/* p[0..n) = value. */
cudaError_t cuda_fill_f32(float *p, size_t n, float value, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
