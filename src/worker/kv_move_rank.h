/*
 * kv_move_rank.h — one rank's side of KV block moves (worker/kv_moves.h has the protocol): a mover
 * (transport/kv_mover.h) over this rank's shard of the KV pools, the reads of a list of block runs
 * into this rank's device pool, and the helpers that travel descriptions between the ranks of an
 * instance. A TP peer uses it to serve MOVE plans; the leader for its own shard.
 * Layout assumed of both sides (kv_pool.h / backend.h BackendKvMemory): per tier, one region holding
 * every layer's K then every layer's V, (n_blocks, block_layer_bytes) each, and one region of the
 * slots' positions; rank i of the lender has the same shard geometry as rank i of the borrower (the
 * same model and TP degree), so only the pools' block counts differ.
 * A CUDA rank (its backend's device pool is GPU memory) has no UCX mover over its pool: its
 * description is its pool's CUDA IPC description and its reads are device-to-device copies, or,
 * from a lender on another node, a staged read through pinned host memory over UCX
 * (worker/kv_move_cuda.h); KvRankBatch hides which a batch is. A borrower refuses a lender of the
 * other kind (fp16 vs bf16 KV).
 * Not thread-safe (the rank's MPI thread).
 */
#ifndef BRAID_WORKER_KV_MOVE_RANK_H
#define BRAID_WORKER_KV_MOVE_RANK_H

#include <mpi.h>
#include <stdbool.h>

#include "common/error.h"
#include "transport/kv_mover.h"
#include "transport/wire.h"
#include "worker/backend.h"
#include "worker/kv_move_cuda.h"
#include "worker/step_msg.h"

typedef struct {
    KvMover *mover;    /* CPU ranks (host-memory pools over UCX); NULL on a CUDA rank */
    KvMoveCuda *cuda;  /* CUDA ranks (same-node IPC); NULL on a CPU rank */
    BackendKvMemory mem[2];
    bool have_tier[2];
    WireBuf desc;
} KvMoveRank;

/* One rank's reads of one move: UCX reads (CPU) or IPC copies (CUDA). Zeroed: none. */
typedef struct {
    KvMoveBatch *ucx;
    KvMoveCudaBatch *ipc;
} KvRankBatch;

/* -1 with err when the backend cannot lend its pools, UCX cannot start (CPU) or the pool cannot be
 * exported (CUDA). */
int kv_move_rank_init(KvMoveRank *r, Backend *backend, BraidError *err);
void kv_move_rank_free(KvMoveRank *r);
/* Connects to the lender rank (desc, named by its world rank) and queues the reads of runs into this
 * rank's device pool as one batch (*batch; the caller polls and ends it). */
int kv_move_rank_read(KvMoveRank *r, int lender_rank, const uint8_t *desc, size_t desc_len, const int32_t pool_blocks[2],
                      const MoveRun *runs, int n_runs, KvRankBatch *batch, BraidError *err);
/* kv_mover_poll / kv_move_cuda_poll of the batch: 1 landed, 0 in flight, -1 failed (err). */
int kv_rank_batch_poll(KvRankBatch *b, BraidError *err);
size_t kv_rank_batch_bytes(const KvRankBatch *b);
/* Ends the batch (zeroes it). A zeroed batch: no-op. */
void kv_rank_batch_end(KvRankBatch *b);
/* The link this rank's moves use by default, for the router: MOVE_LINK_HOST (UCX) or MOVE_LINK_CUDA_IPC. */
int kv_move_rank_link(const KvMoveRank *r);
/* The link a batch uses: MOVE_LINK_HOST, MOVE_LINK_CUDA_IPC or MOVE_LINK_CUDA_STAGED (a CUDA move
 * across nodes); MOVE_LINK_NONE for a zeroed batch. */
int kv_rank_batch_link(const KvRankBatch *b);
/* A lender's last step before answering a loan: its queued GPU work on the lent blocks has
 * finished (CUDA); a no-op on a CPU rank. */
int kv_move_rank_lend_fence(KvMoveRank *r, BraidError *err);
/* A TP peer's part of a move (a MOVE plan): applies the operations, reads the runs, waits for them
 * up to the plan's timeout, and answers the leader (TAG_MOVE_DONE on tp_comm: u64 xfer id, u8 ok,
 * u64 bytes read). -1 only when applying the operations or answering failed (the peer cannot go on). */
int kv_move_rank_serve(KvMoveRank *r, Backend *backend, const StepMsg *plan, MPI_Comm tp_comm, BraidError *err);

/* Collective over tp_comm: every rank gives its description (empty when it has none); the root
 * (rank 0) gets them all in rank order in *all (a description list). 1 on the root when every rank
 * had one, else 0; -1 on an MPI error. */
int kv_moves_gather(MPI_Comm tp_comm, const WireBuf *mine, WireBuf *all, BraidError *err);
/* The i-th description of a list: 0 with *desc / *len pointing into list, -1 when malformed or
 * absent. *count (may be NULL) gets the number of descriptions. */
int kv_move_desc_at(const uint8_t *list, size_t list_len, int i, const uint8_t **desc, size_t *len, int *count);

#endif
