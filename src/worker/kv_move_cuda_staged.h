/*
 * kv_move_cuda_staged.h — KV moves between CUDA instances on different nodes, staged through pinned
 * host memory and UCX (Debian's UCX is not CUDA-aware, so GPU memory is never registered with it).
 * Used by worker/kv_move_cuda.c; the move protocol (worker/kv_moves.h) is unchanged.
 *
 * The plain-C halves are tested on the CPU: the window layout (worker/kv_stage_layout.h), the
 * pipeline (worker/kv_stage_pipe.h) and the UCX reads of a window (worker/kv_stage_wire.h); this file
 * adds the CUDA copies, the host functions and the pinned memory.
 *
 * Lender: a loan to another host is staged into a pinned "window" registered with the rank's UCX
 * mover (created, like the windows, on the first staged loan; at most KV_STAGE_WINDOWS windows of
 * BRAID_KV_STAGE_WINDOW_MB MiB, default 256). The window holds the lent blocks in loan order, per
 * layer's K then V, then their positions; the lent block ids the borrower sees are window slots
 * 0..n-1 (MsgKvExported.blocks), so its runs address the window directly. The device-to-host
 * copies go on the rank's move stream chunk by chunk (BRAID_KV_STAGE_CHUNK_KB, default 1024), each
 * chunk followed by a host function that publishes the window's staged watermark (bytes ready, in
 * window order) in the window's 64-byte header beside the loan's generation (its xfer id): the
 * lender answers at once and chunk k+1 copies while the borrower reads chunk k. A window is
 * reused after its lease ends and its copies finished.
 *
 * Borrower: the loan's description (KV_STAGE_MAGIC, the layout, the window's place and the lender's
 * UCX description) is checked against this rank's pool (element type, layers, block size, block
 * bytes: another layout is refused with the reason, never copied); the runs become byte pieces
 * (window offset -> device address) driven through a worker/kv_stage_pipe.h pipeline over one of
 * this rank's pinned landing rings (KV_STAGE_RINGS rings of KV_STAGE_RING_SLOTS chunk buffers):
 * fetch = UCX reads of the chunk into a ring buffer once the lender's watermark covers it (else a
 * read of the window header first), drain = host-to-device copies on the move stream, which waits
 * for the compute stream's work queued before the move (pending STOREs read a reused block first).
 * The move has landed when every drain's event completed; ending it early waits for what is in
 * flight (ring buffers and device blocks are never touched after the end).
 * A loan may span the lender's tiers: host-tier blocks (pinned host memory, CudaKvPool.host_*) are
 * copied host to host on the same stream into the same window layout, so the borrower cannot tell.
 * Tensor parallelism: only TP 1 stages (a lender's TP peers do not stage; kv_moves.c refuses).
 * Built only with CUDA. Not thread-safe (the rank's MPI thread; the host functions only store the
 * watermark).
 */
#ifndef BRAID_WORKER_KV_MOVE_CUDA_STAGED_H
#define BRAID_WORKER_KV_MOVE_CUDA_STAGED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "transport/wire.h"
#include "worker/cuda_kv_ipc.h"
#include "worker/step_msg.h"

#define KV_STAGE_MAGIC 0x4b565354u /* "KVST" */
enum { KV_STAGE_WINDOWS = 2, KV_STAGE_RINGS = 2, KV_STAGE_RING_SLOTS = 4 };

typedef struct KvStaging KvStaging;
typedef struct KvStagedRead KvStagedRead;

/* Cheap: creates the move stream; UCX, windows and rings come on first use. */
int kv_staging_create(KvStaging **out, const CudaKvPool *mine, BraidError *err);
/* Waits for the move stream, frees windows, rings, the mover. NULL ok. */
void kv_staging_destroy(KvStaging *s);
bool kv_staging_desc_is_staged(const uint8_t *desc, size_t len);

/* Lender: stages the leading blocks of a loan into a free window (block i is blocks[i] of tier
 * tiers[i]: 0 the device pool, 1 the host tier; tiers NULL: all device) and appends the loan's
 * description list (one rank) to desc_list; *n_staged of them fit (>= 1), *window names the window
 * for kv_staging_unstage. -1 with err (nothing staged) when no window is free, a block's tier is
 * absent, or UCX or the copies fail. Call after the lender fence (the blocks hold their final
 * contents: the fence covers the host tier's copy stream too). */
int kv_staging_stage(KvStaging *s, const uint8_t *tiers, const int32_t *blocks, int n, uint64_t xfer_id, WireBuf *desc_list, int *window,
                     int *n_staged, BraidError *err);
/* The lease is over: the window is free once its copies finished (waited for here). */
void kv_staging_unstage(KvStaging *s, int window);

/* Borrower: starts reading runs (src = window slots) of a staged loan into this rank's pool. */
int kv_staged_read_start(KvStaging *s, int lender_rank, const uint8_t *desc, size_t len, const MoveRun *runs, int n_runs,
                         KvStagedRead **out, BraidError *err);
/* 1 landed, 0 in flight, -1 failed (err). Never blocks. */
int kv_staged_read_poll(KvStagedRead *r, BraidError *err);
size_t kv_staged_read_bytes(const KvStagedRead *r);
/* Ends the read: what is in flight is waited for or abandoned; its landing ring is free again. NULL ok. */
void kv_staged_read_end(KvStagedRead *r);

#endif
