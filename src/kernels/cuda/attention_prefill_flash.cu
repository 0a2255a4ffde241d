/*
 * attention_prefill_flash.cu — causal paged attention for multi-token queries with the softmax in
 * registers (flash-attention 2 order), the default prefill kernel of the CUDA backend.
 *
 * Same contract as cuda_attention_prefill (attention_prefill.cu, kept as the fallback): tiles is
 * (n_tiles, 2) = (sequence, first query row of a 64-row tile); keys come through the block table,
 * a key is visible to a query when its recorded slot position is not after the query's, and keys
 * past the tile's last query slot are never loaded.
 *
 * Design. One block of 4 warps per (query head, 64-row tile); warp w owns rows 16w..16w+15.
 * - Q (64 x head_dim bf16) is copied to shared memory once and held in registers as mma.sync A
 *   fragments for the whole key loop.
 * - K and V tiles of 64 keys are copied global -> shared with cp.async (16 bytes per copy, each
 *   key's row found through the block table), double-buffered: tile j+1 is in flight while tile j
 *   is used. Rows are padded by 8 bf16 so that ldmatrix reads are free of bank conflicts.
 * - S = Q Kᵀ: mma.sync m16n8k16 bf16 -> fp32, K fragments by ldmatrix (non-transposed: a K row
 *   is a column of Kᵀ). S stays in registers: thread (g = lane/4, t = lane%4) holds rows g and
 *   g+8, columns 8n + 2t, 8n + 2t + 1 of every 8-key slice n.
 * - Online softmax in registers: row max and sum across the 4 threads of a quad (shuffles), in
 *   base 2 (scores pre-multiplied by log2(e)/sqrt(head_dim)); P rounded to bf16 once, and the row
 *   sum adds the rounded values so the normalisation matches the weights actually applied.
 * - O += P V: the S accumulators of two adjacent 8-key slices are exactly an A fragment of P, so P
 *   never touches shared memory; V fragments by ldmatrix.trans. O (16 x head_dim fp32 per warp)
 *   lives in registers and is rescaled per row by exp2(m_old - m_new).
 * - Masking compares slot positions (kept per tile in shared memory) with the thread's two query
 *   positions; a warp skips it when the tile's largest key position is at most its smallest
 *   query position. Keys past the visible range are zero-filled with position INT_MAX; query rows
 *   past the tile's end have position INT_MIN (nothing visible, never written).
 * - Blocks run the last tiles of the list first (a sequence's last rows see the most keys), and
 *   the query heads of one tile are adjacent blocks, so a KV head's tiles are read by its group
 *   of query heads at about the same time (L2 reuse under GQA).
 * Shared memory: 2 stages x (K + V) x 64 x (head_dim + 8) bf16 + 2 x 64 positions = 70 KB at
 * head_dim 128 (3 blocks per H100 SM); Q borrows stage 1 before the loop starts.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace {

constexpr int BQ = 64, BK = 64, THREADS = 128;
constexpr int MAX_TILES_PER_LAUNCH = 65535; /* gridDim.y limit */

template <int HD>
struct FlashSmem {
    static constexpr int LDH = HD + 8; /* bf16 row stride: 16-byte aligned, rows 4 banks apart */
    static constexpr size_t tile_bytes = (size_t)BK * LDH * 2;
    static constexpr size_t stage_bytes = 2 * tile_bytes; /* K tile, then V tile */
    static constexpr size_t kpos_off = 2 * stage_bytes;
    static constexpr size_t bytes = kpos_off + 2 * BK * sizeof(int);
    static_assert((size_t)BQ * LDH * 2 <= stage_bytes, "Q must fit in one stage");
    static_assert((LDH * 2) % 16 == 0, "rows must stay 16-byte aligned for cp.async and ldmatrix");
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}

/* c (16 x 8 fp32) += a (16 x 16 bf16, row-major fragment) x b (16 x 8 bf16, column fragment b0 b1). */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two bf16 in one register, the lower column in the low half (the mma operand order):
 * __floats2bfloat162_rn puts its first argument in .x, the low half. */
