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
 * Decoded arrays are owned by the StepMsg (step_msg_free); the ForwardBatch view points into them.
 */
#ifndef BRAID_TRANSPORT_STEP_MSG_H
#define BRAID_TRANSPORT_STEP_MSG_H

#include "cache/cache_ops.h"
#include "transport/wire.h"
#include "worker/forward_batch.h"

/* STEP_STOP_LOST_RANKS: stop, and exit without MPI_Finalize (the job lost ranks; see MSG_SHUTDOWN). */
typedef enum { STEP_FORWARD = 1, STEP_STOP = 2, STEP_STOP_LOST_RANKS = 3 } StepKind;

typedef struct {
    StepKind kind;
    int32_t *tokens, *positions, *slots, *seq_start, *seq_ctx, *table_data;
    int32_t **tables;
    ForwardBatch batch; /* view of the arrays above, n_logits = 0 */
    CacheOpList ops;    /* the step's cache operations, to apply before the forward */
} StepMsg;

/* ops may be NULL (no operations); batch and ops are ignored for the STOP kinds. */
void step_msg_encode(WireBuf *b, StepKind kind, const ForwardBatch *batch, const CacheOpList *ops, int block_size);
/* 0 and a filled StepMsg, or -1 (nothing to free) when the bytes are malformed or memory runs out. */
int step_msg_decode(WireReader *r, int block_size, StepMsg *m);
void step_msg_free(StepMsg *m);

#endif
