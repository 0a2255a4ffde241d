/*
 * attention_decode.cu — paged attention for one query token per sequence (decode steps).
 *
 * Grid (sequence, KV head, split): a block handles the GQA group of query heads that share one
 * KV head, so each key and value row is read once for the whole group. The context is cut into
 * n_splits parts computed in parallel (long contexts with few sequences still fill the GPU);
 * each part writes its running max, sum and unnormalized output, and a second kernel merges the
 * parts. Context lengths come from device memory, so one launch shape serves every step of a
 * CUDA graph; a sequence with no context (a padding row) yields zeros.
 * Within a block, each warp takes 32 keys at a time: lane j scores key j for every head of the
 * group and stages key j's value row in shared memory (all 32 loads in flight at once), then the
 * warp accumulates the 32 value rows with each lane owning head_dim/32 dims.
 */
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

using namespace braid_cuda;

namespace {

constexpr int WARPS = 4;

struct DecodeState {
    float *partials;
    int n_splits;
};

__device__ __forceinline__ float *partial_slot(DecodeState st, int di, int h, int n_heads, int split, int hd) {
    return st.partials + (((size_t)di * n_heads + h) * st.n_splits + split) * (size_t)(hd + 2);
}

template <int HD, int G>
__global__ void __launch_bounds__(WARPS * 32) decode_kernel(CudaAttention a, const int32_t *dec_seqs, DecodeState st,
                                                            float scale) {
    constexpr int DPL = HD / 32; /* value dims per lane */
    __shared__ float q_s[G][HD];
    __shared__ float red_m[WARPS][G], red_l[WARPS][G];
    /* The warps' staged value rows during the loop; the cross-warp merge reuses the space after. */
    constexpr size_t V_BYTES = (size_t)WARPS * 32 * HD * 2, RED_BYTES = (size_t)WARPS * G * HD * 4;
    __shared__ __align__(16) unsigned char scratch[V_BYTES > RED_BYTES ? V_BYTES : RED_BYTES];
    uint16_t (*v_tile)[32][HD] = reinterpret_cast<uint16_t (*)[32][HD]>(scratch);
    float (*red_acc)[G][HD] = reinterpret_cast<float (*)[G][HD]>(scratch);

    int di = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    int seq = dec_seqs[di], tok = a.seq_start[seq], n_ctx = a.seq_n_ctx[seq], qpos = a.positions[tok];
    const int32_t *table = a.block_tables + (size_t)seq * a.table_stride;
    int chunk = (n_ctx + st.n_splits - 1) / st.n_splits;
    int k_begin = split * chunk, k_end = min(n_ctx, k_begin + chunk);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    size_t q_dim = (size_t)a.n_heads * HD;
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
        q_s[i / HD][i % HD] = bf16_to_f32(a.q[tok * q_dim + (size_t)(kvh * G + i / HD) * HD + i % HD]) * scale;
    __syncthreads();

    float m[G], l[G], acc[G][DPL];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[g][i] = 0.0f;
    }
    for (int base = k_begin + warp * 32; base < k_end; base += WARPS * 32) {
        int key = base + lane;
        bool visible = false;
        int row = 0; /* (block, kv head, offset) row index of this lane's key in the caches */
        if (key < k_end) {
            int block = table[key / a.block_size], off = key % a.block_size;
            row = (block * a.n_kv_heads + kvh) * a.block_size + off;
            visible = a.slot_pos[(size_t)block * a.block_size + off] <= qpos;
        }
        if (key < k_end) {
            const uint4 *vsrc = reinterpret_cast<const uint4 *>(a.v_cache + (size_t)row * HD);
            uint4 *vdst = reinterpret_cast<uint4 *>(v_tile[warp][lane]);
#pragma unroll
            for (int v8 = 0; v8 < HD / 8; v8++) vdst[v8] = vsrc[v8];
        }
        float s[G];
#pragma unroll
        for (int g = 0; g < G; g++) s[g] = 0.0f;
        if (visible) {
            const uint4 *krow = reinterpret_cast<const uint4 *>(a.k_cache + (size_t)row * HD);
#pragma unroll
            for (int v8 = 0; v8 < HD / 8; v8++) {
                float kf[8];
                unpack8(krow[v8], kf);
#pragma unroll
                for (int g = 0; g < G; g++)
#pragma unroll
                    for (int j = 0; j < 8; j++) s[g] += q_s[g][v8 * 8 + j] * kf[j];
            }
        }
        float p[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            float sg = visible ? s[g] : -INFINITY;
            float m_new = fmaxf(m[g], warp_max(sg));
            if (m_new == -INFINITY) {
                p[g] = 0.0f;
                continue;
            }
            float alpha = __expf(m[g] - m_new);
            p[g] = visible ? __expf(sg - m_new) : 0.0f;
            l[g] = l[g] * alpha + warp_sum(p[g]);
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[g][i] *= alpha;
            m[g] = m_new;
        }
        int n_here = min(32, k_end - base);
        __syncwarp();
        for (int j = 0; j < n_here; j++) {
            float pj[G];
            bool any = false;
#pragma unroll
            for (int g = 0; g < G; g++) {
                pj[g] = __shfl_sync(0xffffffffu, p[g], j);
                any |= pj[g] != 0.0f;
            }
            if (!any) continue; /* uniform across the warp: every lane holds the same pj */
            const uint16_t *vrow = v_tile[warp][j] + lane * DPL;
            float vf[DPL];
#pragma unroll
            for (int i = 0; i < DPL; i++) vf[i] = bf16_to_f32(vrow[i]);
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[g][i] += pj[g] * vf[i];
        }
        __syncwarp(); /* the next 32 keys overwrite this warp's staged rows */
    }
    __syncthreads(); /* every warp is done with its staged rows before the merge reuses them */
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) {
            red_m[warp][g] = m[g];
            red_l[warp][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < DPL; i++) red_acc[warp][g][lane * DPL + i] = acc[g][i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
        int g = i / HD, d = i % HD;
        float mx = -INFINITY;
        for (int w = 0; w < WARPS; w++) mx = fmaxf(mx, red_m[w][g]);
        float sum = 0.0f, out = 0.0f;
        if (mx != -INFINITY)
            for (int w = 0; w < WARPS; w++) {
                float f = __expf(red_m[w][g] - mx);
                sum += red_l[w][g] * f;
                out += red_acc[w][g][d] * f;
            }
        float *slot = partial_slot(st, di, kvh * G + g, a.n_heads, split, HD);
        slot[2 + d] = out;
        if (d == 0) {
            slot[0] = mx;
            slot[1] = sum;
        }
    }
}