__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }

__device__ __forceinline__ uint32_t pack_f32_bf16(float lo, float hi) { return bf16x2_bits(__floats2bfloat162_rn(lo, hi)); }

/* 2^x with the hardware approximation (MUFU.EX2, ~2 ulp); 2^-inf = +0. */
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Enqueues the copies of keys k0..k0+BK-1 (K, V rows and slot positions) into one stage; keys at
 * or past n_keys become zero rows with position INT_MAX (plain stores, visible after the barrier
 * that also publishes the copies). */
template <int HD>
__device__ __forceinline__ void load_kv_async(const CudaAttention &a, const int32_t *table, int kvh, int k0, int n_keys,
                                              uint16_t *ks, uint16_t *vs, int *kpos) {
    constexpr int LDH = FlashSmem<HD>::LDH, VEC = HD / 8;
#pragma unroll 4
    for (int i = threadIdx.x; i < BK * VEC; i += THREADS) {
        int r = i / VEC, c = (i % VEC) * 8, key = k0 + r;
        uint16_t *kd = ks + r * LDH + c, *vd = vs + r * LDH + c;
        if (key < n_keys) {
            size_t block = (size_t)table[key / a.block_size];
            size_t off = ((block * a.n_kv_heads + kvh) * a.block_size + key % a.block_size) * HD + c;
            cp_async16(kd, a.k_cache + off);
            cp_async16(vd, a.v_cache + off);
        } else {
            *reinterpret_cast<uint4 *>(kd) = make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4 *>(vd) = make_uint4(0, 0, 0, 0);
        }
    }
    for (int i = threadIdx.x; i < BK; i += THREADS) {
        int key = k0 + i;
        if (key < n_keys)
            cp_async4(kpos + i, a.slot_pos + (size_t)table[key / a.block_size] * a.block_size + key % a.block_size);
        else
            kpos[i] = INT_MAX;
    }
}

/* Three blocks per SM (12 warps): shared memory allows it at head_dim 128 (3 x 70 KB), and the
 * bound caps registers at 168 per thread, which sm_90a's ptxas meets without spilling. */
template <int HD>
__global__ void __launch_bounds__(THREADS, 3) flash_prefill_kernel(CudaAttention a, const int32_t *tiles, int tile_base,
                                                                int n_launch, float scale_log2) {
    using L = FlashSmem<HD>;
    constexpr int LDH = L::LDH, KSTEPS = HD / 16, SN = BK / 8, ON = HD / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    /* Stage s: K at smem + s * stage_bytes, V tile_bytes after it, positions at kpos_off + s * BK ints. */
    auto k_stage = [&](int s) { return reinterpret_cast<uint16_t *>(smem + s * L::stage_bytes); };
    auto v_stage = [&](int s) { return reinterpret_cast<uint16_t *>(smem + s * L::stage_bytes + L::tile_bytes); };
    int *kpos_stage = reinterpret_cast<int *>(smem + L::kpos_off);
    uint16_t *qs = k_stage(1);

    int tile = tile_base + (n_launch - 1 - (int)blockIdx.y); /* last (longest) tiles first */
    int seq = tiles[2 * tile], r0 = tiles[2 * tile + 1], h = blockIdx.x;
    int q_begin = a.seq_start[seq], n_q = a.seq_start[seq + 1] - q_begin, n_ctx = a.seq_n_ctx[seq];
    int rows = min(BQ, n_q - r0), kvh = h / (a.n_heads / a.n_kv_heads);
    const int32_t *table = a.block_tables + (size_t)seq * a.table_stride;
    int n_keys = n_ctx - n_q + r0 + rows; /* through the slot of the tile's last query */
    int n_kt = (n_keys + BK - 1) / BK;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    size_t q_dim = (size_t)a.n_heads * HD;

    /* Prologue: Q and the first K/V tile in one copy group. */
    for (int i = threadIdx.x; i < BQ * (HD / 8); i += THREADS) {
        int r = i / (HD / 8), c = (i % (HD / 8)) * 8;
        uint16_t *dst = qs + r * LDH + c;
        if (r < rows) cp_async16(dst, a.q + (size_t)(q_begin + r0 + r) * q_dim + (size_t)h * HD + c);
        else *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
    }
    if (n_kt > 0) load_kv_async<HD>(a, table, kvh, 0, n_keys, k_stage(0), v_stage(0), kpos_stage);
    cp_async_commit();

    int row_a = warp * 16 + g, row_b = row_a + 8;
    int qpos_a = row_a < rows ? a.positions[q_begin + r0 + row_a] : INT_MIN;
    int qpos_b = row_b < rows ? a.positions[q_begin + r0 + row_b] : INT_MIN;
    int warp_qmin = __reduce_min_sync(0xffffffffu, min(qpos_a, qpos_b));

    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[KSTEPS][4];
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) ldmatrix_x4(qf[kk], qs + (warp * 16 + (lane & 15)) * LDH + kk * 16 + (lane >> 4) * 8);
    __syncthreads(); /* stage 1 (Q) may now be overwritten by the prefetch */

    float o[ON][4];
