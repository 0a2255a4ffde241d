/* kv_stage_wire.c — kv_stage_wire.h: header probes and chunk reads of a staging window over UCX. */
#include "worker/kv_stage_wire.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    KvMoveBatch *probe, *data;
    KvStageWindowHead head; /* where a probe lands */
    uint64_t need;          /* data bytes that must be staged before the chunk is read */
    uint8_t *buf;
    const StageChunkPiece *pieces;
    int n;
} WireSlot;

struct KvStageWire {
    KvStageWireConfig cfg;
    uint64_t known; /* the highest watermark seen */
    int n_slots, probes;
    WireSlot slot[KV_STAGE_WIRE_MAX_SLOTS];
};

int kv_stage_wire_create(KvStageWire **out, const KvStageWireConfig *cfg, int n_slots, BraidError *err) {
    *out = NULL;
    if (n_slots < 1 || n_slots > KV_STAGE_WIRE_MAX_SLOTS) return braid_error_set(err, "staged move: %d ring buffers (1..%d)", n_slots, KV_STAGE_WIRE_MAX_SLOTS);
    KvStageWire *w = calloc(1, sizeof *w);
    if (!w) return braid_error_set(err, "staged move: out of memory");
    w->cfg = *cfg;
    w->n_slots = n_slots;
    *out = w;
    return 0;
}

void kv_stage_wire_destroy(KvStageWire *w) {
    if (!w) return;
    for (int s = 0; s < w->n_slots; s++) kv_stage_wire_quiesce(w, s);
    free(w);
}

/* Reads the chunk when the watermark covers it, else the window's header. */
static int issue(KvStageWire *w, WireSlot *ws, BraidError *err) {
    const KvStageWireConfig *c = &w->cfg;
    if (w->known >= ws->need) {
        if (kv_mover_batch_begin(c->mover, c->peer, &ws->data, err)) return -1;
        uint64_t data = c->window_offset + KV_STAGE_WINDOW_HEAD;
        for (int i = 0; i < ws->n; i++)
            if (kv_mover_get(ws->data, c->region, data + ws->pieces[i].src, ws->buf + ws->pieces[i].buf_off, ws->pieces[i].len, err)) return -1;
        return 0;
    }
    w->probes++;
    if (kv_mover_batch_begin(c->mover, c->peer, &ws->probe, err)) return -1;
    return kv_mover_get(ws->probe, c->region, c->window_offset, &ws->head, sizeof ws->head, err);
}

int kv_stage_wire_fetch_start(void *wire, int slot, uint8_t *buf, const StageChunkPiece *pieces, int n, BraidError *err) {
    KvStageWire *w = wire;
    WireSlot *ws = &w->slot[slot];
    ws->buf = buf, ws->pieces = pieces, ws->n = n, ws->need = 0;
    for (int i = 0; i < n; i++)
        if (pieces[i].src + pieces[i].len > ws->need) ws->need = pieces[i].src + pieces[i].len;
    return issue(w, ws, err);
}

int kv_stage_wire_fetch_poll(void *wire, int slot, BraidError *err) {
    KvStageWire *w = wire;
    WireSlot *ws = &w->slot[slot];
    if (ws->probe) {
        int st = kv_mover_poll(ws->probe, err);
        if (st <= 0) return st;
        kv_mover_batch_end(ws->probe);
        ws->probe = NULL;
        if (ws->head.gen != w->cfg.gen)
            return braid_error_set(err, "staged move: the lender's window holds loan %llu, not %llu (the lease ended)",
                                   (unsigned long long)ws->head.gen, (unsigned long long)w->cfg.gen);
        if (ws->head.staged > w->known) w->known = ws->head.staged;
        return issue(w, ws, err) ? -1 : 0;
    }
    if (!ws->data) return braid_error_set(err, "staged move: no read in flight on buffer %d", slot);
    int st = kv_mover_poll(ws->data, err);
    if (st == 1) {
        kv_mover_batch_end(ws->data);
        ws->data = NULL;
    }
    return st;
}

void kv_stage_wire_quiesce(void *wire, int slot) {
    KvStageWire *w = wire;
    WireSlot *ws = &w->slot[slot];
    kv_mover_batch_end(ws->probe);
    kv_mover_batch_end(ws->data);
    ws->probe = ws->data = NULL;
}

int kv_stage_wire_probes(const KvStageWire *w) { return w->probes; }
