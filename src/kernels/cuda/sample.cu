/*
 * sample.cu — greedy token selection on the device, so a decode step copies back one id per
 * sequence instead of a vocabulary of logits. Two stages (parts of each row in parallel, then a
 * merge) keep a lone decode row from running on one block.
 */
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace {

/* (value, index) order: larger value wins, the lower index on ties, NaN never. */
__device__ __forceinline__ bool better(float v, int i, float best_v, int best_i) {
    if (isnan(v)) return false;
    if (isnan(best_v) || best_i < 0) return true;
    return v > best_v || (v == best_v && i < best_i);
}

/* Warp-wide (value, index) reduction; every lane ends with the warp's best. */
__device__ __forceinline__ void warp_best(float &best_v, int &best_i) {
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, best_v, o);
        int i = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (i >= 0 && better(v, i, best_v, best_i)) {
            best_v = v;
            best_i = i;
        }
    }
}

/* Block-wide (value, index) reduction; thread 0 ends with the block's best. */
__device__ void block_best(float &best_v, int &best_i) {
    __shared__ float vals[32];
    __shared__ int idxs[32];
    warp_best(best_v, best_i);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        vals[warp] = best_v;
        idxs[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (idxs[w] >= 0 && better(vals[w], idxs[w], best_v, best_i)) {
                best_v = vals[w];
                best_i = idxs[w];
            }
}

/* Stage 1, grid (row, part): the best of one contiguous part of a row. */
__global__ void argmax_parts_kernel(const float *logits, int vocab, float2 *parts) {
    int per = (vocab + gridDim.y - 1) / gridDim.y, begin = blockIdx.y * per, end = min(vocab, begin + per);
    const float *row = logits + (size_t)blockIdx.x * vocab;
    float best_v = -INFINITY;
    int best_i = -1;
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x)
        if (better(row[i], i, best_v, best_i)) {
            best_v = row[i];
            best_i = i;
        }
    block_best(best_v, best_i);
    if (threadIdx.x == 0) parts[blockIdx.x * gridDim.y + blockIdx.y] = make_float2(best_v, __int_as_float(best_i));
}

/* Stage 2, one warp per row: the best of its parts (parts are in index order, so ties keep the
 * lowest index). */
__global__ void argmax_merge_kernel(const float2 *parts, int n_parts, int32_t *out) {
    float best_v = -INFINITY;
    int best_i = -1;
    for (int p = threadIdx.x; p < n_parts; p += 32) {
        float2 c = parts[blockIdx.x * n_parts + p];
        int i = __float_as_int(c.y);
        if (i >= 0 && better(c.x, i, best_v, best_i)) {
            best_v = c.x;
            best_i = i;
        }
    }
    warp_best(best_v, best_i);
    if (threadIdx.x == 0) out[blockIdx.x] = best_i < 0 ? 0 : best_i;
}

}  // namespace

extern "C" cudaError_t cuda_argmax(const float *logits, int n, int vocab, void *scratch, int32_t *out, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    float2 *parts = static_cast<float2 *>(scratch);
    argmax_parts_kernel<<<dim3(n, CUDA_ARGMAX_PARTS), 256, 0, stream>>>(logits, vocab, parts);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    argmax_merge_kernel<<<n, 32, 0, stream>>>(parts, CUDA_ARGMAX_PARTS, out);
    return cudaGetLastError();
}
