#include "worker/kv_moves.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/grow.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "transport/control_msg.h"
#include "transport/move_msg.h"

typedef enum { IMPORT_ASKED = 0, IMPORT_READING } ImportState;

typedef struct {
    uint64_t xfer_id;
    void *owner;
    const SchedRequest *req;
    int source;           /* the lender's leader rank */
    double deadline;
    ImportState state;
    /* While reading: the local prefix and the reserved blocks, held until every rank's reads land. */
    CacheIdentity id;
    bool have_id;
    KvCacheMatch match;
    int32_t *table;
    int n_blocks, n_held, n_local; /* blocks to end up with, blocks of table held now, blocks cached here before */
    KvRankBatch batch;    /* this rank's reads */
    double t_reads;       /* when they were queued (the move's measured time ends when it lands) */
    size_t bytes;         /* every rank's reads */
    int peers_waiting;    /* TP peers that have not answered their MOVE plan */
    bool peers_failed;
    int link;             /* the MoveLink the reads use (MOVE_LINK_NONE before they start) */
} Import;

typedef struct {
    int source;
    uint64_t xfer_id;
    RadixNode *lock;
    CacheIdentity id;
    double expires;
    int window; /* a staged loan's window (kv_move_cuda_stage_loan), -1 for none */
} Lease;

struct KvMoves {
    KvMovesConfig cfg;
    KvMoveRank self;   /* this (leader) rank's mover and shard */
    WireBuf ranks;     /* every rank's description, in TP order (kv_moves_gather), sent with every loan */
    Import *imports;
    int n_imports, cap_imports;
    Lease *leases;
    int n_leases, cap_leases;
    uint64_t next_xfer;
    KvMoveCounters counters;
    char host[64];       /* this node's name, sent with every ask (a CUDA lender elsewhere stages) */
    int kv_layout;       /* MoveKvLayout of this instance's pools */
    bool force_staged;   /* BRAID_KV_MOVE_STAGED=1: a CUDA lender stages every loan (tests, one GPU) */
};

static KvCache *cache_of(KvMoves *mv) { return &mv->cfg.engine->sched.cache; }

int kv_moves_create(KvMoves **out, const KvMovesConfig *cfg, BraidError *err) {
    *out = NULL;
    if (cfg->engine->sched.forkkv) return braid_error_set(err, "KV moves off on instance %d: not with --lora-cache shared (the base cache has residuals beside it)", cfg->instance);
    if (!cfg->engine->sched.cache_enabled) return braid_error_set(err, "KV moves off on instance %d: prefix caching is off", cfg->instance);
    KvMoves *mv = calloc(1, sizeof *mv);
    if (!mv) return braid_error_set(err, "KV moves: out of memory");
    mv->cfg = *cfg;
    /* Transfer ids start from this incarnation's start time (seconds << 20): a leader respawned or
     * rejoined behind the same leader rank must not reuse an id its dead predecessor left in another
     * leader's leases, or meet a late answer meant for it (the relay now reaches the new leader). */
    mv->next_xfer = ((uint64_t)time(NULL) << 20) | 1;
    if (kv_move_rank_init(&mv->self, &cfg->engine->backend, err)) {
        braid_error_wrap(err, "KV moves off on instance %d", cfg->instance);
        free(mv);
        return -1;
    }
    if (gethostname(mv->host, sizeof mv->host - 1) != 0) snprintf(mv->host, sizeof mv->host, "unknown");
    mv->kv_layout = mv->self.cuda ? MOVE_KV_LAYOUT_BF16 : MOVE_KV_LAYOUT_FP16;
    const char *staged = getenv("BRAID_KV_MOVE_STAGED");
    mv->force_staged = mv->self.cuda && staged && strcmp(staged, "1") == 0;
    LOG_INFO("kv-moves", "instance %d: KV moves over %s", cfg->instance,
             !mv->self.cuda    ? "UCX (host memory)"
             : mv->force_staged ? "pinned host staging over UCX (forced by BRAID_KV_MOVE_STAGED=1)"
                                : "CUDA IPC on this node, pinned host staging over UCX across nodes");
    if (cfg->tp_size <= 1) { /* one rank: the list of descriptions is its own */
        wire_put_i32(&mv->ranks, 1);
        wire_put_u64(&mv->ranks, mv->self.desc.len);
        wire_put(&mv->ranks, mv->self.desc.data, mv->self.desc.len);
    }
    *out = mv;
    return 0;
}

