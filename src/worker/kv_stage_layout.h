/*
 * kv_stage_layout.h — where a host-staged KV loan's bytes sit (worker/kv_move_cuda_staged.h), on both
 * sides of the wire, in plain C so the two sides are checked against each other on the CPU
 * (tests/unit/test_kv_stage_pipe.c).
 *
 * The window's data for n lent blocks: for each of the 2 * n_layers planes (every layer's K, then
 * every layer's V, as in the pools), the n blocks in loan order, block_layer_bytes each; then the n
 * blocks' positions, block_size int32 each. The lender's pieces copy its pool's blocks into that
 * layout (src = pool addresses, dst = window offsets); the borrower's pieces copy runs of window
 * slots into its pool (src = window offsets, dst = pool addresses). Both lists are in window order
 * (what the staged watermark and the pipeline's chunks follow), consecutive blocks merged into one
 * piece per plane. Pools are the CUDA backend's: the device pool (cuda_kv_ipc.h CudaKvPool's layout:
 * every layer's K plane, then every layer's V plane, each (n_blocks, block_layer_bytes); positions
 * (n_blocks, block_size)) or its host tier (the same planes, a layer's K and V adjacent:
 * kv_interleaved). A lender may stage blocks of both tiers in one loan (the window layout is the
 * same, so the borrower never knows which tier a block came from).
 */
#ifndef BRAID_WORKER_KV_STAGE_LAYOUT_H
#define BRAID_WORKER_KV_STAGE_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "worker/kv_stage_pipe.h"
#include "worker/step_msg.h"

/* A pool's addresses (device addresses on CUDA: only carried, never dereferenced here) and geometry. */
typedef struct {
    uint64_t kv, slot_pos;
    int n_layers, n_blocks, block_size;
    size_t block_layer_bytes;
    bool kv_interleaved; /* planes K0 V0 K1 V1 ... (the CUDA host tier); else K0 K1 ... V0 V1 ... */
} KvStagePool;

/* Bytes one lent block takes in a window (every plane and its positions). */
size_t kv_stage_block_bytes(const KvStagePool *pool);
/* The lender's pieces for blocks[0..n) of pool (ids checked in range). *out is malloc'd; returns the
 * count, -1 with err. */
int kv_stage_lender_pieces(const KvStagePool *pool, const int32_t *blocks, int n, StagePiece **out, BraidError *err);
/* The same for a loan spanning tiers: block i is blocks[i] of pools[tiers[i]] (tier 0 the device
 * pool, 1 the host tier; a tier whose pool has no blocks refuses). Runs merge within one tier only.
 * Every pool must share the geometry (layers, block size, block bytes); checked. */
int kv_stage_lender_pieces_tiered(const KvStagePool pools[2], const uint8_t *tiers, const int32_t *blocks, int n, StagePiece **out,
                                  BraidError *err);
/* The borrower's pieces for runs (src: window slots of an n_window-block loan, tier 0; dst: this
 * pool's blocks, never the null block 0). Returns the count, -1 with err on a run out of range. */
int kv_stage_borrower_pieces(const KvStagePool *pool, int n_window, const MoveRun *runs, int n_runs, StagePiece **out, BraidError *err);

#endif
