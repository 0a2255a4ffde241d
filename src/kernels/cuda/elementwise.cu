/*
 * elementwise.cu — row-wise kernels of the forward pass: embedding gather, RMSNorm, SwiGLU, and the
 * Q/K/V bias + per-head Q/K RMSNorm of qwen2 / qwen3.
 * Memory-bound; each reads its input once and writes its output once, in fp32 arithmetic.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

using namespace braid_cuda;

namespace {

__global__ void embed_kernel(const uint16_t *table, const int32_t *tokens, int dim, float *x) {
    const uint16_t *row = table + (size_t)tokens[blockIdx.x] * dim;
    float *dst = x + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = bf16_to_f32(row[i]);
}

__global__ void rmsnorm_kernel(const float *x, const int32_t *rows, int dim, const float *weight, float eps,
                               uint16_t *out) {
    __shared__ float scratch[32];
    int src_row = rows ? rows[blockIdx.x] : (int)blockIdx.x;
    const float *in = x + (size_t)src_row * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += in[i] * in[i];
    ss = block_sum(ss, scratch);
    float inv = rsqrtf(ss / (float)dim + eps);
    uint16_t *dst = out + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = f32_to_bf16(in[i] * inv * weight[i]);
}

/* Grid-stride over all n * ff outputs, so a single decode row still spreads over the GPU. */
__global__ void swiglu_kernel(const uint16_t *gate_up, size_t total, int ff, uint16_t *out) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t t = e / ff, i = e % ff;
        float gv = bf16_to_f32(gate_up[t * 2 * ff + i]), uv = bf16_to_f32(gate_up[t * 2 * ff + ff + i]);
        out[e] = f32_to_bf16(gv / (1.0f + expf(-gv)) * uv);
    }
}

/* One block per (token, head of the fused Q|K|V row): bias added, then the head's RMSNorm when its
 * part (Q or K) has a norm weight. The norm decision is uniform across the block. */
__global__ void qkv_bias_norm_kernel(float *qkv, int n_heads, int n_kv_heads, int hd, const float *bias, const float *q_norm,
                                     const float *k_norm, float eps) {
    __shared__ float scratch[32];
    int head = blockIdx.y;
    size_t width = (size_t)(n_heads + 2 * n_kv_heads) * hd;
    float *row = qkv + blockIdx.x * width + (size_t)head * hd;
    const float *b = bias ? bias + (size_t)head * hd : nullptr;
    const float *w = head < n_heads ? q_norm : head < n_heads + n_kv_heads ? k_norm : nullptr;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = row[i] + (b ? b[i] : 0.0f);
        row[i] = v;
        ss += v * v;
    }
    if (!w) return;
    ss = block_sum(ss, scratch);
    float inv = rsqrtf(ss / (float)hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) row[i] = row[i] * inv * w[i];
}

}  // namespace

extern "C" cudaError_t cuda_qkv_bias_norm(float *qkv, int n, int n_heads, int n_kv_heads, int head_dim, const float *bias,
                                          const float *q_norm, const float *k_norm, float eps, cudaStream_t stream) {
    if (n <= 0 || (!bias && !q_norm && !k_norm)) return cudaSuccess;
    /* Without norms only the heads that carry a bias need a block: all of them (Q, K and V). */
    qkv_bias_norm_kernel<<<dim3(n, n_heads + 2 * n_kv_heads), 128, 0, stream>>>(qkv, n_heads, n_kv_heads, head_dim, bias,
                                                                                 q_norm, k_norm, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_embed(const uint16_t *table, const int32_t *tokens, int n, int dim, float *x,
                                  cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    embed_kernel<<<n, 256, 0, stream>>>(table, tokens, dim, x);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_rmsnorm(const float *x, const int32_t *rows, int n, int dim, const float *weight, float eps,
                                    uint16_t *out, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    /* One block per row; wide rows get more threads so a lone decode row is not latency-bound. */
    rmsnorm_kernel<<<n, dim >= 2048 ? 1024 : 256, 0, stream>>>(x, rows, dim, weight, eps, out);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_swiglu(const uint16_t *gate_up, int n, int ff, uint16_t *out, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    size_t total = (size_t)n * ff;
    size_t blocks = (total + 255) / 256;
    swiglu_kernel<<<blocks < 8192 ? (unsigned)blocks : 8192u, 256, 0, stream>>>(gate_up, total, ff, out);
    return cudaGetLastError();
}