int kv_moves_set_ranks(KvMoves *mv, const WireBuf *all, BraidError *err) {
    wire_buf_free(&mv->ranks);
    wire_put(&mv->ranks, all->data, all->len);
    return mv->ranks.failed ? braid_error_set(err, "KV moves: out of memory") : 0;
}

const WireBuf *kv_moves_rank_desc(const KvMoves *mv) { return &mv->self.desc; }

/* ---- lending ---- */

static void lease_end(KvMoves *mv, int at) {
    Lease *l = &mv->leases[at];
    if (l->window >= 0) kv_move_cuda_unstage(mv->self.cuda, l->window); /* waits for its copies to finish */
    kv_cache_lend_end(cache_of(mv), l->lock);
    kv_cache_identity_release(cache_of(mv), &l->id);
    mv->leases[at] = mv->leases[--mv->n_leases];
}

/* One move message to another leader: directly on ctrl, or through the coordinator when the
 * destination (or this leader) is outside ctrl's communicator (KvMovesConfig.relay_from_rank). */
static int send_to_leader(KvMoves *mv, int dest, int type, WireBuf *b, BraidError *err) {
    if (mv->cfg.relay_from_rank <= 0 || dest < mv->cfg.relay_from_rank) return ctrl_send(mv->cfg.ctrl, dest, type, b, err);
    WireBuf env = {0};
    move_msg_relay_encode(&env, mv->cfg.self_rank, dest, type, b->data, b->len);
    wire_buf_free(b);
    return ctrl_send(mv->cfg.ctrl, 0 /* the coordinator */, MSG_KV_RELAY, &env, err);
}

static void send_exported(KvMoves *mv, int dest, const MsgKvExported *m) {
    WireBuf b = {0};
    move_msg_exported_encode(&b, m);
    BraidError err;
    if (send_to_leader(mv, dest, MSG_KV_EXPORTED, &b, &err))
        LOG_WARN("kv-moves", "instance %d: answer to rank %d lost: %s", mv->cfg.instance, dest, err.msg);
}

static void refuse_loan(KvMoves *mv, int dest, uint64_t xfer_id, const char *why) {
    MsgKvExported m = {.xfer_id = xfer_id, .why = (char *)why};
    send_exported(mv, dest, &m);
}

