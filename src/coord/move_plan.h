/*
 * move_plan.h — the cost model of KV block moves: whether the instance a request was routed to
 * should fetch the cached prefix another instance holds (worker/kv_moves.h) or recompute it.
 *
 *   move time      = moved blocks x block bytes / link bandwidth + per-move latency
 *   recompute time = moved blocks x block size / prefill rate
 * A move is planned when moves are on, both instances take part in them (READY: one-rank instances
 * whose KV is host memory), the source holds at least min_blocks more than the chosen instance,
 * and the move is the cheaper. A decision of the cost router (RouteDecision.priced) was weighed
 * already, with the router's learned rates (router_cost.h): it is followed as it stands, under the
 * same conditions (moves on, both instances READY for moves, the gain at least min_blocks). The defaults describe this project's CPU cluster on one machine
 * (serve --help); on a GPU cluster the prefill rate is far higher and the model moves less.
 * Pure; no state.
 */
#ifndef BRAID_COORD_MOVE_PLAN_H
#define BRAID_COORD_MOVE_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "coord/router.h"

typedef struct {
    bool enabled;
    double link_bytes_per_s;     /* sustained bandwidth of one move (UCX transport between instances) */
    double latency_s;            /* per move: the control round trip and the lender's next loop turn */
    double prefill_tokens_per_s; /* the chosen instance's prefill rate */
    int min_blocks;              /* smallest gain worth a move */
    int lender_step_tokens;      /* prefill tokens of an engine step (--max-batch-tokens): a busy lender answers between steps */
    double timeout_s;            /* a move not done by then is abandoned (--move-timeout); 0: none */
} MoveCostModel;

#define MOVE_DEFAULT_LINK_GBPS 1.0
#define MOVE_DEFAULT_LATENCY_S 0.002
#define MOVE_DEFAULT_PREFILL_TPS 1000.0
#define MOVE_DEFAULT_MIN_BLOCKS 1

typedef struct {
    int source;      /* -1: no move */
    int blocks;      /* the prefix to ask the source for (its whole cached part of the prompt) */
    double move_s, recompute_s; /* the model's estimates for the blocks the move would bring */
} MovePlan;

MoveCostModel move_cost_model_default(void);
/* can_move and block_bytes: per instance (READY). block_size: tokens per block. */
MovePlan move_plan(const MoveCostModel *m, const RouteDecision *d, const bool *can_move, const uint64_t *block_bytes, int block_size);

#endif
