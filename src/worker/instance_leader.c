#include "worker/instance_leader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/grow.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "model/weight_shard.h"
#include "transport/control_msg.h"
#include "transport/ctrl_endpoint.h"
#include "transport/mpi_error.h"
#include "transport/move_msg.h"
#include "worker/import_followers.h"
#include "worker/kv_moves.h"
#include "worker/leader_lora.h"
#include "worker/occupancy_log.h"
#include "worker/step_msg.h"
#include "transport/tp_collective_mpi.h"
#ifdef BRAID_HAVE_CUDA
#include "transport/tp_collective_cuda.h"
#endif

enum { COORDINATOR_RANK = 0 };
#define STATS_PERIOD_S 0.1

/* What every rank of an instance holds for tensor parallelism. */
typedef struct {
    int tp_rank, tp_size;
    TpCollective tp;
    ModelWeights shard;
    bool have_tp, have_shard;
} TpSetup;

/* A relayed move message read in the middle of a step and handled after it (serve_move_asks). */
typedef struct {
    uint8_t *data;
    size_t len;
} HeldMove;

/* A request the leader holds, with how many of its generated tokens the coordinator has seen. */
typedef struct {
    uint64_t req_id;
    SchedRequest req;
    int reported;
    bool hidden_sent;
    bool parked;         /* waiting for a KV move (kv_moves.h) before it reaches the engine */
    bool cancel_pending; /* cancelled while parked: cancelled once it reaches the engine */
    int asked_blocks;    /* parked: the blocks its move asked for (import_followers.h) */
    bool following;      /* waiting behind another request's import (import_followers.h) */
    int moved_tokens;    /* prompt tokens a KV move brought in for it */
    double move_s;       /* that move's measured time, and its link (MoveLink), for the router */
    uint8_t move_link;
} LeaderRequest;

typedef struct {
    const WorkerRoleConfig *cfg;
    CtrlEndpoint ctrl;
    Engine engine;
    TpSetup tp;
    LeaderRequest **active;
    int n_active, cap_active;
    WireBuf kv_events;          /* this step's cache events, encoded as they happen (KV_EVENTS) */
    int n_kv_events;
    MsgTokens tokens;           /* this step's sampled tokens */
    int cap_tokens;
    bool shutting_down, failed;
    bool lost_ranks;            /* SHUTDOWN said a rank of the job died */
    double coord_heard;         /* when the coordinator last sent anything (cfg.coordinator_timeout_s) */
    bool coordinator_gone;      /* silent past cfg.coordinator_timeout_s: nothing more is sent to it */
    double last_stats;
    OccupancyLog occupancy;     /* --occupancy-log; fd -1 when off */
    KvMoves *moves;             /* KV block moves with other instances; NULL when off here */
    ImportFollowers followers;  /* requests waiting behind a parked request's import */
    ImportCandidate *candidates; /* scratch: the parked imports a new request may follow */
    int cap_candidates;
    HeldMove *held_moves;       /* relayed move messages read mid-step, for after it, in arrival order */
    int n_held_moves, cap_held_moves;
    /* Tests only (BRAID_TEST_LAYER_DELAY=SECONDS[:MIN_TOKENS]): a step of at least min tokens sleeps
     * this long between its layers, so a test gets a step longer than --move-timeout on any machine. */
    double layer_delay_s;
    int layer_delay_min_tokens;
    BraidError err;             /* first asynchronous failure (observer allocations) */
} Leader;

static void idle_sleep(double idle_for) {
    /* Short naps while traffic is recent keep latency low; longer ones stop an idle rank burning
     * the cores its own compute threads (and the coordinator) need. */
    long ns = idle_for < 0.05 ? 100000 : idle_for < 1.0 ? 1000000 : 5000000;
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

static int tp_setup(const WorkerRoleConfig *cfg, TpSetup *t, BraidError *err) {
    memset(t, 0, sizeof *t);
    if (mpi_check(MPI_Comm_rank(cfg->tp_comm, &t->tp_rank), "tp rank", err) ||
        mpi_check(MPI_Comm_size(cfg->tp_comm, &t->tp_size), "tp size", err))
        return -1;
    if (t->tp_size == 1) return 0;
#ifdef BRAID_HAVE_CUDA
    /* CUDA ranks reduce device buffers: NCCL between distinct GPUs, host-staged when they share one. */
    if (cfg->engine.device == BACKEND_CUDA) {
        if (tp_collective_cuda_create(&t->tp, cfg->tp_comm, cfg->cuda_device, err)) return -1;
    } else if (tp_collective_mpi_create(&t->tp, cfg->tp_comm, err)) {
        return -1;
    }
#else
    if (tp_collective_mpi_create(&t->tp, cfg->tp_comm, err)) return -1;
#endif
    t->have_tp = true;
    if (model_weights_shard(&cfg->model->weights, t->tp_rank, t->tp_size, &t->shard, err)) return -1;
    t->have_shard = true;
    return 0;
}

static void tp_teardown(TpSetup *t) {
    if (t->have_shard) model_weights_free(&t->shard);
    if (t->have_tp) tp_collective_destroy(&t->tp);
    memset(t, 0, sizeof *t);
}

/* Every rank of the instance learns whether all of them set up; returns 1 when all did. */
static int all_ranks_ok(MPI_Comm tp_comm, int ok) {
    int all = 0;
    if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, tp_comm) != MPI_SUCCESS) return 0;
    return all;
}

/* ---- reports to the coordinator ---- */

static int send_ready(Leader *L, bool ok, const char *error) {
    const Engine *e = &L->engine;
    MsgReady m = {.ok = ok, .n_blocks = ok ? kv_cache_total(&e->sched.cache, CACHE_TIER_DEVICE) : 0, .block_size = L->cfg->engine.block_size,
                  .context_length = L->cfg->model->weights.cfg.context_length, .kv_moves = ok && L->moves != NULL,
                  .block_bytes = ok && e->backend.cfg.n_blocks > 0 ? e->backend.kv_bytes / (size_t)e->backend.cfg.n_blocks : 0,
                  .error = (char *)(error ? error : ""), .n_layers = L->cfg->model->weights.cfg.n_layers};
    WireBuf b = {0};
    msg_ready_encode(&b, &m);
    return ctrl_send(&L->ctrl, COORDINATOR_RANK, MSG_READY, &b, &L->err);
}

