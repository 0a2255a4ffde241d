/*
 * residual_attention.cu — ForkKV's ResidualAttention (paper 002 § 5.3, Algorithm 1) for the CUDA
 * backend: causal paged attention of an adapted sequence over the shared base KV cache plus its
 * adapter's low-rank residual cache, without ever writing the adapter's full K/V to memory.
 * Contract in cuda_kernels.h (cuda_residual_attention); the CPU reference is
 * kernels/cpu/residual_attention.c, whose arithmetic this follows step for step.
 *
 * Grid (tile, KV head, split), 128 threads. A tile is up to tile_queries query tokens of one
 * sequence, and a block serves all their GQA query heads at once (rows = queries x group), so the
 * rebuilt keys of a context tile are shared by every row: a decode step (one query) pays the
 * reconstruction once per KV head, a prefill tile once per tile_queries queries.
 * Per context tile of KEYS slots (slots map through the block tables one by one, so the tile need
 * not match the pool's block size), in shared memory:
 *   stage 1  K = K_base + scale_k · RoPE_pos(B_k · K_res), B_k staged once per block (Alg. 1 l. 3),
 *            RoPE deferred to here at each slot's recorded position (Alg. 1 l. 5-9);
 *   stage 2  scores, online softmax, acc += p · V_base and acc_r += p · V_res (Alg. 1 l. 10-17).
 * The split's (m, l, acc, acc_r) go to `partials`; merge_kernel combines the splits and only then
 * up-projects V, out = (acc + scale_v · B_v · acc_r) / l, once per query head (stage 3, matrix
 * associativity: sum_j p_j (B_v · V_res_j) = B_v · sum_j p_j V_res_j).
 * Arithmetic: bf16 storage widened exactly, fp32 everywhere else, bf16 output.
 */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

using namespace braid_cuda;

