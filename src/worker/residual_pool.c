#include "worker/residual_pool.h"

#include "worker/kv_pool.h"

#include <stdlib.h>
#include <string.h>

size_t residual_pool_block_bytes(const ModelConfig *cfg, int block_size, int rank) {
    return 2u * (size_t)cfg->n_layers * (size_t)block_size * (size_t)rank * sizeof(uint16_t);
}

int residual_pool_create(ResidualPool *pool, const ModelConfig *cfg, int n_blocks, int block_size, int rank, BraidError *err) {
    memset(pool, 0, sizeof *pool);
    if (n_blocks < 2 || block_size < 1 || rank < 1)
        return braid_error_set(err, "residual pool: need at least 2 blocks of at least 1 slot and rank >= 1, got %d x %d, rank %d",
                               n_blocks, block_size, rank);
    pool->n_layers = cfg->n_layers;
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    pool->rank = rank;
    size_t per_layer = (size_t)n_blocks * block_size * rank;
    if (kv_layers_alloc(&pool->k, &pool->v, cfg->n_layers, per_layer) == 0) {
        pool->bytes = 2 * per_layer * sizeof **pool->k * (size_t)cfg->n_layers;
        return 0;
    }
    residual_pool_destroy(pool);
    return braid_error_set(err, "residual pool: out of memory for %d blocks of %d tokens at rank %d", n_blocks, block_size, rank);
}

void residual_pool_destroy(ResidualPool *pool) {
    kv_layers_free(pool->k, pool->v, pool->n_layers);
    memset(pool, 0, sizeof *pool);
}

ResidualLayerView residual_pool_layer(const ResidualPool *pool, int layer) {
    return (ResidualLayerView){.k = pool->k[layer], .v = pool->v[layer], .block_size = pool->block_size, .rank = pool->rank};
}
