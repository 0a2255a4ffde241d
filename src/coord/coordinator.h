/*
 * coordinator.h — rank 0's MPI side: routes accepted requests to instances and relays their
 * progress back to the HTTP threads.
 *
 * One thread (the process's main thread, which owns MPI) runs coordinator_run(). HTTP threads
 * never touch MPI: they call coordinator_submit / _cancel / _workflow_end, which only queue a
 * command under a mutex. The MPI loop drains that queue, routes (router.h) and sends SUBMITs,
 * polls the leaders' messages (READY, TOKENS, FINISH, STATS, KV events) and updates the requests
 * and the metrics. SIGINT / SIGTERM (blocked in every thread; a thread of coordinator_run's waits for
 * them) start a drain the moment they arrive: the state is "draining" (new requests get 503), the
 * on_drain hook stops accepting connections, in-flight requests finish, then every leader gets
 * SHUTDOWN and the loop returns.
 * Every accepted request ends with an answer within a bound: a leader that cannot take a SUBMIT
 * answers it with an error FINISH, and the progress watchdog (request_watchdog.h) fails a request
 * that gets neither a token nor queue movement for cfg.request_watchdog_s (500).
 * Workflow forecasts: the MPI thread owns a WorkflowForecast (src/predict/workflow_forecast.h:
 * the workflow tracker and the next-agent predictor). Every routed request with a workflow id and
 * an agent is a call: recorded, learned from, forecast; a non-empty forecast goes to every leader
 * as PREDICT ahead of the request's SUBMIT (when the instances' policy takes predictions). A
 * workflow end (POST /v1/workflows/{id}/end) retires it; once a second, workflows idle longer than
 * the timeout retire too and every leader gets WORKFLOW_END for them. Workflow ids live in their
 * tenant's namespace (coordinator_workflow_key): routing, forecasts and the leaders see the
 * namespaced key, so one tenant can neither end nor steer another's workflow of the same id.
 * Failure domains: each instance lives or dies whole (instance_health.h: a rank's process gone,
 * or its leader silent past --instance-timeout). A dead instance leaves routing and the router's
 * block index; what is left of it on this host is killed; its requests that have streamed nothing
 * yet are routed again to a live instance, the others finish with an error (503). The survivors
 * keep serving ("degraded"); with none left every request gets 503 ("failed"). With
 * --restart-instances a dead instance is spawned again (instance_restart.h); once it is ready it
 * rejoins routing and its listener (coordinator_on_instance_restarted: the warm-up thread,
 * warm_start.h) re-warms its cache in the background. If the MPI loop
 * itself fails, every request still open is answered (503) before coordinator_run returns.
 * Thread-safety: the functions marked "any thread" are safe from HTTP threads.
 */
#ifndef BRAID_COORD_COORDINATOR_H
#define BRAID_COORD_COORDINATOR_H

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

#include "coord/auth.h"
#include "coord/coord_request.h"
#include "coord/instance_health.h"
#include "coord/instance_join.h"
#include "coord/instance_restart.h"
#include "coord/kv_event_publisher.h"
#include "coord/lora_roster.h"
#include "coord/metrics.h"
#include "coord/move_plan.h"
#include "coord/request_watchdog.h"
#include "coord/router.h"
#include "coord/cache_key_affinity.h"
#include "predict/workflow_forecast.h"
#include "transport/ctrl_endpoint.h"

typedef enum { CMD_SUBMIT, CMD_CANCEL, CMD_WORKFLOW_END, CMD_LORA } CoordCommandKind;

typedef struct {
    CoordCommandKind kind;
    CoordRequest *req;  /* SUBMIT (a reference the command holds) */
    uint64_t req_id;    /* CANCEL */
    char *workflow;     /* WORKFLOW_END: the id as the client named it */
    char *tenant;       /* WORKFLOW_END: its tenant (NULL: none); the key is coordinator_workflow_key's */
} CoordCommand;

