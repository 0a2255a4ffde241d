/*
 * cuda_common.cuh — small device helpers shared by Braid's CUDA kernels (bf16 conversion, warp
 * reductions). Internal to src/kernels/cuda.
 */
#ifndef BRAID_KERNELS_CUDA_COMMON_CUH
#define BRAID_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

/* Set-up hooks of individual kernel files, called by kernels_init.cu. */
extern "C" cudaError_t cuda_attention_prefill_init(void);
extern "C" cudaError_t cuda_attention_prefill_flash_init(void);
extern "C" cudaError_t cuda_residual_attention_init(void);
extern "C" int cuda_decode_group_supported(int group);

namespace braid_cuda {

__device__ __forceinline__ float bf16_to_f32(uint16_t bits) { return __uint_as_float((uint32_t)bits << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it. */
__device__ __forceinline__ float block_sum(float v, float *scratch32) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch32[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch32[lane] : 0.0f;
    return warp_sum(v);
}

/* Unpacks 8 bf16 values held in a 16-byte vector. */
__device__ __forceinline__ void unpack8(uint4 raw, float out[8]) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

}  // namespace braid_cuda

#endif
