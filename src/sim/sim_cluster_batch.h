/*
 * sim_cluster_batch.h — braid sim --instances N with instances that batch as braid serve's do (the
 * default cluster replay, SIM_REPLAY_BATCH; sim_cluster.h has the config, the results and the FIFO
 * replay this one replaced).
 *
 * Each instance runs the live scheduler (worker/scheduler.h: continuous batching, chunked prefill
 * under max_batch_tokens, at most max_running sequences, a prefix cache under SimClusterConfig.policy,
 * LRU by default) step by step in modeled time, as sim_tenants.h does for one instance. As the
 * coordinator does, a policy that takes predictions (pbkv) gets each call's forecast ("what comes after
 * it") on every instance when the call is dispatched, before it queues, and a workflow's end reaches
 * every instance's cache: so a call waiting in the queue, and the blocks the running requests hold,
 * weigh on the policy as live (the one-at-a-time replay serves each call the moment its forecast
 * lands, with the whole pool). A step costs
 *     step_s + prefill_s_per_token x its prompt tokens + max(0, decode_s_per_token - step_s) x its decodes,
 * so a lone sequence's decode step costs decode_s_per_token, as in the FIFO replay. The step is planned
 * when it starts (requests that arrive during it wait for the next one) and committed when it ends:
 * that is when its full blocks enter the instance's cache, its cache events reach the router's index,
 * and its first and last tokens are timed, as live.
 *
 * The router is the live one with the coordinator's books: a request is charged to its instance when
 * routed (load, workflow affinity, prefill tokens pending), its prefill leaves the queue at its first
 * token, and its TTFT teaches the cost router its rate when it finishes (coord/router.h). Prompt token
 * ids come from the trace's "tokens", else from its block hashes (equal prefixes, equal ids) with a
 * tail unique to the request; the router's keys are the content hashes the caches report.
 *
 * A planned move parks the request, as kv_moves.c does, and the borrower acts only between its engine
 * steps, as instance_leader.c's loop does (messages, move polls, then one step): it takes the request
 * and asks the lender at its first turn (the end of the step it is in, or at once when idle; the move's
 * timeout starts there). The lender answers as a live leader does, between two layers of its step (the
 * CPU backend's step pulse): at once when idle, else at the first boundary at or after the ask when its
 * step in progress is split in cfg->n_layers equal parts (n_layers <= 1: at the step's end), with the
 * prefix it holds then (the step's own blocks are not committed before its end). The router prices that
 * wait with lender_step_parts = n_layers (cfg->router_lender_parts when set). The borrower, at its next
 * turn, reads the blocks past its own prefix over the link (blocks x block bytes / bandwidth + latency);
 * at the first turn after they land it commits them to its cache and queues the request. A move not landed by move_timeout_s after the ask
 * fails at the borrower's first turn past it: the request is queued and computes the prefix
 * (move_failures). A lender that holds no more than the borrower lends nothing (no move). Message and
 * turn overheads are not modeled.
 * A request routed without a move of its own to an instance that a move is heading for waits for that
 * move's end (landed, failed or lent nothing) when the move brings it more whole blocks than the instance
 * holds of its prompt now, as the live leader holds it (worker/import_followers.h: the blocks both prompts
 * share at the head, at most what the move asked for; the move bringing the most, the first parked on a
 * tie); it is queued right after the move's own request (import_waits counts them).
 *
 * With closed_loop, the workflows are sent as braid-bench run's client sends them: cfg->closed_loop_clients at once
 * (0: as many as the trace's client ran, the workflows started before the first one ended), claimed in the order of
 * their first calls; a workflow's calls go in stages (calls sent within SIM_STAGE_SPREAD_S, 0.1 s, of the stage's
 * first: a fan-out, keeping their offsets), each sent when every call of the stage before it has answered in the
 * replay, not at its trace time; when its last call has answered the workflow ends (router_workflow_ended) and its
 * client claims the next. Latency and TTFT count from the send. Open loop, the trace's workflow ends reach the router
 * at their times.
 *
 * The coordinator's dispatch, in its order (coordinator.c dispatch_submit / on_finish): router_pick_prompt,
 * router_charge, router_assigned, then the move planned by move_plan() (move_plan.h) at the router's start rates,
 * as serve's --move-gbps / --move-prefill-tps; at a request's end router_learn, router_learn_move (a landed move's
 * read time), router_finished. cfg->host_kv_tokens gives each instance serve's host tier (the router's capacity is
 * device + host blocks, as the coordinator's); its load-backs cost nothing here. cfg->route_log gets a line a request.
 *
 * Deterministic. Reports as sim_cluster_run does: prompt tokens by origin (local = cached at the first
 * admission less what moved in), moves, latency (arrival to last token), TTFT (arrival to first token),
 * wait (arrival to the first step that runs it), move time (arrival to landing or timeout).
 */
#ifndef BRAID_SIM_SIM_CLUSTER_BATCH_H
#define BRAID_SIM_SIM_CLUSTER_BATCH_H

#include "common/error.h"
#include "coord/router.h"
#include "sim/sim_cluster.h"
#include "sim/trace.h"

/* The router both cluster replays start with (sim_cluster.c): cfg's instances, each lending blocks of
 * block_size tokens and holding cfg->kv_tokens; the cost model's rates from cfg (the router's start
 * rates where given, else the replay's own), its lender step and move timeout. */
int sim_cluster_router_init(Router *router, const SimClusterConfig *cfg, int router_mode, int block_size, BraidError *err);

/* router_mode: the coord/router.h RouterMode cfg->route stands for. */
int sim_cluster_batch_run(const Trace *t, const SimClusterConfig *cfg, int router_mode, SimClusterResult *res, BraidError *err);

#endif
