#include "coord/instance_health.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int instance_health_init(InstanceHealth *h, int n_instances, int tp, const RankDirectory *dir, double timeout_s, double now) {
    memset(h, 0, sizeof *h);
    size_t n = n_instances > 0 ? (size_t)n_instances : 1;
    h->last_heard = calloc(n, sizeof *h->last_heard);
    h->state = calloc(n, sizeof *h->state);
    h->reason = calloc(n, sizeof *h->reason);
    if (!h->last_heard || !h->state || !h->reason) {
        instance_health_free(h);
        return -1;
    }
    h->n_instances = n_instances;
    h->tp = tp;
    h->dir = dir;
    h->timeout_s = timeout_s;
    h->last_check = now - INSTANCE_HEALTH_CHECK_PERIOD_S; /* the first call checks */
    for (int i = 0; i < n_instances; i++) h->last_heard[i] = now, h->state[i] = INSTANCE_STARTING;
    return 0;
}

void instance_health_free(InstanceHealth *h) {
    free(h->last_heard);
    free(h->state);
    free(h->reason);
    memset(h, 0, sizeof *h);
}

static bool valid(const InstanceHealth *h, int instance) { return instance >= 0 && instance < h->n_instances; }

void instance_health_heard(InstanceHealth *h, int instance, double now) {
    if (valid(h, instance) && h->state[instance] != INSTANCE_DEAD) h->last_heard[instance] = now;
}

void instance_health_started(InstanceHealth *h, int instance, double now) {
    if (!valid(h, instance) || h->state[instance] == INSTANCE_DEAD) return;
    h->state[instance] = INSTANCE_UP;
    h->last_heard[instance] = now;
}

bool instance_health_declare_dead(InstanceHealth *h, int instance, const char *reason) {
    if (!valid(h, instance) || h->state[instance] == INSTANCE_DEAD) return false;
    h->state[instance] = INSTANCE_DEAD;
    snprintf(h->reason[instance], sizeof h->reason[instance], "%s", reason);
    return true;
}

/* The first rank of the instance whose process is gone, or -1. */
static int gone_rank(const InstanceHealth *h, int instance) {
    if (!h->dir) return -1;
    for (int t = 0; t < h->tp; t++) {
        int rank = 1 + instance * h->tp + t;
        if (rank_directory_alive(h->dir, rank) == RANK_GONE) return rank;
    }
    return -1;
}

int instance_health_next_dead(InstanceHealth *h, double now) {
    bool check_processes = now - h->last_check >= INSTANCE_HEALTH_CHECK_PERIOD_S;
    for (int i = 0; i < h->n_instances; i++) {
        if (h->state[i] == INSTANCE_DEAD) continue;
        char why[192];
        int rank = check_processes ? gone_rank(h, i) : -1;
        if (rank >= 0)
            snprintf(why, sizeof why, "rank %d (pid %ld) exited", rank, (long)h->dir->pid[rank]);
        else if (h->state[i] == INSTANCE_UP && h->timeout_s > 0 && now - h->last_heard[i] > h->timeout_s)
            snprintf(why, sizeof why, "no message from its leader for %.1f s (--instance-timeout %g)", now - h->last_heard[i],
                     h->timeout_s);
        else continue;
        instance_health_declare_dead(h, i, why);
        return i;
    }
    if (check_processes) h->last_check = now;
    return -1;
}

bool instance_health_is_dead(const InstanceHealth *h, int instance) {
    return valid(h, instance) && h->state[instance] == INSTANCE_DEAD;
}

int instance_health_alive_count(const InstanceHealth *h) {
    int n = 0;
    for (int i = 0; i < h->n_instances; i++) n += h->state[i] != INSTANCE_DEAD;
    return n;
}

const char *instance_health_reason(const InstanceHealth *h, int instance) {
    return instance_health_is_dead(h, instance) ? h->reason[instance] : "";
}

const char *instance_state_name(InstanceState s) {
    return s == INSTANCE_UP ? "up" : s == INSTANCE_STARTING ? "starting" : "dead";
}

int instance_health_fence(const InstanceHealth *h, int instance) {
    if (!h->dir || !valid(h, instance)) return 0;
    int signalled = 0;
    for (int t = 0; t < h->tp; t++) {
        int rank = 1 + instance * h->tp + t;
        if (rank_directory_alive(h->dir, rank) != RANK_ALIVE) continue;
        if (rank_directory_kill(h->dir, rank) == 0) signalled++;
    }
    return signalled;
}