#pragma unroll
    for (int d = 0; d < ON; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f; /* l: this thread's columns only */

    for (int j = 0; j < n_kt; j++) {
        int s = j & 1;
        if (j + 1 < n_kt) load_kv_async<HD>(a, table, kvh, (j + 1) * BK, n_keys, k_stage(s ^ 1), v_stage(s ^ 1),
                                             kpos_stage + (s ^ 1) * BK);
        cp_async_commit();
        cp_async_wait<1>(); /* every group but the one just committed: tile j has landed */
        __syncthreads();
        const uint16_t *ks = k_stage(s), *vs = v_stage(s);
        const int *kp = kpos_stage + s * BK;

        /* S = Q Kᵀ for this warp's 16 rows x 64 keys. */
        float sc[SN][4];
#pragma unroll
        for (int n = 0; n < SN; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
#pragma unroll
            for (int np = 0; np < SN / 2; np++) {
                uint32_t b[4];
                ldmatrix_x4(b, ks + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LDH + kk * 16 + ((lane >> 3) & 1) * 8);
                mma_bf16(sc[2 * np], qf[kk], b[0], b[1]);
                mma_bf16(sc[2 * np + 1], qf[kk], b[2], b[3]);
            }
        }

        /* Scale to base 2 and mask by position. */
        int tile_kmax = __reduce_max_sync(0xffffffffu, max(kp[lane], kp[lane + 32]));
        bool all_visible = tile_kmax <= warp_qmin;
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int n = 0; n < SN; n++) {
            int2 kp2 = *reinterpret_cast<const int2 *>(kp + n * 8 + t4 * 2);
            float v0 = sc[n][0] * scale_log2, v1 = sc[n][1] * scale_log2;
            float v2 = sc[n][2] * scale_log2, v3 = sc[n][3] * scale_log2;
            if (!all_visible) {
                if (kp2.x > qpos_a) v0 = -INFINITY;
                if (kp2.y > qpos_a) v1 = -INFINITY;
                if (kp2.x > qpos_b) v2 = -INFINITY;
                if (kp2.y > qpos_b) v3 = -INFINITY;
            }
            sc[n][0] = v0, sc[n][1] = v1, sc[n][2] = v2, sc[n][3] = v3;
            mx_a = fmaxf(mx_a, fmaxf(v0, v1));
            mx_b = fmaxf(mx_b, fmaxf(v2, v3));
        }
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));

        /* Online softmax: a row with nothing visible yet keeps max -inf and uses 0 as its
         * reference, so every exp2 below is of -inf (0) or of a finite value <= 0. */
        float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
        float ref_a = new_a == -INFINITY ? 0.0f : new_a, ref_b = new_b == -INFINITY ? 0.0f : new_b;
        float alpha_a = fast_exp2(m_a - ref_a), alpha_b = fast_exp2(m_b - ref_b);
        m_a = new_a, m_b = new_b;
        uint32_t pf[SN][2]; /* P as bf16 pairs: [n][0] row g, [n][1] row g+8 */
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int n = 0; n < SN; n++) {
            __nv_bfloat162 pa = __floats2bfloat162_rn(fast_exp2(sc[n][0] - ref_a), fast_exp2(sc[n][1] - ref_a));
            __nv_bfloat162 pb = __floats2bfloat162_rn(fast_exp2(sc[n][2] - ref_b), fast_exp2(sc[n][3] - ref_b));
            float2 fa = __bfloat1622float2(pa), fb = __bfloat1622float2(pb);
            sum_a += fa.x + fa.y;
            sum_b += fb.x + fb.y;
            pf[n][0] = bf16x2_bits(pa);
            pf[n][1] = bf16x2_bits(pb);
        }
        l_a = l_a * alpha_a + sum_a;
        l_b = l_b * alpha_b + sum_b;