static void lend(KvMoves *mv, int source, const MsgKvExport *ask) {
    KvCache *c = cache_of(mv);
    Lease l = {.source = source, .xfer_id = ask->xfer_id, .expires = braid_now_seconds() + 4 * mv->cfg.timeout_s, .window = -1};
    BraidError err;
    KvCacheMatch m;
    if (ask->kv_layout != MOVE_KV_LAYOUT_UNKNOWN && ask->kv_layout != mv->kv_layout) {
        char why[160];
        snprintf(why, sizeof why, "KV layouts differ: the lender keeps %s, the borrower %s", move_kv_layout_name(mv->kv_layout),
                 move_kv_layout_name(ask->kv_layout));
        return refuse_loan(mv, source, ask->xfer_id, why);
    }
    if (braid_grow((void **)&mv->leases, &mv->cap_leases, mv->n_leases + 1, sizeof *mv->leases) ||
        kv_cache_identity(c, ask->tenant, ask->adapter, NULL, NULL, &l.id, &err))
        return refuse_loan(mv, source, ask->xfer_id, "lender out of memory");
    if (kv_cache_match(c, &l.id, ask->tokens, ask->n_tokens, &m, &err)) {
        kv_cache_identity_release(c, &l.id);
        return refuse_loan(mv, source, ask->xfer_id, err.msg);
    }
    int n = m.device_blocks + m.host_blocks;
    uint8_t *tiers = malloc((size_t)n + 1);
    int32_t *blocks = malloc(((size_t)n + 1) * sizeof *blocks);
    if (n == 0 || !tiers || !blocks) {
        kv_cache_release(c, m.node, NULL, 0);
        kv_cache_identity_release(c, &l.id);
        free(tiers), free(blocks);
        return refuse_loan(mv, source, ask->xfer_id, n == 0 ? "prefix no longer cached here" : "lender out of memory");
    }
    kv_cache_lend(c, &m, tiers, blocks);
    /* another node (or forced): IPC cannot reach it, the loan is staged through a pinned window */
    bool staged = mv->self.cuda && (mv->force_staged || (ask->host && *ask->host && strcmp(ask->host, mv->host) != 0));
    if (mv->self.cuda) { /* IPC maps the device pool only: it lends the prefix's leading device blocks; a
                          * staged loan copies the host tier's blocks into its window as well */
        int lent = n;
        if (!staged) {
            lent = 0;
            while (lent < n && tiers[lent] == 0) lent++;
        }
        n = lent;
        if (n == 0 || kv_move_rank_lend_fence(&mv->self, &err)) {
            kv_cache_lend_end(c, m.node);
            kv_cache_identity_release(c, &l.id);
            free(tiers), free(blocks);
            return refuse_loan(mv, source, ask->xfer_id, n == 0 ? "the prefix is in the host tier (CUDA IPC lends device blocks only)" : err.msg);
        }
    }
    MsgKvExported ans = {.xfer_id = ask->xfer_id, .n_blocks = n, .tiers = tiers, .blocks = blocks,
                         .pool_blocks = {mv->self.mem[0].n_blocks, mv->self.have_tier[1] ? mv->self.mem[1].n_blocks : 0},
                         .desc = mv->ranks.data, .desc_len = mv->ranks.len, .why = ""};
    WireBuf staged_desc = {0};
    if (staged) {
        if (mv->cfg.tp_size > 1 || kv_move_cuda_stage_loan(mv->self.cuda, tiers, blocks, n, ask->xfer_id, &staged_desc, &l.window, &n, &err)) {
            if (mv->cfg.tp_size > 1) snprintf(err.msg, sizeof err.msg, "staged moves need TP 1 (this instance has TP %d)", mv->cfg.tp_size);
            LOG_DEBUG("kv-moves", "instance %d: loan to rank %d not staged: %s", mv->cfg.instance, source, err.msg);
            kv_cache_lend_end(c, m.node);
            kv_cache_identity_release(c, &l.id);
            free(tiers), free(blocks);
            wire_buf_free(&staged_desc);
            return refuse_loan(mv, source, ask->xfer_id, err.msg);
        }
        for (int i = 0; i < n; i++) tiers[i] = 0, blocks[i] = i; /* the borrower reads window slots */
        ans.n_blocks = n;
        ans.pool_blocks[0] = n, ans.pool_blocks[1] = 0;
        ans.desc = staged_desc.data, ans.desc_len = staged_desc.len;
    }
    l.lock = m.node;
    mv->leases[mv->n_leases++] = l;
    mv->counters.lent_blocks += (uint64_t)n;
    send_exported(mv, source, &ans);
    wire_buf_free(&staged_desc);
    free(tiers);
    free(blocks);
    LOG_DEBUG("kv-moves", "instance %d: lent %d blocks to rank %d (xfer %llu)", mv->cfg.instance, n, source,
              (unsigned long long)ask->xfer_id);
}

static void end_lease_of(KvMoves *mv, int source, uint64_t xfer_id) {
    for (int i = 0; i < mv->n_leases; i++)
        if (mv->leases[i].source == source && mv->leases[i].xfer_id == xfer_id) return lease_end(mv, i);
}

/* ---- importing ---- */

static void send_release(KvMoves *mv, int dest, uint64_t xfer_id) {
    WireBuf b = {0};
    wire_put_u64(&b, xfer_id);
    BraidError err;
    if (send_to_leader(mv, dest, MSG_KV_RELEASE, &b, &err))
        LOG_WARN("kv-moves", "instance %d: lease %llu at rank %d not returned: %s", mv->cfg.instance, (unsigned long long)xfer_id, dest,
                 err.msg);
}

