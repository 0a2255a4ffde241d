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
    h->respawned = calloc(n, sizeof *h->respawned);
    h->revived = calloc(n, sizeof *h->revived);
    if (!h->last_heard || !h->state || !h->reason || !h->respawned || !h->revived) {
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
    for (int i = 0; h->respawned && i < h->n_instances; i++) rank_directory_free(&h->respawned[i]);
    free(h->respawned);
    free(h->revived);
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

/* Where the instance's rank t is watched: a revived instance's own process (none until it named
 * it), else the job's directory. NULL when there is nothing to look at. */
static const RankDirectory *watch_of(const InstanceHealth *h, int instance, int t, int *at) {
    const RankDirectory *d = h->dir;
    *at = 1 + instance * h->tp + t;
    if (h->revived[instance]) d = &h->respawned[instance], *at = t;
    return d && *at < d->n_ranks ? d : NULL;
}

/* The first rank of the instance whose process is gone, or -1; *pid gets its pid. */
static int gone_rank(const InstanceHealth *h, int instance, long *pid) {
    for (int t = 0; t < h->tp; t++) {
        int at;
        const RankDirectory *d = watch_of(h, instance, t, &at);
        if (d && rank_directory_alive(d, at) == RANK_GONE) {
            *pid = (long)d->pid[at];
            return 1 + instance * h->tp + t;
        }
    }
    return -1;
}

int instance_health_next_dead(InstanceHealth *h, double now) {
    bool check_processes = now - h->last_check >= INSTANCE_HEALTH_CHECK_PERIOD_S;
    for (int i = 0; i < h->n_instances; i++) {
        if (h->state[i] == INSTANCE_DEAD) continue;
        char why[192];
        long pid = 0;
        int rank = check_processes ? gone_rank(h, i, &pid) : -1;
        if (rank >= 0)
            snprintf(why, sizeof why, "%s %d (pid %ld) exited", h->revived[i] ? "the respawned leader of instance" : "rank",
                     h->revived[i] ? i : rank, pid);
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
    if (!valid(h, instance)) return 0;
    int signalled = 0;
    for (int t = 0; t < h->tp; t++) {
        int at;
        const RankDirectory *d = watch_of(h, instance, t, &at);
        if (!d || rank_directory_alive(d, at) != RANK_ALIVE) continue;
        if (rank_directory_kill(d, at) == 0) signalled++;
    }
    return signalled;
}

int instance_health_revive(InstanceHealth *h, int instance, double now) {
    if (!valid(h, instance) || h->tp != 1) return -1;
    rank_directory_free(&h->respawned[instance]);
    RankDirectory *d = &h->respawned[instance];
    d->pid = calloc(1, sizeof *d->pid);
    d->start_ticks = calloc(1, sizeof *d->start_ticks);
    d->local = calloc(1, sizeof *d->local);
    if (!d->pid || !d->start_ticks || !d->local) {
        rank_directory_free(d);
        return -1;
    }
    h->revived[instance] = true;
    h->state[instance] = INSTANCE_STARTING;
    h->last_heard[instance] = now;
    h->reason[instance][0] = '\0';
    return 0;
}

void instance_health_respawned_process(InstanceHealth *h, int instance, pid_t pid, uint64_t start_ticks) {
    if (!valid(h, instance) || !h->revived[instance] || !h->respawned[instance].pid) return;
    RankDirectory *d = &h->respawned[instance];
    d->pid[0] = pid;
    d->start_ticks[0] = start_ticks;
    d->local[0] = true; /* the coordinator names it only when it runs on this host */
    d->n_ranks = 1;
}
