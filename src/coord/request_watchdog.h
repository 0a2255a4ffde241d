/*
 * request_watchdog.h — the coordinator's per-request progress watchdog: every request it accepted
 * ends with an answer within a bound, even when its instance loses it (a message dropped, a bug).
 *
 * A routed request makes progress when a token of its own arrives, or when its instance's queue
 * moves: a request finishes there, or the instance reports more progress than in its previous
 * stats — prompt tokens admitted (computed or served from its cache), prompt tokens prefilled
 * (each chunk a step computes) or tokens generated. A request that waits behind others on a busy
 * instance is thus never failed, not even behind a prefill or a decode longer than timeout_s (a
 * loaded CPU's minutes-long prompt; issue 36), while one the instance dropped is, once the
 * instance has stood still for timeout_s. (Counting the steps of the requests ahead costs no
 * detection: each of them ends within its max_tokens, and while new ones are admitted the queue
 * moved anyway.) The
 * coordinator then answers it with a 500, logs it with its id, counts it in /metrics
 * (braid_requests_watchdog_total) and /health (requests_past_watchdog), and cancels it on the
 * instance in case it still holds it. Dead instances are not this module's concern: their
 * requests are settled when the instance is declared dead (instance_health.h).
 *
 * Pure bookkeeping over caller-given times: no clock, no locks. Owned by the coordinator's MPI
 * thread (coordinator.h); not thread-safe. Owns its arrays.
 */
#ifndef BRAID_COORD_REQUEST_WATCHDOG_H
#define BRAID_COORD_REQUEST_WATCHDOG_H

#include <stdbool.h>
#include <stdint.h>

#define REQUEST_WATCHDOG_DEFAULT_S 300.0
#define REQUEST_WATCHDOG_CHECK_PERIOD_S 0.1

typedef struct {
    double timeout_s;      /* no progress this long fails a request; <= 0: the watchdog is off */
    int n_instances;
    double *queue_moved;   /* (n_instances) last time the instance's queue moved; 0: never */
    uint64_t *admitted;    /* (n_instances) prompt tokens admitted as of its latest stats */
    bool *seen_stats;      /* (n_instances) a stats report arrived (the first one sets the baseline) */
    double last_check;
} RequestWatchdog;

/* 0, or -1 when out of memory. */
int request_watchdog_init(RequestWatchdog *w, int n_instances, double timeout_s);
void request_watchdog_free(RequestWatchdog *w);

/* A request finished on the instance (any reason): its queue moved. */
void request_watchdog_finished(RequestWatchdog *w, int instance, double now);
/* The instance's stats: admitted_tokens is its running progress total — prompt tokens admitted
 * (computed plus served from either cache tier), prompt tokens prefilled (MsgStats
 * prefilled_tokens) and tokens generated, summed by the coordinator; an increase is queue movement. */
void request_watchdog_stats(RequestWatchdog *w, int instance, uint64_t admitted_tokens, double now);
/* An instance that starts over (restarted: a new leader) has a new baseline. */
void request_watchdog_instance_reset(RequestWatchdog *w, int instance);

/* Seconds without progress for a request on instance whose own last progress (dispatch or its
 * latest token) was at t_progress. */
double request_watchdog_idle_s(const RequestWatchdog *w, int instance, double t_progress, double now);
/* Whether that request is past the watchdog. */
bool request_watchdog_expired(const RequestWatchdog *w, int instance, double t_progress, double now);
/* True at most every REQUEST_WATCHDOG_CHECK_PERIOD_S (and never when off): time to scan the requests. */
bool request_watchdog_due(RequestWatchdog *w, double now);

#endif