namespace {

constexpr int THREADS = 128, WARPS = THREADS / 32;
/* Context slots per tile: one per lane, so the softmax of a row is a single warp reduction. */
constexpr int KEYS = 32;
constexpr int MAX_HEAD_DIM = 128;

/* Where each array lives in the dynamic shared memory, in 4-byte words. Row strides of the tiles
 * read across slots (k, kres, vres) are padded by one word: lanes reading the same dimension of
 * 32 consecutive slots then hit 32 different banks. */
struct Smem {
    int ldk, ldr;
    int q, bk, k, v, kres, vres, score, acc, acc_r, m, l, alpha, kpos, krow, rslot, qpos, words;
};

__host__ __device__ inline Smem smem_layout(int head_dim, int rank, int rows) {
    Smem s;
    s.ldk = head_dim + 1;
    s.ldr = rank + 1;
    int at = 0;
    s.q = at, at += rows * head_dim;       /* (rows, head_dim) queries pre-scaled by 1/sqrt(head_dim) */
    s.bk = at, at += head_dim * rank;      /* (head_dim, rank) this KV head's rows of B_k */
    s.k = at, at += KEYS * s.ldk;          /* (KEYS, head_dim) rebuilt keys */
    s.v = at, at += KEYS * head_dim;       /* (KEYS, head_dim) base values */
    s.kres = at, at += KEYS * s.ldr;       /* (KEYS, rank) K residuals */
    s.vres = at, at += KEYS * s.ldr;       /* (KEYS, rank) V residuals */
    s.score = at, at += rows * KEYS;       /* (rows, KEYS) scores, then probabilities */
    s.acc = at, at += rows * head_dim;     /* (rows, head_dim) sum p · V_base */
    s.acc_r = at, at += rows * rank;       /* (rows, rank) sum p · V_res */
    s.m = at, at += rows;                  /* running max */
    s.l = at, at += rows;                  /* running sum */
    s.alpha = at, at += rows;              /* this tile's rescale of the accumulators */
    s.kpos = at, at += KEYS;               /* recorded position of each slot (INT_MAX: none) */
    s.krow = at, at += KEYS;               /* (block, kv head, offset) row in the base cache, -1: none */
    s.rslot = at, at += KEYS;              /* slot in the residual pool */
    s.qpos = at, at += CUDA_RESIDUAL_MAX_TILE_QUERIES;
    s.words = at;
    return s;
}

/* What a block needs of its sequence's adapter; b_k/b_v NULL: that side is not adapted. */
struct SeqAdapter {
    const float *b_k, *b_v;
    int rank_k, rank_v;
    float scale_k, scale_v;
};

__device__ SeqAdapter adapter_of(const CudaResidualAttention &a, int seq) {
    SeqAdapter ad = {nullptr, nullptr, 0, 0, 0.0f, 0.0f};
    int id = a.seq_adapter ? a.seq_adapter[seq] : 0;
    if (id > 0 && id < a.k_proj.n_ids && a.k_proj.b[id]) {
        ad.b_k = a.k_proj.b[id];
        ad.rank_k = min((int)a.k_proj.rank[id], a.res.rank); /* never read past a residual row */
        ad.scale_k = a.k_proj.scale[id];
    }
    if (id > 0 && id < a.v_proj.n_ids && a.v_proj.b[id]) {
        ad.b_v = a.v_proj.b[id];
        ad.rank_v = min((int)a.v_proj.rank[id], a.res.rank);
        ad.scale_v = a.v_proj.scale[id];
    }
    return ad;
}

/* The query rows of one work item: tokens [row0, row0 + n_queries) of the batch, each with group
 * query heads. n_queries <= 0 for a tile past its sequence's rows. */
struct Tile {
    int seq, row0, n_queries, rows, n_ctx;
    const int32_t *table, *res_table;
};

__device__ Tile tile_of(const CudaResidualAttention &a, const int32_t *tiles, int tile_index, int tile_queries, int group) {
    Tile t;
    t.seq = tiles[2 * tile_index];
    int q_begin = a.base.seq_start[t.seq], r0 = tiles[2 * tile_index + 1];
    t.row0 = q_begin + r0;
    t.n_queries = min(tile_queries, a.base.seq_start[t.seq + 1] - q_begin - r0);
    t.rows = t.n_queries * group;
    t.n_ctx = a.base.seq_n_ctx[t.seq];
    t.table = a.base.block_tables + (size_t)t.seq * a.base.table_stride;
    t.res_table = a.res_block_tables + (size_t)t.seq * a.base.table_stride;
    return t;
}

/* Partial state of (tile, query head, query of the tile, split): m, l, acc (head_dim), acc_r (rank). */
__device__ __forceinline__ float *partial_at(float *partials, const CudaResidualAttention &a, int tile, int h, int qi,
                                             int tile_queries, int split, int n_splits) {
    size_t stride = (size_t)a.base.head_dim + a.res.rank + 2;
    return partials + ((((size_t)tile * a.base.n_heads + h) * tile_queries + qi) * n_splits + split) * stride;
}

/* Records where the tile's slots live; true when at least one is visible to some query. */
__device__ bool locate_slots(const CudaResidualAttention &a, const Tile &t, int k0, int k_end, int qmax, const Smem &L,
                             float *sm) {
    int *kpos = reinterpret_cast<int *>(sm + L.kpos), *krow = reinterpret_cast<int *>(sm + L.krow);
    int *rslot = reinterpret_cast<int *>(sm + L.rslot);
    int j = threadIdx.x, key = k0 + j, bs = a.base.block_size;
    bool visible = false;
    if (j < KEYS) {
        kpos[j] = INT_MAX;
        krow[j] = -1;
        if (key < k_end) {
            int block = t.table[key / bs], off = key % bs;
            kpos[j] = a.base.slot_pos[(size_t)block * bs + off];
            krow[j] = (block * a.base.n_kv_heads + blockIdx.y) * bs + off;
            rslot[j] = t.res_table[key / bs] * bs + off;
            visible = kpos[j] <= qmax;
        }
    }
    return __syncthreads_or(visible) != 0; /* also the barrier before the slots are read */
}

/* Stage 1a: base keys and values, and the residuals the adapter uses (zeros elsewhere). */
__device__ void load_tile(const CudaResidualAttention &a, const SeqAdapter &ad, const Smem &L, float *sm) {
    const int *krow = reinterpret_cast<const int *>(sm + L.krow), *rslot = reinterpret_cast<const int *>(sm + L.rslot);
    int hd = a.base.head_dim, pool_rank = a.res.rank;
    for (int i = threadIdx.x; i < KEYS * hd; i += THREADS) {
        int j = i / hd, d = i % hd;
        bool live = krow[j] >= 0;
        sm[L.k + j * L.ldk + d] = live ? bf16_to_f32(a.base.k_cache[(size_t)krow[j] * hd + d]) : 0.0f;
        sm[L.v + j * hd + d] = live ? bf16_to_f32(a.base.v_cache[(size_t)krow[j] * hd + d]) : 0.0f;
    }
    for (int i = threadIdx.x; i < KEYS * pool_rank; i += THREADS) {
        int j = i / pool_rank, c = i % pool_rank;
        bool live = krow[j] >= 0;
        size_t at = (size_t)rslot[j] * pool_rank + c;
        sm[L.kres + j * L.ldr + c] = live && c < ad.rank_k ? bf16_to_f32(a.res.k[at]) : 0.0f;
        sm[L.vres + j * L.ldr + c] = live && c < ad.rank_v ? bf16_to_f32(a.res.v[at]) : 0.0f;
    }
}

/* Stage 1b: K += RoPE_pos(scale_k · B_k · K_res), one thread per (rotation pair, slot). The pairs
 * are rope_kv.cu's: (2i, 2i+1) interleaved or (i, i + rope_dim/2), and dimensions past rope_dim
 * pass through unrotated in (2i, 2i+1) pairs. Angles are formed exactly as cuda_rope_kv_store
 * forms them, so a rebuilt key is rotated as a directly projected one would have been. */
__device__ void rebuild_keys(const CudaResidualAttention &a, const SeqAdapter &ad, const Smem &L, float *sm) {
    if (!ad.b_k || ad.rank_k == 0) return;
    const int *kpos = reinterpret_cast<const int *>(sm + L.kpos), *krow = reinterpret_cast<const int *>(sm + L.krow);
    int hd = a.base.head_dim, rope_half = a.rope.rope_dim / 2, pool_rank = a.res.rank;
    for (int i = threadIdx.x; i < KEYS * (hd / 2); i += THREADS) {
        int pair = i / KEYS, j = i % KEYS; /* the slot varies fastest: a warp shares one B_k row */
        if (krow[j] < 0) continue;
        int da = 2 * pair, db = 2 * pair + 1;
        if (pair < rope_half && !a.rope.interleaved) da = pair, db = pair + rope_half;
        const float *kres = sm + L.kres + j * L.ldr, *bka = sm + L.bk + da * pool_rank, *bkb = sm + L.bk + db * pool_rank;
        float xa = 0.0f, xb = 0.0f;
        for (int c = 0; c < ad.rank_k; c++) {
            xa += bka[c] * kres[c];
            xb += bkb[c] * kres[c];
        }
        xa *= ad.scale_k;
        xb *= ad.scale_k;
        if (pair < rope_half) {
            /* An unwritten slot may record a negative position; the CPU kernel rotates it as 0. */
            float s, c, pos = (float)max(kpos[j], 0) * a.rope.position_scale;
            sincosf(pos * a.rope.inv_freq[pair], &s, &c);
            float ra = xa * c - xb * s, rb = xa * s + xb * c;
            xa = ra;
            xb = rb;
        }
        sm[L.k + j * L.ldk + da] += xa;
        sm[L.k + j * L.ldk + db] += xb;
    }
}

/* Stage 2a: scores of every row against every slot; -inf where the slot is after the query. */
__device__ void score_tile(const CudaResidualAttention &a, const Tile &t, int group, const Smem &L, float *sm) {
    const int *kpos = reinterpret_cast<const int *>(sm + L.kpos), *krow = reinterpret_cast<const int *>(sm + L.krow);
    const int *qpos = reinterpret_cast<const int *>(sm + L.qpos);
    int hd = a.base.head_dim;
    for (int i = threadIdx.x; i < t.rows * KEYS; i += THREADS) {
        int row = i / KEYS, j = i % KEYS;
        float s = -INFINITY;
        if (krow[j] >= 0 && kpos[j] <= qpos[row / group]) {
            const float *q = sm + L.q + row * hd, *k = sm + L.k + j * L.ldk;
            s = 0.0f;
            for (int d = 0; d < hd; d++) s += q[d] * k[d];
        }
        sm[L.score + i] = s;
    }
}

/* Stage 2b: the online softmax of each row, a warp per row and a lane per slot. Scores become
 * probabilities against the new running max; alpha rescales what the row accumulated so far. */
__device__ void softmax_tile(const Tile &t, const Smem &L, float *sm) {
    int lane = threadIdx.x & 31;
    for (int row = threadIdx.x >> 5; row < t.rows; row += WARPS) {
        float s = sm[L.score + row * KEYS + lane], m_old = sm[L.m + row];
        float m_new = fmaxf(m_old, warp_max(s));
        float alpha = 1.0f, p = 0.0f;
        if (m_new != -INFINITY) { /* else: nothing visible to this row yet */
            alpha = __expf(m_old - m_new);
            p = s == -INFINITY ? 0.0f : __expf(s - m_new);
        }
        float sum = warp_sum(p);
        sm[L.score + row * KEYS + lane] = p;
        __syncwarp(); /* every lane has read m and l before lane 0 replaces them */
        if (lane == 0) {
            sm[L.m + row] = m_new;
            sm[L.l + row] = sm[L.l + row] * alpha + sum;
            sm[L.alpha + row] = alpha;
        }
    }
}

/* Stage 2c: acc = alpha · acc + P · V_base and acc_r = alpha · acc_r + P · V_res. */
__device__ void accumulate_tile(const CudaResidualAttention &a, const SeqAdapter &ad, const Tile &t, const Smem &L, float *sm) {
    int hd = a.base.head_dim, pool_rank = a.res.rank;
    for (int i = threadIdx.x; i < t.rows * hd; i += THREADS) {
        int row = i / hd, d = i % hd;
        const float *p = sm + L.score + row * KEYS;
        float sum = 0.0f;
        for (int j = 0; j < KEYS; j++) sum += p[j] * sm[L.v + j * hd + d];
        sm[L.acc + i] = sm[L.acc + i] * sm[L.alpha + row] + sum;
    }
    for (int i = threadIdx.x; i < t.rows * ad.rank_v; i += THREADS) {
        int row = i / ad.rank_v, c = i % ad.rank_v;
        const float *p = sm + L.score + row * KEYS;
        float sum = 0.0f;
        for (int j = 0; j < KEYS; j++) sum += p[j] * sm[L.vres + j * L.ldr + c];
        float *acc_r = sm + L.acc_r + row * pool_rank + c;
        *acc_r = *acc_r * sm[L.alpha + row] + sum;
    }
}

/* Queries (scaled), this KV head's B_k rows, and the fresh running state. */
__device__ void init_block(const CudaResidualAttention &a, const SeqAdapter &ad, const Tile &t, int group, const Smem &L,
                           float *sm) {
    int hd = a.base.head_dim, kvh = blockIdx.y, pool_rank = a.res.rank;
    float q_scale = rsqrtf((float)hd);
    size_t q_dim = (size_t)a.base.n_heads * hd;
    for (int i = threadIdx.x; i < t.rows * hd; i += THREADS) {
        int row = i / hd, d = i % hd, qi = row / group, h = kvh * group + row % group;
        sm[L.q + i] = bf16_to_f32(a.base.q[(size_t)(t.row0 + qi) * q_dim + (size_t)h * hd + d]) * q_scale;
        sm[L.acc + i] = 0.0f;
    }
    for (int i = threadIdx.x; i < hd * ad.rank_k; i += THREADS) {
        int d = i / ad.rank_k, c = i % ad.rank_k;
        sm[L.bk + d * pool_rank + c] = ad.b_k[((size_t)kvh * hd + d) * ad.rank_k + c];
    }
    for (int i = threadIdx.x; i < t.rows * pool_rank; i += THREADS) sm[L.acc_r + i] = 0.0f;
    for (int row = threadIdx.x; row < t.rows; row += THREADS) {
        sm[L.m + row] = -INFINITY;
        sm[L.l + row] = 0.0f;
    }
    int *qpos = reinterpret_cast<int *>(sm + L.qpos);
    for (int qi = threadIdx.x; qi < t.n_queries; qi += THREADS) qpos[qi] = a.base.positions[t.row0 + qi];
    __syncthreads();
}

__global__ void __launch_bounds__(THREADS) residual_attention_kernel(CudaResidualAttention a, const int32_t *tiles,
                                                                     int tile_queries, int n_splits, float *partials) {
    extern __shared__ __align__(16) float sm[];
    int group = a.base.n_heads / a.base.n_kv_heads, hd = a.base.head_dim;
    Smem L = smem_layout(hd, a.res.rank, tile_queries * group);
    Tile t = tile_of(a, tiles, blockIdx.x, tile_queries, group);
    if (t.n_queries <= 0) return; /* the whole block: a tile past its sequence's rows */
    SeqAdapter ad = adapter_of(a, t.seq);
    init_block(a, ad, t, group, L, sm);

    int qmax = INT_MIN;
    for (int qi = 0; qi < t.n_queries; qi++) qmax = max(qmax, reinterpret_cast<const int *>(sm + L.qpos)[qi]);
    int chunk = (t.n_ctx + n_splits - 1) / n_splits, k_begin = blockIdx.z * chunk, k_end = min(t.n_ctx, k_begin + chunk);
    for (int k0 = k_begin; k0 < k_end; k0 += KEYS) {
        if (!locate_slots(a, t, k0, k_end, qmax, L, sm)) continue; /* every slot after every query */
        load_tile(a, ad, L, sm);
        __syncthreads();
        rebuild_keys(a, ad, L, sm);
        __syncthreads();
        score_tile(a, t, group, L, sm);
        __syncthreads();
        softmax_tile(t, L, sm);
        __syncthreads();
        accumulate_tile(a, ad, t, L, sm);
        __syncthreads(); /* the next tile overwrites everything but the running state */
    }

    int pool_rank = a.res.rank;
    for (int i = threadIdx.x; i < t.rows * (hd + pool_rank + 2); i += THREADS) {
        int row = i / (hd + pool_rank + 2), e = i % (hd + pool_rank + 2);
        int qi = row / group, h = blockIdx.y * group + row % group;
        float v = e == 0 ? sm[L.m + row] : e == 1 ? sm[L.l + row] : e < hd + 2 ? sm[L.acc + row * hd + e - 2]
                                                                                   : sm[L.acc_r + row * pool_rank + e - 2 - hd];
        partial_at(partials, a, blockIdx.x, h, qi, tile_queries, blockIdx.z, n_splits)[e] = v;
    }
}

/* Grid (tile, query head, query of the tile): merges the splits, then stage 3 of Algorithm 1,
 * out = (acc + scale_v · B_v · acc_r) / l, written as bf16. */
__global__ void __launch_bounds__(THREADS) merge_kernel(CudaResidualAttention a, const int32_t *tiles, int tile_queries,
                                                        int n_splits, float *partials) {
    __shared__ float acc_r[CUDA_LORA_MAX_RANK];
    int group = a.base.n_heads / a.base.n_kv_heads, hd = a.base.head_dim, h = blockIdx.y, qi = blockIdx.z;
    Tile t = tile_of(a, tiles, blockIdx.x, tile_queries, group);
    if (qi >= t.n_queries) return; /* the whole block */
    SeqAdapter ad = adapter_of(a, t.seq);
    const float *part[CUDA_DECODE_MAX_SPLITS];
    float m_max = -INFINITY;
    for (int s = 0; s < n_splits; s++) {
        part[s] = partial_at(partials, a, blockIdx.x, h, qi, tile_queries, s, n_splits);
        m_max = fmaxf(m_max, part[s][0]);
    }
    float weight[CUDA_DECODE_MAX_SPLITS], l = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        weight[s] = m_max == -INFINITY ? 0.0f : __expf(part[s][0] - m_max); /* no visible slot: all zero */
        l += part[s][1] * weight[s];
    }
    for (int c = threadIdx.x; c < ad.rank_v; c += THREADS) {
        float sum = 0.0f;
        for (int s = 0; s < n_splits; s++) sum += part[s][2 + hd + c] * weight[s];
        acc_r[c] = sum;
    }
    __syncthreads();
    int kvh = h / group;
    uint16_t *out = a.base.out + (size_t)(t.row0 + qi) * a.base.n_heads * hd + (size_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += THREADS) {
        float v = 0.0f;
        for (int s = 0; s < n_splits; s++) v += part[s][2 + d] * weight[s];
        if (ad.b_v) {
            const float *brow = ad.b_v + ((size_t)kvh * hd + d) * ad.rank_v;
            float up = 0.0f;
            for (int c = 0; c < ad.rank_v; c++) up += brow[c] * acc_r[c];
            v += ad.scale_v * up;
        }
        out[d] = f32_to_bf16(l > 0.0f ? v / l : 0.0f);
    }
}

