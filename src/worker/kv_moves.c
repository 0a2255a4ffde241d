#include "worker/kv_moves.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "transport/control_msg.h"
#include "transport/kv_mover.h"
#include "transport/move_msg.h"

/* Regions every lender registers, in this order: per tier, its K/V array then its positions. */
enum { REGION_KV = 0, REGION_POS = 1, REGIONS_PER_TIER = 2 };

typedef enum { IMPORT_ASKED = 0, IMPORT_READING } ImportState;

typedef struct {
    uint64_t xfer_id;
    void *owner;
    const SchedRequest *req;
    int source;           /* the lender's leader rank */
    double deadline;
    ImportState state;
    /* While reading: the local prefix and the reserved blocks, held until the batch lands. */
    CacheIdentity id;
    bool have_id;
    KvCacheMatch match;
    int32_t *table;
    int n_blocks, n_held, n_local; /* blocks to end up with, blocks of table held now, blocks cached here before */
    KvMoveBatch *batch;
} Import;

typedef struct {
    int source;
    uint64_t xfer_id;
    RadixNode *lock;
    CacheIdentity id;
    double expires;
} Lease;

struct KvMoves {
    KvMovesConfig cfg;
    KvMover *mover;
    BackendKvMemory mem[2];
    bool have_tier[2];
    WireBuf desc; /* this rank's mover description, sent with every loan */
    Import *imports;
    int n_imports, cap_imports;
    Lease *leases;
    int n_leases, cap_leases;
    uint64_t next_xfer;
    KvMoveCounters counters;
};

static KvCache *cache_of(KvMoves *mv) { return &mv->cfg.engine->sched.cache; }

int kv_moves_create(KvMoves **out, const KvMovesConfig *cfg, BraidError *err) {
    *out = NULL;
    if (cfg->tp_size > 1) return braid_error_set(err, "KV moves: instances of %d ranks do not move blocks yet (only --tp 1)", cfg->tp_size);
    if (cfg->engine->sched.forkkv) return braid_error_set(err, "KV moves: not with --lora-cache shared (the base cache has residuals beside it)");
    if (!cfg->engine->sched.cache_enabled) return braid_error_set(err, "KV moves: prefix caching is off");
    KvMoves *mv = calloc(1, sizeof *mv);
    if (!mv) return braid_error_set(err, "KV moves: out of memory");
    mv->cfg = *cfg;
    mv->next_xfer = 1;
    if (backend_kv_memory(&cfg->engine->backend, 0, &mv->mem[0], err)) goto fail;
    mv->have_tier[0] = true;
    BraidError host_err;
    mv->have_tier[1] = backend_kv_memory(&cfg->engine->backend, 1, &mv->mem[1], &host_err) == 0;
    if (kv_mover_create(&mv->mover, err)) goto fail;
    for (int t = 0; t < 2 && mv->have_tier[t]; t++) {
        int kv_region, pos_region;
        if (kv_mover_register(mv->mover, mv->mem[t].kv, mv->mem[t].kv_bytes, &kv_region, err) ||
            kv_mover_register(mv->mover, mv->mem[t].slot_pos, mv->mem[t].slot_pos_bytes, &pos_region, err))
            goto fail;
        if (kv_region != t * REGIONS_PER_TIER + REGION_KV || pos_region != t * REGIONS_PER_TIER + REGION_POS) {
            braid_error_set(err, "KV moves: unexpected region numbering from the mover");
            goto fail;
        }
    }
    if (kv_mover_describe(mv->mover, &mv->desc, err)) goto fail;
    *out = mv;
    return 0;
fail:
    braid_error_wrap(err, "KV moves off on instance %d", cfg->instance);
    kv_moves_destroy(mv);
    return -1;
}

/* ---- lending ---- */

static void lease_end(KvMoves *mv, int at) {
    Lease *l = &mv->leases[at];
    kv_cache_lend_end(cache_of(mv), l->lock);
    kv_cache_identity_release(cache_of(mv), &l->id);
    mv->leases[at] = mv->leases[--mv->n_leases];
}

static void send_exported(KvMoves *mv, int dest, const MsgKvExported *m) {
    WireBuf b = {0};
    move_msg_exported_encode(&b, m);
    BraidError err;
    if (ctrl_send(mv->cfg.ctrl, dest, MSG_KV_EXPORTED, &b, &err))
        LOG_WARN("kv-moves", "instance %d: answer to rank %d lost: %s", mv->cfg.instance, dest, err.msg);
}

static void refuse_loan(KvMoves *mv, int dest, uint64_t xfer_id, const char *why) {
    MsgKvExported m = {.xfer_id = xfer_id, .why = (char *)why};
    send_exported(mv, dest, &m);
}

static void lend(KvMoves *mv, int source, const MsgKvExport *ask) {
    KvCache *c = cache_of(mv);
    Lease l = {.source = source, .xfer_id = ask->xfer_id, .expires = braid_now_seconds() + 4 * mv->cfg.timeout_s};
    BraidError err;
    KvCacheMatch m;
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
    l.lock = m.node;
    mv->leases[mv->n_leases++] = l;
    mv->counters.lent_blocks += (uint64_t)n;
    MsgKvExported ans = {.xfer_id = ask->xfer_id, .n_blocks = n, .tiers = tiers, .blocks = blocks,
                         .pool_blocks = {mv->mem[0].n_blocks, mv->have_tier[1] ? mv->mem[1].n_blocks : 0},
                         .desc = mv->desc.data, .desc_len = mv->desc.len, .why = ""};
    send_exported(mv, source, &ans);
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
    if (ctrl_send(mv->cfg.ctrl, dest, MSG_KV_RELEASE, &b, &err))
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
                       .tokens = r->tokens, .n_tokens = n_ask};
    WireBuf b = {0};
    move_msg_export_encode(&b, &ask);
    BraidError err;
    if (ctrl_send(mv->cfg.ctrl, source_rank, MSG_KV_EXPORT, &b, &err)) {
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
    kv_mover_batch_end(im->batch);
    im->batch = NULL;
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
    ready(ctx, im.owner, moved_tokens);
}

