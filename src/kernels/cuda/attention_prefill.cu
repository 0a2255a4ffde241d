/*
 * attention_prefill.cu — causal paged attention for multi-token queries (prefill chunks).
 *
 * One block of 4 warps computes a 64-query tile of one head against its sequence's context,
 * 64 keys at a time (flash-attention order): S = Q Kᵀ and O += P V run on the tensor cores
 * (bf16 WMMA, fp32 accumulators), the online softmax runs in fp32. Keys come through the block
 * table, so a cached prefix and this chunk's own tokens are read the same way. A key is visible
 * to a query when its recorded position is not after the query's; keys past the tile's last
 * query slot are never loaded (they are later tokens of this same batch).
 * Each warp owns 16 query rows of the tile; the accumulator O lives in shared memory so the
 * softmax rescaling can reach individual rows.
 */
#include <limits.h>
#include <math.h>
#include <mma.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

using namespace nvcuda;
using namespace braid_cuda;

namespace {

constexpr int BQ = 64, BK = 64, THREADS = 128;

template <int HD>
struct PrefillSmem {
    static constexpr int LDH = HD + 8;  /* bf16 row stride of Q, K, V tiles (padding against bank conflicts) */
    static constexpr int LDS = BK + 4;  /* fp32 row stride of S */
    static constexpr int LDP = BK + 8;  /* bf16 row stride of P */
    static constexpr int LDO = HD + 4;  /* fp32 row stride of O */
    static constexpr size_t q_off = 0;
    static constexpr size_t k_off = q_off + (size_t)BQ * LDH * 2;
    static constexpr size_t v_off = k_off + (size_t)BK * LDH * 2;
    static constexpr size_t s_off = v_off + (size_t)BK * LDH * 2;
    static constexpr size_t p_off = s_off + (size_t)BQ * LDS * 4;
    static constexpr size_t o_off = p_off + (size_t)BQ * LDP * 2;
    static constexpr size_t alpha_off = o_off + (size_t)BQ * LDO * 4;
    static constexpr size_t qpos_off = alpha_off + BQ * 4;
    static constexpr size_t kpos_off = qpos_off + BQ * 4;
    static constexpr size_t bytes = kpos_off + BK * 4;
};

template <int HD>
__device__ void load_q_tile(const CudaAttention &a, int row0, int rows, int h, __nv_bfloat16 *qs, int *qpos) {
    constexpr int LDH = PrefillSmem<HD>::LDH, VEC = HD / 8;
    size_t q_dim = (size_t)a.n_heads * HD;
    for (int i = threadIdx.x; i < BQ * VEC; i += THREADS) {
        int r = i / VEC, c = (i % VEC) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows) v = *reinterpret_cast<const uint4 *>(a.q + (row0 + r) * q_dim + (size_t)h * HD + c);
        *reinterpret_cast<uint4 *>(qs + r * LDH + c) = v;
    }
    for (int i = threadIdx.x; i < BQ; i += THREADS) qpos[i] = i < rows ? a.positions[row0 + i] : INT_MIN;
}

template <int HD>
__device__ void load_kv_tile(const CudaAttention &a, const int32_t *table, int kvh, int k0, int n_keys,
                             __nv_bfloat16 *ks, __nv_bfloat16 *vs, int *kpos) {
    constexpr int LDH = PrefillSmem<HD>::LDH, VEC = HD / 8;
    for (int i = threadIdx.x; i < BK * VEC; i += THREADS) {
        int r = i / VEC, c = (i % VEC) * 8, key = k0 + r;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
        if (key < n_keys) {
            size_t block = (size_t)table[key / a.block_size];
            size_t off = ((block * a.n_kv_heads + kvh) * a.block_size + key % a.block_size) * HD + c;
            kv = *reinterpret_cast<const uint4 *>(a.k_cache + off);
            vv = *reinterpret_cast<const uint4 *>(a.v_cache + off);
        }
        *reinterpret_cast<uint4 *>(ks + r * LDH + c) = kv;
        *reinterpret_cast<uint4 *>(vs + r * LDH + c) = vv;
    }
    for (int i = threadIdx.x; i < BK; i += THREADS) {
        int key = k0 + i;
        kpos[i] = key < n_keys ? a.slot_pos[(size_t)table[key / a.block_size] * a.block_size + key % a.block_size] : INT_MAX;
    }
}

/* S (16 x BK) of this warp = Q rows x K tileᵀ. */
template <int HD>
__device__ void warp_scores(const __nv_bfloat16 *qs, const __nv_bfloat16 *ks, float *ss, int warp) {
    constexpr int LDH = PrefillSmem<HD>::LDH, LDS = PrefillSmem<HD>::LDS;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[HD / 16];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) wmma::load_matrix_sync(fa[kk], qs + warp * 16 * LDH + kk * 16, LDH);
#pragma unroll
    for (int n = 0; n < BK / 16; n++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
            wmma::load_matrix_sync(fb, ks + n * 16 * LDH + kk * 16, LDH);
            wmma::mma_sync(acc, fa[kk], fb, acc);
        }
        wmma::store_matrix_sync(ss + warp * 16 * LDS + n * 16, acc, LDS, wmma::mem_row_major);
    }
}

/* O rows of this warp += P (16 x BK) x V tile. */
template <int HD>
__device__ void warp_accumulate(const __nv_bfloat16 *ps, const __nv_bfloat16 *vs, float *os, int warp) {
    constexpr int LDH = PrefillSmem<HD>::LDH, LDP = PrefillSmem<HD>::LDP, LDO = PrefillSmem<HD>::LDO;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[BK / 16];
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) wmma::load_matrix_sync(fa[kk], ps + warp * 16 * LDP + kk * 16, LDP);
#pragma unroll
    for (int n = 0; n < HD / 16; n++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::load_matrix_sync(acc, os + warp * 16 * LDO + n * 16, LDO, wmma::mem_row_major);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
            wmma::load_matrix_sync(fb, vs + kk * 16 * LDH + n * 16, LDH);
            wmma::mma_sync(acc, fa[kk], fb, acc);
        }
        wmma::store_matrix_sync(os + warp * 16 * LDO + n * 16, acc, LDO, wmma::mem_row_major);
    }
}