int kv_moves_park(KvMoves *mv, const SchedRequest *r, int source_rank, int source_blocks, void *owner) {
    int bs = cache_of(mv)->block_size;
    int useful = (r->n_prompt - 1) / bs; /* a match never covers the whole prompt */
    if (source_blocks <= 0 || useful <= 0 || braid_grow((void **)&mv->imports, &mv->cap_imports, mv->n_imports + 1, sizeof *mv->imports))
        return 0;
    uint64_t xfer_id = mv->next_xfer++;
    int n_ask = (source_blocks < useful ? source_blocks : useful) * bs + 1;
    MsgKvExport ask = {.xfer_id = xfer_id, .tenant = r->tenant ? r->tenant : "", .adapter = r->adapter ? r->adapter : "",
                       .tokens = r->tokens, .n_tokens = n_ask, .host = mv->host, .kv_layout = (uint8_t)mv->kv_layout};
    WireBuf b = {0};
    move_msg_export_encode(&b, &ask);
    BraidError err;
    if (send_to_leader(mv, source_rank, MSG_KV_EXPORT, &b, &err)) {
        LOG_WARN("kv-moves", "instance %d: could not ask rank %d for a prefix: %s", mv->cfg.instance, source_rank, err.msg);
        return 0;
    }
    mv->imports[mv->n_imports++] = (Import){.xfer_id = xfer_id, .owner = owner, .req = r, .source = source_rank,
                                            .deadline = braid_now_seconds() + mv->cfg.timeout_s};
    return 1;
}

/* Gives back what an import holds; the reserved blocks return to the free list uncommitted. */
static void import_drop_holds(KvMoves *mv, Import *im) {
    KvCache *c = cache_of(mv);
    kv_rank_batch_end(&im->batch);
    if (im->match.node) kv_cache_release(c, im->match.node, im->n_held ? im->table : NULL, im->n_held);
    if (im->have_id) kv_cache_identity_release(c, &im->id);
    free(im->table);
    im->table = NULL;
    im->match.node = NULL;
    im->have_id = false;
}

/* The import is over: its request goes back to the leader, and the lease (if any) to the lender. */
static void import_finish(KvMoves *mv, int at, int moved_tokens, bool failed, const char *why, KvMoveReadyFn ready, void *ctx) {
    Import im = mv->imports[at];
    mv->imports[at] = mv->imports[--mv->n_imports];
    if (failed) {
        mv->counters.move_failures++;
        LOG_WARN("kv-moves", "instance %d: req %s: move from rank %d failed (%s); the prefix is recomputed", mv->cfg.instance,
                 im.req->id, im.source, why);
    }
    import_drop_holds(mv, &im);
    double move_s = moved_tokens > 0 ? braid_now_seconds() - im.t_reads : 0;
    ready(ctx, im.owner, moved_tokens, move_s, im.link ? im.link : kv_move_rank_link(&mv->self)); /* staged vs IPC: the router learns each */
}

/* The loan's blocks [from, n) into table[from..n), as runs of ids consecutive on both sides. */
static int build_runs(const MsgKvExported *loan, const int32_t *table, int from, int n, MoveRun **out) {
    MoveRun *runs = malloc(((size_t)(n - from) + 1) * sizeof *runs);
    if (!runs) return -1;
    int n_runs = 0;
    for (int i = from; i < n;) {
        int run = 1;
        while (i + run < n && loan->tiers[i + run] == loan->tiers[i] && loan->blocks[i + run] == loan->blocks[i] + run &&
               table[i + run] == table[i] + run)
            run++;
        runs[n_runs++] = (MoveRun){.tier = loan->tiers[i], .src = loan->blocks[i], .dst = table[i], .count = run};
        i += run;
    }
    *out = runs;
    return n_runs;
}

