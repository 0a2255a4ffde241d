/*
 * warm_heads.h — prefilling prompt heads through the normal request path: the one function both
 * the start-up warm start and the re-warm of a restarted instance send their heads with
 * (warm_start.h owns the thread that calls it).
 *
 * Each head becomes a completion body with the head's token ids, max_tokens 1, temperature 0, in
 * the head's tenant and adapter (with a pin TTL, "directives": [{"op": "pin", "ttl": TTL}]), and
 * is parsed, built and submitted exactly as an HTTP request is (http_choices.h), so its blocks
 * enter the instance's radix tree and segment index and the router's index. With pin_instance the
 * request goes to that instance (as an n > 1 sibling does) instead of where the router would send
 * it. Heads go one at a time, in the given order (heads that share a prefix then hit the cache);
 * the job stops at max_heads heads, before a head that would take the prompt tokens sent past
 * max_tokens, when *stop is set or keep_going says no. Progress goes to the log under the job's
 * label ("warm start: 37/120 heads, 5 skipped, ...": skipped = the manifest's bad lines); a head the server refuses is logged and counted.
 * Called on a thread of its own (it blocks until each head's request finishes; never on the MPI
 * thread). The context's metrics and manifest recorder must be NULL: warm-up requests are not traffic.
 */
#ifndef BRAID_COORD_WARM_HEADS_H
#define BRAID_COORD_WARM_HEADS_H

#include <stdatomic.h>
#include <stdbool.h>

#include "coord/http/http_generate.h"
#include "coord/manifest_heads.h"

typedef struct {
    const HttpGenerateContext *generate; /* what an HTTP request would be built with */
    const char *label;                   /* names the job in the log: "warm start", "instance 1 re-warm" */
    const char *pin_ttl;                 /* "5m", ...; NULL = no pin directive */
    int pin_instance;                    /* -1: the router picks; else every head runs on this instance */
    int max_heads;                       /* <= 0: no bound */
    long long max_tokens;                /* prompt tokens sent, at most; <= 0: no bound */
    const atomic_bool *stop;             /* set: stop before the next head */
    bool (*keep_going)(void *ctx);       /* asked before each head (NULL: always); false stops the job */
    void *keep_going_ctx;
} WarmHeadsJob;

typedef struct {
    int warmed, refused;  /* heads prefilled / refused by the server */
    int left;             /* heads not sent: past a bound, or stopped */
    long long prompt_tokens, cached_tokens; /* of the warmed heads */
} WarmTotals;

WarmTotals warm_heads_send(const WarmHeadsJob *job, const ManifestHeads *m);

#endif
