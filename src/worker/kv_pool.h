/*
 * kv_pool.h — the worker's paged KV memory (CPU backend: IEEE fp16).
 *
 * Owns: per layer K and V arrays (n_blocks, n_kv_heads, block_size, head_dim) of halves (half the
 * bytes of fp32: decode streams the whole cache each step, and twice the blocks fit) and the per-slot
 * recorded positions (n_blocks, block_size). Block 0 is the null block: valid memory that padding
 * may write, never handed out by the cache. Which blocks belong to whom is decided elsewhere
 * (src/cache); this module only holds the memory. The CPU backend's host tier is a second pool
 * of the same layout; kv_pool_copy_block moves one block between (or within) pools, and
 * kv_pool_rotate_block re-positions one block's keys (the ROTATE cache operation).
 * Thread-safety: the forward pass writes slots of the sequences in its plan; no locking here.
 */
#ifndef BRAID_WORKER_KV_POOL_H
#define BRAID_WORKER_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "model/model_config.h"

typedef struct {
    int n_layers, n_blocks, block_size, n_kv_heads, head_dim;
    uint16_t **k, **v;  /* per layer (n_blocks, n_kv_heads, block_size, head_dim) IEEE half */
    int32_t *slot_pos;  /* (n_blocks, block_size) position of the token in each slot */
    size_t bytes;
} KvPool;

int kv_pool_create(KvPool *pool, const ModelConfig *cfg, int n_blocks, int block_size, BraidError *err);
void kv_pool_destroy(KvPool *pool);
/* n_layers zeroed K and V arrays of per_layer halves each (the pools' layer storage), carved from one
 * allocation at k[0]: every layer's K, then every layer's V, so a pool is one contiguous region of
 * 2 * n_layers * per_layer halves (KV block moves register it whole). -1 when out of memory,
 * leaving what was allocated for kv_layers_free (which takes partial allocations). */
int kv_layers_alloc(uint16_t ***k, uint16_t ***v, int n_layers, size_t per_layer);
void kv_layers_free(uint16_t **k, uint16_t **v, int n_layers);
KvLayerView kv_pool_layer(const KvPool *pool, int layer);
/* Bytes one block takes across all layers (K + V). */
size_t kv_pool_block_bytes(const ModelConfig *cfg, int block_size);
/* Copies block src_block of src to block dst_block of dst: every layer's K and V (all of the pool's
 * KV heads) and the recorded slot positions. The pools must have the same geometry (layers, KV
 * heads, block size, head_dim) and the ids must be in range (asserted: callers validate them);
 * src and dst may be the same pool, but then the blocks must differ. */
void kv_pool_copy_block(const KvPool *src, int32_t src_block, KvPool *dst, int32_t dst_block);
/* The ROTATE cache operation on one block: every layer's keys of every slot and KV head of the
 * pool are re-positioned by delta (their first rope_dim dimensions rotated, in fp32, by the angles
 * cos/sin (rope_dim/2) of the position difference delta, see cpu_rope_angles; rounded back to
 * half), and the slots' recorded positions move by delta. Values and dimensions past rope_dim are
 * untouched. All block_size slots are rotated: slots past a partial block's fill hold no token and
 * attention never reads them. block must be in range (asserted: callers validate it). */
void kv_pool_rotate_block(KvPool *pool, int32_t block, int32_t delta, int rope_dim, RopePairing pairing, const float *cos_v,
                          const float *sin_v);
/* The COPY_SLOTS cache operation: slots [src_slot, src_slot + n) of block src_block to slots
 * [dst_slot, dst_slot + n) of dst_block (another block of the same pool), every layer and KV head:
 * values copied, keys copied then re-positioned by delta like kv_pool_rotate_block (cos/sin of
 * delta; delta 0 copies them unchanged), recorded positions copied plus delta. Asserted in range. */
void kv_pool_copy_slots(KvPool *pool, int32_t src_block, int src_slot, int32_t dst_block, int dst_slot, int n, int32_t delta,
                        int rope_dim, RopePairing pairing, const float *cos_v, const float *sin_v);

#endif