/* Each TP peer gets a MOVE plan: the operations just applied here, the runs, its lender rank. */
static int send_move_plans(KvMoves *mv, const Import *im, const MsgKvExported *loan, const CacheOpList *ops, const MoveRun *runs, int n_runs,
                           BraidError *err) {
    for (int peer = 1; peer < mv->cfg.tp_size; peer++) {
        const uint8_t *desc;
        size_t len;
        if (kv_move_desc_at(loan->desc, loan->desc_len, peer, &desc, &len, NULL))
            return braid_error_set(err, "KV moves: the loan has no description for rank %d", peer);
        StepMove plan = {.xfer_id = im->xfer_id, .lender_rank = im->source + peer, .pool_blocks = {loan->pool_blocks[0], loan->pool_blocks[1]},
                         .desc = (uint8_t *)desc, .desc_len = len, .runs = (MoveRun *)runs, .n_runs = n_runs, .timeout_s = mv->cfg.timeout_s};
        WireBuf b = {0};
        step_msg_encode_move(&b, ops, &plan);
        int rc = b.failed ? -1 : MPI_Send(b.data, (int)b.len, MPI_BYTE, peer, TAG_STEP, mv->cfg.tp_comm) == MPI_SUCCESS ? 0 : -1;
        wire_buf_free(&b);
        if (rc) return braid_error_set(err, "KV moves: sending a move plan to TP peer %d failed", peer);
    }
    return 0;
}

/* Runs the cache's pending operations now (into ops, for the TP peers too): a block a demotion just
 * freed may be reserved for the move, and its STORE must read the old contents before the reads
 * overwrite them. */
static int apply_pending_ops(KvMoves *mv, CacheOpList *ops, BraidError *err) {
    int rc = kv_cache_take_ops(cache_of(mv), ops) ? braid_error_set(err, "KV moves: out of memory taking cache operations") : 0;
    if (rc == 0 && ops->n > 0) rc = backend_apply_cache_ops(&mv->cfg.engine->backend, ops->ops, ops->n, err);
    return rc;
}

/* The lender answered: hold the local prefix, reserve the rest and start reading. Returns 0 with
 * the import reading, 1 when it is over (why says why), -1 on a local failure. */
static int start_reads(KvMoves *mv, Import *im, const MsgKvExported *loan, const char **why, BraidError *err) {
    KvCache *c = cache_of(mv);
    const SchedRequest *r = im->req;
    BraidError e;
    int lender_ranks = 0;
    const uint8_t *desc;
    size_t desc_len;
    *why = "out of memory";
    if (loan->n_blocks == 0) return *why = "the lender had nothing to lend", 1;
    if (kv_move_desc_at(loan->desc, loan->desc_len, 0, &desc, &desc_len, &lender_ranks) || lender_ranks != mv->cfg.tp_size)
        return *why = "the lender's TP degree differs from this instance's", 1;
    if (kv_cache_identity(c, r->tenant, r->adapter, r->workflow, r->agent, &im->id, &e)) return 1;
    im->have_id = true;
    if (kv_cache_match(c, &im->id, r->tokens, r->n_prompt, &im->match, &e)) return 1;
    im->n_blocks = loan->n_blocks;
    if (im->match.device_blocks + im->match.host_blocks >= im->n_blocks) return *why = NULL, 1; /* it got here meanwhile */
    if (!(im->table = malloc((size_t)im->n_blocks * sizeof *im->table))) return 1;
    int usable = kv_cache_acquire(c, &im->match, im->table, &e);
    if (usable < 0) return 1;
    im->n_held = im->n_local = usable;
    if (kv_cache_reserve(c, im->n_blocks - usable, im->table + usable) != 0) return *why = "no free device blocks for the moved prefix", 1;
    im->n_held = im->n_blocks;
    MoveRun *runs = NULL;
    CacheOpList ops = {0};
    int n_runs = build_runs(loan, im->table, im->n_local, im->n_blocks, &runs), rc = 0;
    if (n_runs < 0) rc = 1;
    else if (apply_pending_ops(mv, &ops, err) || send_move_plans(mv, im, loan, &ops, runs, n_runs, err)) rc = -1;
    else if (kv_move_rank_read(&mv->self, im->source, desc, desc_len, loan->pool_blocks, runs, n_runs, &im->batch, &e)) {
        LOG_WARN("kv-moves", "instance %d: %s", mv->cfg.instance, e.msg);
        *why = "the reads could not be queued";
        /* The peers were sent their plans: their answers still come, and find no import. */
        rc = 1;
    }
    cache_ops_free(&ops);
    free(runs);
    if (rc) return rc;
    im->bytes = kv_rank_batch_bytes(&im->batch); /* the peers add theirs when they answer */
    im->link = kv_rank_batch_link(&im->batch);
    im->t_reads = braid_now_seconds();
    /* The reads get their own timeout from now: the answer may be read late, after a long step of
     * this instance's own, and reads queued past the ask's deadline would fail unattempted. */
    im->deadline = im->t_reads + mv->cfg.timeout_s;
    im->peers_waiting = mv->cfg.tp_size - 1;
    im->state = IMPORT_READING;
    return 0;
}