#pragma unroll
        for (int d = 0; d < ON; d++) {
            o[d][0] *= alpha_a, o[d][1] *= alpha_a;
            o[d][2] *= alpha_b, o[d][3] *= alpha_b;
        }

        /* O += P V: slices 2k and 2k+1 of S form the A fragment of key step k. */
#pragma unroll
        for (int k = 0; k < BK / 16; k++) {
            uint32_t pa[4] = {pf[2 * k][0], pf[2 * k][1], pf[2 * k + 1][0], pf[2 * k + 1][1]};
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, vs + (k * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDH + dp * 16 + (lane >> 4) * 8);
                mma_bf16(o[2 * dp], pa, b[0], b[1]);
                mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads(); /* stage s is refilled by the next iteration's prefetch */
    }

    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
    uint16_t *out_head = a.out + (size_t)(q_begin + r0) * q_dim + (size_t)h * HD + t4 * 2;
    if (row_a < rows) {
        uint32_t *dst = reinterpret_cast<uint32_t *>(out_head + (size_t)row_a * q_dim);
#pragma unroll
        for (int d = 0; d < ON; d++) dst[d * 4] = pack_f32_bf16(o[d][0] * inv_a, o[d][1] * inv_a);
    }
    if (row_b < rows) {
        uint32_t *dst = reinterpret_cast<uint32_t *>(out_head + (size_t)row_b * q_dim);
#pragma unroll
        for (int d = 0; d < ON; d++) dst[d * 4] = pack_f32_bf16(o[d][2] * inv_b, o[d][3] * inv_b);
    }
}

template <int HD>
cudaError_t launch_flash(const CudaAttention *a, const int32_t *tiles, int n_tiles, cudaStream_t stream) {
    float scale_log2 = 1.4426950408889634f / sqrtf((float)HD);
    for (int base = 0; base < n_tiles; base += MAX_TILES_PER_LAUNCH) {
        int n = n_tiles - base < MAX_TILES_PER_LAUNCH ? n_tiles - base : MAX_TILES_PER_LAUNCH;
        flash_prefill_kernel<HD><<<dim3(a->n_heads, n), THREADS, FlashSmem<HD>::bytes, stream>>>(*a, tiles, base, n, scale_log2);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

}  // namespace

extern "C" cudaError_t cuda_attention_prefill_flash_init(void) {
    cudaError_t e = cudaFuncSetAttribute(flash_prefill_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)FlashSmem<64>::bytes);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(flash_prefill_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)FlashSmem<128>::bytes);
}

extern "C" cudaError_t cuda_attention_prefill_flash(const CudaAttention *a, const int32_t *tiles, int n_tiles,
                                                    cudaStream_t stream) {
    if (n_tiles <= 0) return cudaSuccess;
    switch (a->head_dim) {
    case 64: return launch_flash<64>(a, tiles, n_tiles, stream);
    case 128: return launch_flash<128>(a, tiles, n_tiles, stream);
    default: return cudaErrorInvalidValue;
    }
}
