/*
 * warm_start.h — `braid serve --warm-start m.jsonl`: prefill a manifest's prompt heads once the
 * instances are up, before the server reports ready (paper 004, App. S).
 *
 * A thread of its own reads the manifest (manifest_heads.h: bad and stale lines skipped with a
 * logged reason, never fatal; an unreadable file is logged and warms nothing), waits until every
 * instance is up, then sends each prompt head through the normal request path — a completion body
 * with the head's token ids, max_tokens 1, temperature 0, in the head's tenant and adapter, parsed,
 * built and submitted exactly as an HTTP request is (http_choices.h), so it is routed like one and
 * its blocks enter that instance's radix tree and segment index. With a pin TTL each body carries
 * "directives": [{"op": "pin", "ttl": TTL}] (a pin without a span pins the whole prompt). Heads go
 * one at a time (heads that share a prefix then hit the cache). Progress goes to the log
 * ("warm start: 37/120 heads, 5 skipped"); a head the server refuses is logged and counted.
 * Meanwhile the coordinator's state is "warming" (/health 503, the ready line waits); at the end
 * coordinator_warming_done. Warm-start requests are not recorded in the manifest recorder nor in
 * the request metrics.
 * Owned by rank 0's run_coordinator: begin after the HTTP server is up, end after coordinator_run
 * returned (every request is finished by then, so the join cannot hang).
 */
#ifndef BRAID_COORD_WARM_START_H
#define BRAID_COORD_WARM_START_H

#include "common/error.h"
#include "coord/http_generate.h"

typedef struct {
    const char *path;             /* the manifest (borrowed) */
    const char *pin_ttl;          /* "5m", "1h", ...; NULL = no pin directive */
    HttpGenerateContext generate; /* what an HTTP request would be built with (metrics and manifest are ignored) */
} WarmStartConfig;

typedef struct WarmStart WarmStart;

/* Starts the thread; NULL with err set when it cannot (then call coordinator_warming_done). */
WarmStart *warm_start_begin(const WarmStartConfig *cfg, BraidError *err);
/* Stops sending heads, joins the thread and frees it (NULL: nothing). */
void warm_start_end(WarmStart *w);

#endif
