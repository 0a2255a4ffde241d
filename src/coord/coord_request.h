/*
 * coord_request.h — one accepted request as both coordinator threads see it.
 *
 * The HTTP thread that accepted it fills the submission part, hands it to the MPI thread
 * (coordinator_submit), then waits on `cv` for tokens and the finish. The MPI thread appends the
 * tokens the instance streams back and records the finish, under `mu`. Reference counted: each
 * thread drops its reference when done with it, and the last one frees it.
 */
#ifndef BRAID_COORD_COORD_REQUEST_H
#define BRAID_COORD_COORD_REQUEST_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/cache_directive.h"
#include "common/token_logprob.h"
#include "coord/router_cost.h"

typedef struct CoordRequest {
    uint64_t id;
    /* Submission (written by the HTTP thread before submit, read-only afterwards). */
    int32_t *prompt;
    int n_prompt, max_tokens;
    float temperature, top_p;
    int top_k;
    uint64_t seed;
    bool ignore_eos;
    uint8_t segment_mode;   /* SegmentReuseMode, resolved against the server's */
    bool want_logprobs;     /* the instance reports each token's logprob and logprobs_top alternatives */
    int logprobs_top;
    int pull_source;        /* KV move planned for this dispatch (move_plan.h): the instance lending the prefix, -1 none */
    int pull_blocks;        /* the prefix it holds, in blocks */
    int pin_instance;       /* -1: the router picks; else the instance to run on (the n > 1 choices
                               after the first go where the first's prompt KV is cached; a restarted
                               instance's re-warm heads go to it) */
    uint64_t *block_hashes; /* chained hashes of the prompt's full blocks (seeded by
                               content_hash_namespace(tenant, adapter)), for routing */
    int n_hashes;
    char *workflow, *agent, *tenant, *adapter; /* NULL when not given; sent to the instance as they are (the
                                                  workflow as its namespaced key, workflow_key) */
    char *cache_key;        /* prompt_cache_key in its tenant's scope (cache_key_affinity_scoped), NULL when none */
    char *workflow_key;     /* the workflow in its tenant's namespace (coordinator_workflow_key): what
                               routing, forecasts and the instances see; set by coordinator_submit */
    CacheDirectives directives; /* resolved cache directives (directive_plan.h), sent with the SUBMIT */
    char *grammar;          /* the output's grammar spec (grammar.h's JSON text), NULL = unconstrained */
    bool restartable;       /* no partial answer ever reaches the client (not streamed, no stop strings read
                               as tokens arrive): generation may start over if its instance dies */
    double t_submit;
    /* The prefill's hidden state (HIDDEN from the instance), kept for the trace; written and read
     * by the MPI thread only. */
    float *hidden;
    int hidden_dim;
    /* Progress (under mu). */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *tokens;        /* generated so far */
    int n_tokens, cap_tokens;
    TokenLogprob *logprobs; /* (n_tokens) when want_logprobs: each token's logprobs, as the instance sent them */
    int cap_logprobs;
    double t_first_token;
    bool finished;
    int finish_reason;      /* FinishReason */
    int prompt_tokens, completion_tokens, preemptions;
    int cached_tokens;      /* prompt tokens served from the cache, both tiers */
    int cached_tokens_host; /* of those, loaded back from the host tier */
    int cached_tokens_remote; /* of those, moved in from another instance */
    int reused_tokens;      /* prompt tokens whose K/V came from reused segments */
    char *directive_outcomes; /* the instance's JSON array of directive outcomes (set with the finish), or NULL */
    char error[256];
    int error_status;       /* an error finish: the HTTP status to answer (0: 500); set before the finish */
    int instance;
    bool cancel_requested;  /* MPI thread only: the client's cancel was sent to the instance */
    bool workflow_held;     /* MPI thread only: the forecaster holds its workflow busy until it leaves the table */
    double t_progress;      /* MPI thread only: dispatched, or its latest token (request_watchdog.h) */
    RouteCharge route_charge; /* MPI thread only: what its dispatch charged the router's cost books (router.h) */
    int refs;
} CoordRequest;

/* A new request with one reference (the HTTP thread's); NULL when out of memory. */
CoordRequest *coord_request_create(void);
void coord_request_retain(CoordRequest *r);
void coord_request_release(CoordRequest *r);
/* MPI thread: appends a token (with its logprobs, NULL when the instance sent none: then a request
 * that wants them records zeros) / records the finish and wakes the waiter. */
int coord_request_push_token(CoordRequest *r, int32_t token, const TokenLogprob *logprob, double now);
/* MPI thread: forgets the tokens generated so far, because the request starts over on another
 * instance (its own died). Only for a restartable request or one that has no token yet. */
void coord_request_restart(CoordRequest *r);
/* The instance's usage numbers for a finished request. */
typedef struct {
    int prompt_tokens, cached_tokens, cached_tokens_host, cached_tokens_remote, reused_tokens, completion_tokens, preemptions;
    const char *directive_outcomes; /* JSON array text, or NULL / "" when the request had none (copied) */
} CoordUsage;
/* A request that finished without error and without a token (its first sampled token was EOS)
 * gets its first token's time from the finish, so every answered request has a TTFT. */
void coord_request_finish(CoordRequest *r, int reason, const CoordUsage *usage, const char *error);

#endif
