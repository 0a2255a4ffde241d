#include "coord/instance_restart.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/mpi_error.h"

int instance_restarts_init(InstanceRestarts *r, int n_instances, int max_restarts, const char *const *args, BraidError *err) {
    memset(r, 0, sizeof *r);
    int n_args = 0;
    while (args[n_args]) n_args++;
    size_t n = n_instances > 0 ? (size_t)n_instances : 1;
    r->restarts = calloc(n, sizeof *r->restarts);
    r->due = calloc(n, sizeof *r->due);
    r->joined = calloc(n, sizeof *r->joined);
    r->ep = calloc(n, sizeof *r->ep);
    r->argv = calloc((size_t)n_args + 3, sizeof *r->argv);
    r->binary = realpath("/proc/self/exe", NULL);
    if (!r->restarts || !r->due || !r->joined || !r->ep || !r->argv || !r->binary) {
        instance_restarts_free(r);
        return braid_error_set(err, "restarts: out of memory (or /proc/self/exe unreadable)");
    }
    r->n_instances = n_instances;
    r->max_restarts = max_restarts;
    for (r->argc = 0; r->argc < n_args; r->argc++)
        if (!(r->argv[r->argc] = strdup(args[r->argc]))) {
            instance_restarts_free(r);
            return braid_error_set(err, "restarts: out of memory");
        }
    return 0;
}

void instance_restarts_free(InstanceRestarts *r) {
    for (int i = 0; r->ep && i < r->n_instances; i++)
        if (r->joined[i]) ctrl_free(&r->ep[i]);
    for (int i = 0; r->argv && r->argv[i]; i++) free(r->argv[i]);
    free(r->argv);
    free(r->binary);
    free(r->restarts);
    free(r->due);
    free(r->joined);
    free(r->ep);
    memset(r, 0, sizeof *r);
}

bool instance_restarts_schedule(InstanceRestarts *r, int instance, double now, double *delay_s) {
    if (instance < 0 || instance >= r->n_instances || r->restarts[instance] >= r->max_restarts) return false;
    double delay = 1.0;
    for (int k = 0; k < r->restarts[instance] && delay < INSTANCE_RESTART_MAX_BACKOFF_S; k++) delay *= 2;
    if (delay > INSTANCE_RESTART_MAX_BACKOFF_S) delay = INSTANCE_RESTART_MAX_BACKOFF_S;
    r->due[instance] = now + delay;
    *delay_s = delay;
    return true;
}

int instance_restarts_due(const InstanceRestarts *r, double now) {
    for (int i = 0; i < r->n_instances; i++)
        if (r->due[i] > 0 && r->due[i] <= now) return i;
    return -1;
}

int instance_restarts_spawn(InstanceRestarts *r, int instance, BraidError *err) {
    char which[16];
    snprintf(which, sizeof which, "%d", instance);
    r->argv[r->argc] = "--respawned-instance";
    r->argv[r->argc + 1] = which;
    r->due[instance] = 0;
    r->restarts[instance]++;
    MPI_Comm inter = MPI_COMM_NULL;
    int spawn_error = MPI_SUCCESS;
    int rc = MPI_Comm_spawn(r->binary, r->argv, 1, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter, &spawn_error);
    r->argv[r->argc] = r->argv[r->argc + 1] = NULL;
    if (mpi_check(rc, "spawning a new leader", err)) return braid_error_wrap(err, "instance %d", instance);
    if (spawn_error != MPI_SUCCESS) return braid_error_set(err, "instance %d: MPI_Comm_spawn started no process (error %d)", instance, spawn_error);
    MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    instance_restarts_adopt(r, instance, inter, false);
    return 0;
}

void instance_restarts_adopt(InstanceRestarts *r, int instance, MPI_Comm inter, bool restarted) {
    if (restarted) r->restarts[instance]++;
    r->due[instance] = 0;
    /* The endpoint of a previous leader of this instance: its process is dead, its sends given up. */
    if (r->joined[instance]) ctrl_free(&r->ep[instance]);
    ctrl_init(&r->ep[instance], inter);
    r->joined[instance] = true;
}
