#include "worker/kv_pool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"

size_t kv_pool_block_bytes(const ModelConfig *cfg, int block_size) {
    return 2u * (size_t)cfg->n_layers * (size_t)cfg->n_kv_heads * (size_t)block_size * (size_t)cfg->head_dim * sizeof(uint16_t);
}

int kv_pool_create(KvPool *pool, const ModelConfig *cfg, int n_blocks, int block_size, BraidError *err) {
    memset(pool, 0, sizeof *pool);
    if (n_blocks < 2 || block_size < 1)
        return braid_error_set(err, "kv pool: need at least 2 blocks (one is the null block) of at least 1 slot, got %d x %d",
                               n_blocks, block_size);
    pool->n_layers = cfg->n_layers;
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    pool->n_kv_heads = cfg->n_kv_heads;
    pool->head_dim = cfg->head_dim;
    size_t per_layer = (size_t)n_blocks * cfg->n_kv_heads * block_size * cfg->head_dim;
    pool->slot_pos = calloc((size_t)n_blocks * block_size, sizeof *pool->slot_pos);
    if (!pool->slot_pos || kv_layers_alloc(&pool->k, &pool->v, cfg->n_layers, per_layer)) goto oom;
    pool->bytes = 2 * per_layer * sizeof **pool->k * (size_t)cfg->n_layers;
    return 0;
oom:
    kv_pool_destroy(pool);
    return braid_error_set(err, "kv pool: out of memory for %d blocks of %d tokens (%.1f MiB)", n_blocks, block_size,
                           (double)kv_pool_block_bytes(cfg, block_size) * n_blocks / (1 << 20));
}

int kv_layers_alloc(uint16_t ***k, uint16_t ***v, int n_layers, size_t per_layer) {
    *k = calloc((size_t)n_layers, sizeof **k);
    *v = calloc((size_t)n_layers, sizeof **v);
    if (!*k || !*v || n_layers < 1) return -1;
    /* One allocation for every layer's K then every layer's V: a pool is one contiguous region, so
     * another instance can read its blocks through a single registration (kv_moves.h). */
    uint16_t *all = calloc(2 * (size_t)n_layers * per_layer, sizeof *all);
    if (!all) return -1;
    for (int l = 0; l < n_layers; l++) {
        (*k)[l] = all + (size_t)l * per_layer;
        (*v)[l] = all + ((size_t)n_layers + l) * per_layer;
    }
    return 0;
}

void kv_layers_free(uint16_t **k, uint16_t **v, int n_layers) {
    if (k && n_layers > 0) free(k[0]); /* the one allocation behind every layer (kv_layers_alloc) */
    free(k);
    free(v);
}

void kv_pool_destroy(KvPool *pool) {
    kv_layers_free(pool->k, pool->v, pool->n_layers);
    free(pool->slot_pos);
    memset(pool, 0, sizeof *pool);
}

KvLayerView kv_pool_layer(const KvPool *pool, int layer) {
    KvLayerView view = {
        .k = pool->k[layer],
        .v = pool->v[layer],
        .slot_pos = pool->slot_pos,
        .block_size = pool->block_size,
        .n_kv_heads = pool->n_kv_heads,
        .head_dim = pool->head_dim,
    };
    return view;
}

void kv_pool_copy_block(const KvPool *src, int32_t src_block, KvPool *dst, int32_t dst_block) {
    assert(src->n_layers == dst->n_layers && src->n_kv_heads == dst->n_kv_heads && src->block_size == dst->block_size &&
           src->head_dim == dst->head_dim);
    assert(src_block >= 0 && src_block < src->n_blocks && dst_block >= 0 && dst_block < dst->n_blocks);
    assert(src != dst || src_block != dst_block);
    size_t block_elems = (size_t)src->n_kv_heads * src->block_size * src->head_dim;
    size_t s = (size_t)src_block * block_elems, d = (size_t)dst_block * block_elems;
    for (int l = 0; l < src->n_layers; l++) {
        memcpy(dst->k[l] + d, src->k[l] + s, block_elems * sizeof **src->k);
        memcpy(dst->v[l] + d, src->v[l] + s, block_elems * sizeof **src->v);
    }
    memcpy(dst->slot_pos + (size_t)dst_block * dst->block_size, src->slot_pos + (size_t)src_block * src->block_size,
           (size_t)src->block_size * sizeof *src->slot_pos);
}

void kv_pool_rotate_block(KvPool *pool, int32_t block, int32_t delta, int rope_dim, RopePairing pairing, const float *cos_v,
                          const float *sin_v) {
    assert(block >= 0 && block < pool->n_blocks && rope_dim <= pool->head_dim);
    int rows = pool->n_kv_heads * pool->block_size; /* a block's keys are contiguous in each layer */
    size_t first = (size_t)block * rows * pool->head_dim;
    /* Layers are independent; below ~32K key values the threads' start-up costs more than it saves. */
#pragma omp parallel for schedule(static) if ((size_t)pool->n_layers * rows * pool->head_dim >= 32768)
    for (int l = 0; l < pool->n_layers; l++)
        cpu_rope_rotate_f16(pool->k[l] + first, rows, pool->head_dim, rope_dim, pairing, cos_v, sin_v);
    int32_t *pos = pool->slot_pos + (size_t)block * pool->block_size;
    for (int s = 0; s < pool->block_size; s++) pos[s] += delta;
}

void kv_pool_copy_slots(KvPool *pool, int32_t src_block, int src_slot, int32_t dst_block, int dst_slot, int n, int32_t delta,
                        int rope_dim, RopePairing pairing, const float *cos_v, const float *sin_v) {
    int bs = pool->block_size, hd = pool->head_dim, heads = pool->n_kv_heads;
    assert(src_block > 0 && src_block < pool->n_blocks && dst_block > 0 && dst_block < pool->n_blocks && src_block != dst_block);
    assert(n > 0 && src_slot >= 0 && dst_slot >= 0 && src_slot + n <= bs && dst_slot + n <= bs && rope_dim <= hd);
    size_t rows = (size_t)n * hd;
    for (int l = 0; l < pool->n_layers; l++)
        for (int h = 0; h < heads; h++) { /* a head's slots are contiguous inside a block */
            size_t s = (((size_t)src_block * heads + h) * bs + src_slot) * hd, d = (((size_t)dst_block * heads + h) * bs + dst_slot) * hd;
            memcpy(pool->k[l] + d, pool->k[l] + s, rows * sizeof **pool->k);
            memcpy(pool->v[l] + d, pool->v[l] + s, rows * sizeof **pool->v);
            if (delta != 0) cpu_rope_rotate_f16(pool->k[l] + d, n, hd, rope_dim, pairing, cos_v, sin_v);
        }
    const int32_t *from = pool->slot_pos + (size_t)src_block * bs + src_slot;
    int32_t *to = pool->slot_pos + (size_t)dst_block * bs + dst_slot;
    for (int s = 0; s < n; s++) to[s] = from[s] + delta;
}
