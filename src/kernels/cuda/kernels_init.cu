/*
 * kernels_init.cu — one-time per-device set-up of the kernels and what they support.
 */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

extern "C" cudaError_t cuda_kernels_init(void) {
    cudaError_t e = cuda_attention_prefill_init();
    if (e == cudaSuccess) e = cuda_attention_prefill_flash_init();
    return e != cudaSuccess ? e : cuda_residual_attention_init();
}

extern "C" int cuda_kernels_shape_supported(int head_dim, int n_heads, int n_kv_heads) {
    if (head_dim != 64 && head_dim != 128) return 0;
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return 0;
    return cuda_decode_group_supported(n_heads / n_kv_heads);
}
