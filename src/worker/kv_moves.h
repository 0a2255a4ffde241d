/*
 * kv_moves.h — KV block moves between instances, an instance leader's side of them
 * (ARCHITECTURE § 8, "KV block moves"; messages in transport/move_msg.h, data over UCX in
 * transport/kv_mover.h).
 *
 * Importing. The router sends a request to this instance with a pull hint: another instance (its
 * leader rank) holds a longer cached prefix of the prompt. kv_moves_park() holds the request back
 * and asks that leader for the prefix (KV_EXPORT). When the answer (KV_EXPORTED) lists the blocks,
 * the local prefix is matched and acquired, device blocks are reserved for the rest, the cache's
 * pending operations are applied at once (a block freed by a demotion is only safe to overwrite
 * once its STORE ran), and one batch of UCX reads copies every layer's K and V and the recorded
 * positions of the missing blocks straight into this instance's pool. When the batch lands, the
 * blocks are committed to the tree (they are then ordinary cached blocks: KV events, eviction,
 * reuse) and the request is handed back through the ready callback with the tokens that came
 * from the other instance, then the lease is returned (KV_RELEASE). Any failure on the way — the
 * source lends nothing, no device room, a UCX error, no answer within the timeout of the ask, or no
 * landing within the timeout of the reads' start (an answer read late, after a long step here, still
 * gets its full time) — hands the request back with 0 moved tokens and it recomputes: a move can
 * fail, a request never. Requests the router sent here without a hint because it counted a parked
 * import's blocks as local wait behind that import in the leader (worker/import_followers.h) and
 * reach the engine when the ready callback hands the import's request back.
 *
 * Lending. On KV_EXPORT the leader matches the prefix in its own cache and lends it
 * (kv_cache_lend: the path stays locked and its host copies stay put) under a lease that
 * KV_RELEASE ends, or a timeout when the importer went away; the answer carries the blocks' tiers
 * and ids and this rank's mover description (its device and host pools registered at creation).
 * The leader hands an ask (MSG_KV_EXPORT) to kv_moves_handle between two layers of an engine step
 * too (instance_leader.c, the CPU backend's step pulse), so an ask waits one layer, not a whole
 * step, which on a loaded CPU outlasts the timeout (issue 33). That is safe: lending locks blocks
 * earlier steps committed (a step's own blocks join the tree after its forward), the prefetch's
 * overlapped copies are waited for first, and the data is read by the mover's progress thread.
 * Every other move message is handled between steps only.
 *
 * Tensor parallelism: every rank of an instance has a mover over its own shard of the pools
 * (KvMoveRank); at start-up the leader gathers its ranks' descriptions (kv_moves_gather) and lends
 * them all. Moves go shard by shard, rank i to rank i: the borrowing leader sends each peer a MOVE
 * plan (step_msg.h: the pending cache operations, the runs to read, the lender rank's description),
 * reads its own shard, and lands the move once every peer answered that its reads landed
 * (TAG_MOVE_DONE). Lender and borrower must have the same TP degree (else the borrower declines).
 * Backends: the CPU backend's pools are host memory, read over UCX (kv_mover.h), both tiers. A CUDA
 * instance's ranks describe their device pools with CUDA IPC handles (kv_move_cuda.h): a borrower on
 * the same node opens the lender's pool once and copies the runs device to device on its compute
 * stream, polled by an event; over IPC a CUDA lender lends only the leading device-tier blocks of a
 * prefix, after its queued GPU work finished. Across nodes (the ask carries the importer's host name;
 * or always, with BRAID_KV_MOVE_STAGED=1 in the lender's environment, which tests use on one GPU) a
 * CUDA lender stages the prefix's blocks of both tiers (the host tier copied host to host) into a
 * pinned window registered with UCX instead and answers with the
 * window's own description, the lent blocks renamed to window slots 0..n-1; the borrower reads the
 * window chunk by chunk through its pinned landing ring and copies each chunk to its device
 * (worker/kv_move_cuda_staged.h; TP 1 only). The ask also carries the importer's KV layout: a CUDA
 * (bf16) lender and a CPU (fp16) borrower, or the reverse, refuse each other at the lender with the
 * reason. Each landed move reports its link (UCX, CUDA IPC or CUDA staged) for the router. ForkKV's shared base cache refuses at kv_moves_create with the reason, and
 * the instance tells the coordinator it takes no part in moves (READY). A joined instance's leader
 * (its own MPI job, reached over an intercommunicator) cannot reach other leaders on MPI: its move
 * messages, and theirs to it, go through the coordinator (MSG_KV_RELAY, relay_from_rank below);
 * the data still goes over UCX between the two leaders. So do a leader respawned by
 * --restart-instances (it keeps its instance's leader rank number, but only its intercommunicator
 * with rank 0 reaches it) and, under that option, every world leader (relay_from_rank 1), since
 * any leader rank may stand for a respawned one. A lone instance starts no mover at all (braid
 * serve decides).
 * Not thread-safe: the leader's thread.
 */
