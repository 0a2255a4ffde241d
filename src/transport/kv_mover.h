/*
 * kv_mover.h — one-sided reads of another rank's registered memory over UCX: the data plane of KV
 * block moves between instances (ARCHITECTURE § 8, "KV block moves").
 *
 * Each worker rank that takes part in moves creates one mover (a UCX context with RMA and one
 * worker, single-threaded) and registers the memory others may read (its KV pools: one region per
 * contiguous array). kv_mover_describe() serialises what a reader needs — this worker's address and,
 * per region, its base address, length and packed remote key — into a byte string that travels on
 * the MPI control plane. A reader connects to that description (an endpoint to the owner's worker
 * and the unpacked keys) and then reads byte ranges of the owner's regions straight into its own
 * memory with ucp_get_nbx. Reads are grouped in a batch that completes (or fails) as a whole;
 * batches are polled, never waited on, so a leader keeps stepping its engine while a move is in
 * flight. The owner does nothing per read: transports that emulate RMA with messages (TCP, and
 * shared memory for small reads) need the owner's worker to progress, and a progress thread of the
 * mover does that (it naps 50 us while traffic is recent, 1 ms when quiet), so an owner busy in a
 * long engine step still serves reads. kv_mover_progress() is there for callers that want to
 * progress from their own loop too.
 *
 * Transports are UCX's choice (UCX_TLS and the other UCX_* variables apply): shared memory and TCP
 * on one machine, RDMA across nodes. Host memory only (CUDA memory is not registered here).
 * Errors: every UCX failure is reported through BraidError with the UCX status string; a failed
 * read fails its batch and, when the endpoint broke, the peer (its later batches fail at once; the
 * caller falls back to recomputing). Endpoints use peer error handling, so a dead owner never
 * takes the reader down.
 * Owns its UCX objects, registrations, endpoints, keys, batches and the progress thread. The
 * worker is UCX-multi-threaded (the progress thread and the caller share it); the API itself is
 * for one calling thread (the rank's MPI thread).
 */
#ifndef BRAID_TRANSPORT_KV_MOVER_H
#define BRAID_TRANSPORT_KV_MOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "transport/wire.h"

typedef struct KvMover KvMover;
typedef struct KvMoveBatch KvMoveBatch;

/* Creates the UCX context and worker. -1 with err when UCX cannot start (no usable transport). */
int kv_mover_create(KvMover **out, BraidError *err);
/* Cancels batches still in flight, closes endpoints, unregisters memory, frees everything. NULL ok. */
void kv_mover_destroy(KvMover *m);
/* Registers [base, base + len) for remote reads; *region gets its index (0, 1, ... in call order).
 * The memory must stay valid until kv_mover_destroy. */
int kv_mover_register(KvMover *m, void *base, size_t len, int *region, BraidError *err);
/* Appends this rank's description (worker address, every registered region) to out. */
int kv_mover_describe(KvMover *m, WireBuf *out, BraidError *err);
/* Connects to the owner a description came from (kv_mover_describe on another rank). key names the
 * owner for the caller (e.g. its MPI rank): connecting again with a key already connected returns the
 * same peer when the description is byte-identical, else replaces that peer. *peer gets a handle. */
int kv_mover_connect(KvMover *m, int key, const uint8_t *desc, size_t len, int *peer, BraidError *err);
/* Forgets a peer (its endpoint is closed; batches reading from it fail). */
void kv_mover_disconnect(KvMover *m, int peer);
/* Opens a batch of reads from one peer. */
int kv_mover_batch_begin(KvMover *m, int peer, KvMoveBatch **out, BraidError *err);
/* Queues a read of len bytes at offset within the peer's region into dst (local memory, any).
 * The range must lie inside the region as described (checked: -1 with err otherwise). */
int kv_mover_get(KvMoveBatch *b, int region, size_t offset, void *dst, size_t len, BraidError *err);
/* Progresses UCX and checks the batch: 1 when every read landed, 0 while some are in flight, -1
 * when a read failed (err says which and why). */
int kv_mover_poll(KvMoveBatch *b, BraidError *err);
/* Bytes the batch reads. */
size_t kv_mover_batch_bytes(const KvMoveBatch *b);
/* Ends a batch: cancels what is in flight (a timeout, a cancelled request) and frees it. NULL ok. */
void kv_mover_batch_end(KvMoveBatch *b);
/* Progresses the worker (call it from the owner's loop: emulated RMA needs it). */
void kv_mover_progress(KvMover *m);
/* The transports UCX chose for a peer's endpoint, e.g. "cma/memory tcp/lo" (for logs and the
 * benchmark); "" when unknown. */
const char *kv_mover_peer_transports(KvMover *m, int peer);

#endif