static int on_exported(KvMoves *mv, int source, const MsgKvExported *loan, KvMoveReadyFn ready, void *ctx, BraidError *err) {
    int at = -1;
    for (int i = 0; i < mv->n_imports; i++)
        if (mv->imports[i].xfer_id == loan->xfer_id && mv->imports[i].source == source && mv->imports[i].state == IMPORT_ASKED) at = i;
    if (at < 0) { /* it timed out here meanwhile: the lender still holds a lease */
        if (loan->n_blocks > 0) send_release(mv, source, loan->xfer_id);
        return 0;
    }
    const char *why = NULL;
    int rc = start_reads(mv, &mv->imports[at], loan, &why, err);
    if (rc != 0) {
        if (loan->n_blocks > 0) send_release(mv, source, loan->xfer_id);
        bool declined = loan->n_blocks == 0 || why == NULL;
        if (declined) {
            mv->counters.move_declines++;
            LOG_INFO("kv-moves", "instance %d: req %s: move from rank %d declined: %s", mv->cfg.instance, mv->imports[at].req->id,
                     source, why ? why : "the prefix got here meanwhile");
            if (loan->why && *loan->why) LOG_DEBUG("kv-moves", "instance %d: rank %d lent nothing: %s", mv->cfg.instance, source, loan->why);
        }
        import_finish(mv, at, 0, !declined, why ? why : "", ready, ctx);
    }
    return rc < 0 ? -1 : 0;
}

static void land(KvMoves *mv, int at, KvMoveReadyFn ready, void *ctx) {
    Import *im = &mv->imports[at];
    KvCache *c = cache_of(mv);
    BraidError e;
    int moved = im->n_blocks - im->n_local;
    size_t bytes = im->bytes;
    if (kv_cache_commit(c, &im->id, im->req->tokens, im->n_blocks, im->table, &im->match.node, false, &e)) {
        send_release(mv, im->source, im->xfer_id);
        return import_finish(mv, at, 0, true, e.msg, ready, ctx);
    }
    mv->counters.moved_in_blocks += (uint64_t)moved;
    mv->counters.moved_in_bytes += bytes;
    LOG_DEBUG("kv-moves", "instance %d: req %s: %d blocks (%zu bytes) moved in from rank %d", mv->cfg.instance, im->req->id, moved, bytes,
              im->source);
    send_release(mv, im->source, im->xfer_id);
    import_finish(mv, at, moved * c->block_size, false, NULL, ready, ctx);
}

/* The TP peers' answers to MOVE plans (u64 xfer id, u8 ok, u64 bytes read). */
static void collect_peer_answers(KvMoves *mv) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_MOVE_DONE, mv->cfg.tp_comm, &flag, &st) != MPI_SUCCESS || !flag) return;
        uint8_t msg[17];
        if (MPI_Recv(msg, sizeof msg, MPI_BYTE, st.MPI_SOURCE, TAG_MOVE_DONE, mv->cfg.tp_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        WireReader rd = wire_reader(msg, sizeof msg);
        uint64_t xfer_id = wire_get_u64(&rd);
        uint8_t ok = wire_get_u8(&rd);
        uint64_t bytes = wire_get_u64(&rd);
        for (int i = 0; i < mv->n_imports; i++) {
            Import *im = &mv->imports[i];
            if (im->xfer_id != xfer_id || im->state != IMPORT_READING || im->peers_waiting == 0) continue;
            im->peers_waiting--;
            im->peers_failed |= !ok;
            im->bytes += bytes;
        }
    }
}

