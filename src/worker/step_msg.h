/*
 * step_msg.h — the step plan an instance leader sends its TP peers before every forward pass.
 *
 * Carries a ForwardBatch (token ids, positions, KV slots, per-sequence block tables and context
 * lengths) so every rank of the instance runs the same forward on its own shard; the leader alone
 * samples, so peers receive no logit rows. A STOP plan ends the peers' loop at shutdown.
 * Decoded arrays are owned by the StepMsg (step_msg_free); the ForwardBatch view points into them.
 */
#ifndef BRAID_TRANSPORT_STEP_MSG_H
#define BRAID_TRANSPORT_STEP_MSG_H

#include "transport/wire.h"
#include "worker/forward_batch.h"

typedef enum { STEP_FORWARD = 1, STEP_STOP = 2 } StepKind;

typedef struct {
    StepKind kind;
    int32_t *tokens, *positions, *slots, *seq_start, *seq_ctx, *table_data;
    int32_t **tables;
    ForwardBatch batch; /* view of the arrays above, n_logits = 0 */
} StepMsg;

void step_msg_encode(WireBuf *b, StepKind kind, const ForwardBatch *batch, int block_size);
int step_msg_decode(WireReader *r, int block_size, StepMsg *m);
void step_msg_free(StepMsg *m);

#endif