#ifndef BRAID_WORKER_KV_MOVES_H
#define BRAID_WORKER_KV_MOVES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include <mpi.h>

#include "transport/ctrl_endpoint.h"
#include "worker/engine.h"
#include "worker/kv_move_rank.h"

typedef struct KvMoves KvMoves;

typedef struct {
    Engine *engine;
    CtrlEndpoint *ctrl; /* the leader's control endpoint; other leaders are ranks on its communicator */
    int instance;       /* for logs */
    int tp_size;
    MPI_Comm tp_comm;   /* the instance's ranks (MOVE plans to the peers when tp_size > 1) */
    double timeout_s;   /* an import not landed by then recomputes; a lease ends after 4x that */
    /* Relayed moves (a joined instance, --join-instance): leader ranks >= relay_from_rank are not on
     * ctrl's communicator, so messages to them go to the coordinator as MSG_KV_RELAY envelopes
     * naming self_rank (this leader's rank in the coordinator's numbering) and the destination; 0:
     * every leader is reached directly. A relayed message that arrives is handed to
     * kv_moves_handle with its sender's leader rank as source. */
    int relay_from_rank;
    int self_rank;
} KvMovesConfig;

typedef struct {
    uint64_t moved_in_blocks, moved_in_bytes, move_failures, lent_blocks;
    /* Moves that ended without a read and without a fault: the lender had nothing to lend, or the
     * prefix got here meanwhile (this instance's own requests prefilled it while the ask waited on a
     * busy lender). Not failures, but a move the router planned that did not pay. */
    uint64_t move_declines;
} KvMoveCounters;

/* Called for a parked request once its move is over (landed or not): moved_tokens of its prompt
 * now sit in this instance's cache because of the move (0 when it failed); move_s is the move's
 * measured time from queuing the reads to landing (0 when it failed) and link its MoveLink
 * (transport/control_msg.h), which the coordinator's router learns per instance pair. */
typedef void (*KvMoveReadyFn)(void *ctx, void *owner, int moved_tokens, double move_s, int link);

/* -1 with err when this instance cannot take part (the scope above, or UCX could not start). With
 * tp_size > 1 the moves are usable after kv_moves_set_ranks. */
int kv_moves_create(KvMoves **out, const KvMovesConfig *cfg, BraidError *err);
/* The descriptions of every rank of the instance, from kv_moves_gather (copied). */
int kv_moves_set_ranks(KvMoves *mv, const WireBuf *all, BraidError *err);
/* This leader rank's own description (what it gives kv_moves_gather). */
const WireBuf *kv_moves_rank_desc(const KvMoves *mv);
/* Ends every lease, abandons every import (their requests are not handed back). NULL ok. */
void kv_moves_destroy(KvMoves *mv);
/* A request with a pull hint: 1 when parked (the move started; owner comes back through the
 * ready callback), 0 when no move is worth trying (the caller submits it now). r must stay valid
 * while parked; owner is the caller's handle for it. */
int kv_moves_park(KvMoves *mv, const SchedRequest *r, int source_rank, int source_blocks, void *owner);
/* A message from another leader (MSG_KV_EXPORT / MSG_KV_EXPORTED / MSG_KV_RELEASE). -1 only on
 * a local failure that stops the leader (applying cache operations failed); bad messages are
 * logged and dropped. */
int kv_moves_handle(KvMoves *mv, int source, int type, const uint8_t *data, size_t len, KvMoveReadyFn ready, void *ctx,
                    BraidError *err);
/* Progresses UCX, lands finished reads, ends timed-out imports and leases. */
void kv_moves_poll(KvMoves *mv, KvMoveReadyFn ready, void *ctx);
/* Imports in flight (the leader should not nap). */
bool kv_moves_busy(const KvMoves *mv);
KvMoveCounters kv_moves_counters(const KvMoves *mv);

#endif
