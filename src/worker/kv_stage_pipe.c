/* kv_stage_pipe.c — kv_stage_pipe.h: chunk planning and the ring's state machine. */
#include "worker/kv_stage_pipe.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { SLOT_FREE = 0, SLOT_FETCHING, SLOT_FETCHED, SLOT_DRAINING } SlotState;

static bool in_flight(SlotState st) { return st == SLOT_FETCHING || st == SLOT_DRAINING; }

typedef struct {
    SlotState state;
    int chunk; /* the chunk it holds while not free */
} Slot;

struct KvStagePipe {
    KvStagePipeConfig cfg;
    StageChunkPiece *pieces; /* every chunk's pieces, chunk after chunk */
    int *chunk_first;        /* (n_chunks + 1): chunk k's pieces are [chunk_first[k], chunk_first[k+1]) */
    int n_chunks;
    size_t bytes;
    Slot *slots;
    int next_fetch, next_drain, landed;
    bool failed;
    char why[sizeof(((BraidError *)0)->msg)];
};

/* Splits the pieces into chunks of at most buf_bytes. Counts first (cap NULL), then fills. */
static void plan_chunks(const StagePiece *in, int n_in, size_t cap, StageChunkPiece *out, int *first, int *n_pieces, int *n_chunks) {
    int np = 0, nc = 0;
    size_t used = cap; /* no chunk open yet */
    for (int i = 0; i < n_in; i++) {
        size_t done = 0;
        while (done < in[i].len) {
            if (used == cap) { /* open the next chunk */
                if (first) first[nc] = np;
                nc++;
                used = 0;
            }
            size_t take = in[i].len - done < cap - used ? in[i].len - done : cap - used;
            if (out) out[np] = (StageChunkPiece){.src = in[i].src + done, .dst = in[i].dst + done, .len = take, .buf_off = used};
            np++;
            used += take;
            done += take;
        }
    }
    if (first) first[nc] = np;
    *n_pieces = np;
    *n_chunks = nc;
}

int kv_stage_pipe_create(KvStagePipe **out, const StagePiece *pieces, int n_pieces, const KvStagePipeConfig *cfg, BraidError *err) {
    *out = NULL;
    if (!cfg->ops || !cfg->ops->fetch_start || !cfg->ops->fetch_poll || !cfg->ops->quiesce || cfg->n_bufs < 1 || cfg->buf_bytes == 0 ||
        !cfg->bufs || (!cfg->ops->drain_start) != (!cfg->ops->drain_poll))
        return braid_error_set(err, "staged move: bad pipeline configuration");
    KvStagePipe *p = calloc(1, sizeof *p);
    if (!p) return braid_error_set(err, "staged move: out of memory");
    p->cfg = *cfg;
    int np, nc;
    plan_chunks(pieces, n_pieces, cfg->buf_bytes, NULL, NULL, &np, &nc);
    p->pieces = malloc(((size_t)np + 1) * sizeof *p->pieces);
    p->chunk_first = malloc(((size_t)nc + 1) * sizeof *p->chunk_first);
    p->slots = calloc((size_t)cfg->n_bufs, sizeof *p->slots);
    if (!p->pieces || !p->chunk_first || !p->slots) {
        kv_stage_pipe_destroy(p);
        return braid_error_set(err, "staged move: out of memory");
    }
    plan_chunks(pieces, n_pieces, cfg->buf_bytes, p->pieces, p->chunk_first, &np, &p->n_chunks);
    for (int i = 0; i < n_pieces; i++) p->bytes += pieces[i].len;
    *out = p;
    return 0;
}

/* Abandons everything in flight; the pipe fails with err's message. */
static int fail(KvStagePipe *p, BraidError *err) {
    for (int s = 0; s < p->cfg.n_bufs; s++) {
        if (in_flight(p->slots[s].state)) p->cfg.ops->quiesce(p->cfg.ctx, s);
        p->slots[s].state = SLOT_FREE; /* a fetched chunk waiting for its drain holds nothing in flight */
    }
    p->failed = true;
    snprintf(p->why, sizeof p->why, "%s", err->msg);
    return -1;
}

static const StageChunkPiece *chunk_pieces(const KvStagePipe *p, int k, int *n) {
    *n = p->chunk_first[k + 1] - p->chunk_first[k];
    return p->pieces + p->chunk_first[k];
}

