/*
 * rope_rotate.cu — the ROTATE cache operation on the GPU: re-positions one KV block's keys by a
 * signed number of positions, in place, in every layer.
 *
 * RoPE at position p rotates each pair of a key by the angle p·θ_i, so the key of position p + Δ is
 * the key of position p turned by Δ·θ_i: R(p + Δ) = R(Δ) R(p). The kernel widens each stored bf16
 * pair to fp32, applies R(Δ) with the angle computed exactly as rope_kv.cu computes a position's
 * ((Δ · position_scale) · inv_freq[i], the same inverse-frequency table), and rounds back to bf16
 * once. Grid (pair chunks, layer): one thread per rotation pair of the block; dimensions past
 * rope_dim and the values are never touched. The block's recorded slot positions move by Δ.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

using namespace braid_cuda;

namespace {

#define ROTATE_THREADS 256

__global__ void rotate_block_keys_kernel(uint16_t *const *k_layers, int32_t *slot_pos, int32_t block, int32_t delta,
                                         CudaRopeShape sh, int block_size) {
    int hd = sh.head_dim, rope_half = sh.rope_dim / 2, rows = sh.n_kv_heads * block_size;
    int item = blockIdx.x * blockDim.x + threadIdx.x;
    if (blockIdx.x == 0 && blockIdx.y == 0)
        for (int s = threadIdx.x; s < block_size; s += blockDim.x) slot_pos[(size_t)block * block_size + s] += delta;
    if (item >= rows * rope_half) return;
    int row = item / rope_half, i = item % rope_half;
    int a = sh.interleaved ? 2 * i : i, b = sh.interleaved ? 2 * i + 1 : i + rope_half;
    uint16_t *k = k_layers[blockIdx.y] + ((size_t)block * rows + row) * hd;
    float x0 = bf16_to_f32(k[a]), x1 = bf16_to_f32(k[b]), s, c;
    float pos = (float)delta * sh.position_scale; /* as rope_kv.cu forms a position's angle */
    sincosf(pos * sh.inv_freq[i], &s, &c);
    k[a] = f32_to_bf16(x0 * c - x1 * s);
    k[b] = f32_to_bf16(x0 * s + x1 * c);
}

}  // namespace

extern "C" cudaError_t cuda_rotate_block_keys(uint16_t *const *k_layers, int n_layers, int32_t *slot_pos, int32_t block,
                                              int32_t delta, const CudaRopeShape *shape, int block_size,
                                              cudaStream_t stream) {
    int pairs = shape->n_kv_heads * block_size * (shape->rope_dim / 2);
    if (n_layers <= 0 || pairs <= 0) return cudaSuccess;
    dim3 grid((pairs + ROTATE_THREADS - 1) / ROTATE_THREADS, n_layers);
    rotate_block_keys_kernel<<<grid, ROTATE_THREADS, 0, stream>>>(k_layers, slot_pos, block, delta, *shape, block_size);
    return cudaGetLastError();
}
