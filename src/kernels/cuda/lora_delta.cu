/*
 * lora_delta.cu — the per-token LoRA work of a mixed multi-adapter batch on the CUDA backend:
 * the delta y += scale · B · (A · x) of an adapted projection, and ForkKV's residual projection
 * (x · A_k, x · A_v into the residual pool). Contracts in cuda_kernels.h.
 *
 * The delta runs as two launches, the shrink (u = scale · A · x, rank values per token) and the
 * expand (y += B · u), because the two products have opposite shapes: the shrink reduces over the
 * projection's whole input, a warp per rank row; the expand fans u out to every output, a thread
 * per output. One kernel per token would either recompute A · x for every output chunk or leave a
 * decode step (a handful of tokens) on a handful of SMs.
 * Every token looks up its own adapter, so base-model tokens and tokens of different adapters
 * share a launch; the A and B of a token's adapter are read through the id-indexed tables.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

using namespace braid_cuda;

namespace {

constexpr int WARPS = 4, EXPAND_THREADS = 128;

/* The pair adapter `id` holds for one projection; a == NULL when there is none (the base model,
 * an id out of range, or an adapter that leaves the projection alone). */
struct TokenLora {
    const float *a, *b;
    int rank;
    float scale;
};

__device__ TokenLora token_lora(const CudaLoraProjection &p, int id) {
    TokenLora lo = {nullptr, nullptr, 0, 0.0f};
    if (id <= 0 || id >= p.n_ids) return lo;
    lo.a = p.a[id];
    lo.b = p.b[id];
    /* A rank past the scratch width would write into the next token's row. */
    lo.rank = min((int)p.rank[id], p.max_rank);
    lo.scale = p.scale[id];
    return lo;
}

/* A[row] · x over one warp, lanes striding the input; every lane gets the sum. */
__device__ float warp_dot(const float *a_row, const uint16_t *x, int in) {
    float s = 0.0f;
    for (int i = threadIdx.x & 31; i < in; i += 32) s += a_row[i] * bf16_to_f32(x[i]);
    return warp_sum(s);
}

/* Grid (token, WARPS rank rows): u[t, r] = scale · A[r] · x[t]. */
__global__ void __launch_bounds__(WARPS * 32) shrink_kernel(CudaLoraProjection p, const int32_t *token_adapter,
                                                            const uint16_t *x, int in, float *u) {
    int t = blockIdx.x, r = blockIdx.y * WARPS + (threadIdx.x >> 5);
    TokenLora lo = token_lora(p, token_adapter[t]);
    if (!lo.a || !lo.b || r >= lo.rank) return;
    float s = warp_dot(lo.a + (size_t)r * in, x + (size_t)t * in, in);
    if ((threadIdx.x & 31) == 0) u[(size_t)t * p.max_rank + r] = lo.scale * s;
}

/* Grid (token, EXPAND_THREADS outputs): y[t, o] += B[o] · u[t]. */
__global__ void __launch_bounds__(EXPAND_THREADS) expand_kernel(CudaLoraProjection p, const int32_t *token_adapter,
                                                                const float *u, float *y, int y_stride, int out) {
    __shared__ float u_s[CUDA_LORA_MAX_RANK];
    int t = blockIdx.x;
    TokenLora lo = token_lora(p, token_adapter[t]);
    if (!lo.a || !lo.b) return; /* the whole block agrees: one token */
    for (int c = threadIdx.x; c < lo.rank; c += blockDim.x) u_s[c] = u[(size_t)t * p.max_rank + c];
    __syncthreads();
    int o = blockIdx.y * EXPAND_THREADS + threadIdx.x;
    if (o >= out) return;
    const float *brow = lo.b + (size_t)o * lo.rank;
    float s = 0.0f;
    for (int c = 0; c < lo.rank; c++) s += brow[c] * u_s[c];
    y[(size_t)t * y_stride + o] += s;
}

/* Grid (token, WARPS residual lanes, K or V): res[slot, c] = bf16(A[c] · x[t]), 0 past the rank. */
__global__ void __launch_bounds__(WARPS * 32) residual_store_kernel(CudaLoraProjection k_proj, CudaLoraProjection v_proj,
                                                                    const int32_t *token_adapter, const uint16_t *x, int in,
                                                                    const int32_t *slots, CudaResidualLayer res) {
    int t = blockIdx.x, c = blockIdx.y * WARPS + (threadIdx.x >> 5);
    bool is_v = blockIdx.z == 1;
    const CudaLoraProjection &p = is_v ? v_proj : k_proj;
    int id = token_adapter[t], slot = slots[t];
    if (id <= 0 || id >= p.n_ids || slot < 0 || c >= res.rank) return;
    TokenLora lo = token_lora(p, id);
    float s = lo.a && c < lo.rank ? warp_dot(lo.a + (size_t)c * in, x + (size_t)t * in, in) : 0.0f;
    if ((threadIdx.x & 31) == 0) (is_v ? res.v : res.k)[(size_t)slot * res.rank + c] = f32_to_bf16(s);
}

bool projection_valid(const CudaLoraProjection *p) {
    return p->n_ids >= 1 && p->max_rank >= 1 && p->max_rank <= CUDA_LORA_MAX_RANK;
}

}  // namespace

extern "C" cudaError_t cuda_lora_delta(const CudaLoraProjection *proj, const int32_t *token_adapter, const uint16_t *x, int n,
                                       int in, float *y, int y_stride, int out, float *scratch, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (!projection_valid(proj) || in <= 0 || out <= 0 || y_stride < out) return cudaErrorInvalidValue;
    shrink_kernel<<<dim3(n, (proj->max_rank + WARPS - 1) / WARPS), WARPS * 32, 0, stream>>>(*proj, token_adapter, x, in,
                                                                                            scratch);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    expand_kernel<<<dim3(n, (out + EXPAND_THREADS - 1) / EXPAND_THREADS), EXPAND_THREADS, 0, stream>>>(
        *proj, token_adapter, scratch, y, y_stride, out);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_lora_residual_store(const CudaLoraProjection *k_proj, const CudaLoraProjection *v_proj,
                                                const int32_t *token_adapter, const uint16_t *x, int n, int in,
                                                const int32_t *slots, const CudaResidualLayer *res, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (!projection_valid(k_proj) || !projection_valid(v_proj) || in <= 0 || res->rank < 1 || res->rank > CUDA_LORA_MAX_RANK)
        return cudaErrorInvalidValue;
    residual_store_kernel<<<dim3(n, (res->rank + WARPS - 1) / WARPS, 2), WARPS * 32, 0, stream>>>(*k_proj, *v_proj,
                                                                                                  token_adapter, x, in, slots,
                                                                                                  *res);
    return cudaGetLastError();
}
