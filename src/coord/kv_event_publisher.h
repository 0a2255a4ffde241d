/*
 * kv_event_publisher.h — publishes the instances' KV events in vLLM's wire format, so that an
 * external KV-aware router (llm-d's, Dynamo's) can follow a Braid cluster's caches.
 *
 * Format (vllm/distributed/kv_events.py): each MSG_KV_EVENTS message from an instance becomes one
 * KVEventBatch, msgpack-encoded as msgspec encodes its array-like, tagged structs:
 *   batch  = [ts (float64 seconds), [event...], data_parallel_rank (the Braid instance)]
 *   event  = ["BlockStored", [hash...], parent_hash|nil, [token_id...], block_size, lora_id (nil),
 *             medium, lora_name|nil]
 *          | ["BlockRemoved", [hash...], medium]
 *          | ["AllBlocksCleared"]
 * Hashes are Braid's chained XXH3 block hashes (uint64; parent nil at a root); medium is "GPU" for
 * Braid's device tier and "CPU" for its host tier (vLLM's names); lora_name is the adapter ("" ->
 * nil); token_ids are present on inserts only (a demotion or load-back re-stores known blocks).
 * Wire: a PUB socket sends each batch as three frames [topic, seq (8-byte big-endian), payload],
 * seq counting from 0 without gaps. A ROUTER replay socket answers a request frame holding an
 * 8-byte big-endian start seq with [id, "", seq, payload] for every batch still in the ring
 * buffer from that seq on, then the end marker [id, "", seq -1, ""] (a REQ/DEALER client sees
 * [seq, payload] pairs). The ring keeps the last `replay_batches` batches.
 *
 * Threads: publish is called from one thread (the coordinator's MPI thread); the replay socket is
 * served by a thread the publisher owns. The ring is shared under a mutex. Owns its sockets,
 * context, ring and thread.
 */
#ifndef BRAID_COORD_KV_EVENT_PUBLISHER_H
#define BRAID_COORD_KV_EVENT_PUBLISHER_H

#include <stdint.h>

#include "common/error.h"
#include "transport/control_msg.h"
#include "transport/wire.h"

typedef struct {
    const char *endpoint;        /* PUB bind address, e.g. "tcp://127.0.0.1:5557" */
    const char *replay_endpoint; /* ROUTER bind address, or NULL: no replay */
    const char *topic;           /* first frame of every message; "" (vLLM's default) when NULL */
    int replay_batches;          /* ring size; <= 0: KV_EVENT_REPLAY_DEFAULT */
} KvEventPublisherConfig;

#define KV_EVENT_REPLAY_DEFAULT 10000 /* vLLM's default buffer_steps */

typedef struct KvEventPublisher KvEventPublisher;

/* NULL with err set when a socket cannot be bound or memory runs out. */
KvEventPublisher *kv_event_publisher_new(const KvEventPublisherConfig *cfg, BraidError *err);
/* Stops the replay thread, closes the sockets. NULL is fine. */
void kv_event_publisher_free(KvEventPublisher *p);
/* Encodes events[0..n) as one batch from `instance`, stamped with the wall clock (seconds since the
 * epoch, as vLLM's time.time()), sends it
 * and keeps it for replay. n == 0 sends nothing. Returns 0, or -1 (logged) when the batch could not
 * be encoded or sent; the sequence number is consumed either way only when the batch was sent. */
int kv_event_publisher_publish(KvEventPublisher *p, int instance, const MsgKvEvent *events, int n);
/* Batches published so far (the next sequence number). */
uint64_t kv_event_publisher_sent(const KvEventPublisher *p);

/* The batch payload alone (no framing): appends to *out (tests check it byte for byte). */
void kv_event_batch_encode(WireBuf *out, int instance, const MsgKvEvent *events, int n, double ts);

#endif
