/*
 * rope_kv.cu — RoPE on the fused Q/K/V projection plus the paged KV store, in one pass.
 *
 * Grid (token, part): each thread handles one rotation pair or one V element, so a single decode
 * token still spreads over many blocks. Q is rotated and written as bf16 for attention, K is rotated and V copied
 * straight into the token's cache slot (slot -1: skipped, used by padding rows). Angles are
 * computed in fp32 from precomputed inverse frequencies, as the CPU backend does.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

using namespace braid_cuda;

namespace {

__global__ void rope_kv_kernel(const float *qkv, const int32_t *positions, const int32_t *slots, CudaRopeShape sh,
                               uint16_t *q_out, uint16_t *k_cache, uint16_t *v_cache, int block_size) {
    int t = blockIdx.x, hd = sh.head_dim, half_hd = hd / 2, rope_half = sh.rope_dim / 2;
    int q_dim = sh.n_heads * hd, kv_dim = sh.n_kv_heads * hd;
    const float *row = qkv + (size_t)t * (q_dim + 2 * kv_dim);
    float pos = (float)positions[t] * sh.position_scale;
    int slot = slots[t];
    size_t block = slot >= 0 ? (size_t)(slot / block_size) : 0;
    int offset = slot >= 0 ? slot % block_size : 0;
    int n_pairs = (sh.n_heads + sh.n_kv_heads) * half_hd;
    int item = blockIdx.y * blockDim.x + threadIdx.x; /* [0, n_pairs): a pair; then V elements */
    if (item < n_pairs) {
        int e = item;
        int head = e / half_hd, i = e % half_hd;
        int a = 2 * i, b = 2 * i + 1; /* pass-through dims past rope_dim keep their places */
        if (i < rope_half && !sh.interleaved) {
            a = i;
            b = i + rope_half;
        }
        const float *src = row + (size_t)head * hd;
        float x0 = src[a], x1 = src[b];
        if (i < rope_half) {
            float s, c;
            sincosf(pos * sh.inv_freq[i], &s, &c);
            float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
            x0 = r0;
            x1 = r1;
        }
        if (head < sh.n_heads) {
            uint16_t *dst = q_out + (size_t)t * q_dim + (size_t)head * hd;
            dst[a] = f32_to_bf16(x0);
            dst[b] = f32_to_bf16(x1);
        } else if (slot >= 0) {
            int kvh = head - sh.n_heads;
            uint16_t *dst = k_cache + ((block * sh.n_kv_heads + kvh) * block_size + offset) * hd;
            dst[a] = f32_to_bf16(x0);
            dst[b] = f32_to_bf16(x1);
        }
    }
    if (slot < 0 || item < n_pairs || item >= n_pairs + kv_dim) return;
    const float *v = row + q_dim + kv_dim;
    {
        int e = item - n_pairs, kvh = e / hd, d = e % hd;
        v_cache[((block * sh.n_kv_heads + kvh) * block_size + offset) * hd + d] = f32_to_bf16(v[e]);
    }
}

}  // namespace

extern "C" cudaError_t cuda_rope_kv_store(const float *qkv, const int32_t *positions, const int32_t *slots, int n,
                                          const CudaRopeShape *shape, uint16_t *q_out, uint16_t *k_cache,
                                          uint16_t *v_cache, int block_size, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    int items = (shape->n_heads + shape->n_kv_heads) * shape->head_dim / 2 + shape->n_kv_heads * shape->head_dim;
    dim3 grid(n, (items + 127) / 128);
    rope_kv_kernel<<<grid, 128, 0, stream>>>(qkv, positions, slots, *shape, q_out, k_cache, v_cache, block_size);
    return cudaGetLastError();
}
