/*
 * move_msg.h — the leader-to-leader messages of a KV block move (worker/kv_moves.h), one MPI
 * message each on the control communicator, tag = MsgType (control_msg.h).
 *
 *   KV_EXPORT    importer → exporter: "lend me the cached prefix of these tokens" (namespace names
 *                and the prompt; xfer_id is the importer's, echoed back), with the importer's host
 *                name and KV layout (a CUDA exporter stages a loan to another host through pinned
 *                host memory; exporters of another layout refuse).
 *   KV_EXPORTED  exporter → importer: the blocks that hold it, in sequence order, each with its tier
 *                (0 device, 1 host) and block id, under a lease the exporter keeps until KV_RELEASE
 *                or its timeout; the exporter's pool sizes per tier (the importer computes byte
 *                offsets from them) and its mover description (kv_mover_describe). n_blocks 0 =
 *                nothing to lend (why in `why`).
 *   KV_RELEASE   importer → exporter: xfer_id's lease is over.
 * encode/decode are pure; decoded arrays and strings are malloc'd (move_msg_*_free).
 */
#ifndef BRAID_TRANSPORT_MOVE_MSG_H
#define BRAID_TRANSPORT_MOVE_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "transport/wire.h"

typedef struct {
    uint64_t xfer_id;
    char *tenant, *adapter; /* "" = none */
    int32_t *tokens;
    int n_tokens;
    char *host;        /* the importer's host name ("" = unknown): a CUDA exporter on another host stages the loan */
    uint8_t kv_layout; /* the importer's KV layout (MoveKvLayout); an exporter of another layout refuses */
} MsgKvExport;

/* The element type of an instance's KV pools, which a move must match: the CPU backend keeps fp16,
 * the CUDA backend bf16 (same shapes, different bits). */
typedef enum { MOVE_KV_LAYOUT_UNKNOWN = 0, MOVE_KV_LAYOUT_FP16, MOVE_KV_LAYOUT_BF16 } MoveKvLayout;
const char *move_kv_layout_name(int layout);

typedef struct {
    uint64_t xfer_id;
    int n_blocks;
    uint8_t *tiers;           /* (n_blocks) */
    int32_t *blocks;          /* (n_blocks) */
    int32_t pool_blocks[2];   /* device, host: blocks in each pool (incl. the null block; 0 = no tier) */
    uint8_t *desc;            /* kv_mover description */
    size_t desc_len;
    char *why;                /* when n_blocks is 0: why nothing is lent ("" otherwise) */
} MsgKvExported;

/* MSG_KV_RELAY's envelope: a move message between two leaders (named by their leader ranks, the
 * coordinator's numbering: 1 + instance * tp) relayed by the coordinator because one of them is
 * reached only over its own intercommunicator (a joined instance). body borrows the decoded bytes. */
typedef struct {
    int32_t from_rank, to_rank, type;
    const uint8_t *body;
    size_t body_len;
} MsgKvRelay;

void move_msg_relay_encode(WireBuf *b, int from_rank, int to_rank, int type, const uint8_t *body, size_t body_len);
/* -1 on a truncated envelope or ranks below 1. */
int move_msg_relay_decode(const uint8_t *data, size_t len, MsgKvRelay *m);

void move_msg_export_encode(WireBuf *b, const MsgKvExport *m);
int move_msg_export_decode(WireReader *r, MsgKvExport *m);
void move_msg_export_free(MsgKvExport *m);
void move_msg_exported_encode(WireBuf *b, const MsgKvExported *m);
int move_msg_exported_decode(WireReader *r, MsgKvExported *m);
void move_msg_exported_free(MsgKvExported *m);

#endif
