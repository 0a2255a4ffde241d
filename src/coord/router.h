/*
 * router.h — picks the instance for each request (ARCHITECTURE § 3, step 2).
 *
 * Prefers the instance whose prefix cache already holds the longest prefix of the prompt (by the
 * per-instance BlockIndex the instances' KV events keep current), unless that instance is badly
 * overloaded compared with the least-loaded one: then only instances within the load slack
 * compete. Ties go to the instance that served the workflow last (its history is most likely
 * cached there), then to the least loaded, then to the lowest index.
 * Load = requests the coordinator has routed to the instance and not yet seen finish.
 * Mode ROUTER_ROUND_ROBIN (a baseline for benchmarks and tests) ignores caches and load: each
 * request goes to the next live instance in turn. Mode ROUTER_BALANCED is for clusters that move KV
 * blocks: the longest prefix cached anywhere counts as reachable from every instance, so the least
 * loaded instance wins, ties going to the one that holds the most of the prefix itself, then to the
 * workflow's last instance.
 * Mode ROUTER_COST (serve's and sim's default) prices every live instance with the cost model of
 * router_cost.h — queue ahead + prefill of what it would compute + the move of what another
 * instance can lend it — and picks the smallest score: the estimated time to first token, plus
 * the work the choice adds times the requests that work delays (route_cost_score). What an
 * instance holds counts the blocks in flight to it: the prompt blocks of requests routed there and
 * not yet past their prefill (Router.inflight), which a request queued behind them will find
 * cached; only stored blocks can be lent. Ties go to the workflow's
 * last instance, then to the one holding the most of the prefix, then to the least loaded, then
 * to the one whose cache holds the fewest blocks (spreading prefixes over the cluster's caches),
 * then to the lowest index. Lenders are the instances that take part in moves. The decision is
 * priced (priced, the estimates, and move: the estimate counted on moving the source's prefix in),
 * and move_plan follows it.
 * The cost mode's bookkeeping: router_instance_kv (each instance's KV geometry and whether it
 * takes part in moves), router_instance_capacity (its cache size), router_charge at dispatch (the prefill tokens it adds to the instance's
 * queue), router_prefill_done at its first token, router_learn at its finish (the measured TTFT
 * teaches the model its rates). The other modes keep the same books; only cost reads them.
 * Either way the decision also names the live instance other than the chosen one that holds the
 * longest cached prefix (source, source_blocks), when it holds more than the chosen one: the
 * coordinator may have the chosen instance move those blocks over (move_plan.h) instead of
 * recomputing them.
 * An instance marked down (router_instance_down: it died) is not picked until router_instance_up
 * (it was restarted), and its index is emptied; router_pick answers instance -1 when every
 * instance is down.
 * Owns the indexes and the workflow-affinity table. Not thread-safe (the coordinator's MPI thread).
 */
#ifndef BRAID_COORD_ROUTER_H
#define BRAID_COORD_ROUTER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strmap.h"
#include "coord/block_index.h"
#include "coord/router_cost.h"

typedef enum { ROUTER_CACHE_AWARE = 0, ROUTER_ROUND_ROBIN, ROUTER_BALANCED, ROUTER_COST } RouterMode;

/* --router's names: "cache", "round-robin", "balanced", "cost"; -1 for anything else. */
int router_mode_parse(const char *name);
const char *router_mode_name(RouterMode mode);
#define ROUTER_MODE_CHOICES "cost, cache, balanced or round-robin"

typedef struct {
    int n_instances;
    RouterMode mode;
    int next_turn;     /* ROUTER_ROUND_ROBIN: the next instance to try */
    BlockIndex *index; /* (n_instances) */
    BlockIndex *inflight; /* (n_instances) ROUTER_COST: blocks of prompts charged there (router_charge), held there by the
                             time a request queued behind them runs, even if evicted meanwhile (their request computes
                             them again); emptied when the instance has no prefill pending; at most its cache's size */
    int *load;         /* (n_instances) */
    bool *down;        /* (n_instances) dead instances, never picked */
    StrMap *affinity;  /* workflow id -> instance + 1 (0: ended); reset past ROUTER_MAX_AFFINITY ids */
    int load_slack;    /* an instance more than this many requests above the least loaded is "badly unbalanced" */
    /* ROUTER_COST */
    RouteCostModel cost;
    double *pending_prefill; /* (n_instances) prefill tokens charged and not yet past their first token */
    int *prefilling;         /* (n_instances) requests charged there and not yet past their first token */
    bool *can_move;          /* (n_instances) takes part in KV moves (READY) */
    double *bytes_per_token; /* (n_instances) K/V bytes of a token, from READY's block bytes */
    RouteLinkRate *links;    /* (n_instances x n_instances) [lender * n + borrower]: measured move rates */
    long *capacity_blocks;   /* (n_instances) blocks its cache holds, all tiers (0: unknown) */
    int block_size;          /* tokens per block (0 until an instance told: 16 is assumed) */
    RouteCostEstimate *estimate; /* (n_instances) scratch: each instance's estimate for the prompt being priced */
    int *match;              /* (n_instances) scratch: each instance's cached prefix for the prompt being priced, counting the
                                blocks in flight to it (a request queued behind them finds them stored) */
    int *held;               /* (n_instances) scratch: the part of it stored now (what it can lend) */
    uint64_t *picked;        /* the last priced prompt's block hashes (copied), which router_charge records as in flight */
    int n_picked, cap_picked;
    const double *queue_s;   /* (n_instances) borrowed, or NULL: the queue ahead in seconds, given by the
                                caller (braid sim) instead of estimated from the books */
    const double *lender_wait_s; /* (n_instances) borrowed, or NULL: how long each would take to answer a move
                                    (the rest of its current step), given by braid sim; else from the queue ahead */
} Router;

