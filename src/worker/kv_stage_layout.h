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
 * piece per plane. Pools are the CUDA backend's (cuda_kv_ipc.h CudaKvPool's layout): per plane
 * (n_blocks, block_layer_bytes), positions (n_blocks, block_size).
 */
#ifndef BRAID_WORKER_KV_STAGE_LAYOUT_H
#define BRAID_WORKER_KV_STAGE_LAYOUT_H

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
} KvStagePool;

/* Bytes one lent block takes in a window (every plane and its positions). */
size_t kv_stage_block_bytes(const KvStagePool *pool);
/* The lender's pieces for blocks[0..n) of pool (ids checked in range). *out is malloc'd; returns the
 * count, -1 with err. */
int kv_stage_lender_pieces(const KvStagePool *pool, const int32_t *blocks, int n, StagePiece **out, BraidError *err);
/* The borrower's pieces for runs (src: window slots of an n_window-block loan, tier 0; dst: this
 * pool's blocks, never the null block 0). Returns the count, -1 with err on a run out of range. */
int kv_stage_borrower_pieces(const KvStagePool *pool, int n_window, const MoveRun *runs, int n_runs, StagePiece **out, BraidError *err);

#endif
