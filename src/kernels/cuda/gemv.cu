/*
 * gemv.cu — y (n, out) = x (n, in) · Wᵀ for a handful of tokens (n <= 8), the decode-step shape.
 *
 * At these sizes the product is a pure stream over W: one warp per output row reads the row once
 * in 16-byte vectors (several in flight per lane) and dots it with all n token vectors, which stay
 * in L1/L2 because every warp reads them. Accumulation is fp32; the output is fp32 (optionally
 * added to what is there, for residual adds) or bf16. cuBLAS serves larger n.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

using namespace braid_cuda;

namespace {

constexpr int ROWS_PER_BLOCK = 8;

__device__ __forceinline__ uint4 load_streaming(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

template <int N>
__global__ void __launch_bounds__(ROWS_PER_BLOCK * 32) gemv_kernel(const uint16_t *w, int out, int in, const uint16_t *x,
                                                                  void *y, int y_fp32, int accumulate) {
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= out) return;
    const uint4 *wr = reinterpret_cast<const uint4 *>(w + (size_t)row * in);
    int n_vec = in / 8;
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; j++) acc[j] = 0.0f;
    /* Issue DEPTH row loads per lane before using any, to keep enough bytes in flight. */
    constexpr int DEPTH = 8;
    for (int base = lane; base < n_vec; base += 32 * DEPTH) {
        uint4 wv[DEPTH];
#pragma unroll
        for (int u = 0; u < DEPTH; u++)
            if (base + u * 32 < n_vec) wv[u] = load_streaming(wr + base + u * 32);
#pragma unroll
        for (int u = 0; u < DEPTH; u++) {
            int v = base + u * 32;
            if (v >= n_vec) break;
            float wf[8];
            unpack8(wv[u], wf);
#pragma unroll
            for (int j = 0; j < N; j++) {
                float xf[8];
                unpack8(__ldg(reinterpret_cast<const uint4 *>(x + (size_t)j * in) + v), xf);
#pragma unroll
                for (int k = 0; k < 8; k++) acc[j] += wf[k] * xf[k];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < N; j++) {
        float s = warp_sum(acc[j]);
        if (lane != 0) continue;
        size_t at = (size_t)j * out + row;
        if (y_fp32) {
            float *yf = static_cast<float *>(y);
            yf[at] = accumulate ? yf[at] + s : s;
        } else {
            static_cast<uint16_t *>(y)[at] = f32_to_bf16(s);
        }
    }
}

template <int N>
cudaError_t launch(const uint16_t *w, int out, int in, const uint16_t *x, void *y, int y_fp32, int accumulate,
                   cudaStream_t stream) {
    gemv_kernel<N><<<(out + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, ROWS_PER_BLOCK * 32, 0, stream>>>(w, out, in, x, y, y_fp32,
                                                                                                  accumulate);
    return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t cuda_gemv_bf16(const uint16_t *w, int out, int in, const uint16_t *x, int n, void *y, int y_fp32,
                                      int accumulate, cudaStream_t stream) {
    if (in % 8 != 0) return cudaErrorInvalidValue;
    switch (n) {
    case 1: return launch<1>(w, out, in, x, y, y_fp32, accumulate, stream);
    case 2: return launch<2>(w, out, in, x, y, y_fp32, accumulate, stream);
    case 3: return launch<3>(w, out, in, x, y, y_fp32, accumulate, stream);
    case 4: return launch<4>(w, out, in, x, y, y_fp32, accumulate, stream);
    case 5: return launch<5>(w, out, in, x, y, y_fp32, accumulate, stream);
    case 6: return launch<6>(w, out, in, x, y, y_fp32, accumulate, stream);
    case 7: return launch<7>(w, out, in, x, y, y_fp32, accumulate, stream);
    case 8: return launch<8>(w, out, in, x, y, y_fp32, accumulate, stream);
    default: return cudaErrorInvalidValue;
    }
}
