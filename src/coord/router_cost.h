/*
 * router_cost.h — the cost model behind --router cost (the default): for one instance, the
 * estimated time to first token of a prompt if it were sent there, and how the model's rates are
 * learned from what the cluster measures.
 *
 *   TTFT(i) = queue ahead on i
 *           + prefill of the prompt tokens i would compute
 *           + move time of the prefix blocks another instance can lend i (when moving them is
 *             cheaper than computing them):
 *                 blocks x block size x KV bytes per token / link rate + per-move latency
 * A busy lender answers a move at the next point of its engine step where it looks at asks: with
 * lender_step_parts = 1 between steps, so it adds the rest of its current step (min(its queue ahead,
 * one step of lender_step_tokens prefill tokens)); with P parts, between two layers of a step (the
 * CPU backend's step pulse, serve since the busy-lender fix), so it adds at most a P-th of a step.
 * P is the model's layer count: the coordinator takes it from the instances' READY (the first one;
 * ROUTE_COST_LIVE_LENDER_STEP_PARTS until one comes), and braid sim's batching replay, whose lender
 * answers at its step's next layer boundary too, from --model-layers (its fifo replay keeps 1: its
 * lender answers between steps), so each prices the lender it has. A move whose estimate
 * reaches move_timeout_s is not planned: live it would be abandoned after the timeout and the
 * prefix recomputed (the lender in a long prefill step does not answer in time).
 * Queue ahead = the prefill tokens routed to i that have not produced their first token yet, plus
 * a fixed weight per request running there (a running request slows a batching engine's step
 * without blocking a new prefill), times the measured seconds per prefill token. The caller may
 * give the queue in seconds instead (braid sim knows it exactly).
 * The router minimises a score, not the bare TTFT (route_cost_score): the TTFT plus what the choice
 * costs the other requests — the work it adds to the instance (the prefill it computes, and the
 * cached tokens its new blocks push out of a full cache, which will be computed again) times the
 * requests that work delays: every request decoding on that instance (a batching engine runs one
 * step at a time, so each running sequence waits while the step computes this prefill's chunks; one
 * still waiting for its own prefill is ahead of it, first come first served, and not stalled by it)
 * plus the requests waiting per instance across the cluster (they stand for the arrivals the work
 * will delay while queues last). Idle, that is the TTFT (spread out, move prefixes in); busy, the
 * work it costs everyone sharing the instance (keep prefixes where they are, do not recompute on a
 * crowded instance what another holds). Its one weight is a count of requests, not a tuned constant.
 * Blocks in flight count as local: the router (router.h) remembers the prompt blocks it routed to an
 * instance until no prefill is pending there, because a request queued behind them finds them
 * cached when its turn comes (even those evicted meanwhile: their own request computes them again).
 * KV bytes per token come from the model's geometry (the instance's block bytes / block size,
 * READY). The rates start from priors (serve's --move-gbps, --move-prefill-tps) and follow
 * exponentially weighted averages of the samples each finished request gives:
 *  - a request with no move: its TTFT over (queue ahead at dispatch + tokens it computed) is one
 *    sample of seconds per prefill token (from ROUTE_COST_MIN_SAMPLE_TOKENS tokens on: below, the
 *    request's fixed overhead would pass for prefill);
 *  - a request with a move: its TTFT less the modeled queue and compute is the move's time (at
 *    most the whole TTFT, at least ROUTE_COST_MOVE_FLOOR of it); moved bytes over that is one
 *    sample of the link rate — a lower bound (the residual also holds what the model missed), so
 *    the rate follows samples above it at once (weight 0.5) and below it slowly (a quarter of
 *    ROUTE_COST_LEARN_WEIGHT). Coarse — the coordinator sees no timestamps inside a move — but it
 *    follows the order of magnitude of the link, which is what the choice between moving and
 *    computing turns on.
 * Measured per pair: the borrowing leader times each move it lands (reads queued to landed) and
 * reports that time with the move's link (MOVE_LINK_*: host memory over UCX, same-node CUDA IPC,
 * cross-node pinned-host staging) on the request's FINISH; each ordered (lender, borrower) pair
 * keeps its own rate (RouteLinkRate, an exponentially weighted average in the log domain,
 * ROUTE_LINK_WEIGHT), which prices that pair's moves instead of the shared rate above once it has a
 * sample. A sample over another link than the pair's last one starts the pair afresh: the two links
 * differ by orders of magnitude (GPU to GPU over IPC vs host staging over the network), so an
 * average across them would fit neither.
 * Pure functions on the model; no global state. Not thread-safe (the coordinator's MPI thread).
 */
#ifndef BRAID_COORD_ROUTER_COST_H
#define BRAID_COORD_ROUTER_COST_H

#include <stdbool.h>

typedef struct {
    double s_per_token;       /* prefill seconds per computed prompt token (learned) */
    double link_bytes_per_s;  /* one move's sustained rate (learned) */
    double move_latency_s;    /* a move's fixed cost: the control round trip and the lender's next turn */
    double running_tokens;    /* a running request's weight in the queue ahead, in prefill tokens */
    int min_move_blocks;      /* the smallest gain a move is planned for */
    double lender_step_tokens; /* prefill tokens of one engine step (serve's --max-batch-tokens): a busy lender
                                * answers a move within a step part (lender_step_parts); 0: it answers at once */
    double move_timeout_s;    /* a move not done by then is abandoned and the prefix recomputed (--move-timeout); 0: none */
    int lender_step_parts;    /* the points in one step where a busy lender answers (its layers); <= 1: between steps */
    bool moves;               /* moves on (--kv-moves) */
    long prefill_samples, link_samples; /* how many samples each rate has learned from */
} RouteCostModel;