typedef struct {
    int n_instances, tp;
    int max_pending;     /* accepted, unfinished requests beyond which submit answers 429 */
    int load_slack;      /* router: see router.h */
    RouterMode router_mode;
    MoveCostModel moves; /* KV block moves between instances (move_plan.h); enabled = false: never */
    FILE *events;        /* JSONL routing decisions and the instances' KV events, or NULL */
    FILE *trace;         /* replayable trace of finished requests and workflow ends (docs/TRACE_FORMAT.md), or NULL */
    const char *ready_line; /* printed on stdout once every instance is up (the URL), or NULL */
    /* The tracker and predictor; coordinator_init takes forecast.predictor over, even when it fails.
     * forecast.idle_timeout_s > 0: workflows idle that long retire (WORKFLOW_END to the leaders). */
    WorkflowForecastConfig forecast;
    bool send_forecasts;    /* the instances' eviction policy takes predictions: send PREDICT */
    const RankDirectory *ranks; /* every rank's process (borrowed); NULL: failures seen by heartbeat only */
    double instance_timeout_s;  /* an up instance silent this long is dead; 0: never */
    KvEventPublisher *kv_publisher; /* every KV events message also goes out in vLLM's format (borrowed), or NULL */
    bool warm_start;        /* once the instances are up, the state is "warming" (and the ready line waits)
                               until coordinator_warming_done */
    /* --restart-instances: a dead instance is spawned again at most this many times (0: never;
     * tp must be 1), as `braid respawn_args... --respawned-instance I` (see instance_restart.h). */
    int max_restarts;
    const char *const *respawn_args;
    /* --join-slots (instance_join.h): instances join_first.. n_instances-1 have no rank in this job;
     * they start dead ("awaiting a joining instance") and are filled, or filled again after they
     * die, by a leader that connects as join_service from its own MPI job. join_service NULL: off. */
    int join_first;
    const char *join_service;
    /* --request-watchdog-s: a routed request with no token and no queue movement on its (live)
     * instance for this long is answered 500 (request_watchdog.h); <= 0: off. */
    double request_watchdog_s;
    /* --api-keys (borrowed; NULL = none): each tenant's weight= goes with its requests to the
     * instances' fair sharing (sched_fair.h). */
    const AuthKeys *keys;
} CoordinatorConfig;

/* One instance as /health reports it. */
typedef struct {
    InstanceState state;
    char reason[192]; /* why it died; "" otherwise */
    int restarts;     /* times it was brought back (--restart-instances) */
} InstanceStatus;

typedef enum { SUBMIT_OK = 0, SUBMIT_BUSY = 429, SUBMIT_UNAVAILABLE = 503 } SubmitResult;

/* The adapter load or unload the instances are carrying out (coordinator_lora), under mu. */
typedef struct {
    bool active, finished, unload;
    char name[257], path[4097];
    int generation;                /* load: which load of the name (model/lora_adapter.h lora_cache_name) */
    int expected, replied, failed; /* instances sent to / answered / refused */
    int busy;                      /* unload: requests of the adapter in flight (then nothing is sent) */
    char why[640];                 /* the first refusal, "instance N: ..." */
    pthread_cond_t done;
} CoordLoraOp;

typedef struct {
    CoordinatorConfig cfg;
    MPI_Comm world;
    Metrics *metrics;            /* borrowed */
    long poll_nap_ns;            /* the MPI thread's next nap while requests are in flight (coordinator.c nap) */
    /* Shared with HTTP threads, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t wake;         /* signalled when a command is queued */
    CoordCommand *queue;
    int n_queue, cap_queue;
    int inflight;                /* accepted, not finished */
    int ready_instances;
    int dead_instances;
    InstanceStatus *status;      /* (n_instances) */
    bool draining, failed;
    bool warming;                /* a warm start is prefilling its manifest (cfg.warm_start) */
    char failure[512];
    uint64_t next_id;
    int pool_tokens;             /* smallest instance pool, in tokens (0 until ready) */
    int block_size;
    /* MPI thread only. */
    double t_start;              /* trace times count from here */
    int trace_seq;
    Router router;
    CacheKeyAffinity cache_keys; /* prompt_cache_key -> instance (cache_key_affinity.h) */
    InstanceHealth health;
    CtrlEndpoint ctrl;
    bool restarts_on;
    InstanceRestarts restarts;   /* when restarts_on: spawned leaders and their endpoints */
    JoinAcceptor *joins;         /* cfg.join_service: leaders that join from their own MPI job */
    double last_alive_sent;      /* when the leaders in other MPI jobs were last sent MSG_COORD_ALIVE */
    bool *reviving;              /* (n_instances) spawned again, not yet ready: still counted dead */
    bool *ever_ready;            /* (n_instances) reported READY once (counted in ready_instances) */
    bool *can_move;              /* (n_instances) takes part in KV moves (READY; never a respawned leader) */
    uint64_t *block_bytes;       /* (n_instances) one KV block's bytes (READY) */
    int model_layers;            /* the first READY's layer count (0: none came; the router keeps its fallback) */
    uint64_t moves_planned;      /* requests sent with a pull hint */
    bool lost_ranks;             /* a rank of the job died (even if its instance came back) */
    CoordRequest **table;        /* sorted by id */
    int n_table, cap_table;
    WorkflowForecast forecast;
    bool have_forecast;
    uint64_t forecasts_sent;
    bool warned_hidden_dim;   /* the predictor's hidden-state width differs from the model's (said once) */
    bool announced;              /* the ready line went out */
    double last_expiry;          /* when idle workflows were last looked for */
    int expiry_rc;               /* an MPI failure while sending the expired ones' WORKFLOW_END */
    BraidError *expiry_err;
    void (*on_restarted)(void *ctx, int instance); /* a restarted instance is ready (NULL: nobody listens) */
    void *on_restarted_ctx;
    void (*on_drain)(void *ctx); /* a stop signal arrived: stop accepting connections (NULL: none) */
    void *on_drain_ctx;
    RequestWatchdog watchdog;    /* MPI thread only */
    uint64_t watchdog_failed;    /* (under mu) requests the watchdog answered 500 */
    uint64_t watchdog_last_id;   /* (under mu) the latest of them */
    CoordLoraOp lora_op;         /* (under mu) adapters at run time */
    LoraRoster lora_roster;      /* (under mu) the run-time adapters every instance must hold (lora_roster.h) */
    int *replay_pending;         /* MPI thread: (n_instances, allocated at the first replay) a revived instance's
                                  * run-time adapter loads not yet answered; it rejoins routing at 0 */
    int *replay_blocks;          /* MPI thread: its READY's KV blocks, for the log line when it rejoins */
} Coordinator;

