/*
 * step_msg.h — the step plan an instance leader sends its TP peers before every forward pass.
 *
 * Carries a ForwardBatch (token ids, positions, KV slots, per-sequence block tables and context
 * lengths) so every rank of the instance runs the same forward on its own shard; the leader alone
 * samples, so peers receive no logit rows. It also carries the step's cache operations
 * (cache/cache_ops.h: count, then kind/src/dst/delta per operation; delta is ROTATE's signed
 * shift), which every peer applies to its shard, in order, before the forward. A STOP plan ends the peers' loop at shutdown.
 * Decoding checks bounds and consistency (counts against the bytes present, known operation
 * kinds); block ids are checked by backend_apply_cache_ops against the pools' sizes.
 * A MOVE plan (KV block moves, worker/kv_moves.h) carries cache operations to apply and runs of
 * blocks to read from the lending instance's rank of the same TP index (its mover description),
 * with no forward; the peer answers with one TAG_MOVE_DONE message (u64 xfer id, u8 ok) to rank 0.
 * Decoded arrays are owned by the StepMsg (step_msg_free); the ForwardBatch view points into them.
 */
#ifndef BRAID_TRANSPORT_STEP_MSG_H
#define BRAID_TRANSPORT_STEP_MSG_H

#include "cache/cache_ops.h"
#include "transport/wire.h"
#include "worker/forward_batch.h"

/* STEP_STOP_LOST_RANKS: stop, and exit without MPI_Finalize (the job lost ranks; see MSG_SHUTDOWN). */
typedef enum { STEP_FORWARD = 1, STEP_STOP = 2, STEP_STOP_LOST_RANKS = 3, STEP_MOVE = 4 } StepKind;

/* Tags on an instance's TP communicator: plans to the peers, and the peers' answers to MOVE plans. */
enum { TAG_STEP = 1, TAG_MOVE_DONE = 2 };

/* A run of consecutive blocks to move: count blocks from the lender's tier pool at src on to this
 * rank's device pool at dst on. */
typedef struct {
    uint8_t tier;
    int32_t src, dst, count;
} MoveRun;

typedef struct {
    uint64_t xfer_id;
    int32_t lender_rank;    /* the lending rank (world), naming it for the mover's connections */
    int32_t pool_blocks[2]; /* the lender's pools, device and host (offsets into its regions) */
    uint8_t *desc;          /* the lender rank's mover description */
    size_t desc_len;
    MoveRun *runs;
    int n_runs;
    double timeout_s;
} StepMove;

typedef struct {
    StepKind kind;
    int32_t *tokens, *positions, *slots, *seq_start, *seq_ctx, *table_data;
    int32_t **tables;
    ForwardBatch batch; /* view of the arrays above, n_logits = 0 */
    CacheOpList ops;    /* the step's cache operations, to apply before the forward */
    StepMove move;      /* STEP_MOVE only (owned) */
} StepMsg;

/* ops may be NULL (no operations); batch and ops are ignored for the STOP kinds. */
void step_msg_encode(WireBuf *b, StepKind kind, const ForwardBatch *batch, const CacheOpList *ops, int block_size);
/* 0 and a filled StepMsg, or -1 (nothing to free) when the bytes are malformed or memory runs out. */
int step_msg_decode(WireReader *r, int block_size, StepMsg *m);
/* A MOVE plan: the operations, then the reads (the description is the lender rank's). */
void step_msg_encode_move(WireBuf *b, const CacheOpList *ops, const StepMove *mv);
void step_msg_free(StepMsg *m);

#endif