/* Copies blocks [from, n) of the loan into table[from..n) of the device pool: per run of
 * consecutive ids on both sides, every layer's K and V and the slots' positions. */
static int queue_reads(KvMoves *mv, Import *im, const MsgKvExported *loan, int peer, BraidError *err) {
    const BackendKvMemory *dst = &mv->mem[0];
    if (kv_mover_batch_begin(mv->mover, peer, &im->batch, err)) return -1;
    size_t blb = dst->block_layer_bytes, pos_bytes = (size_t)dst->block_size * sizeof(int32_t);
    for (int i = im->n_local; i < im->n_blocks;) {
        int tier = loan->tiers[i], run = 1;
        while (i + run < im->n_blocks && loan->tiers[i + run] == tier && loan->blocks[i + run] == loan->blocks[i] + run &&
               im->table[i + run] == im->table[i] + run)
            run++;
        size_t src_n = (size_t)loan->pool_blocks[tier], sb = (size_t)loan->blocks[i], db = (size_t)im->table[i];
        int kv_region = tier * REGIONS_PER_TIER + REGION_KV;
        for (int kv = 0; kv < 2; kv++)
            for (int l = 0; l < dst->n_layers; l++) {
                size_t layer = (size_t)kv * dst->n_layers + l;
                if (kv_mover_get(im->batch, kv_region, (layer * src_n + sb) * blb,
                                 (uint8_t *)dst->kv + (layer * dst->n_blocks + db) * blb, run * blb, err))
                    return -1;
            }
        if (kv_mover_get(im->batch, tier * REGIONS_PER_TIER + REGION_POS, sb * pos_bytes, (uint8_t *)dst->slot_pos + db * pos_bytes,
                         run * pos_bytes, err))
            return -1;
        i += run;
    }
    return 0;
}

/* Runs the cache's pending operations now: a block a demotion just freed may be reserved for the
 * move, and its STORE must read the old contents before the reads overwrite them. */
static int apply_pending_ops(KvMoves *mv, BraidError *err) {
    CacheOpList ops = {0};
    int rc = kv_cache_take_ops(cache_of(mv), &ops) ? braid_error_set(err, "KV moves: out of memory taking cache operations") : 0;
    if (rc == 0 && ops.n > 0) rc = backend_apply_cache_ops(&mv->cfg.engine->backend, ops.ops, ops.n, err);
    cache_ops_free(&ops);
    return rc;
}

/* The lender answered: hold the local prefix, reserve the rest and start reading. Returns 0 with
 * the import reading, 1 when it is over (why says why), -1 on a local failure. */
static int start_reads(KvMoves *mv, Import *im, const MsgKvExported *loan, const char **why, BraidError *err) {
    KvCache *c = cache_of(mv);
    const SchedRequest *r = im->req;
    int peer;
    BraidError e;
    *why = "out of memory";
    if (loan->n_blocks == 0) return *why = "the lender had nothing to lend", 1;
    if (kv_mover_connect(mv->mover, im->source, loan->desc, loan->desc_len, &peer, &e)) {
        LOG_WARN("kv-moves", "instance %d: %s", mv->cfg.instance, e.msg);
        return *why = "no connection to the lender", 1;
    }
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
    if (apply_pending_ops(mv, err)) return -1;
    if (queue_reads(mv, im, loan, peer, &e)) {
        LOG_WARN("kv-moves", "instance %d: %s", mv->cfg.instance, e.msg);
        return *why = "the reads could not be queued", 1;
    }
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
        import_finish(mv, at, 0, !declined, why ? why : "", ready, ctx);
        if (declined && loan->why && *loan->why)
            LOG_DEBUG("kv-moves", "instance %d: rank %d lent nothing: %s", mv->cfg.instance, source, loan->why);
    }
    return rc < 0 ? -1 : 0;
}

static void land(KvMoves *mv, int at, KvMoveReadyFn ready, void *ctx) {
    Import *im = &mv->imports[at];
    KvCache *c = cache_of(mv);
    BraidError e;
    int moved = im->n_blocks - im->n_local;
    size_t bytes = kv_mover_batch_bytes(im->batch);
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

void kv_moves_poll(KvMoves *mv, KvMoveReadyFn ready, void *ctx) {
    if (!mv) return;
    kv_mover_progress(mv->mover);
    double now = braid_now_seconds();
    for (int i = mv->n_imports - 1; i >= 0; i--) {
        Import *im = &mv->imports[i];
        BraidError e;
        int st = im->state == IMPORT_READING ? kv_mover_poll(im->batch, &e) : 0;
        if (st == 1) land(mv, i, ready, ctx);
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
    wire_buf_free(&mv->desc);
    kv_mover_destroy(mv->mover);
    free(mv);
}
