/*
 * memory_ops.cu — kernels that move or initialize memory: slot-position records, block copies
 * between pool locations (a kernel within the device pool; cudaMemcpyAsync runs between the device
 * pool and the host tier), fills and synthetic random weights.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

using namespace braid_cuda;

namespace {

__global__ void record_slot_positions_kernel(const int32_t *positions, const int32_t *slots, int n, int32_t *slot_pos) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n && slots[t] >= 0) slot_pos[slots[t]] = positions[t];
}

/* grid (n_pairs, n_layers): one block copies one block of one layer's K and V. */
__global__ void copy_blocks_kernel(uint16_t *const *k_layers, uint16_t *const *v_layers, int32_t *slot_pos,
                                   const int32_t *src, const int32_t *dst, int block_elems, int block_size) {
    size_t s = (size_t)src[blockIdx.x] * block_elems, d = (size_t)dst[blockIdx.x] * block_elems;
    uint16_t *k = k_layers[blockIdx.y], *v = v_layers[blockIdx.y];
    for (int i = threadIdx.x; i < block_elems; i += blockDim.x) {
        k[d + i] = k[s + i];
        v[d + i] = v[s + i];
    }
    if (blockIdx.y == 0)
        for (int i = threadIdx.x; i < block_size; i += blockDim.x)
            slot_pos[(size_t)dst[blockIdx.x] * block_size + i] = slot_pos[(size_t)src[blockIdx.x] * block_size + i];
}

/* splitmix64: a cheap, well-mixed hash of the element index, so the values do not depend on the
 * launch shape. */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Element (r, c) of a rows x cols region is the value of index index0 + r * stride + c: the same
 * arithmetic as synthetic_weight_bf16 (model/synthetic_model.c), so host and device agree bit for bit. */
__global__ void fill_random_bf16_kernel(uint16_t *p, int64_t rows, int64_t cols, uint64_t seed, uint64_t index0, int64_t stride,
                                        float scale) {
    size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = i / (uint64_t)cols, c = i % (uint64_t)cols;
        uint64_t index = index0 + r * (uint64_t)stride + c;
        float u = (float)(mix64(seed ^ (index * 0x2545f4914f6cdd1dull)) >> 40) * (1.0f / 16777216.0f);
        p[i] = f32_to_bf16((2.0f * u - 1.0f) * scale);
    }
}

__global__ void fill_f32_kernel(float *p, size_t n, float value) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = value;
}

}  // namespace

extern "C" cudaError_t cuda_record_slot_positions(const int32_t *positions, const int32_t *slots, int n,
                                                  int32_t *slot_pos, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    record_slot_positions_kernel<<<(n + 255) / 256, 256, 0, stream>>>(positions, slots, n, slot_pos);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_copy_blocks(uint16_t *const *k_layers, uint16_t *const *v_layers, int n_layers,
                                        int32_t *slot_pos, const int32_t *src, const int32_t *dst, int n_pairs,
                                        int block_elems, int block_size, cudaStream_t stream) {
    if (n_pairs <= 0) return cudaSuccess;
    copy_blocks_kernel<<<dim3(n_pairs, n_layers), 256, 0, stream>>>(k_layers, v_layers, slot_pos, src, dst, block_elems,
                                                                     block_size);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_memcpy_kv_blocks(const CudaKvTier *src, int src_block, const CudaKvTier *dst, int dst_block,
                                             int n, int n_layers, size_t block_elems, int block_size,
                                             enum cudaMemcpyKind kind, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    size_t bytes = (size_t)n * block_elems * sizeof(uint16_t);
    size_t s = (size_t)src_block * block_elems, d = (size_t)dst_block * block_elems;
    for (int l = 0; l < n_layers; l++) {
        cudaError_t e = cudaMemcpyAsync(dst->k[l] + d, src->k[l] + s, bytes, kind, stream);
        if (e == cudaSuccess) e = cudaMemcpyAsync(dst->v[l] + d, src->v[l] + s, bytes, kind, stream);
        if (e != cudaSuccess) return e;
    }
    return cudaMemcpyAsync(dst->slot_pos + (size_t)dst_block * block_size, src->slot_pos + (size_t)src_block * block_size,
                           (size_t)n * block_size * sizeof(int32_t), kind, stream);
}

extern "C" cudaError_t cuda_fill_random_bf16(uint16_t *p, int64_t rows, int64_t cols, uint64_t seed, uint64_t index0,
                                             int64_t stride, float scale, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    fill_random_bf16_kernel<<<1024, 256, 0, stream>>>(p, rows, cols, seed, index0, stride, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_fill_f32(float *p, size_t n, float value, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    fill_f32_kernel<<<256, 256, 0, stream>>>(p, n, value);
    return cudaGetLastError();
}
