/* The per-request progress watchdog's bookkeeping; the contract is in request_watchdog.h. */
#include "coord/request_watchdog.h"

#include <stdlib.h>
#include <string.h>

int request_watchdog_init(RequestWatchdog *w, int n_instances, double timeout_s) {
    memset(w, 0, sizeof *w);
    size_t n = (size_t)(n_instances > 0 ? n_instances : 1);
    w->timeout_s = timeout_s;
    w->n_instances = n_instances > 0 ? n_instances : 0;
    w->queue_moved = calloc(n, sizeof *w->queue_moved);
    w->admitted = calloc(n, sizeof *w->admitted);
    w->seen_stats = calloc(n, sizeof *w->seen_stats);
    if (!w->queue_moved || !w->admitted || !w->seen_stats) {
        request_watchdog_free(w);
        return -1;
    }
    return 0;
}

void request_watchdog_free(RequestWatchdog *w) {
    free(w->queue_moved);
    free(w->admitted);
    free(w->seen_stats);
    memset(w, 0, sizeof *w);
}

static bool valid(const RequestWatchdog *w, int instance) { return instance >= 0 && instance < w->n_instances; }

void request_watchdog_finished(RequestWatchdog *w, int instance, double now) {
    if (valid(w, instance)) w->queue_moved[instance] = now;
}

void request_watchdog_stats(RequestWatchdog *w, int instance, uint64_t admitted_tokens, double now) {
    if (!valid(w, instance)) return;
    if (w->seen_stats[instance] && admitted_tokens != w->admitted[instance]) w->queue_moved[instance] = now;
    w->seen_stats[instance] = true;
    w->admitted[instance] = admitted_tokens;
}

void request_watchdog_instance_reset(RequestWatchdog *w, int instance) {
    if (!valid(w, instance)) return;
    w->seen_stats[instance] = false;
    w->admitted[instance] = 0;
}

double request_watchdog_idle_s(const RequestWatchdog *w, int instance, double t_progress, double now) {
    double last = t_progress;
    if (valid(w, instance) && w->queue_moved[instance] > last) last = w->queue_moved[instance];
    return now > last ? now - last : 0;
}

bool request_watchdog_expired(const RequestWatchdog *w, int instance, double t_progress, double now) {
    return w->timeout_s > 0 && request_watchdog_idle_s(w, instance, t_progress, now) >= w->timeout_s;
}

bool request_watchdog_due(RequestWatchdog *w, double now) {
    if (w->timeout_s <= 0 || now - w->last_check < REQUEST_WATCHDOG_CHECK_PERIOD_S) return false;
    w->last_check = now;
    return true;
}