template <int HD>
__global__ void merge_kernel(CudaAttention a, const int32_t *dec_seqs, DecodeState st) {
    int di = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    int tok = a.seq_start[dec_seqs[di]];
    float mx = -INFINITY;
    for (int s = 0; s < st.n_splits; s++) mx = fmaxf(mx, partial_slot(st, di, h, a.n_heads, s, HD)[0]);
    float sum = 0.0f, out = 0.0f;
    if (mx != -INFINITY)
        for (int s = 0; s < st.n_splits; s++) {
            const float *slot = partial_slot(st, di, h, a.n_heads, s, HD);
            float f = __expf(slot[0] - mx);
            sum += slot[1] * f;
            out += slot[2 + d] * f;
        }
    a.out[(size_t)tok * a.n_heads * HD + (size_t)h * HD + d] = f32_to_bf16(sum > 0.0f ? out / sum : 0.0f);
}

template <int HD, int G>
cudaError_t launch_group(const CudaAttention *a, const int32_t *dec_seqs, int n_dec, DecodeState st,
                         cudaStream_t stream) {
    decode_kernel<HD, G><<<dim3(n_dec, a->n_kv_heads, st.n_splits), WARPS * 32, 0, stream>>>(*a, dec_seqs, st,
                                                                                           1.0f / sqrtf((float)HD));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    merge_kernel<HD><<<dim3(n_dec, a->n_heads), HD, 0, stream>>>(*a, dec_seqs, st);
    return cudaGetLastError();
}

template <int HD>
cudaError_t launch_head_dim(const CudaAttention *a, const int32_t *dec_seqs, int n_dec, DecodeState st,
                            cudaStream_t stream) {
    switch (a->n_heads / a->n_kv_heads) {
    case 1: return launch_group<HD, 1>(a, dec_seqs, n_dec, st, stream);
    case 2: return launch_group<HD, 2>(a, dec_seqs, n_dec, st, stream);
    case 3: return launch_group<HD, 3>(a, dec_seqs, n_dec, st, stream);
    case 4: return launch_group<HD, 4>(a, dec_seqs, n_dec, st, stream);
    case 5: return launch_group<HD, 5>(a, dec_seqs, n_dec, st, stream); /* Qwen2.5-14B */
    case 6: return launch_group<HD, 6>(a, dec_seqs, n_dec, st, stream); /* Qwen2.5-1.5B */
    case 7: return launch_group<HD, 7>(a, dec_seqs, n_dec, st, stream); /* Qwen2.5-0.5B, -7B */
    case 8: return launch_group<HD, 8>(a, dec_seqs, n_dec, st, stream);
    default: return cudaErrorInvalidValue;
    }
}

}  // namespace

extern "C" int cuda_decode_group_supported(int group) { return group >= 1 && group <= 8; }

extern "C" cudaError_t cuda_attention_decode(const CudaAttention *a, const int32_t *dec_seqs, int n_dec, int n_splits,
                                             float *partials, cudaStream_t stream) {
    if (n_dec <= 0) return cudaSuccess;
    if (n_splits < 1 || n_splits > CUDA_DECODE_MAX_SPLITS) return cudaErrorInvalidValue;
    DecodeState st = {partials, n_splits};
    switch (a->head_dim) {
    case 64: return launch_head_dim<64>(a, dec_seqs, n_dec, st, stream);
    case 128: return launch_head_dim<128>(a, dec_seqs, n_dec, st, stream);
    default: return cudaErrorInvalidValue;
    }
}