/* One pass over the ring; *moved is set when anything changed state. 0 or -1 (failed). */
static int pass(KvStagePipe *p, bool *moved, BraidError *err) {
    const StageCopyOps *ops = p->cfg.ops;
    int nb = p->cfg.n_bufs, n;
    for (int s = 0; s < nb; s++) /* fetches in flight */
        if (p->slots[s].state == SLOT_FETCHING) {
            int st = ops->fetch_poll(p->cfg.ctx, s, err);
            if (st < 0) return braid_error_wrap(err, "staged move: chunk %d of %d", p->slots[s].chunk, p->n_chunks);
            if (st == 1) p->slots[s].state = SLOT_FETCHED, *moved = true;
        }
    while (p->next_drain < p->n_chunks) { /* drains start in chunk order */
        Slot *slot = &p->slots[p->next_drain % nb];
        if (slot->state != SLOT_FETCHED || slot->chunk != p->next_drain) break;
        const StageChunkPiece *pc = chunk_pieces(p, slot->chunk, &n);
        if (!ops->drain_start) slot->state = SLOT_FREE, p->landed++;
        else {
            slot->state = SLOT_DRAINING; /* before the start: a start that fails is quiesced too */
            if (ops->drain_start(p->cfg.ctx, p->next_drain % nb, p->cfg.bufs[p->next_drain % nb], pc, n, err))
                return braid_error_wrap(err, "staged move: landing chunk %d of %d", slot->chunk, p->n_chunks);
        }
        p->next_drain++;
        *moved = true;
    }
    for (int s = 0; s < nb; s++) /* drains in flight */
        if (p->slots[s].state == SLOT_DRAINING) {
            int st = ops->drain_poll(p->cfg.ctx, s, err);
            if (st < 0) return braid_error_wrap(err, "staged move: landing chunk %d of %d", p->slots[s].chunk, p->n_chunks);
            if (st == 1) p->slots[s].state = SLOT_FREE, p->landed++, *moved = true;
        }
    while (p->next_fetch < p->n_chunks) { /* fetches start in chunk order, each into its ring buffer once free */
        int s = p->next_fetch % nb;
        if (p->slots[s].state != SLOT_FREE) break;
        const StageChunkPiece *pc = chunk_pieces(p, p->next_fetch, &n);
        p->slots[s] = (Slot){.state = SLOT_FETCHING, .chunk = p->next_fetch};
        if (ops->fetch_start(p->cfg.ctx, s, p->cfg.bufs[s], pc, n, err))
            return braid_error_wrap(err, "staged move: reading chunk %d of %d", p->next_fetch, p->n_chunks);
        p->next_fetch++;
        *moved = true;
    }
    return 0;
}

int kv_stage_pipe_step(KvStagePipe *p, double now, BraidError *err) {
    if (p->failed) return braid_error_set(err, "%s", p->why);
    if (p->cfg.deadline > 0 && now > p->cfg.deadline) {
        braid_error_set(err, "staged move: timed out with %d of %d chunks landed", p->landed, p->n_chunks);
        return fail(p, err);
    }
    bool moved = true;
    while (moved) { /* copies that complete at once let the next ones start: go on while anything moves (bounded by the chunks) */
        moved = false;
        if (pass(p, &moved, err)) return fail(p, err);
    }
    return p->landed == p->n_chunks ? 1 : 0;
}

void kv_stage_pipe_destroy(KvStagePipe *p) {
    if (!p) return;
    if (p->slots)
        for (int s = 0; s < p->cfg.n_bufs; s++)
            if (in_flight(p->slots[s].state)) p->cfg.ops->quiesce(p->cfg.ctx, s);
    free(p->pieces);
    free(p->chunk_first);
    free(p->slots);
    free(p);
}

int kv_stage_pipe_chunks(const KvStagePipe *p) { return p->n_chunks; }
int kv_stage_pipe_chunks_landed(const KvStagePipe *p) { return p->landed; }
size_t kv_stage_pipe_bytes(const KvStagePipe *p) { return p->bytes; }

int kv_stage_pipe_busy_buffers(const KvStagePipe *p) {
    int busy = 0;
    for (int s = 0; s < p->cfg.n_bufs; s++) busy += in_flight(p->slots[s].state);
    return busy;
}