typedef struct {
    int instance;
    int matched_blocks;  /* cached prefix the chosen instance is believed to hold */
    const char *reason;  /* "cache", "affinity", "load", "round-robin" (for the event log) */
    int source;          /* another live instance holding more of the prefix, -1 when none */
    int source_blocks;   /* the prefix it holds, in blocks */
    /* ROUTER_COST: the chosen instance's estimate (router_cost.h) */
    bool priced;
    int priced_for;      /* the instance the estimate is for (a later rule that changes instance voids it) */
    bool move;           /* the estimate moves source's prefix in (move_plan follows it) */
    double est_ttft_s, est_queue_s, est_move_s, est_recompute_s;
} RouteDecision;

/* Whether d still carries the cost router's estimate for its instance. */
static inline bool route_decision_priced(const RouteDecision *d) { return d->priced && d->priced_for == d->instance && d->instance >= 0; }


int router_init(Router *r, int n_instances, int load_slack);
void router_free(Router *r);
/* hashes: chained hashes of the prompt's full blocks; workflow may be NULL. */
RouteDecision router_pick(Router *r, const uint64_t *hashes, int n_hashes, const char *workflow);
/* The same with the prompt's length in tokens (the cost mode prices the tokens past the blocks). */
RouteDecision router_pick_prompt(Router *r, const uint64_t *hashes, int n_hashes, int prompt_tokens, const char *workflow);
/* The instance is up with this KV geometry (READY): block_bytes over block_size tokens. */
void router_instance_kv(Router *r, int instance, bool can_move, uint64_t block_bytes, int block_size);
/* The instance's cache holds this many blocks in all (its tiers together; 0: unknown). */
void router_instance_capacity(Router *r, int instance, long blocks);
/* Cost bookkeeping for a dispatched request (d: its decision, now: the dispatch time). Call it
 * before router_assigned: the queue ahead it records is the one the request found. In cost mode it
 * also records the blocks of the prompt last priced (router_pick_prompt) as in flight to
 * d->instance (Router.inflight), whichever instance a later rule chose. */
RouteCharge router_charge(Router *r, const RouteDecision *d, int prompt_tokens, double now);
/* Its first token came (or it finished without one): its prefill leaves the instance's queue. */
void router_prefill_done(Router *r, RouteCharge *c);
/* It finished: ttft_s measured from dispatch (<= 0: unknown), the tokens it computed and moved in.
 * A planned move that brought nothing (it failed, and the request waited for its timeout) teaches
 * nothing. */
void router_learn(Router *r, RouteCharge *c, double ttft_s, int computed_tokens, int moved_tokens);
/* A move landed on borrower: moved_tokens brought from lender in move_s seconds (measured by the
 * borrower) over link (MoveLink): one sample of that pair's rate (router_cost.h). No-op without a
 * lender, tokens or a time. */
void router_learn_move(Router *r, int lender, int borrower, int moved_tokens, double move_s, int link);
/* The measured rate from lender to borrower (NULL: never measured). */
const RouteLinkRate *router_link(const Router *r, int lender, int borrower);
/* Bookkeeping: a request was sent to / finished on an instance. */
void router_assigned(Router *r, int instance, const char *workflow);
void router_finished(Router *r, int instance);
/* The workflow has ended: its later requests (if any) get no affinity. */
void router_workflow_ended(Router *r, const char *workflow);
#define ROUTER_MAX_AFFINITY 65536
#define ROUTER_INFLIGHT_MAX_BLOCKS ((size_t)1 << 16) /* per instance; the oldest in-flight blocks are forgotten first */
void router_stored(Router *r, int instance, const uint64_t *hashes, int n);
void router_evicted(Router *r, int instance, const uint64_t *hashes, int n);
/* The instance's cache was cleared (AllBlocksCleared): its index empties. */
void router_cleared(Router *r, int instance);
/* The registry's size over every instance's index (blocks held, bytes allocated, blocks evicted). */
void router_registry_size(const Router *r, unsigned long long *blocks, unsigned long long *bytes, unsigned long long *evicted);
/* The instance died: it leaves routing, with its index and load. */
void router_instance_down(Router *r, int instance);
/* The instance came back (restarted, with an empty cache): it is picked again. */
void router_instance_up(Router *r, int instance);

#endif
