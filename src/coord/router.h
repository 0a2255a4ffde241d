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

typedef enum { ROUTER_CACHE_AWARE = 0, ROUTER_ROUND_ROBIN, ROUTER_BALANCED } RouterMode;

typedef struct {
    int n_instances;
    RouterMode mode;
    int next_turn;     /* ROUTER_ROUND_ROBIN: the next instance to try */
    BlockIndex *index; /* (n_instances) */
    int *load;         /* (n_instances) */
    bool *down;        /* (n_instances) dead instances, never picked */
    StrMap *affinity;  /* workflow id -> instance + 1 (0: ended); reset past ROUTER_MAX_AFFINITY ids */
    int load_slack;    /* an instance more than this many requests above the least loaded is "badly unbalanced" */
} Router;

typedef struct {
    int instance;
    int matched_blocks;  /* cached prefix the chosen instance is believed to hold */
    const char *reason;  /* "cache", "affinity", "load", "round-robin" (for the event log) */
    int source;          /* another live instance holding more of the prefix, -1 when none */
    int source_blocks;   /* the prefix it holds, in blocks */
} RouteDecision;

int router_init(Router *r, int n_instances, int load_slack);
void router_free(Router *r);
/* hashes: chained hashes of the prompt's full blocks; workflow may be NULL. */
RouteDecision router_pick(Router *r, const uint64_t *hashes, int n_hashes, const char *workflow);
/* Bookkeeping: a request was sent to / finished on an instance. */
void router_assigned(Router *r, int instance, const char *workflow);
void router_finished(Router *r, int instance);
/* The workflow has ended: its later requests (if any) get no affinity. */
void router_workflow_ended(Router *r, const char *workflow);
#define ROUTER_MAX_AFFINITY 65536
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
