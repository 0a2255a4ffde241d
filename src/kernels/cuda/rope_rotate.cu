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

/* COPY_SLOTS: grid (items, layer); an item is one (KV head, slot, pair) of the range: both keys of
 * the pair turned by delta (as above) into the target slot, plus the pair's two values copied.
 * Items past rope_half copy dimensions 2·pair and 2·pair + 1 (all past rope_dim, in both pairings). */
__global__ void copy_slots_kernel(uint16_t *const *k_layers, uint16_t *const *v_layers, int32_t *slot_pos, CudaSlotCopy cp,
                                  CudaRopeShape sh, int block_size) {
    int hd = sh.head_dim, half = hd / 2, rope_half = sh.rope_dim / 2;
    int item = blockIdx.x * blockDim.x + threadIdx.x;
    if (blockIdx.x == 0 && blockIdx.y == 0)
        for (int s = threadIdx.x; s < cp.n_slots; s += blockDim.x)
            slot_pos[(size_t)cp.dst_block * block_size + cp.dst_slot + s] = slot_pos[(size_t)cp.src_block * block_size + cp.src_slot + s] + cp.delta;
    if (item >= sh.n_kv_heads * cp.n_slots * half) return;
    int pair = item % half, slot = (item / half) % cp.n_slots, head = item / (half * cp.n_slots);
    size_t src = (((size_t)cp.src_block * sh.n_kv_heads + head) * block_size + cp.src_slot + slot) * hd;
    size_t dst = (((size_t)cp.dst_block * sh.n_kv_heads + head) * block_size + cp.dst_slot + slot) * hd;
    const uint16_t *ks = k_layers[blockIdx.y] + src, *vs = v_layers[blockIdx.y] + src;
    uint16_t *kd = k_layers[blockIdx.y] + dst, *vd = v_layers[blockIdx.y] + dst;
    int a = 2 * pair, b = 2 * pair + 1; /* two dimensions per item, rotated when they form a RoPE pair */
    if (pair < rope_half && !sh.interleaved) a = pair, b = pair + rope_half; /* NeoX halves; past rope_dim 2·pair is right for both */
    vd[a] = vs[a];
    vd[b] = vs[b];
    if (pair >= rope_half || cp.delta == 0) {
        kd[a] = ks[a];
        kd[b] = ks[b];
        return;
    }
    float x0 = bf16_to_f32(ks[a]), x1 = bf16_to_f32(ks[b]), sn, cs;
    float pos = (float)cp.delta * sh.position_scale;
    sincosf(pos * sh.inv_freq[pair], &sn, &cs);
    kd[a] = f32_to_bf16(x0 * cs - x1 * sn);
    kd[b] = f32_to_bf16(x0 * sn + x1 * cs);
}

}  // namespace

extern "C" cudaError_t cuda_copy_slots(uint16_t *const *k_layers, uint16_t *const *v_layers, int n_layers, int32_t *slot_pos,
                                       const CudaSlotCopy *copy, const CudaRopeShape *shape, int block_size, cudaStream_t stream) {
    int items = shape->n_kv_heads * copy->n_slots * (shape->head_dim / 2);
    if (n_layers <= 0 || items <= 0) return cudaSuccess;
    dim3 grid((items + ROTATE_THREADS - 1) / ROTATE_THREADS, n_layers);
    copy_slots_kernel<<<grid, ROTATE_THREADS, 0, stream>>>(k_layers, v_layers, slot_pos, *copy, *shape, block_size);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_rotate_block_keys(uint16_t *const *k_layers, int n_layers, int32_t *slot_pos, int32_t block,
                                              int32_t delta, const CudaRopeShape *shape, int block_size,
                                              cudaStream_t stream) {
    int pairs = shape->n_kv_heads * block_size * (shape->rope_dim / 2);
    if (n_layers <= 0 || pairs <= 0) return cudaSuccess;
    dim3 grid((pairs + ROTATE_THREADS - 1) / ROTATE_THREADS, n_layers);
    rotate_block_keys_kernel<<<grid, ROTATE_THREADS, 0, stream>>>(k_layers, slot_pos, block, delta, *shape, block_size);
    return cudaGetLastError();
}
