/*
 * warm_start.h — the thread that warms caches in the background: `braid serve --warm-start m.jsonl`
 * prefills a manifest's prompt heads once the instances are up, before the server reports ready
 * (paper 004, App. S); and an instance brought back by --restart-instances is re-warmed on its own.
 *
 * Start-up: the thread reads the manifest (manifest_heads.h: bad and stale lines skipped, and with
 * API keys the lines of a tenant no key runs in; one summary line by reason, never fatal; an
 * unreadable file is logged and warms nothing), waits until every instance is up, then sends the
 * heads, most counted first (warm_heads.h), wherever the router puts them — at most max_heads heads
 * and max_tokens prompt tokens, so a huge manifest cannot keep the server "warming" for hours: the
 * rest is left out and counted. Meanwhile the coordinator's state is "warming" (/health 503, the
 * ready line waits); at the end coordinator_warming_done, and the outcome goes to /metrics
 * (metrics_set_warm_start).
 * Re-warm: the coordinator calls warm_start_instance_restarted from its MPI thread when a respawned
 * leader reports ready; that only queues the instance (the MPI loop never waits on a warm-up). The
 * thread then takes the hot heads it knows — the manifest recorder's current table, chunks counted
 * at least WARM_START_REWARM_MIN_COUNT times (a chunk seen twice is one a client re-sent; one seen
 * once may never come again), most counted first; then the --warm-start file's heads — and sends
 * them pinned to that instance, at most rewarm_max_heads heads and rewarm_max_tokens prompt tokens,
 * while the instance already takes traffic. It stops early when the instance dies again or the
 * server stops. Each head warmed and each re-warm finished counts in /metrics
 * (metrics_count_rewarm). Restarts queued during the start-up warm start wait for it.
 * Warm-up requests are recorded neither in the manifest recorder nor in the request metrics.
 * Owned by rank 0's run_coordinator: begin after the HTTP server is up and before coordinator_run
 * (it registers itself with the coordinator), end after coordinator_run returned (every request
 * is finished by then, so the join cannot hang).
 */
#ifndef BRAID_COORD_WARM_START_H
#define BRAID_COORD_WARM_START_H

#include "common/error.h"
#include "coord/auth.h"
#include "coord/http/http_generate.h"
#include "coord/manifest_recorder.h"
#include "coord/metrics.h"

#define WARM_START_REWARM_MIN_COUNT 2
#define WARM_START_DEFAULT_REWARM_HEADS 64
#define WARM_START_DEFAULT_REWARM_TOKENS 16384
#define WARM_START_DEFAULT_HEADS 512
#define WARM_START_DEFAULT_TOKENS 262144

typedef struct {
    const char *path;             /* the --warm-start manifest (borrowed); NULL = no start-up warm start */
    const char *pin_ttl;          /* "5m", "1h", ...; NULL = no pin directive */
    HttpGenerateContext generate; /* what an HTTP request would be built with (its metrics and manifest are ignored) */
    ManifestRecorder *recorder;   /* hot chunks a restarted instance is re-warmed with (borrowed); NULL = none */
    Metrics *metrics;             /* re-warm counters (borrowed); NULL = none */
    int rewarm_max_heads;         /* a restarted instance gets at most this many heads; 0 = no re-warm */
    long long rewarm_max_tokens;  /* ... and at most this many prompt tokens; <= 0 = no bound */
    long long max_heads;          /* the start-up warm start sends at most this many heads; <= 0 = no bound */
    long long max_tokens;         /* ... and at most this many prompt tokens; <= 0 = no bound */
    const AuthKeys *keys;         /* --api-keys (borrowed): lines of other tenants are refused; NULL = all taken */
} WarmStartConfig;

typedef struct WarmStart WarmStart;

/* Starts the thread and registers the re-warm with cfg->generate.coord; NULL with err set when it
 * cannot (then call coordinator_warming_done). */
WarmStart *warm_start_begin(const WarmStartConfig *cfg, BraidError *err);
/* Any thread, never blocks on a warm-up: queues a re-warm of the instance (a restart's READY). */
void warm_start_instance_restarted(void *warm_start, int instance);
/* Stops sending heads, joins the thread and frees it (NULL: nothing). */
void warm_start_end(WarmStart *w);

#endif
