/*
 * kv_stage_wire.h — the wire half of a host-staged KV move (worker/kv_move_cuda_staged.h): a
 * borrower's UCX reads (transport/kv_mover.h) of chunks of a lender's staging window, as the fetch
 * of a worker/kv_stage_pipe.h pipeline. Plain C (no CUDA), so it is tested over real UCX between two
 * MPI ranks on the CPU (tests/unit/test_kv_stage_wire.c).
 *
 * The window (the lender's, registered with its mover): a KvStageWindowHead, padded to
 * KV_STAGE_WINDOW_HEAD bytes, then the staged data. The lender stages the data front to back and
 * raises head.staged (bytes ready) as each chunk lands, after head.gen was set to the loan's
 * generation. A fetch of a chunk whose pieces end at byte E of the data reads it only once a
 * watermark >= E was seen: until then each poll that finds the previous header read landed reads
 * the header again (one small UCX read per poll; the pipe's caller paces the polls). A header with
 * another generation fails the fetch (the window was given to another loan: the lease ended).
 * Watermarks seen are kept for the whole move (they only grow), so later chunks skip the probe.
 * Piece src offsets are relative to the window's data. Not thread-safe.
 */
#ifndef BRAID_WORKER_KV_STAGE_WIRE_H
#define BRAID_WORKER_KV_STAGE_WIRE_H

#include <stdint.h>

#include "common/error.h"
#include "transport/kv_mover.h"
#include "worker/kv_stage_pipe.h"

typedef struct {
    uint64_t gen;    /* the loan occupying the window */
    uint64_t staged; /* bytes of the data ready, front to back */
} KvStageWindowHead;

enum { KV_STAGE_WINDOW_HEAD = 64, KV_STAGE_WIRE_MAX_SLOTS = 16 };

typedef struct {
    KvMover *mover;
    int peer;                 /* kv_mover_connect's handle of the lender */
    int region;               /* the lender's region holding the window */
    uint64_t window_offset;   /* the window's head within the region; its data follows the head */
    uint64_t gen;             /* the loan's generation (its xfer id) */
} KvStageWireConfig;

typedef struct KvStageWire KvStageWire;

/* n_slots: the pipe's buffers (at most KV_STAGE_WIRE_MAX_SLOTS). */
int kv_stage_wire_create(KvStageWire **out, const KvStageWireConfig *cfg, int n_slots, BraidError *err);
/* Ends every read in flight (kv_mover_batch_end: waits or cuts them off) and frees. NULL ok. */
void kv_stage_wire_destroy(KvStageWire *w);
/* The StageCopyOps fetch and quiesce, with ctx = the wire (see kv_stage_pipe.h). */
int kv_stage_wire_fetch_start(void *wire, int slot, uint8_t *buf, const StageChunkPiece *pieces, int n, BraidError *err);
int kv_stage_wire_fetch_poll(void *wire, int slot, BraidError *err);
/* Ends the slot's reads in flight: afterwards nothing lands in its buffer. */
void kv_stage_wire_quiesce(void *wire, int slot);
/* Header reads issued so far (a measure of how long the borrower waited on the lender's staging). */
int kv_stage_wire_probes(const KvStageWire *w);

#endif
