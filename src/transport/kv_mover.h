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
 * flight. The owner does nothing per read: transports that emulate RMA with messages (TCP) need
 * the owner's worker to progress, and a progress thread of each mover does that (it naps 50 us while
 * traffic is recent; when quiet it sleeps on the worker's event fd, or naps 1 ms where UCX gives
 * none), so an owner busy inside a long engine step still serves reads. kv_mover_progress() progresses from the caller's thread too.
 *
 * Transports are UCX's choice (UCX_TLS and the other UCX_* variables apply) among those that
 * support peer error handling: RDMA across nodes, TCP; on one machine with UCX 1.13 that is TCP over
 * loopback (RMA emulated in software), because its shared-memory transports either lack peer
 * failure handling (sysv, posix) or carry no messages (cma), so UCX_TLS=sm fails to connect
 * ("Destination is unreachable"). Host memory only (CUDA memory is not registered here).
 * UCX prints its own warnings on stdout unless UCX_LOG_FILE says otherwise (e.g. /dev/stderr).
 * Errors: every UCX failure is reported through BraidError with the UCX status string; a failed
 * read fails its batch and, when the endpoint broke, the peer (its later batches fail at once; the
 * caller falls back to recomputing). Endpoints use peer error handling, so a dead owner never
 * takes the reader down.
 * No read lands in the reader's memory after kv_mover_batch_end, kv_mover_disconnect or
 * kv_mover_destroy returns: UCX cannot cancel an RMA read, so ending a batch with reads in flight
 * waits for them up to 0.5 s (normally microseconds) and then force-closes the peer's endpoint (the
 * peer is broken from then on; connect again to get a fresh one).
 * Owns its UCX objects, registrations, endpoints, keys, batches and the progress thread. The API is
 * for one calling thread (the rank's MPI thread); it and the progress thread take turns on the
 * worker under the mover's lock. Descriptions are trusted to come from kv_mover_describe of the same build: their
 * framing and lengths are checked, the worker address and packed keys inside are parsed by UCX.
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
/* Cancels batches still in flight, closes endpoints, unregisters memory, frees everything,
 * including batches not yet ended (their handles die with it). NULL ok. */
void kv_mover_destroy(KvMover *m);
/* Registers [base, base + len) for remote reads; *region gets its index (0, 1, ... in call order).
 * The memory must stay valid until kv_mover_destroy. */
int kv_mover_register(KvMover *m, void *base, size_t len, int *region, BraidError *err);
/* Appends this rank's description (worker address, every registered region) to out. A region
 * registered later needs a new description (and readers a new connect). */
int kv_mover_describe(KvMover *m, WireBuf *out, BraidError *err);
/* Connects to the owner a description came from (kv_mover_describe on another rank). key names the
 * owner for the caller (e.g. its MPI rank): connecting again with a key already connected returns the
 * same peer when the description is byte-identical and the peer is not broken, else replaces that
 * peer (the old handle is disconnected; batches on it fail). *peer gets a handle; handles are never
 * reused within a mover. -1 with err on a malformed description or when UCX cannot reach the owner. */
int kv_mover_connect(KvMover *m, int key, const uint8_t *desc, size_t len, int *peer, BraidError *err);
/* Forgets a peer (its endpoint is closed; batches reading from it fail). Unknown handles: no-op. */
void kv_mover_disconnect(KvMover *m, int peer);
/* Opens a batch of reads from one peer; -1 at once when the peer is unknown or broken. */
int kv_mover_batch_begin(KvMover *m, int peer, KvMoveBatch **out, BraidError *err);
/* Queues a read of len bytes at offset within the peer's region into dst (local memory, any; it must
 * stay valid until the batch settles or ends). The range must lie inside the region as described
 * (checked: -1 with err otherwise, and the batch is left as it was). len 0 is a no-op. -1 with err
 * (and the batch failed) when UCX refuses the read at once, e.g. the peer broke. The read may land
 * at once or later; only a poll that returns 1 says it did. */
int kv_mover_get(KvMoveBatch *b, int region, size_t offset, void *dst, size_t len, BraidError *err);
/* Progresses UCX and checks the batch: 1 when every read landed, 0 while some are in flight, -1
 * when a read failed or the peer broke or was disconnected (err says which and why). Never blocks.
 * A batch that polled 1 may take more reads and be polled again. */
int kv_mover_poll(KvMoveBatch *b, BraidError *err);
/* Bytes the batch reads. */
size_t kv_mover_batch_bytes(const KvMoveBatch *b);
/* Ends a batch: cancels what is in flight (a timeout, a cancelled request) and frees it. NULL ok.
 * With reads in flight it may wait up to 0.5 s and break the peer (see above). */
void kv_mover_batch_end(KvMoveBatch *b);
/* Progresses the worker from the caller's thread (the progress thread does it anyway). */
void kv_mover_progress(KvMover *m);
/* The transports UCX chose for a peer's endpoint, e.g. "tcp/lo" or "rc_mlx5/mlx5_0:1 tcp/eth0" (the
 * tl/device of each lane of ucp_ep_print_info; UCX 1.13 has no query for it), for logs and the
 * benchmark; "" when unknown or the peer is gone. Computed once per peer; the string is the mover's
 * and lives until the peer is disconnected or replaced. */
const char *kv_mover_peer_transports(KvMover *m, int peer);

#endif