void kv_moves_poll(KvMoves *mv, KvMoveReadyFn ready, void *ctx) {
    if (!mv) return;
    if (mv->self.mover) kv_mover_progress(mv->self.mover);
    if (mv->cfg.tp_size > 1) collect_peer_answers(mv);
    double now = braid_now_seconds();
    for (int i = mv->n_imports - 1; i >= 0; i--) {
        Import *im = &mv->imports[i];
        BraidError e;
        int st = im->state == IMPORT_READING ? kv_rank_batch_poll(&im->batch, &e) : 0;
        if (st == 1 && im->peers_failed) st = -1, snprintf(e.msg, sizeof e.msg, "a TP peer's reads failed");
        if (st == 1 && im->peers_waiting == 0) land(mv, i, ready, ctx);
        else if (st < 0) {
            send_release(mv, im->source, im->xfer_id);
            import_finish(mv, i, 0, true, e.msg, ready, ctx);
        } else if (now > im->deadline) {
            if (im->state == IMPORT_READING) send_release(mv, im->source, im->xfer_id);
            import_finish(mv, i, 0, true, im->state == IMPORT_READING ? "the reads did not land in time" : "the lender did not answer in time",
                          ready, ctx);
        }
    }
    for (int i = mv->n_leases - 1; i >= 0; i--)
        if (now > mv->leases[i].expires) {
            LOG_WARN("kv-moves", "instance %d: the lease of xfer %llu to rank %d expired unreturned", mv->cfg.instance,
                     (unsigned long long)mv->leases[i].xfer_id, mv->leases[i].source);
            lease_end(mv, i);
        }
}

int kv_moves_handle(KvMoves *mv, int source, int type, const uint8_t *data, size_t len, KvMoveReadyFn ready, void *ctx,
                    BraidError *err) {
    WireReader rd = wire_reader(data, len);
    if (type == MSG_KV_EXPORT) {
        MsgKvExport ask;
        if (move_msg_export_decode(&rd, &ask)) {
            LOG_WARN("kv-moves", "instance %d: malformed kv_export from rank %d dropped", mv ? mv->cfg.instance : -1, source);
            return 0;
        }
        if (mv) lend(mv, source, &ask);
        move_msg_export_free(&ask);
        return 0;
    }
    if (!mv) return 0; /* no moves here: nothing was lent or asked for */
    if (type == MSG_KV_EXPORTED) {
        MsgKvExported loan;
        if (move_msg_exported_decode(&rd, &loan)) {
            LOG_WARN("kv-moves", "instance %d: malformed kv_exported from rank %d dropped", mv->cfg.instance, source);
            return 0;
        }
        int rc = on_exported(mv, source, &loan, ready, ctx, err);
        move_msg_exported_free(&loan);
        return rc;
    }
    if (type == MSG_KV_RELEASE) {
        uint64_t xfer_id = wire_get_u64(&rd);
        if (!rd.failed) end_lease_of(mv, source, xfer_id);
    }
    return 0;
}

bool kv_moves_busy(const KvMoves *mv) { return mv && mv->n_imports > 0; }

KvMoveCounters kv_moves_counters(const KvMoves *mv) { return mv ? mv->counters : (KvMoveCounters){0}; }

void kv_moves_destroy(KvMoves *mv) {
    if (!mv) return;
    while (mv->n_imports > 0) {
        import_drop_holds(mv, &mv->imports[mv->n_imports - 1]);
        mv->n_imports--;
    }
    while (mv->n_leases > 0) lease_end(mv, mv->n_leases - 1);
    free(mv->imports);
    free(mv->leases);
    wire_buf_free(&mv->ranks);
    kv_move_rank_free(&mv->self);
    free(mv);
}