int coordinator_init(Coordinator *c, const CoordinatorConfig *cfg, MPI_Comm world, Metrics *metrics, BraidError *err);
/* Adapters at run time (coord/http/http_lora.h): has every live instance's leader load adapter `name`
 * from `path` (unload: retire it), and waits up to timeout_s for their answers. Returns 0 when every
 * instance did it; 409 when an unload finds requests of the adapter in flight (nothing sent) or
 * another load/unload is under way; 400 when an instance refused (why: the first refusal; a load
 * may have succeeded on others: the caller unloads it there); 503 when no instance is up or not all
 * answered in time. why is filled whenever the result is not 0; *succeeded (may be NULL) counts the
 * instances that did it. generation (load) goes to the instances with the name (lora_cache_name).
 * A load sent is recorded in the roster (lora_roster.h) and an instance that restarts later gets it
 * again before it rejoins routing; an unload that some instance carried out takes it out. */
int coordinator_lora(Coordinator *c, bool unload, const char *name, const char *path, int generation, double timeout_s, int *succeeded,
                     char *why, size_t cap);
void coordinator_free(Coordinator *c);
/* MPI thread: runs until the drain after a signal completes (0) or an instance failed (-1). */
int coordinator_run(Coordinator *c, const sigset_t *stop_signals, BraidError *err);

/* MPI thread, after coordinator_run: whether an instance died. Then no rank may call MPI_Finalize
 * (its fence over the whole job can wait for the dead rank forever; Open MPI 4.1 measured here hung
 * in half of the runs); SHUTDOWN has told the surviving ranks so. */
bool coordinator_lost_ranks(const Coordinator *c);

/* Any thread. Takes a reference to req when accepted (SUBMIT_OK); assigns req->id. */
SubmitResult coordinator_submit(Coordinator *c, CoordRequest *req);
void coordinator_cancel(Coordinator *c, uint64_t req_id);
/* Any thread: ends the workflow `workflow` of `tenant` (NULL or "": none). Workflow ids live in
 * their tenant's namespace: two tenants' "w1" are two workflows, and a key ends only its own. */
int coordinator_workflow_end(Coordinator *c, const char *tenant, const char *workflow);
/* The namespaced key a workflow id of a tenant is routed, forecast and ended under: the id itself
 * without a tenant, else "<bytes of tenant>:<tenant>/<id>" (unambiguous whatever either holds).
 * malloc'd; NULL when out of memory or workflow is NULL. */
char *coordinator_workflow_key(const char *tenant, const char *workflow);
/* Any thread: "ready", "degraded" (some instances died, the rest serve), "loading", "warming" (up,
 * a warm start still prefilling; requests are served meanwhile), "draining" or "failed" (start-up
 * failed, or no instance is left). */
const char *coordinator_state(Coordinator *c);
/* Any thread: copies min(cap, n_instances) instances' status into out; returns how many instances
 * are alive (not dead). */
int coordinator_instances(Coordinator *c, InstanceStatus *out, int cap);
/* Any thread: the warm start has finished; the state becomes ready and the ready line goes out. */
void coordinator_warming_done(Coordinator *c);
/* Before coordinator_run: fn(ctx, i) is called on the MPI thread each time a restarted instance i
 * reports ready (and is back in routing). fn must return at once (queue work, never wait on it). */
void coordinator_on_instance_restarted(Coordinator *c, void (*fn)(void *ctx, int instance), void *ctx);
/* Before coordinator_run: fn(ctx) is called once, on a signal-waiting thread, the moment the first
 * SIGINT / SIGTERM arrives (after the state became "draining"); e.g. the HTTP server stops accepting. */
void coordinator_on_drain(Coordinator *c, void (*fn)(void *ctx), void *ctx);
/* Any thread: the watchdog's bound in seconds (0: off), the requests it failed since start-up and
 * the latest one's id (0: none), for /health. */
void coordinator_watchdog_status(Coordinator *c, double *timeout_s, uint64_t *failed, uint64_t *last_id);
/* Any thread: the smallest instance KV pool in tokens and the block size (0 before ready). */
void coordinator_pool(Coordinator *c, int *pool_tokens, int *block_size);

#endif
