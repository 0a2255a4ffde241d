/*
 * instance_restart.h — bringing dead instances back (`braid serve --restart-instances N`, tp = 1).
 *
 * Policy: an instance that dies is spawned again after a backoff that doubles with each of its
 * restarts (1, 2, 4, ... s, at most INSTANCE_RESTART_MAX_BACKOFF_S), at most N times per instance,
 * so a crash loop neither spins nor goes on forever.
 * Mechanism: Open MPI 4.1 cannot add a process to a running job's MPI_COMM_WORLD, but under mpirun
 * --enable-recovery MPI_Comm_spawn still works after a rank died. Rank 0 spawns one `braid serve`
 * process over MPI_COMM_SELF with the serve arguments it was started with plus
 * `--respawned-instance I`; that process is the instance's new leader, with the intercommunicator
 * as its control plane (the coordinator is rank 0 of the remote group there, as in the world).
 * The coordinator sends to and polls the instance through that intercommunicator's endpoint,
 * beside the world's. The new leader starts with an empty cache.
 * Owns the endpoints and the spawn command. Rank 0's MPI thread only (spawn blocks it until the
 * new process has called MPI_Init: about 0.5 s measured here).
 */
#ifndef BRAID_COORD_INSTANCE_RESTART_H
#define BRAID_COORD_INSTANCE_RESTART_H

#include <stdbool.h>

#include "common/error.h"
#include "transport/ctrl_endpoint.h"

#define INSTANCE_RESTART_MAX_BACKOFF_S 30.0

typedef struct {
    int n_instances, max_restarts;
    int *restarts;   /* (n_instances) spawns made */
    double *due;     /* (n_instances) when the next spawn is due; 0 = none scheduled */
    bool *joined;    /* (n_instances) its leader is a spawned process, reached through ep[i] */
    CtrlEndpoint *ep; /* (n_instances) */
    char *binary;    /* this executable */
    char **argv;     /* the serve arguments, then --respawned-instance I, NULL */
    int argc;
} InstanceRestarts;

/* args: NULL-terminated arguments of `braid` for a respawned process ("serve", options...). */
int instance_restarts_init(InstanceRestarts *r, int n_instances, int max_restarts, const char *const *args, BraidError *err);
void instance_restarts_free(InstanceRestarts *r);
/* The instance died: its next spawn is due after the backoff (*delay_s). False when it has had
 * max_restarts already (it stays dead). */
bool instance_restarts_schedule(InstanceRestarts *r, int instance, double now, double *delay_s);
/* An instance whose spawn is due by now, or -1. */
int instance_restarts_due(const InstanceRestarts *r, double now);
/* Spawns the instance's new leader and makes its endpoint the one to use; -1 with err (the
 * instance stays dead; no further attempt is scheduled). */
int instance_restarts_spawn(InstanceRestarts *r, int instance, BraidError *err);
/* A leader that joined from its own MPI job (instance_join.h) becomes the instance's: its
 * intercommunicator is the endpoint to use from now on (a previous one's sends are given up).
 * Counts as a restart when the instance had been up before (`restarted`). */
void instance_restarts_adopt(InstanceRestarts *r, int instance, MPI_Comm inter, bool restarted);

#endif
