/* kv_stage_layout.c — kv_stage_layout.h: the window layout of a staged KV loan, as piece lists. */
#include "worker/kv_stage_layout.h"

#include <stdlib.h>

size_t kv_stage_block_bytes(const KvStagePool *pool) {
    return 2 * (size_t)pool->n_layers * pool->block_layer_bytes + (size_t)pool->block_size * sizeof(int32_t);
}

/* Where plane `plane` (window order: every layer's K, then every layer's V) of block 0 sits in pool. */
static uint64_t plane_base(const KvStagePool *pool, size_t plane) {
    size_t layers = (size_t)pool->n_layers, stride = (size_t)pool->n_blocks * pool->block_layer_bytes;
    size_t at = pool->kv_interleaved ? 2 * (plane % layers) + plane / layers : plane;
    return pool->kv + at * stride;
}

int kv_stage_lender_pieces_tiered(const KvStagePool pools[2], const uint8_t *tiers, const int32_t *blocks, int n, StagePiece **out,
                                  BraidError *err) {
    *out = NULL;
    const KvStagePool *dev = &pools[0];
    if (pools[1].n_blocks > 0 && (pools[1].n_layers != dev->n_layers || pools[1].block_size != dev->block_size ||
                                  pools[1].block_layer_bytes != dev->block_layer_bytes))
        return braid_error_set(err, "staged move: the host tier's geometry differs from the device pool's");
    size_t planes = 2 * (size_t)dev->n_layers, blb = dev->block_layer_bytes, pos = (size_t)dev->block_size * sizeof(int32_t);
    size_t un = (size_t)n;
    for (int i = 0; i < n; i++) {
        int t = tiers ? tiers[i] : 0;
        if (t < 0 || t > 1 || pools[t].n_blocks == 0)
            return braid_error_set(err, "staged move: lent block %d is in tier %d, which this instance does not stage", blocks[i], t);
        if (blocks[i] < 0 || blocks[i] >= pools[t].n_blocks)
            return braid_error_set(err, "staged move: lent block %d out of the %s", blocks[i], t ? "host tier" : "pool");
    }
    StagePiece *p = malloc((planes + 1) * (un + 1) * sizeof *p);
    if (!p) return braid_error_set(err, "staged move: out of memory");
    int np = 0;
    for (size_t plane = 0; plane <= planes; plane++) /* plane == planes: the positions */
        for (int i = 0; i < n;) {
            int t = tiers ? tiers[i] : 0, run = 1;
            while (i + run < n && (tiers ? tiers[i + run] : 0) == t && blocks[i + run] == blocks[i] + run) run++;
            const KvStagePool *pool = &pools[t];
            size_t b = (size_t)blocks[i], slot = (size_t)i, count = (size_t)run;
            if (plane < planes)
                p[np++] = (StagePiece){.src = plane_base(pool, plane) + b * blb, .dst = (plane * un + slot) * blb, .len = count * blb};
            else
                p[np++] = (StagePiece){.src = pool->slot_pos + b * pos, .dst = planes * un * blb + slot * pos, .len = count * pos};
            i += run;
        }
    *out = p;
    return np;
}

int kv_stage_lender_pieces(const KvStagePool *pool, const int32_t *blocks, int n, StagePiece **out, BraidError *err) {
    KvStagePool pools[2] = {*pool, {0}};
    return kv_stage_lender_pieces_tiered(pools, NULL, blocks, n, out, err);
}

int kv_stage_borrower_pieces(const KvStagePool *pool, int n_window, const MoveRun *runs, int n_runs, StagePiece **out, BraidError *err) {
    *out = NULL;
    size_t planes = 2 * (size_t)pool->n_layers, blb = pool->block_layer_bytes, pos = (size_t)pool->block_size * sizeof(int32_t);
    size_t N = (size_t)pool->n_blocks, n = (size_t)n_window;
    for (int k = 0; k < n_runs; k++) {
        const MoveRun *r = &runs[k];
        if (r->tier != 0 || r->src < 0 || r->count < 1 || (size_t)r->src + (size_t)r->count > n || r->dst < 1 || (size_t)r->dst + (size_t)r->count > N)
            return braid_error_set(err, "staged move: run %d (window slots %d.., %d blocks, into %d..) out of range", k, r->src, r->count, r->dst);
    }
    StagePiece *p = malloc((planes + 1) * ((size_t)n_runs + 1) * sizeof *p);
    if (!p) return braid_error_set(err, "staged move: out of memory");
    int np = 0;
    for (size_t plane = 0; plane <= planes; plane++)
        for (int k = 0; k < n_runs; k++) {
            size_t src = (size_t)runs[k].src, dst = (size_t)runs[k].dst, count = (size_t)runs[k].count;
            if (plane < planes)
                p[np++] = (StagePiece){.src = (plane * n + src) * blb, .dst = plane_base(pool, plane) + dst * blb, .len = count * blb};
            else
                p[np++] = (StagePiece){.src = planes * n * blb + src * pos, .dst = pool->slot_pos + dst * pos, .len = count * pos};
        }
    *out = p;
    return np;
}
