/*
 * instance_leader.h — the cluster roles of worker ranks: an instance's leader and its TP peers.
 *
 * The leader (tp_rank 0) owns the instance's engine (scheduler, prefix cache, backend on its
 * weight shard). It takes SUBMIT / CANCEL / WORKFLOW_END / SHUTDOWN from the coordinator, runs
 * engine steps while there is work, and reports back: one TOKENS message per step with every token
 * sampled in it, FINISH per ended request, STATS about every 100 ms, and one KV_EVENTS message per
 * step with the cache's events (blocks stored / removed per tier, with chained content hashes). With T > 1 it
 * sends each step's batch to its peers (step_msg.h) before running its own share of the forward.
 * A peer runs the same forward on its shard for every batch it receives, until a STOP.
 * KV block moves (kv_moves.h): the leader also takes KV_EXPORT / KV_EXPORTED / KV_RELEASE from
 * other leaders, parks a SUBMIT with a pull hint until its move is over, and sends its peers MOVE
 * plans; a peer serves those with its own mover (kv_move_rank.h). An ask for a loan (KV_EXPORT) is
 * answered between two layers of a long step as well (the CPU backend's step pulse), so a borrower
 * waits one layer for it, not a whole step (issue 33); other move messages wait for the step's end.
 * BRAID_TEST_LAYER_DELAY=SECONDS[:MIN_TOKENS] (tests only) makes every step of at least MIN_TOKENS
 * tokens sleep SECONDS between its layers: a step longer than --move-timeout on any machine.
 * Adapters at run time: LORA_LOAD / LORA_UNLOAD from the coordinator change the rank's adapter set
 * between steps and are answered with LORA_RESULT (leader_lora.h).
 * A SUBMIT the leader cannot take (it does not decode: an empty prompt, a bad field) is never
 * dropped in silence: its FINISH says FINISH_ERROR with the reason (instance_leader_refusal), so
 * the coordinator answers the client; only a message too short to hold a request id is just logged
 * (the coordinator's request watchdog answers that request).
 * After SHUTDOWN the leader finishes every request it holds, then stops its peers and returns.
 * When SHUTDOWN says the job lost ranks (another instance died), both roles report it through
 * *lost_ranks so the caller skips MPI_Finalize, whose job-wide fence could wait for the dead forever.
 * Both loops sleep briefly when idle instead of spinning (ranks may share cores).
 * Single-threaded: each runs on its rank's main thread, which owns MPI there.
 */
#ifndef BRAID_WORKER_INSTANCE_LEADER_H
#define BRAID_WORKER_INSTANCE_LEADER_H

#include <mpi.h>
#include <stdbool.h>

#include "model/model.h"
#include "transport/wire.h"
#include "worker/engine.h"

typedef struct {
    const BraidModel *model;
    EngineConfig engine;       /* shard / tp / before_forward are filled in by the role */
    MPI_Comm world;            /* the coordinator is rank 0 here */
    MPI_Comm tp_comm;          /* this instance's ranks; the leader is rank 0 */
    int instance;              /* index, for logs */
    int cuda_device;
    const char *occupancy_log; /* leader: append pool-occupancy samples here (occupancy_log.h); NULL = off */
    double occupancy_interval; /* seconds between samples at most (0 = 1.0) */
    bool kv_moves;             /* lend and take KV blocks to and from other instances (kv_moves.h) */
    /* Every move message goes through the coordinator (MSG_KV_RELAY), none straight to another
     * leader: set under --restart-instances, where a respawned leader keeps its instance's world
     * rank number but is reached only over its own intercommunicator with rank 0. A leader whose
     * control plane is an intercommunicator (respawned, joined) relays everything anyway. */
    bool relay_moves;
    double move_timeout_s;     /* a move not done by then recomputes (0 = 5 s) */
    /* > 0: a leader that hears nothing from the coordinator for this long stops with an error (a
     * joined leader: the coordinator sends MSG_COORD_ALIVE every second, so silence means it is gone);
     * 0: never. */
    double coordinator_timeout_s;
} WorkerRoleConfig;

/* Runs until the coordinator's SHUTDOWN has been honoured. Returns 0, or -1 with err filled. */
int instance_leader_run(const WorkerRoleConfig *cfg, bool *lost_ranks, BraidError *err);
/* The FINISH (FINISH_ERROR, error = why) answering a SUBMIT message the leader cannot take, encoded
 * into *out (which the caller frees with wire_buf_free, or sends); *req_id is the request's id.
 * -1 (out untouched) when the message is too short to hold even the id. Pure: no MPI. */
int instance_leader_refusal(const uint8_t *submit, size_t len, const char *why, WireBuf *out, uint64_t *req_id);
/* Runs until the leader's STOP. */
int tp_peer_run(const WorkerRoleConfig *cfg, bool *lost_ranks, BraidError *err);

#endif
