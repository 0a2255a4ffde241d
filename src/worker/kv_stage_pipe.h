/*
 * kv_stage_pipe.h — the pipeline of a host-staged KV move (worker/kv_move_cuda_staged.c, ARCHITECTURE
 * § 8 "KV moves on CUDA, across nodes"): a list of byte pieces travels from a source to a destination
 * through a ring of staging buffers, chunk by chunk, so fetching chunk k+1 into one buffer overlaps
 * draining chunk k out of another (borrower: UCX read of the lender's pinned window into a pinned
 * landing buffer, then host-to-device copy on the move stream).
 *
 * Plain C with the copies behind a small vtable (StageCopyOps), so the logic — chunking, ordering,
 * completion, failure or timeout in mid-move, buffer reuse — is tested on the CPU
 * (tests/unit/test_kv_stage_pipe.c) and the CUDA file only supplies the copies.
 *
 * Contract:
 * - Chunking: the pieces, in list order, are packed into chunks of at most buf_bytes staging bytes;
 *   a piece longer than the room left is split (its parts keep their order). Chunk k uses buffer
 *   k % n_bufs; a buffer is reused only after the drain of the chunk it held completed.
 * - Ordering: drains start in chunk order (chunk k's drain never before chunk k-1's), whatever order
 *   fetches complete in; fetches start in chunk order too.
 * - Completion: kv_stage_pipe_step returns 1 once every chunk's drain completed (all bytes landed).
 *   Never blocks: each call polls what is in flight and starts what may start.
 * - Failure: a start or poll that reports -1, or a step after the deadline, fails the pipe: every
 *   buffer with an operation in flight is quiesced (ops->quiesce: when it returns nothing reads or
 *   writes that buffer any more), nothing new starts, and this and every later step return -1 with
 *   the first error. Destroying a pipe in flight quiesces likewise, so no buffer is ever left busy.
 * Not thread-safe (one caller: the rank's MPI thread).
 */
#ifndef BRAID_WORKER_KV_STAGE_PIPE_H
#define BRAID_WORKER_KV_STAGE_PIPE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* len bytes from src (a source offset or address, the vtable's to interpret) to dst (likewise). */
typedef struct {
    uint64_t src, dst;
    size_t len;
} StagePiece;

/* A piece (or part of one) inside a chunk: it sits at buf_off in the chunk's staging buffer. */
typedef struct {
    uint64_t src, dst;
    size_t len, buf_off;
} StageChunkPiece;

/* The copies. start: 0 when queued (it may already be done), -1 with err. poll: 1 done, 0 in flight,
 * -1 failed (err); a start that fails may have queued part of its copies, so its buffer is quiesced
 * like one in flight. drain_start / drain_poll may be NULL: a fetched chunk is then landed. quiesce:
 * the buffer's operation in flight (fetch or drain) is abandoned or waited for; afterwards nothing
 * touches the buffer. slot is the buffer's index (0 .. n_bufs-1). */
typedef struct {
    int (*fetch_start)(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *pieces, int n, BraidError *err);
    int (*fetch_poll)(void *ctx, int slot, BraidError *err);
    int (*drain_start)(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *pieces, int n, BraidError *err);
    int (*drain_poll)(void *ctx, int slot, BraidError *err);
    void (*quiesce)(void *ctx, int slot);
} StageCopyOps;

typedef struct {
    uint8_t *const *bufs; /* n_bufs staging buffers of buf_bytes each (the caller's; they outlive the pipe) */
    int n_bufs;
    size_t buf_bytes;
    double deadline;      /* a step at now > deadline fails the pipe; 0 = none */
    const StageCopyOps *ops;
    void *ctx;
} KvStagePipeConfig;

typedef struct KvStagePipe KvStagePipe;

/* Plans the chunks (the pieces are copied). -1 with err on a bad config or out of memory. */
int kv_stage_pipe_create(KvStagePipe **out, const StagePiece *pieces, int n_pieces, const KvStagePipeConfig *cfg, BraidError *err);
/* Progresses the pipe at time now (seconds, the deadline's clock): 1 landed, 0 in flight, -1 failed. */
int kv_stage_pipe_step(KvStagePipe *p, double now, BraidError *err);
/* Quiesces what is in flight and frees the pipe. NULL ok. */
void kv_stage_pipe_destroy(KvStagePipe *p);
int kv_stage_pipe_chunks(const KvStagePipe *p);
int kv_stage_pipe_chunks_landed(const KvStagePipe *p);
/* Buffers with an operation in flight (0 after a failure or once landed). */
int kv_stage_pipe_busy_buffers(const KvStagePipe *p);
size_t kv_stage_pipe_bytes(const KvStagePipe *p);

#endif
