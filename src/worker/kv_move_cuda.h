/*
 * kv_move_cuda.h — one CUDA rank's side of KV block moves (worker/kv_moves.h has the protocol,
 * worker/kv_move_rank.h the CPU side it stands beside): the data plane for instances whose device
 * KV tier is GPU memory, which UCX here cannot read (Debian's UCX is not CUDA-aware).
 *
 * Same node (the only link built): the rank's description is its pool's CUDA IPC description
 * (worker/cuda_kv_ipc.h: cudaIpcGetMemHandle of the one pool allocation and of the slot positions,
 * the host name, the geometry). A borrower opens a lender's description once and keeps the mapping
 * (cached per lender rank; a different description from the same rank — a restarted lender —
 * replaces it), then queues one device-to-device cudaMemcpyAsync per layer's K and V and one for the
 * positions of each run on its backend's compute stream, records an event after them, and the batch
 * is polled with cudaEventQuery, never waited on. The compute stream orders the copies after the
 * cache operations applied before them (a block freed by a STORE is overwritten only after it was
 * read) and before any later forward (the moved blocks are complete before they are attended).
 * Over IPC only device-tier blocks travel: a CUDA lender lends the device part of a prefix (its host
 * tier is pinned host memory that IPC cannot map); a staged loan (below) carries host-tier blocks
 * too. kv_move_cuda_lend_fence makes a lender's queued writes
 * (forwards, cache operations) finish before it answers a loan, since a borrower's copies are not
 * ordered after another process's stream.
 * Across nodes (or when BRAID_KV_MOVE_STAGED=1 forces it, for tests on one GPU) the lender stages the
 * loan instead (worker/kv_move_cuda_staged.h): device-to-host copies into a pinned window registered
 * with UCX, published chunk by chunk, and a loan description of its own (kv_move_cuda_stage_loan);
 * the borrower reads it over UCX through a pinned landing ring and copies each chunk host to device
 * on its move stream (worker/kv_stage_pipe.h pipelines the two). kv_move_cuda_read tells the two
 * kinds of description apart; a batch says which link it used (kv_move_cuda_batch_link).
 * Descriptions of the two kinds never mix: a CPU rank's (UCX) and a CUDA rank's (IPC) are told apart
 * by kv_move_cuda_desc_is_ipc, and a borrower refuses the other kind (KV layouts and dtypes differ).
 * Built only with CUDA; the stub (kv_move_cuda_stub.c) refuses. Not thread-safe (the rank's MPI thread).
 */
#ifndef BRAID_WORKER_KV_MOVE_CUDA_H
#define BRAID_WORKER_KV_MOVE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "transport/wire.h"
#include "worker/backend.h"
#include "worker/step_msg.h"

typedef struct KvMoveCuda KvMoveCuda;
typedef struct KvMoveCudaBatch KvMoveCudaBatch;

/* Exports the backend's device pool; appends this rank's description to desc. -1 with err when the
 * backend is not CUDA, the build has no CUDA or the export failed. */
int kv_move_cuda_create(KvMoveCuda **out, Backend *backend, WireBuf *desc, BraidError *err);
/* Closes every opened lender pool (after the compute stream finished its copies). NULL ok. */
void kv_move_cuda_destroy(KvMoveCuda *c);
/* Whether a rank description is a CUDA IPC one / a staged loan's (pure; both builds). */
bool kv_move_cuda_desc_is_ipc(const uint8_t *desc, size_t len);
bool kv_move_cuda_desc_is_staged(const uint8_t *desc, size_t len);
/* Queues the copies of runs (device tier only) from the lender rank's pool into this rank's pool
 * as one batch: IPC copies for an IPC description, a staged read for a staged loan's (runs' src are
 * then window slots). -1 with err (nothing queued) on a description of another kind or host, a
 * geometry or KV layout mismatch, a host-tier run or a run out of range. */
int kv_move_cuda_read(KvMoveCuda *c, int lender_rank, const uint8_t *desc, size_t desc_len, const MoveRun *runs, int n_runs,
                      KvMoveCudaBatch **out, BraidError *err);
/* 1 when every copy landed, 0 while in flight, -1 with err on a CUDA error. Never blocks. */
int kv_move_cuda_poll(KvMoveCudaBatch *b, BraidError *err);
size_t kv_move_cuda_batch_bytes(const KvMoveCudaBatch *b);
/* MOVE_LINK_CUDA_IPC or MOVE_LINK_CUDA_STAGED (transport/control_msg.h). */
int kv_move_cuda_batch_link(const KvMoveCudaBatch *b);
/* Frees the batch. Copies in flight still land (stream order keeps them ahead of any later forward,
 * so the blocks they write are safe to hand back). NULL ok. */
void kv_move_cuda_batch_end(KvMoveCudaBatch *b);
/* Lender side, a loan to another node: stages the leading device blocks of the loan (ids in blocks)
 * and appends the loan's own description list (one rank) to desc_list; *n_staged fit (>= 1) and
 * become window slots 0..n_staged-1 for the borrower; *window is released by kv_move_cuda_unstage
 * when the lease ends. -1 with err (nothing staged) when staging is off or every window is lent. */
int kv_move_cuda_stage_loan(KvMoveCuda *c, const uint8_t *tiers, const int32_t *blocks, int n, uint64_t xfer_id, WireBuf *desc_list,
                            int *window, int *n_staged, BraidError *err);
void kv_move_cuda_unstage(KvMoveCuda *c, int window);
/* Lender side: waits until the work queued on the backend's streams (forwards on the compute
 * stream, cache operations — STOREs into the host tier — on the copy stream) has finished, so lent
 * blocks of either tier hold their final contents. */
int kv_move_cuda_lend_fence(KvMoveCuda *c, BraidError *err);

#endif