template <int HD>
__global__ void __launch_bounds__(THREADS) prefill_kernel(CudaAttention a, const int32_t *tiles, float scale_log2) {
    using L = PrefillSmem<HD>;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *qs = reinterpret_cast<__nv_bfloat16 *>(smem + L::q_off);
    __nv_bfloat16 *ks = reinterpret_cast<__nv_bfloat16 *>(smem + L::k_off);
    __nv_bfloat16 *vs = reinterpret_cast<__nv_bfloat16 *>(smem + L::v_off);
    float *ss = reinterpret_cast<float *>(smem + L::s_off);
    __nv_bfloat16 *ps = reinterpret_cast<__nv_bfloat16 *>(smem + L::p_off);
    float *os = reinterpret_cast<float *>(smem + L::o_off);
    float *row_scale = reinterpret_cast<float *>(smem + L::alpha_off);
    int *qpos = reinterpret_cast<int *>(smem + L::qpos_off);
    int *kpos = reinterpret_cast<int *>(smem + L::kpos_off);

    int seq = tiles[2 * blockIdx.x], r0 = tiles[2 * blockIdx.x + 1], h = blockIdx.y;
    int q_begin = a.seq_start[seq], n_q = a.seq_start[seq + 1] - q_begin, n_ctx = a.seq_n_ctx[seq];
    int rows = min(BQ, n_q - r0), kvh = h / (a.n_heads / a.n_kv_heads);
    const int32_t *table = a.block_tables + (size_t)seq * a.table_stride;
    int n_keys = n_ctx - n_q + r0 + rows; /* through the slot of the tile's last query */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    load_q_tile<HD>(a, q_begin + r0, rows, h, qs, qpos);
    for (int i = threadIdx.x; i < BQ * L::LDO; i += THREADS) os[i] = 0.0f;
    __syncthreads();

    /* Lanes 2r and 2r+1 of a warp own row r of its 16 and half of the tile's columns each. */
    int row = warp * 16 + (lane >> 1), col0 = (lane & 1) * (BK / 2), my_qpos = qpos[row];
    float m_run = -INFINITY, l_run = 0.0f;
    for (int k0 = 0; k0 < n_keys; k0 += BK) {
        load_kv_tile<HD>(a, table, kvh, k0, n_keys, ks, vs, kpos);
        __syncthreads();
        warp_scores<HD>(qs, ks, ss, warp);
        __syncwarp();
        float *srow = ss + row * L::LDS;
        float tile_max = -INFINITY;
        for (int c = col0; c < col0 + BK / 2; c++) {
            float v = kpos[c] <= my_qpos ? srow[c] * scale_log2 : -INFINITY;
            srow[c] = v;
            tile_max = fmaxf(tile_max, v);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        float m_new = fmaxf(m_run, tile_max);
        float alpha = m_new == -INFINITY ? 1.0f : exp2f(m_run - m_new);
        float sum = 0.0f;
        for (int c = col0; c < col0 + BK / 2; c++) {
            float p = m_new == -INFINITY ? 0.0f : exp2f(srow[c] - m_new);
            ps[row * L::LDP + c] = __float2bfloat16_rn(p);
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l_run = l_run * alpha + sum;
        m_run = m_new;
        if ((lane & 1) == 0) row_scale[row] = alpha;
        __syncwarp();
        for (int i = lane; i < 16 * HD; i += 32) {
            int r = warp * 16 + i / HD;
            os[r * L::LDO + i % HD] *= row_scale[r];
        }
        __syncwarp();
        warp_accumulate<HD>(ps, vs, os, warp);
        __syncthreads(); /* the next tile overwrites K, V and their positions */
    }
    if ((lane & 1) == 0) row_scale[row] = l_run > 0.0f ? 1.0f / l_run : 0.0f;
    __syncwarp();
    size_t q_dim = (size_t)a.n_heads * HD;
    for (int i = lane; i < 16 * HD; i += 32) {
        int r = warp * 16 + i / HD, d = i % HD;
        if (r < rows) a.out[(size_t)(q_begin + r0 + r) * q_dim + (size_t)h * HD + d] = f32_to_bf16(os[r * L::LDO + d] * row_scale[r]);
    }
}

template <int HD>
cudaError_t launch_prefill(const CudaAttention *a, const int32_t *tiles, int n_tiles, cudaStream_t stream) {
    float scale_log2 = 1.4426950408889634f / sqrtf((float)HD);
    prefill_kernel<HD><<<dim3(n_tiles, a->n_heads), THREADS, PrefillSmem<HD>::bytes, stream>>>(*a, tiles, scale_log2);
    return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t cuda_attention_prefill_init(void) {
    cudaError_t e = cudaFuncSetAttribute(prefill_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)PrefillSmem<64>::bytes);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(prefill_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)PrefillSmem<128>::bytes);
}

extern "C" cudaError_t cuda_attention_prefill(const CudaAttention *a, const int32_t *tiles, int n_tiles,
                                              cudaStream_t stream) {
    if (n_tiles <= 0) return cudaSuccess;
    switch (a->head_dim) {
    case 64: return launch_prefill<64>(a, tiles, n_tiles, stream);
    case 128: return launch_prefill<128>(a, tiles, n_tiles, stream);
    default: return cudaErrorInvalidValue;
    }
}