static int send_stats(Leader *L) {
    const Scheduler *s = &L->engine.sched;
    const KvCache *c = &s->cache;
    const KvCacheCounters *cc = &c->counters;
    KvMoveCounters mc = kv_moves_counters(L->moves);
    MsgStats m = {.waiting = s->n_waiting, .running = s->n_running, .pool_used_blocks = kv_cache_in_use(c, CACHE_TIER_DEVICE),
                  .pool_total_blocks = kv_cache_total(c, CACHE_TIER_DEVICE),
                  .host_used_blocks = kv_cache_total(c, CACHE_TIER_HOST) - kv_cache_free_blocks(c, CACHE_TIER_HOST),
                  .host_total_blocks = kv_cache_total(c, CACHE_TIER_HOST),
                  .cached_prompt_tokens_device = s->counters.cached_prompt_tokens_device,
                  .cached_prompt_tokens_host = s->counters.cached_prompt_tokens_host,
                  .computed_prompt_tokens = s->counters.computed_prompt_tokens, .demoted_blocks = cc->demoted_blocks,
                  .loaded_blocks = cc->loaded_blocks, .host_evicted_blocks = cc->host_evicted_blocks,
                  .device_evicted_blocks = cc->device_evicted_blocks, .preemptions = s->counters.preemptions,
                  .prefilled_tokens = s->counters.prefilled_tokens,
                  .generated_tokens = L->engine.generated_tokens, .prefetched_blocks = cc->prefetched_blocks,
                  .prefetch_hit_blocks = cc->prefetch_hit_blocks, .prefetch_wasted_blocks = cc->prefetch_wasted_blocks,
                  .segment_reused_tokens = s->counters.segment_reused_prompt_tokens, .segment_candidates = cc->segment_candidates,
                  .segments_exact = cc->segments_exact, .segments_approx = cc->segments_approx,
                  .segments_rejected_context = cc->segments_rejected_context,
                  .segments_rejected_window = cc->segments_rejected_window,
                  .segment_flops_saved = (uint64_t)s->counters.segment_flops_saved,
                  .moved_in_blocks = mc.moved_in_blocks, .moved_in_bytes = mc.moved_in_bytes, .move_failures = mc.move_failures, .move_declines = mc.move_declines,
                  .move_followers = L->followers.total,
                  .lent_blocks = mc.lent_blocks, .directive_requests = s->counters.directive_requests, .pins = cc->pins, .pin_expired_blocks = cc->pin_expired_blocks,
                  .pin_revoked_blocks = cc->pin_revoked_blocks, .spliced_tokens = cc->spliced_tokens,
                  .shared_hit_tokens = cc->shared_hit_tokens, .directive_evicted_blocks = cc->directive_evicted_blocks,
                  .pinned_blocks = kv_cache_pinned(c),
                  .segment_lsh_candidates = cc->segment_lsh_candidates, .segment_lsh_admitted = cc->segment_lsh_admitted,
                  .segment_lsh_reused_tokens = cc->segment_lsh_reused_tokens,
                  .segment_probes_ok = s->guard_counters.probes_ok, .segment_probes_rejected = s->guard_counters.probes_rejected};
    if (s->forkkv) {
        m.residual_used_blocks = residual_cache_in_use(&s->residual);
        m.residual_total_blocks = residual_cache_total(&s->residual);
        m.residual_hit_tokens = s->counters.residual_hit_tokens;
        m.fork_tokens = s->counters.fork_tokens;
        m.partial_hit_tokens = s->counters.partial_hit_tokens;
        m.residual_evicted_blocks = residual_cache_counters(&s->residual)->device_evicted_blocks;
    }
    WireBuf b = {0};
    msg_stats_encode(&b, &m);
    L->last_stats = braid_now_seconds();
    return ctrl_send(&L->ctrl, COORDINATOR_RANK, MSG_STATS, &b, &L->err);
}

static void handle_relayed_move(Leader *L, const uint8_t *data, size_t len);
static void on_move_ready(void *ctx, void *owner, int moved_tokens, double move_s, int link);

/* Keeps a relayed move message for after the step (it takes data). */
static void hold_move(Leader *L, uint8_t *data, size_t len) {
    if (braid_grow((void **)&L->held_moves, &L->cap_held_moves, L->n_held_moves + 1, sizeof *L->held_moves)) {
        free(data);
        braid_error_set(&L->err, "leader: out of memory holding a relayed move message");
        L->failed = true;
        return;
    }
    L->held_moves[L->n_held_moves++] = (HeldMove){.data = data, .len = len};
}

/* The relayed move messages held during the last step, in the order they came. */
static void handle_held_moves(Leader *L) {
    for (int i = 0; i < L->n_held_moves; i++) {
        handle_relayed_move(L, L->held_moves[i].data, L->held_moves[i].len);
        free(L->held_moves[i].data);
    }
    L->n_held_moves = 0;
}

/* One ask read mid-step: the prefetch's overlapped copies end first, so no block it lends is still
 * being loaded into (a LOAD in flight marks its node on the device already). */
static void lend_mid_step(Leader *L, int source, const uint8_t *data, size_t len, bool *synced) {
    if (!*synced && backend_sync(&L->engine.backend, &L->err)) {
        L->failed = true;
        return;
    }
    *synced = true;
    if (kv_moves_handle(L->moves, source, MSG_KV_EXPORT, data, len, on_move_ready, L, &L->err)) L->failed = true;
}

/* Another leader's ask for a prefix (KV_EXPORT) is answered between two layers of a step, not only
 * between steps: on a loaded CPU one prefill step outlasts --move-timeout, and an ask that waited
 * for the step's end timed out at the borrower, which then recomputed (issue 33). Lending here is
 * safe: it locks blocks earlier steps committed (this step's blocks join the tree after its
 * forward, sched_commit) and reads nothing the forward writes. Everything else waits for the
 * step's end: other leaders' direct messages stay queued in MPI; a relayed message that is not an
 * ask is held, and handled first thing after the step (handle_held_moves). */