#define ROUTE_COST_DEFAULT_RUNNING_TOKENS 8.0
#define ROUTE_COST_LEARN_WEIGHT 0.2 /* weight of a new sample in the running averages */
#define ROUTE_COST_MOVE_FLOOR 0.05  /* a move took at least this share of its request's TTFT */
#define ROUTE_COST_MIN_SAMPLE_TOKENS 64   /* a prefill sample needs this many tokens queued + computed */
/* Live, a busy lender answers between two layers of its step: its wait is at most one layer's share
 * of the step. The instances' READY carries the model's layer count and the coordinator prices with
 * it; this is the fallback until a READY with a count comes: the served models have 24-30 layers
 * (Qwen2.5-0.5B 24, SmolLM2-135M 30), so 16 bounds a layer's share from above for any model of 16
 * layers or more (priced high rather than low: a move priced too cheap may run into the timeout). */
#define ROUTE_COST_LIVE_LENDER_STEP_PARTS 16

/* What the model needs to know about one candidate instance for one prompt. */
typedef struct {
    double queue_s;           /* work ahead of the prompt on the instance, seconds */
    int prompt_tokens;
    int block_size;           /* tokens per block */
    int local_blocks;         /* prefix blocks the instance holds (any tier) */
    int source_blocks;        /* the longest prefix another instance that can lend holds; 0: none */
    bool can_move;            /* the instance takes moves and a lender exists */
    double bytes_per_token;   /* K/V bytes of one token across layers */
    long free_blocks;         /* room left in the instance's cache, in blocks; < 0: unknown (never counted full) */
    double link_bytes_per_s;  /* the measured rate from that lender to this instance; 0: the model's shared rate */
    double lender_queue_s;    /* work ahead on the lender, seconds (0: idle; it answers at once) */
} RouteCostInput;

/* One ordered (lender, borrower) pair's measured move rate. Zeroed: never measured. */
typedef struct {
    double bytes_per_s;
    long samples;
    int link; /* MoveLink (transport/control_msg.h) of the last sample */
} RouteLinkRate;

#define ROUTE_LINK_WEIGHT 0.3 /* weight of a new measured move in the pair's average */

typedef struct {
    double queue_s, compute_s, move_s, ttft_s;
    double recompute_s;       /* computing the blocks a move would bring instead (0: no move possible) */
    int computed_tokens;      /* prompt tokens the instance would prefill */
    int moved_blocks;         /* blocks moved in (0: none; the move did not pay) */
    double evicted_s;         /* the cached tokens they push out of a full cache, priced as prefill */
    double score_s;           /* route_cost_score: what the router minimises */
} RouteCostEstimate;

/* What dispatching a request charged its instance (kept with the request: router_charge in
 * router.h fills it, router_prefill_done and router_learn settle it). Zeroed: nothing charged. */
typedef struct {
    int instance;
    double prefill_tokens; /* added to the instance's pending prefill until its first token */
    double ahead_tokens;   /* the queue ahead at dispatch, in prefill tokens */
    double moved_bytes;    /* the move the decision counted on (0: none) */
    double t_dispatch;     /* 0: never charged */
    bool prefill_open;
} RouteCharge;

/* Priors: prefill_tokens_per_s and link_bytes_per_s > 0 (others fall back to 1). */
RouteCostModel route_cost_model_init(bool moves, double prefill_tokens_per_s, double link_bytes_per_s, double move_latency_s);
RouteCostEstimate route_cost_estimate(const RouteCostModel *m, const RouteCostInput *in);
/* lender_step_parts for a model of n_layers layers (READY's count): n_layers; ROUTE_COST_LIVE_LENDER_STEP_PARTS when
 * the count is unknown (<= 0). */
int route_cost_lender_step_parts(int n_layers);
/* How long a lender with lender_queue_s of work ahead takes to answer a move: the rest of its
 * current step part, at most one step of lender_step_tokens prefill tokens over lender_step_parts
 * (0 when idle or unknown). */
double route_cost_lender_wait_s(const RouteCostModel *m, double lender_queue_s);
/* The work a choice costs the cluster: the prefill it computes and the cached tokens it evicts. */
double route_cost_work_s(const RouteCostEstimate *e);
/* What the router minimises: the TTFT, plus the work the choice adds x the requests it delays
 * (delayed_requests: those on the instance + those waiting per live instance; <= 0: none). */
double route_cost_score(const RouteCostEstimate *e, double delayed_requests);
/* Learning from a finished request: its measured TTFT (dispatch to first token), the queue ahead
 * it was charged at dispatch (prefill tokens), the tokens it computed, and the bytes moved in for
 * it (0: no move). Samples that say nothing (a TTFT <= 0) are ignored. */
void route_cost_learn(RouteCostModel *m, double ttft_s, double ahead_tokens, int computed_tokens, double moved_bytes);
/* A landed move of `bytes` measured at `seconds` over `link`: one sample of the pair's rate.
 * Samples that say nothing (bytes or seconds <= 0) are ignored. */
void route_link_learn(RouteLinkRate *l, double bytes, double seconds, int link);

#endif