size_t smem_bytes(int head_dim, int rank, int rows) { return (size_t)smem_layout(head_dim, rank, rows).words * 4; }

}  // namespace

extern "C" cudaError_t cuda_residual_attention_init(void) {
    /* The widest shape the launcher accepts, or what the device allows: a GPU with less shared
     * memory still runs the narrower shapes, and the launch reports the rest. */
    int device = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e != cudaSuccess) return e;
    size_t widest = smem_bytes(MAX_HEAD_DIM, CUDA_LORA_MAX_RANK, CUDA_RESIDUAL_MAX_TILE_QUERIES * CUDA_RESIDUAL_MAX_GROUP);
    int bytes = widest < (size_t)optin ? (int)widest : optin;
    return cudaFuncSetAttribute(residual_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

extern "C" size_t cuda_residual_partials_floats(int n_tiles, int n_heads, int tile_queries, int n_splits, int head_dim,
                                                int rank) {
    return (size_t)n_tiles * n_heads * tile_queries * n_splits * ((size_t)head_dim + rank + 2);
}

extern "C" cudaError_t cuda_residual_attention(const CudaResidualAttention *a, const int32_t *tiles, int n_tiles,
                                               int tile_queries, int n_splits, float *partials, cudaStream_t stream) {
    if (n_tiles <= 0) return cudaSuccess;
    const CudaAttention *b = &a->base;
    bool shape_ok = b->head_dim > 0 && b->head_dim % 2 == 0 && b->head_dim <= MAX_HEAD_DIM && b->n_kv_heads > 0 &&
                    b->n_heads % b->n_kv_heads == 0 && b->n_heads / b->n_kv_heads <= CUDA_RESIDUAL_MAX_GROUP &&
                    a->rope.rope_dim >= 0 && a->rope.rope_dim % 2 == 0 && a->rope.rope_dim <= b->head_dim;
    bool res_ok = a->res.rank >= 1 && a->res.rank <= CUDA_LORA_MAX_RANK && a->res.block_size == b->block_size;
    bool launch_ok = tile_queries >= 1 && tile_queries <= CUDA_RESIDUAL_MAX_TILE_QUERIES && n_splits >= 1 &&
                     n_splits <= CUDA_DECODE_MAX_SPLITS;
    if (!shape_ok || !res_ok || !launch_ok) return cudaErrorInvalidValue;
    int group = b->n_heads / b->n_kv_heads;
    size_t bytes = smem_bytes(b->head_dim, a->res.rank, tile_queries * group);
    residual_attention_kernel<<<dim3(n_tiles, b->n_kv_heads, n_splits), THREADS, bytes, stream>>>(*a, tiles, tile_queries,
                                                                                                  n_splits, partials);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    merge_kernel<<<dim3(n_tiles, b->n_heads, tile_queries), THREADS, 0, stream>>>(*a, tiles, tile_queries, n_splits, partials);
    return cudaGetLastError();
}