static void serve_move_asks(Leader *L) {
    if (!L->moves) return;
    int source, got = 0;
    uint8_t *data;
    size_t len;
    bool synced = false;
    while (!L->failed && (got = ctrl_poll_type(&L->ctrl, MPI_ANY_SOURCE, MSG_KV_EXPORT, &source, &data, &len, &L->err)) == 1) {
        lend_mid_step(L, source, data, len, &synced);
        free(data);
    }
    if (got < 0) L->failed = true;
    got = 0;
    while (!L->failed && (got = ctrl_poll_type(&L->ctrl, COORDINATOR_RANK, MSG_KV_RELAY, &source, &data, &len, &L->err)) == 1) {
        L->coord_heard = braid_now_seconds();
        MsgKvRelay m;
        if (move_msg_relay_decode(data, len, &m) == 0 && m.type == MSG_KV_EXPORT) {
            lend_mid_step(L, m.from_rank, m.body, m.body_len, &synced);
            free(data);
        } else {
            hold_move(L, data, len); /* a malformed one is reported when it is handled */
        }
    }
    if (got < 0) L->failed = true;
}

/* BRAID_TEST_LAYER_DELAY (tests only): sleeps between the layers of a step of enough tokens. */
static void test_layer_delay(const Leader *L) {
    if (L->layer_delay_s <= 0 || L->engine.plan.n_tokens < L->layer_delay_min_tokens) return;
    struct timespec ts = {(time_t)L->layer_delay_s, (long)((L->layer_delay_s - (double)(time_t)L->layer_delay_s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Between the layers of a long step: the coordinator counts a leader silent for --instance-timeout
 * as a lost node, and across hosts silence is its only failure detector, so the step keeps the
 * STATS period (a prefill of many tokens on a loaded CPU takes tens of seconds); and asks for KV
 * moves are answered (serve_move_asks). Read-only on the scheduler; a failed send surfaces at the
 * next iteration's ctrl_progress. */
static void leader_step_pulse(void *ctx) {
    Leader *L = ctx;
    if (L->failed) return;
    test_layer_delay(L);
    serve_move_asks(L);
    if (L->failed || braid_now_seconds() - L->last_stats < STATS_PERIOD_S) return;
    if (send_stats(L) || ctrl_progress(&L->ctrl, &L->err)) L->failed = true;
}

/* The step's cache events in one message. A batch whose encoding ran out of memory is dropped
 * with a warning: the router's index is approximate anyway, and a lost report costs a routing
 * choice (and lines of the event log) at most. */
static int send_kv_events(Leader *L) {
    int n = L->n_kv_events;
    if (n == 0) return 0;
    L->n_kv_events = 0;
    if (L->kv_events.failed) {
        LOG_WARN("leader", "instance %d: out of memory; %d KV events not reported", L->cfg->instance, n);
        wire_buf_free(&L->kv_events);
        return 0;
    }
    msg_kv_events_finish(&L->kv_events, n);
    return ctrl_send(&L->ctrl, COORDINATOR_RANK, MSG_KV_EVENTS, &L->kv_events, &L->err);
}

static FinishReason reason_code(const SchedRequest *r) {
    const char *why = r->finish_reason ? r->finish_reason : "error";
    if (!strcmp(why, "stop")) return FINISH_STOP;
    if (!strcmp(why, "length")) return FINISH_LENGTH;
    if (!strcmp(why, "cancelled")) return FINISH_CANCELLED;
    return FINISH_ERROR;
}

static int send_finish(Leader *L, const LeaderRequest *lr) {
    const SchedRequest *r = &lr->req;
    MsgFinish m = {.req_id = lr->req_id, .reason = (uint8_t)reason_code(r), .prompt_tokens = r->n_prompt,
                   .cached_tokens = r->cached_tokens > 0 ? r->cached_tokens : 0,
                   .cached_tokens_host = r->cached_tokens > 0 && r->cached_tokens_host > 0 ? r->cached_tokens_host : 0,
                   .cached_tokens_remote = r->cached_tokens > 0 ? (lr->moved_tokens < r->cached_tokens ? lr->moved_tokens : r->cached_tokens) : 0,
                   .reused_tokens = r->reused_tokens > 0 ? r->reused_tokens : 0,
                   .completion_tokens = r->n_tokens - r->n_prompt, .preemptions = r->preemptions, .error = (char *)r->error,
                   .directive_outcomes = r->directive_outcomes, .move_s = lr->move_s, .move_link = lr->move_link};
    WireBuf b = {0};
    msg_finish_encode(&b, &m);
    return ctrl_send(&L->ctrl, COORDINATOR_RANK, MSG_FINISH, &b, &L->err);
}

/* ---- KV events for the coordinator (router index, --events) ---- */

_Static_assert((int)KV_EVENT_STORED == (int)CACHE_EVENT_STORED && (int)KV_EVENT_REMOVED == (int)CACHE_EVENT_REMOVED &&
                   (int)KV_EVENT_CLEARED == (int)CACHE_EVENT_CLEARED, "KV event kinds travel as the cache's values");
_Static_assert((int)KV_TIER_DEVICE == (int)CACHE_TIER_DEVICE && (int)KV_TIER_HOST == (int)CACHE_TIER_HOST &&
                   (int)KV_ON_DEVICE == (int)CACHE_ON_DEVICE && (int)KV_ON_HOST == (int)CACHE_ON_HOST,
               "KV event tiers travel as the cache's values");

/* Every cache event is encoded at once (the hashes belong to a node that may be gone after the
 * callback; the names are resolved from the interned ids here, since the coordinator knows no
 * ids) and sent with the step's others in one KV_EVENTS message. The coordinator decides what
 * changes its router index: blocks inserted (reason insert) are stored on the instance, blocks gone
 * from every tier evicted from it; demotions and load-backs keep a block on the instance. */
static void on_cache_event(void *ctx, const CacheEvent *ev) {
    Leader *L = ctx;
    const KvCache *c = &L->engine.sched.cache;
    if (L->n_kv_events == 0) {
        wire_buf_free(&L->kv_events);
        msg_kv_events_begin(&L->kv_events);
    }
    MsgKvEvent e = {.kind = (uint8_t)ev->kind, .tier = (uint8_t)ev->tier, .reason = (uint8_t)kv_reason_code(ev->reason),
                    .tiers_after = ev->tiers_after, .parent_hash = ev->parent_hash,
                    .tenant = (char *)kv_cache_name(c, CACHE_NAME_TENANT, ev->tenant),
                    .adapter = (char *)kv_cache_name(c, CACHE_NAME_ADAPTER, ev->adapter), .n_blocks = ev->n_blocks,
                    .hashes = (uint64_t *)ev->hashes, .block_size = c->block_size,
                    .n_tokens = ev->tokens ? ev->n_blocks * ev->token_block : 0, .tokens = (int32_t *)ev->tokens};
    msg_kv_event_append(&L->kv_events, &e);
    L->n_kv_events++;
}

/* ---- requests ---- */

static LeaderRequest *find_request(Leader *L, uint64_t id) {
    for (int i = 0; i < L->n_active; i++)
        if (L->active[i]->req_id == id) return L->active[i];
    return NULL;
}

static void request_free(LeaderRequest *lr) {
    sched_request_free(&lr->req);
    free(lr);
}

/* Whole blocks of r's prompt this instance's cache matches now (kv_cache_peek_prefix: no lock, no
 * touch); 0 when its names cannot be interned (out of memory: then it does not wait). */
static int cached_blocks_now(Leader *L, const SchedRequest *r) {
    KvCache *c = &L->engine.sched.cache;
    CacheIdentity id;
    BraidError err;
    if (kv_cache_identity(c, r->tenant, r->adapter, NULL, NULL, &id, &err)) return 0;
    int blocks = kv_cache_peek_prefix(c, &id, r->tokens, r->n_prompt);
    kv_cache_identity_release(c, &id);
    return blocks;
}

/* Issue 33 (a): the router counted the blocks of a move in flight here as local when it sent lr
 * (no pull hint). lr waits behind the parked import that brings more of its head than the cache
 * holds now (import_followers.h), instead of prefilling that head itself and making the move a
 * decline. Returns true when it waits (the import's end hands it to the engine). */
static bool follow_import(Leader *L, LeaderRequest *lr) {
    int n = 0, bs = L->cfg->engine.block_size;
    for (int i = 0; i < L->n_active; i++) {
        LeaderRequest *q = L->active[i];
        if (!q->parked) continue;
        if (braid_grow((void **)&L->candidates, &L->cap_candidates, n + 1, sizeof *L->candidates)) return false;
        L->candidates[n++] = (ImportCandidate){.req = &q->req, .asked_blocks = q->asked_blocks, .owner = q};
    }
    if (n == 0) return false;
    /* First against no local blocks: a request that shares no block with any import costs no cache walk. */
    int gain, at = import_followers_choose(&lr->req, L->candidates, n, 0, bs, &gain);
    if (at < 0) return false;
    int local = cached_blocks_now(L, &lr->req);
    at = import_followers_choose(&lr->req, L->candidates, n, local, bs, &gain);
    if (at < 0 || !import_followers_worth_waiting(gain, local, bs, L->cfg->engine.max_batch_tokens, sched_idle(&L->engine.sched)))
        return false;
    if (import_followers_add(&L->followers, lr, L->candidates[at].owner)) return false;
    lr->following = true;
    LOG_DEBUG("leader", "instance %d: req %s waits behind req %s's move: %d blocks of its head on the way, %d cached here",
              L->cfg->instance, lr->req.id, L->candidates[at].req->id, gain, local);
    return true;
}

/* The requests that waited behind import's move go to the engine (its own request went first). */
static void release_followers(Leader *L, const LeaderRequest *import, int moved_tokens) {
    enum { BATCH = 16 };
    void *batch[BATCH];
    int got;
    do {
        got = import_followers_take(&L->followers, import, batch, BATCH);
        for (int i = 0; i < got; i++) {
            LeaderRequest *f = batch[i];
            f->following = false;
            LOG_INFO("leader", "instance %d: req %s released after req %s's move (%d tokens moved): %d blocks of its prompt cached here",
                     L->cfg->instance, f->req.id, import->req.id, moved_tokens, cached_blocks_now(L, &f->req));
            engine_submit(&L->engine, &f->req);
        }
    } while (got == BATCH);
}

static int accept_submit(Leader *L, MsgSubmit *m) {
    LeaderRequest *lr = calloc(1, sizeof *lr);
    char id[32];
    snprintf(id, sizeof id, "%llu", (unsigned long long)m->req_id);
    if (!lr || braid_grow((void **)&L->active, &L->cap_active, L->n_active + 1, sizeof *L->active) || !(lr->req.id = strdup(id))) {
        free(lr ? lr->req.id : NULL);
        free(lr);
        return braid_error_set(&L->err, "leader: out of memory accepting request %s", id);
    }
    lr->req_id = m->req_id;
    SchedRequest *r = &lr->req;
    r->tokens = m->tokens;
    r->n_tokens = r->n_prompt = r->cap_tokens = m->n_tokens;
    m->tokens = NULL;
    r->max_tokens = m->max_tokens;
    /* The identity strings move over (empty = none); sched_request_free frees them. */
    char **names[][2] = {{&m->tenant, &r->tenant}, {&m->adapter, &r->adapter}, {&m->workflow, &r->workflow}, {&m->agent, &r->agent}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (*names[i][0] && **names[i][0]) *names[i][1] = *names[i][0], *names[i][0] = NULL;
    }
    r->ignore_eos = m->ignore_eos;
    r->tenant_weight = m->tenant_weight;
    r->want_hidden = m->want_hidden;
    r->segment_mode = m->segment_mode;
    r->want_logprobs = m->want_logprobs;
    r->logprobs_top = m->logprobs_top;
    if (m->grammar && m->grammar[0]) r->grammar_spec = m->grammar, m->grammar = NULL; /* compiled by engine_submit */
    r->directives = m->directives; /* moves over */
    memset(&m->directives, 0, sizeof m->directives);
    r->sampling = (SamplingParams){.temperature = m->temperature, .top_p = m->top_p, .top_k = m->top_k, .seed = m->seed};
    L->active[L->n_active++] = lr;
    /* A prefix cached on another instance is moved here first, when the router asked for it. */
    if (m->pull_blocks > 0 && m->pull_rank > COORDINATOR_RANK && L->moves &&
        kv_moves_park(L->moves, r, m->pull_rank, m->pull_blocks, lr) == 1) {
        lr->parked = true;
        int useful = (r->n_prompt - 1) / L->cfg->engine.block_size; /* what kv_moves_park asked for */
        lr->asked_blocks = m->pull_blocks < useful ? m->pull_blocks : useful;
        return 0;
    }
    /* Or it waits for a move already in flight here that brings its head (import_followers.h). */
    if (follow_import(L, lr)) return 0;
    /* A request the engine refuses is already marked finished with its error; report_progress sends it. */
    engine_submit(&L->engine, r);
    return 0;
}

/* A follower cancelled while it waits: out of the list, and finished now (not at the move's end). */
static void cancel_follower(Leader *L, LeaderRequest *lr) {
    import_followers_remove(&L->followers, lr);
    lr->following = false;
    engine_submit(&L->engine, &lr->req);
    if (lr->req.state != REQ_FINISHED) sched_cancel(&L->engine.sched, &lr->req);
}

/* A parked request's move is over (moved or not): it goes to the engine now, then the requests
 * that waited behind the move, in the order they came. */
static void on_move_ready(void *ctx, void *owner, int moved_tokens, double move_s, int link) {
    Leader *L = ctx;
    LeaderRequest *lr = owner;
    lr->parked = false;
    lr->moved_tokens = moved_tokens;
    lr->move_s = moved_tokens > 0 ? move_s : 0;
    lr->move_link = moved_tokens > 0 ? (uint8_t)link : MOVE_LINK_NONE;
    engine_submit(&L->engine, &lr->req);
    if (lr->cancel_pending && lr->req.state != REQ_FINISHED) sched_cancel(&L->engine.sched, &lr->req);
    release_followers(L, lr, moved_tokens);
}

int instance_leader_refusal(const uint8_t *submit, size_t len, const char *why, WireBuf *out, uint64_t *req_id) {
    WireReader rd = wire_reader(submit, len);
    uint64_t id = wire_get_u64(&rd); /* a SUBMIT opens with its request id */
    if (rd.failed) return -1;
    *req_id = id;
    msg_finish_encode(out, &(MsgFinish){.req_id = id, .reason = FINISH_ERROR, .error = (char *)why, .directive_outcomes = ""});
    return 0;
}

/* A SUBMIT that does not decode is answered, not dropped: the coordinator would wait for it forever. */
static int refuse_submit(Leader *L, const uint8_t *data, size_t len) {
    const char *why = "the instance could not take the request: its SUBMIT message is malformed "
                      "(an empty prompt, a field out of range or a truncated message)";
    WireBuf b = {0};
    uint64_t id;
    if (instance_leader_refusal(data, len, why, &b, &id)) {
        LOG_ERROR("leader", "instance %d: a submit message of %zu bytes is too short to name its request; dropped", L->cfg->instance, len);
        return 0;
    }
    LOG_WARN("leader", "instance %d: req %llu: malformed submit message (%zu bytes); answered with an error", L->cfg->instance,
             (unsigned long long)id, len);
    return ctrl_send(&L->ctrl, COORDINATOR_RANK, MSG_FINISH, &b, &L->err);
}

/* How many requests the leader holds that run adapter `name` (an unload waits for none). */
static int requests_of_adapter(void *ctx, const char *name) {
    const Leader *L = ctx;
    int n = 0;
    for (int i = 0; i < L->n_active; i++)
        if (lora_name_is(L->active[i]->req.adapter, name)) n++; /* any generation: requests carry cache names */
    return n;
}

/* LORA_LOAD / LORA_UNLOAD (leader_lora.h): applied between steps, answered with LORA_RESULT. The set
 * is the one this rank loaded at start-up and lent its engine read-only; the leader is its only
 * writer, on the thread that runs the steps. */
static void handle_lora(Leader *L, bool unload, const uint8_t *data, size_t len) {
    const EngineConfig *ec = &L->engine.cfg;
    LeaderLoraCtx ctx = {.set = (LoraSet *)ec->lora, .base = &L->cfg->model->weights.cfg, .tp_size = L->tp.tp_size,
                         .device = ec->device, .residual_rank = ec->lora_shared ? L->engine.backend.cfg.residual_rank : 0,
                         .cache = &L->engine.sched.cache, .residual_tree = L->engine.sched.forkkv ? &L->engine.sched.residual.tree : NULL};
    WireBuf reply = {0};
    if (!ctx.set) {
        wire_put_u8(&reply, 0), wire_put_str(&reply, ""), wire_put_str(&reply, "this instance has no adapter set");
    } else {
        leader_lora_apply(&ctx, unload, data, len, requests_of_adapter, L, &reply);
    }
    if (ctrl_send(&L->ctrl, COORDINATOR_RANK, MSG_LORA_RESULT, &reply, &L->err)) L->failed = true;
}

static void handle_message(Leader *L, int type, const uint8_t *data, size_t len) {
    WireReader rd = wire_reader(data, len);
    if (type == MSG_LORA_LOAD || type == MSG_LORA_UNLOAD) {
        handle_lora(L, type == MSG_LORA_UNLOAD, data, len);
        return;
    }
    if (type == MSG_SUBMIT) {
        MsgSubmit m;
        if (msg_submit_decode(&rd, &m)) {
            if (refuse_submit(L, data, len)) L->failed = true;
            return;
        }
        if (accept_submit(L, &m)) L->failed = true;
        msg_submit_free(&m);
    } else if (type == MSG_CANCEL) {
        uint64_t id = wire_get_u64(&rd);
        LeaderRequest *lr = rd.failed ? NULL : find_request(L, id);
        if (lr && lr->parked) lr->cancel_pending = true;
        else if (lr && lr->following) cancel_follower(L, lr);
        else if (lr) sched_cancel(&L->engine.sched, &lr->req);
    } else if (type == MSG_WORKFLOW_END) {
        char *wf = wire_get_str(&rd);
        LOG_DEBUG("leader", "instance %d: workflow %s ended", L->cfg->instance, wf ? wf : "?");
        if (wf && *wf) sched_workflow_end(&L->engine.sched, wf);
        free(wf);
    } else if (type == MSG_PREDICT) {
        /* A forecast is advice: a malformed one is dropped, one the cache cannot take is lost. */
        MsgPredict m;
        BraidError err;
        if (msg_predict_decode(&rd, &m)) {
            LOG_WARN("leader", "instance %d: malformed predict message (%zu bytes) dropped", L->cfg->instance, len);
            return;
        }
        if (sched_predict(&L->engine.sched, m.workflow, m.agent, m.k, m.n_agents, (const char *const *)m.agents, m.prob, &err))
            LOG_WARN("leader", "instance %d: workflow %s: forecast lost: %s", L->cfg->instance, m.workflow, err.msg);
        msg_predict_free(&m);
    } else if (type == MSG_SHUTDOWN) {
        L->shutting_down = true;
        L->lost_ranks = wire_get_u8(&rd) == 1;
    } else if (type == MSG_COORD_ALIVE) {
        /* nothing to do: hearing it is the point (coord_heard) */
    } else {
        LOG_WARN("leader", "instance %d: unexpected %s message ignored", L->cfg->instance, msg_type_name(type));
    }
}

/* HIDDEN for every request whose prefill produced its hidden state this step (before its FINISH). */
static int send_hidden_states(Leader *L) {
    int dim = L->engine.model->weights.cfg.dim;
    for (int i = 0; i < L->n_active; i++) {
        LeaderRequest *lr = L->active[i];
        if (!lr->req.hidden || lr->hidden_sent) continue;
        lr->hidden_sent = true;
        WireBuf b = {0};
        msg_hidden_encode(&b, &(MsgHidden){.req_id = lr->req_id, .dim = dim, .values = lr->req.hidden});
        if (ctrl_send(&L->ctrl, COORDINATOR_RANK, MSG_HIDDEN, &b, &L->err)) return -1;
    }
    return 0;
}

/* Sends this step's new tokens in one message, the new hidden states, then a FINISH for each
 * request that ended. */
/* Room for one more token in this step's TOKENS message. */
static int reserve_token_slot(Leader *L) {
    MsgTokens *t = &L->tokens;
    if (t->n < L->cap_tokens) return 0;
    int cap = L->cap_tokens ? 2 * L->cap_tokens : 256;
    uint64_t *ids = realloc(t->req_ids, (size_t)cap * sizeof *ids);
    if (ids) t->req_ids = ids;
    int32_t *toks = ids ? realloc(t->tokens, (size_t)cap * sizeof *toks) : NULL;
    if (toks) t->tokens = toks;
    uint8_t *has = toks ? realloc(t->has_logprob, (size_t)cap) : NULL;
    if (has) t->has_logprob = has;
    TokenLogprob *lps = has ? realloc(t->logprobs, (size_t)cap * sizeof *lps) : NULL;
    if (lps) t->logprobs = lps;
    if (!lps) return braid_error_set(&L->err, "leader: out of memory reporting tokens");
    L->cap_tokens = cap;
    return 0;
}

static int report_progress(Leader *L) {
    MsgTokens *t = &L->tokens;
    t->n = 0;
    for (int i = 0; i < L->n_active; i++) {
        LeaderRequest *lr = L->active[i];
        int generated = lr->req.n_tokens - lr->req.n_prompt;
        for (; lr->reported < generated; lr->reported++) {
            if (reserve_token_slot(L)) return -1;
            t->req_ids[t->n] = lr->req_id;
            t->tokens[t->n] = lr->req.tokens[lr->req.n_prompt + lr->reported];
            t->has_logprob[t->n] = lr->req.want_logprobs && lr->reported < lr->req.cap_logprobs;
            if (t->has_logprob[t->n]) t->logprobs[t->n] = lr->req.logprobs[lr->reported];
            t->n++;
        }
    }
    if (t->n) {
        WireBuf b = {0};
        msg_tokens_encode(&b, t);
        if (ctrl_send(&L->ctrl, COORDINATOR_RANK, MSG_TOKENS, &b, &L->err)) return -1;
    }
    if (send_hidden_states(L)) return -1;
    for (int i = 0; i < L->n_active;) {
        LeaderRequest *lr = L->active[i];
        if (lr->req.state != REQ_FINISHED) {
            i++;
            continue;
        }
        if (send_finish(L, lr)) return -1;
        request_free(lr);
        L->active[i] = L->active[--L->n_active];
    }
    return 0;
}

/* ---- TP: the batch goes to the peers before the leader's own forward ---- */

/* The step's cache operations travel with it; every peer applies them to its shard first. */
static int send_step(void *ctx, const ForwardBatch *batch, const CacheOpList *ops, BraidError *err) {
    Leader *L = ctx;
    WireBuf b = {0};
    step_msg_encode(&b, STEP_FORWARD, batch, ops, L->cfg->engine.block_size);
    if (b.failed) return wire_buf_free(&b), braid_error_set(err, "leader: out of memory encoding a step");
    int rc = 0;
    for (int peer = 1; peer < L->tp.tp_size && rc == 0; peer++)
        rc = mpi_check(MPI_Send(b.data, (int)b.len, MPI_BYTE, peer, TAG_STEP, L->cfg->tp_comm), "step to a TP peer", err);
    wire_buf_free(&b);
    return rc;
}

static void stop_peers(const WorkerRoleConfig *cfg, int tp_size, bool lost_ranks) {
    uint8_t stop = lost_ranks ? STEP_STOP_LOST_RANKS : STEP_STOP;
    for (int peer = 1; peer < tp_size; peer++) MPI_Send(&stop, 1, MPI_BYTE, peer, TAG_STEP, cfg->tp_comm);
}

/* ---- the loops ---- */

/* KV moves (kv_moves.h): this rank's mover, and with TP every rank's description (a collective the
 * peers join in tp_peer_run). Failing leaves moves off on this instance, with the reason logged. */
static void leader_moves_setup(Leader *L) {
    const WorkerRoleConfig *cfg = L->cfg;
    BraidError move_err;
    KvMovesConfig mc = {.engine = &L->engine, .ctrl = &L->ctrl, .instance = cfg->instance, .tp_size = L->tp.tp_size,
                        .tp_comm = cfg->tp_comm, .timeout_s = cfg->move_timeout_s > 0 ? cfg->move_timeout_s : 5.0};
    /* On an intercommunicator (a joined or respawned leader) no other leader is a rank of it: every
     * move message is relayed by the coordinator; so it is when cfg->relay_moves says a world rank
     * may stand for a respawned leader; otherwise, in the world, the leaders beyond it (join slots) are. */
    int inter = 0, world_size = 0;
    MPI_Comm_test_inter(cfg->world, &inter);
    if (!inter) MPI_Comm_size(cfg->world, &world_size);
    mc.relay_from_rank = inter || cfg->relay_moves ? 1 : world_size;
    mc.self_rank = 1 + cfg->instance * L->tp.tp_size;
    if (kv_moves_create(&L->moves, &mc, &move_err)) LOG_INFO("leader", "%s", move_err.msg);
    if (L->tp.tp_size <= 1) return;
    WireBuf all = {0};
    int every = kv_moves_gather(cfg->tp_comm, L->moves ? kv_moves_rank_desc(L->moves) : NULL, &all, &move_err);
    if (L->moves && (every != 1 || kv_moves_set_ranks(L->moves, &all, &move_err))) {
        LOG_INFO("leader", "KV moves off on instance %d: %s", cfg->instance, every < 0 ? move_err.msg : "a TP rank has no mover (see its log)");
        kv_moves_destroy(L->moves);
        L->moves = NULL;
    }
    wire_buf_free(&all);
}

static int leader_init(Leader *L, const WorkerRoleConfig *cfg, BraidError *err) {
    memset(L, 0, sizeof *L);
    L->cfg = cfg;
    L->occupancy.fd = -1; /* off until instance_leader_run opens it */
    ctrl_init(&L->ctrl, cfg->world);
    int ok = tp_setup(cfg, &L->tp, err) == 0;
    EngineConfig ec = cfg->engine;
    ec.step_pulse = leader_step_pulse;
    ec.step_pulse_ctx = L;
    if (ok && L->tp.tp_size > 1) {
        ec.shard = &L->tp.shard;
        ec.tp = &L->tp.tp;
        ec.before_forward = send_step;
        ec.before_forward_ctx = L;
    }
    if (ok && engine_init(&L->engine, cfg->model, &ec, err)) ok = 0;
    if (ok) L->engine.sched.observer = (SchedObserver){.ctx = L, .on_cache_event = on_cache_event};
    if (!all_ranks_ok(cfg->tp_comm, ok) && ok) braid_error_set(err, "a TP peer of instance %d failed to set up (see its log)", cfg->instance), ok = 0;
    if (ok && cfg->kv_moves) leader_moves_setup(L);
    const char *delay = getenv("BRAID_TEST_LAYER_DELAY");
    if (ok && delay && sscanf(delay, "%lf:%d", &L->layer_delay_s, &L->layer_delay_min_tokens) >= 1 && L->layer_delay_s > 0)
        LOG_WARN("leader", "instance %d: BRAID_TEST_LAYER_DELAY: steps of %d tokens or more sleep %.3f s between layers (tests only)",
                 cfg->instance, L->layer_delay_min_tokens, L->layer_delay_s);
    return ok ? 0 : -1;
}

static void leader_free(Leader *L, bool engine_up) {
    for (int i = 0; i < L->n_active; i++) request_free(L->active[i]);
    free(L->active);
    import_followers_free(&L->followers);
    free(L->candidates);
    for (int i = 0; i < L->n_held_moves; i++) free(L->held_moves[i].data);
    free(L->held_moves);
    kv_moves_destroy(L->moves); /* before the engine: leases and imports hold cache nodes */
    if (engine_up) occupancy_log_close(&L->occupancy, &L->engine.sched.cache);
    if (engine_up) engine_free(&L->engine);
    tp_teardown(&L->tp);
    wire_buf_free(&L->kv_events); /* after engine_free: the cache's last (CLEARED) event lands here */
    msg_tokens_free(&L->tokens);
    ctrl_free(&L->ctrl);
}

/* A joined leader's coordinator is gone when it has been silent past cfg.coordinator_timeout_s
 * (checked right after the messages waiting were read, so a long engine step is not silence). */
static bool coordinator_silent(Leader *L) {
    double timeout = L->cfg->coordinator_timeout_s, silent = braid_now_seconds() - L->coord_heard;
    if (timeout <= 0 || silent < timeout) return false;
    L->coordinator_gone = true;
    braid_error_set(&L->err, "the coordinator is gone: no message from it for %.1f s (--coordinator-timeout %g); this instance stops",
                    silent, timeout);
    return true;
}

/* A move message from a leader this one reaches only through the coordinator (kv_moves.h). */
static void handle_relayed_move(Leader *L, const uint8_t *data, size_t len) {
    MsgKvRelay m;
    if (move_msg_relay_decode(data, len, &m)) {
        LOG_WARN("leader", "instance %d: malformed kv_relay dropped", L->cfg->instance);
        return;
    }
    if (kv_moves_handle(L->moves, m.from_rank, m.type, m.body, m.body_len, on_move_ready, L, &L->err)) L->failed = true;
}

static int leader_iteration(Leader *L, double *idle_since) {
    int source, type;
    uint8_t *data;
    size_t len;
    int got;
    handle_held_moves(L); /* read during the last step: they came before anything still queued */
    while ((got = ctrl_poll(&L->ctrl, &source, &type, &data, &len, &L->err)) == 1) {
        if (source == COORDINATOR_RANK) L->coord_heard = braid_now_seconds();
        if (source == COORDINATOR_RANK && type == MSG_KV_RELAY) handle_relayed_move(L, data, len);
        else if (source == COORDINATOR_RANK) handle_message(L, type, data, len);
        else if (kv_moves_handle(L->moves, source, type, data, len, on_move_ready, L, &L->err)) L->failed = true;
        free(data);
    }
    if (got < 0 || L->failed) return -1;
    if (coordinator_silent(L)) return -1;
    kv_moves_poll(L->moves, on_move_ready, L);
    bool busy = !sched_idle(&L->engine.sched) || kv_moves_busy(L->moves);
    if (!sched_idle(&L->engine.sched) && engine_step(&L->engine, &L->err) < 0) return -1;
    /* Also when idle: a change held back by the interval (a finish, a cancel) still goes out. */
    occupancy_log_sample(&L->occupancy, &L->engine.sched.cache);
    /* KV events before the tokens and finishes: a client that sends its next request as soon as its
     * answer ends finds the blocks of this one in the router's index already. */
    if (send_kv_events(L) || report_progress(L)) return -1;
    double now = braid_now_seconds();
    if (now - L->last_stats >= STATS_PERIOD_S && send_stats(L)) return -1;
    if (ctrl_progress(&L->ctrl, &L->err)) return -1;
    if (busy) *idle_since = now;
    else idle_sleep(now - *idle_since);
    return 0;
}

int instance_leader_run(const WorkerRoleConfig *cfg, bool *lost_ranks, BraidError *err) {
    *lost_ranks = false;
    Leader *L = calloc(1, sizeof *L);
    if (!L) return braid_error_set(err, "leader: out of memory");
    bool up = leader_init(L, cfg, err) == 0;
    int rc = 0;
    if (!up) {
        LOG_ERROR("leader", "instance %d: %s", cfg->instance, err->msg);
        send_ready(L, false, err->msg);
    } else {
        LOG_INFO("leader", "instance %d ready: %d ranks, %d KV blocks of %d tokens, host tier %d blocks", cfg->instance,
                 L->tp.tp_size, kv_cache_total(&L->engine.sched.cache, CACHE_TIER_DEVICE), cfg->engine.block_size,
                 kv_cache_total(&L->engine.sched.cache, CACHE_TIER_HOST));
        const Backend *be = &L->engine.backend;
        if (L->engine.sched.forkkv)
            LOG_INFO("leader", "instance %d: ForkKV residual pool %d blocks, %.1f MiB (%.0f bytes per block against %.0f per base block: %.2fx)",
                     cfg->instance, be->cfg.residual_blocks - 1, (double)be->residual_kv_bytes / (1 << 20),
                     (double)be->residual_kv_bytes / be->cfg.residual_blocks, (double)be->kv_bytes / be->cfg.n_blocks,
                     ((double)be->kv_bytes / be->cfg.n_blocks) / ((double)be->residual_kv_bytes / be->cfg.residual_blocks));
        rc = send_ready(L, true, NULL);
        BraidError log_err;
        if (cfg->occupancy_log && occupancy_log_open(&L->occupancy, cfg->occupancy_log, false, cfg->instance, cfg->occupancy_interval,
                                                     &L->engine.sched.cache, &log_err))
            LOG_WARN("leader", "instance %d: %s; no occupancy samples", cfg->instance, log_err.msg);
    }
    double idle_since = braid_now_seconds();
    L->coord_heard = idle_since;
    /* After SHUTDOWN the coordinator has drained its clients; finish what is still here, then stop. */
    while (rc == 0 && !(L->shutting_down && (!up || (sched_idle(&L->engine.sched) && L->n_active == 0)))) {
        if (up) rc = leader_iteration(L, &idle_since);
        else {
            int source, type;
            uint8_t *data;
            size_t len;
            int got = ctrl_poll(&L->ctrl, &source, &type, &data, &len, &L->err);
            if (got == 1 && type == MSG_SHUTDOWN) {
                WireReader rd = wire_reader(data, len);
                L->shutting_down = true;
                L->lost_ranks = wire_get_u8(&rd) == 1;
            }
            if (got == 1) free(data);
            else idle_sleep(1.0);
            rc = got < 0 ? -1 : 0;
        }
    }
    if (rc) {
        *err = L->err;
        LOG_ERROR("leader", "instance %d: %s", cfg->instance, err->msg);
    }
    if (L->coordinator_gone) ctrl_forget_dest(&L->ctrl, COORDINATOR_RANK); /* sends to it would never complete */
    else if (up && send_stats(L) == 0) ctrl_flush(&L->ctrl, &L->err);
    else ctrl_flush(&L->ctrl, &L->err);
    stop_peers(cfg, L->tp.tp_size ? L->tp.tp_size : 1, L->lost_ranks);
    *lost_ranks = L->lost_ranks;
    leader_free(L, up);
    free(L);
    return rc;
}

int tp_peer_run(const WorkerRoleConfig *cfg, bool *lost_ranks, BraidError *err) {
    *lost_ranks = false;
    TpSetup t;
    Backend backend;
    int ok = tp_setup(cfg, &t, err) == 0;
    if (ok) {
        BackendConfig bc = backend_config_default(cfg->engine.device, &cfg->model->weights.cfg, cfg->engine.n_blocks,
                                                  cfg->engine.block_size, cfg->engine.max_batch_tokens);
        bc.max_seqs = cfg->engine.max_running;
        bc.host_blocks = cfg->engine.host_blocks; /* the leader's host tier, so every op's block ids exist here */
        bc.cpu_matmul = engine_cpu_matmul(&cfg->engine); /* the leader's arithmetic, so partial sums match */
        bc.tp = &t.tp;
        bc.cuda_device = cfg->cuda_device;
        ok = backend_create(&backend, &t.shard, &bc, err) == 0;
    }
    if (!ok) LOG_ERROR("tp-peer", "instance %d: %s", cfg->instance, err->msg);
    ok = all_ranks_ok(cfg->tp_comm, ok) && ok;
    /* KV moves: this rank's mover over its shard; the leader gathers every rank's description. */
    KvMoveRank mover = {0};
    if (ok && cfg->kv_moves) {
        BraidError move_err;
        if (kv_move_rank_init(&mover, &backend, &move_err)) LOG_INFO("tp-peer", "instance %d: KV moves off: %s", cfg->instance, move_err.msg);
        if (kv_moves_gather(cfg->tp_comm, mover.mover || mover.cuda ? &mover.desc : NULL, NULL, &move_err) < 0)
            LOG_WARN("tp-peer", "instance %d: %s", cfg->instance, move_err.msg);
    }
    int rc = 0;
    double idle_since = braid_now_seconds();
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if ((rc = mpi_check(MPI_Iprobe(0, TAG_STEP, cfg->tp_comm, &flag, &st), "probe for a step", err))) break;
        if (!flag) {
            idle_sleep(braid_now_seconds() - idle_since);
            continue;
        }
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        uint8_t *data = malloc((size_t)count + 1);
        if (!data) { rc = braid_error_set(err, "tp peer: out of memory for a %d-byte step", count); break; }
        rc = mpi_check(MPI_Recv(data, count, MPI_BYTE, 0, TAG_STEP, cfg->tp_comm, MPI_STATUS_IGNORE), "receive a step", err);
        StepMsg m;
        WireReader rd = wire_reader(data, (size_t)count);
        if (rc == 0 && step_msg_decode(&rd, cfg->engine.block_size, &m)) rc = braid_error_set(err, "tp peer: malformed step");
        free(data);
        if (rc) break;
        if (m.kind == STEP_STOP || m.kind == STEP_STOP_LOST_RANKS) {
            *lost_ranks = m.kind == STEP_STOP_LOST_RANKS;
            break;
        }
        /* A peer that could not set up still has to drain steps; the leader refused to serve, so none come. */
        if (ok && m.kind == STEP_MOVE) {
            rc = kv_move_rank_serve(&mover, &backend, &m, cfg->tp_comm, err);
        } else if (ok) {
            ForwardOutput out = {0};
            rc = backend_apply_cache_ops(&backend, m.ops.ops, m.ops.n, err);
            if (rc) braid_error_wrap(err, "tp peer: the step's cache operations");
            else rc = backend_forward(&backend, &m.batch, &out, err);
        }
        step_msg_free(&m);
        if (rc) break;
        idle_since = braid_now_seconds();
    }
    kv_move_rank_free(&mover);
    if (ok) backend_destroy(&backend);
    tp_teardown(&t);
    return rc;
}
