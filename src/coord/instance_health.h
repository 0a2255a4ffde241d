/*
 * instance_health.h — which instances are alive, as the coordinator sees them: each instance is
 * a failure domain (all of its T ranks live or die together).
 *
 * An instance is declared dead when any of its ranks' processes is gone (looked up by pid in the
 * rank directory, for ranks on the coordinator's host; checked at most every
 * INSTANCE_HEALTH_CHECK_PERIOD_S) or, once it has started, when its leader has sent nothing for
 * timeout_s seconds (the only sign of death from another host; leaders send STATS every 0.1 s, so
 * silence that long means a dead or hung instance). A dead instance stays dead unless it is
 * revived (--restart-instances, tp = 1 only): then its one process is a new one, outside the
 * directory, named by the process itself (instance_health_respawned_process).
 * instance_health_fence kills what is left of a dead instance on this host, so a TP
 * peer blocked forever in a collective with a dead rank does not outlive its instance.
 * Owns its arrays, borrows the directory. Not thread-safe (the coordinator's MPI thread).
 */
#ifndef BRAID_COORD_INSTANCE_HEALTH_H
#define BRAID_COORD_INSTANCE_HEALTH_H

#include <stdbool.h>

#include "transport/rank_directory.h"

#define INSTANCE_HEALTH_CHECK_PERIOD_S 0.05

typedef enum { INSTANCE_STARTING, INSTANCE_UP, INSTANCE_DEAD } InstanceState;

typedef struct {
    int n_instances, tp;
    const RankDirectory *dir; /* borrowed; NULL or empty: no process checks, heartbeats only */
    double timeout_s;         /* silence after which an up instance is dead; 0: never */
    double last_check;
    double *last_heard;       /* (n_instances) */
    InstanceState *state;     /* (n_instances) */
    char (*reason)[192];      /* (n_instances) why a dead instance died */
    bool *revived;            /* (n_instances) revived at least once: watched through respawned[] */
    RankDirectory *respawned; /* (n_instances) a revived instance's process (n_ranks 1 once known) */
} InstanceHealth;

/* Instance i's ranks are 1 + i*tp .. (i+1)*tp (rank 0 coordinates). Returns 0, or -1 when out of memory. */
int instance_health_init(InstanceHealth *h, int n_instances, int tp, const RankDirectory *dir, double timeout_s, double now);
void instance_health_free(InstanceHealth *h);

/* The instance sent a message (any message is a heartbeat). Ignored for a dead instance. */
void instance_health_heard(InstanceHealth *h, int instance, double now);
/* The instance reported READY: from now on its silence counts. */
void instance_health_started(InstanceHealth *h, int instance, double now);
/* Declares the instance dead for the given reason (e.g. an MPI error talking to it). Returns
 * true when it was not dead already. */
bool instance_health_declare_dead(InstanceHealth *h, int instance, const char *reason);

/* One instance that died since the last calls (now marked dead, with its reason), or -1 when
 * none did. Call until it returns -1. Process checks run at most every CHECK_PERIOD. */
int instance_health_next_dead(InstanceHealth *h, double now);

bool instance_health_is_dead(const InstanceHealth *h, int instance);
int instance_health_alive_count(const InstanceHealth *h);
const char *instance_health_reason(const InstanceHealth *h, int instance);
const char *instance_state_name(InstanceState s);

/* SIGKILL to every rank of the (dead) instance still running on this host; returns how many
 * were signalled. Ranks on other hosts are left to their launcher. */
int instance_health_fence(const InstanceHealth *h, int instance);
/* A dead tp = 1 instance comes back (--restart-instances): starting again, its process not yet
 * known (until instance_health_respawned_process; a death before that is not seen). Returns -1
 * when out of memory or for tp > 1. */
int instance_health_revive(InstanceHealth *h, int instance, double now);
/* The revived instance's process on this host (MSG_REJOIN): watched and fenced from now on
 * instead of the directory's rank, which is gone for good. */
void instance_health_respawned_process(InstanceHealth *h, int instance, pid_t pid, uint64_t start_ticks);

#endif
