/* kv_move_cuda_staged.c — kv_move_cuda_staged.h: the lender's pinned windows and the borrower's
 * landing rings of host-staged CUDA KV moves, the copies of a worker/kv_stage_pipe.h pipeline. */
#include "worker/kv_move_cuda_staged.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timeutil.h"
#include "transport/kv_mover.h"
#include "transport/move_msg.h"
#include "worker/kv_stage_layout.h"
#include "worker/kv_stage_pipe.h"
#include "worker/kv_stage_wire.h"

/* Every window starts with a KvStageWindowHead (kv_stage_wire.h), padded to WINDOW_HEAD bytes: the
 * loan's xfer id and the staged watermark the host functions raise; the staged bytes follow. */
enum { WINDOW_HEAD = KV_STAGE_WINDOW_HEAD };
typedef KvStageWindowHead WindowHead;

/* What a loan's description starts with; the lender's UCX description follows. */
typedef struct {
    uint32_t magic, kv_layout;
    int32_t n_layers, block_size, n_blocks, pad;
    uint64_t block_layer_bytes, window_offset, window_bytes, gen;
} StagedDescHead;

typedef struct {
    uint64_t *staged;
    uint64_t value;
} Publish;

typedef struct {
    bool busy;
    cudaEvent_t copied; /* after the window's last copy */
    Publish *publish;
} Window;

typedef struct {
    bool busy;
    uint8_t *mem; /* KV_STAGE_RING_SLOTS chunk buffers, pinned */
} Ring;

struct KvStaging {
    CudaKvPool mine;
    cudaStream_t lend_stream, land_stream;
    size_t window_bytes, chunk_bytes;
    KvMover *mover;       /* on first use */
    uint8_t *windows_mem; /* KV_STAGE_WINDOWS windows, pinned, UCX region 0; on the first staged loan */
    Window windows[KV_STAGE_WINDOWS];
    WireBuf mover_desc;
    Ring rings[KV_STAGE_RINGS];
};

/* Per ring buffer: its drain's event (the UCX reads of its chunk are the wire's). */
typedef struct {
    cudaEvent_t drained;
    bool draining;
} ReadSlot;

struct KvStagedRead {
    KvStaging *s;
    KvStageWire *wire;
    Ring *ring;
    KvStagePipe *pipe;
    ReadSlot slot[KV_STAGE_RING_SLOTS];
};

static int cuda_fail(cudaError_t e, const char *what, BraidError *err) {
    return braid_error_set(err, "staged KV move (CUDA): %s: %s", what, cudaGetErrorString(e));
}

/* A size from the environment in units of unit bytes (dflt when unset, malformed or below min). */
static size_t env_size(const char *name, size_t dflt, size_t min, size_t unit) {
    const char *v = getenv(name);
    char *end;
    unsigned long long n = v ? strtoull(v, &end, 10) : 0;
    if (!v || end == v || *end || n < min) return dflt * unit;
    return (size_t)n * unit;
}

bool kv_staging_desc_is_staged(const uint8_t *desc, size_t len) {
    uint32_t magic;
    if (!desc || len < sizeof(StagedDescHead)) return false;
    memcpy(&magic, desc, sizeof magic);
    return magic == KV_STAGE_MAGIC;
}

int kv_staging_create(KvStaging **out, const CudaKvPool *mine, BraidError *err) {
    *out = NULL;
    KvStaging *s = calloc(1, sizeof *s);
    if (!s) return braid_error_set(err, "staged KV move: out of memory");
    s->mine = *mine;
    s->window_bytes = env_size("BRAID_KV_STAGE_WINDOW_MB", 256, 1, 1u << 20);
    s->chunk_bytes = env_size("BRAID_KV_STAGE_CHUNK_KB", 1024, 4, 1u << 10);
    cudaError_t e = cudaSetDevice(mine->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->lend_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->land_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        kv_staging_destroy(s);
        return cuda_fail(e, "creating the move streams", err);
    }
    *out = s;
    return 0;
}

void kv_staging_destroy(KvStaging *s) {
    if (!s) return;
    cudaSetDevice(s->mine.device);
    if (s->lend_stream) cudaStreamSynchronize(s->lend_stream), cudaStreamDestroy(s->lend_stream);
    if (s->land_stream) cudaStreamSynchronize(s->land_stream), cudaStreamDestroy(s->land_stream);
    kv_mover_destroy(s->mover); /* before the memory it registered goes */
    for (int w = 0; w < KV_STAGE_WINDOWS; w++) {
        if (s->windows[w].copied) cudaEventDestroy(s->windows[w].copied);
        free(s->windows[w].publish);
    }
    if (s->windows_mem) cudaFreeHost(s->windows_mem);
    for (int r = 0; r < KV_STAGE_RINGS; r++)
        if (s->rings[r].mem) cudaFreeHost(s->rings[r].mem);
    wire_buf_free(&s->mover_desc);
    free(s);
}

static int ensure_mover(KvStaging *s, BraidError *err) {
    if (s->mover) return 0;
    if (kv_mover_create(&s->mover, err)) return braid_error_wrap(err, "staged KV move: UCX");
    return 0;
}

/* The windows, pinned and registered, and the description a borrower connects with. */
static int ensure_windows(KvStaging *s, BraidError *err) {
    if (s->windows_mem) return 0;
    if (ensure_mover(s, err)) return -1;
    size_t total = KV_STAGE_WINDOWS * s->window_bytes;
    cudaError_t e = cudaHostAlloc((void **)&s->windows_mem, total, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        s->windows_mem = NULL;
        return cuda_fail(e, "allocating the pinned staging windows", err);
    }
    for (int w = 0; w < KV_STAGE_WINDOWS && e == cudaSuccess; w++) e = cudaEventCreateWithFlags(&s->windows[w].copied, cudaEventDisableTiming);
    int region;
    if (e != cudaSuccess) cuda_fail(e, "creating the windows' events", err);
    else if (kv_mover_register(s->mover, s->windows_mem, total, &region, err) || kv_mover_describe(s->mover, &s->mover_desc, err)) e = cudaErrorUnknown;
    else if (region != 0) braid_error_set(err, "staged KV move: the windows are not the mover's first region"), e = cudaErrorUnknown;
    if (e != cudaSuccess) { /* the mover may hold a registration of the memory: both go */
        kv_mover_destroy(s->mover);
        s->mover = NULL;
        cudaFreeHost(s->windows_mem);
        s->windows_mem = NULL;
        return -1;
    }
    return 0;
}

/* ---- lender ---- */

static void publish_watermark(void *arg) { /* a host function on the lend stream: no CUDA calls here */
    Publish *p = arg;
    __atomic_store_n(p->staged, p->value, __ATOMIC_RELEASE);
}

/* This rank's pool as the layout sees it. */
static KvStagePool stage_pool(const CudaKvPool *m) {
    return (KvStagePool){.kv = (uint64_t)(uintptr_t)m->kv, .slot_pos = (uint64_t)(uintptr_t)m->slot_pos, .n_layers = m->n_layers,
                         .n_blocks = m->n_blocks, .block_size = m->block_size, .block_layer_bytes = m->block_layer_bytes};
}

/* Its host tier the same way (no blocks when it has none): a layer's K and V planes side by side. */
static KvStagePool stage_host_pool(const CudaKvPool *m) {
    if (m->host_blocks <= 0 || !m->host_kv) return (KvStagePool){0};
    return (KvStagePool){.kv = (uint64_t)(uintptr_t)m->host_kv, .slot_pos = (uint64_t)(uintptr_t)m->host_slot_pos, .n_layers = m->n_layers,
                         .n_blocks = m->host_blocks, .block_size = m->block_size, .block_layer_bytes = m->block_layer_bytes,
                         .kv_interleaved = true};
}

static size_t staged_block_bytes(const CudaKvPool *m) {
    KvStagePool p = stage_pool(m);
    return kv_stage_block_bytes(&p);
}

/* Queues len bytes from src (device memory or the pinned host tier: cudaMemcpyDefault tells them
 * apart) to the window's data at off, publishing the watermark at each chunk end. */
typedef struct {
    KvStaging *s;
    uint8_t *data;
    Window *w;
    WindowHead *head;
    size_t in_chunk;
    int n_publish;
} StageCursor;

static int stage_copy(StageCursor *c, const uint8_t *src, size_t off, size_t len, BraidError *err) {
    size_t done = 0;
    while (done < len) {
        size_t take = len - done < c->s->chunk_bytes - c->in_chunk ? len - done : c->s->chunk_bytes - c->in_chunk;
        cudaError_t e = cudaMemcpyAsync(c->data + off + done, src + done, take, cudaMemcpyDefault, c->s->lend_stream);
        if (e != cudaSuccess) return cuda_fail(e, "queuing a staging copy", err);
        done += take;
        c->in_chunk += take;
        if (c->in_chunk == c->s->chunk_bytes) {
            Publish *p = &c->w->publish[c->n_publish++];
            *p = (Publish){.staged = &c->head->staged, .value = off + done};
            if ((e = cudaLaunchHostFunc(c->s->lend_stream, publish_watermark, p)) != cudaSuccess) return cuda_fail(e, "queuing a watermark", err);
            c->in_chunk = 0;
        }
    }
    return 0;
}

/* The window's data (kv_stage_layout.h), copied in window order from either tier (tiers NULL: all device). */
static int stage_blocks(StageCursor *c, const uint8_t *tiers, const int32_t *blocks, int n, BraidError *err) {
    KvStagePool pools[2] = {stage_pool(&c->s->mine), stage_host_pool(&c->s->mine)};
    StagePiece *pieces;
    int np = kv_stage_lender_pieces_tiered(pools, tiers, blocks, n, &pieces, err), rc = np < 0 ? -1 : 0;
    for (int i = 0; i < np && rc == 0; i++) rc = stage_copy(c, (const uint8_t *)(uintptr_t)pieces[i].src, pieces[i].dst, pieces[i].len, err);
    free(pieces);
    return rc;
}

int kv_staging_stage(KvStaging *s, const uint8_t *tiers, const int32_t *blocks, int n, uint64_t xfer_id, WireBuf *desc_list, int *window,
                     int *n_staged, BraidError *err) {
    *window = -1, *n_staged = 0;
    if (ensure_windows(s, err)) return -1;
    int w = 0;
    while (w < KV_STAGE_WINDOWS && s->windows[w].busy) w++;
    if (w == KV_STAGE_WINDOWS) return braid_error_set(err, "staged KV move: all %d staging windows are lent", KV_STAGE_WINDOWS);
    size_t per_block = staged_block_bytes(&s->mine), fit = (s->window_bytes - WINDOW_HEAD) / per_block;
    if (fit == 0) return braid_error_set(err, "staged KV move: a block (%zu bytes) does not fit a %zu-byte window", per_block, s->window_bytes);
    if ((size_t)n > fit) n = (int)fit;
    size_t total = (size_t)n * per_block;
    Window *win = &s->windows[w];
    free(win->publish);
    if (!(win->publish = calloc(total / s->chunk_bytes + 2, sizeof *win->publish))) return braid_error_set(err, "staged KV move: out of memory");
    uint8_t *base = s->windows_mem + (size_t)w * s->window_bytes;
    WindowHead *head = (WindowHead *)base;
    head->gen = xfer_id;
    __atomic_store_n(&head->staged, 0, __ATOMIC_RELEASE);
    StageCursor c = {.s = s, .data = base + WINDOW_HEAD, .w = win, .head = head};
    cudaError_t e = cudaSetDevice(s->mine.device);
    int rc = e == cudaSuccess ? stage_blocks(&c, tiers, blocks, n, err) : cuda_fail(e, "selecting the device", err);
    if (rc == 0 && c.in_chunk > 0) { /* the last, partial chunk */
        Publish *p = &win->publish[c.n_publish++];
        *p = (Publish){.staged = &head->staged, .value = total};
        if ((e = cudaLaunchHostFunc(s->lend_stream, publish_watermark, p)) != cudaSuccess) rc = cuda_fail(e, "queuing a watermark", err);
    }
    if (rc == 0 && (e = cudaEventRecord(win->copied, s->lend_stream)) != cudaSuccess) rc = cuda_fail(e, "recording the staging copies", err);
    if (rc) {
        cudaStreamSynchronize(s->lend_stream); /* nothing may still write or publish into the window */
        return -1;
    }
    StagedDescHead h = {.magic = KV_STAGE_MAGIC, .kv_layout = MOVE_KV_LAYOUT_BF16, .n_layers = s->mine.n_layers, .block_size = s->mine.block_size,
                        .n_blocks = n, .block_layer_bytes = s->mine.block_layer_bytes, .window_offset = (uint64_t)w * s->window_bytes,
                        .window_bytes = s->window_bytes, .gen = xfer_id};
    wire_put_i32(desc_list, 1);
    wire_put_u64(desc_list, sizeof h + s->mover_desc.len);
    wire_put(desc_list, &h, sizeof h);
    wire_put(desc_list, s->mover_desc.data, s->mover_desc.len);
    if (desc_list->failed) {
        cudaStreamSynchronize(s->lend_stream);
        return braid_error_set(err, "staged KV move: out of memory");
    }
    win->busy = true;
    *window = w, *n_staged = n;
    return 0;
}

void kv_staging_unstage(KvStaging *s, int window) {
    if (!s || window < 0 || window >= KV_STAGE_WINDOWS || !s->windows[window].busy) return;
    cudaEventSynchronize(s->windows[window].copied); /* normally long done: the borrower read it all */
    s->windows[window].busy = false;
}

/* ---- borrower ---- */

static int check_desc(const KvStaging *s, const StagedDescHead *h, BraidError *err) {
    const CudaKvPool *m = &s->mine;
    if (h->kv_layout != MOVE_KV_LAYOUT_BF16)
        return braid_error_set(err, "staged KV move: the lender's KV is %s, this instance's %s", move_kv_layout_name((int)h->kv_layout),
                               move_kv_layout_name(MOVE_KV_LAYOUT_BF16));
    if (h->n_layers != m->n_layers || h->block_size != m->block_size || h->block_layer_bytes != m->block_layer_bytes)
        return braid_error_set(err, "staged KV move: the lender's pool geometry (%d layers, block %d, %llu bytes) differs from this one's (%d, %d, %zu)",
                               h->n_layers, h->block_size, (unsigned long long)h->block_layer_bytes, m->n_layers, m->block_size, m->block_layer_bytes);
    if (h->n_blocks < 1 || (uint64_t)h->n_blocks * staged_block_bytes(m) + WINDOW_HEAD > h->window_bytes)
        return braid_error_set(err, "staged KV move: malformed loan description (%d blocks)", h->n_blocks);
    return 0;
}

static int fetch_start(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *pieces, int n, BraidError *err) {
    return kv_stage_wire_fetch_start(((KvStagedRead *)ctx)->wire, slot, buf, pieces, n, err);
}

static int fetch_poll(void *ctx, int slot, BraidError *err) { return kv_stage_wire_fetch_poll(((KvStagedRead *)ctx)->wire, slot, err); }

static int drain_start(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *pieces, int n, BraidError *err) {
    KvStagedRead *r = ctx;
    ReadSlot *rs = &r->slot[slot];
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < n && e == cudaSuccess; i++)
        e = cudaMemcpyAsync((void *)(uintptr_t)pieces[i].dst, buf + pieces[i].buf_off, pieces[i].len, cudaMemcpyHostToDevice, r->s->land_stream);
    if (e == cudaSuccess) e = cudaEventRecord(rs->drained, r->s->land_stream);
    rs->draining = true; /* quiesce waits for whatever was queued */
    return e == cudaSuccess ? 0 : cuda_fail(e, "queuing a host-to-device copy", err);
}

static int drain_poll(void *ctx, int slot, BraidError *err) {
    KvStagedRead *r = ctx;
    cudaError_t e = cudaEventQuery(r->slot[slot].drained);
    if (e == cudaSuccess) return r->slot[slot].draining = false, 1;
    return e == cudaErrorNotReady ? 0 : cuda_fail(e, "a host-to-device copy failed", err);
}

static void quiesce(void *ctx, int slot) {
    KvStagedRead *r = ctx;
    ReadSlot *rs = &r->slot[slot];
    kv_stage_wire_quiesce(r->wire, slot); /* waits for (or cuts off) reads in flight into the buffer */
    if (rs->draining) cudaStreamSynchronize(r->s->land_stream); /* a failed record leaves no event to wait on */
    rs->draining = false;
}

static const StageCopyOps STAGED_OPS = {fetch_start, fetch_poll, drain_start, drain_poll, quiesce};

static Ring *take_ring(KvStaging *s, BraidError *err) {
    for (int i = 0; i < KV_STAGE_RINGS; i++) {
        Ring *ring = &s->rings[i];
        if (ring->busy) continue;
        if (!ring->mem) {
            cudaError_t e = cudaHostAlloc((void **)&ring->mem, KV_STAGE_RING_SLOTS * s->chunk_bytes, cudaHostAllocDefault);
            if (e != cudaSuccess) {
                ring->mem = NULL;
                cuda_fail(e, "allocating a pinned landing ring", err);
                return NULL;
            }
        }
        ring->busy = true;
        return ring;
    }
    braid_error_set(err, "staged KV move: all %d landing rings are busy", KV_STAGE_RINGS);
    return NULL;
}

int kv_staged_read_start(KvStaging *s, int lender_rank, const uint8_t *desc, size_t len, const MoveRun *runs, int n_runs,
                         KvStagedRead **out, BraidError *err) {
    *out = NULL;
    if (!kv_staging_desc_is_staged(desc, len)) return braid_error_set(err, "staged KV move: not a staged loan description");
    StagedDescHead h;
    memcpy(&h, desc, sizeof h);
    if (check_desc(s, &h, err) || ensure_mover(s, err)) return -1;
    KvStagedRead *r = calloc(1, sizeof *r);
    if (!r) return braid_error_set(err, "staged KV move: out of memory");
    r->s = s;
    int n_pieces = 0, rc = -1, peer;
    KvStagePool pool = stage_pool(&s->mine);
    StagePiece *pieces = NULL;
    n_pieces = kv_stage_borrower_pieces(&pool, h.n_blocks, runs, n_runs, &pieces, err);
    cudaError_t e = cudaSuccess;
    cudaEvent_t before = NULL;
    for (int i = 0; i < KV_STAGE_RING_SLOTS && e == cudaSuccess; i++) e = cudaEventCreateWithFlags(&r->slot[i].drained, cudaEventDisableTiming);
    if (n_pieces < 0) {
    } else if (e != cudaSuccess) cuda_fail(e, "creating the landing events", err);
    else if (kv_mover_connect(s->mover, lender_rank, desc + sizeof h, len - sizeof h, &peer, err)) braid_error_wrap(err, "staged KV move: lender rank %d", lender_rank);
    else if (kv_stage_wire_create(&r->wire, &(KvStageWireConfig){.mover = s->mover, .peer = peer, .region = 0, .window_offset = h.window_offset, .gen = h.gen},
                                  KV_STAGE_RING_SLOTS, err)) {
    } else if (!(r->ring = take_ring(s, err))) {
    } else if ((e = cudaEventCreateWithFlags(&before, cudaEventDisableTiming)) != cudaSuccess ||
               (e = cudaEventRecord(before, s->mine.stream)) != cudaSuccess || (e = cudaStreamWaitEvent(s->land_stream, before, 0)) != cudaSuccess)
        cuda_fail(e, "ordering the landing copies after the compute stream", err); /* pending STOREs read reused blocks first */
    else {
        uint8_t *bufs[KV_STAGE_RING_SLOTS];
        for (int i = 0; i < KV_STAGE_RING_SLOTS; i++) bufs[i] = r->ring->mem + (size_t)i * s->chunk_bytes;
        KvStagePipeConfig cfg = {.bufs = bufs, .n_bufs = KV_STAGE_RING_SLOTS, .buf_bytes = s->chunk_bytes, .ops = &STAGED_OPS, .ctx = r};
        rc = kv_stage_pipe_create(&r->pipe, pieces, n_pieces, &cfg, err);
    }
    if (before) cudaEventDestroy(before); /* legal while pending: the wait was queued */
    free(pieces);
    if (rc) {
        kv_staged_read_end(r);
        return -1;
    }
    *out = r;
    return 0;
}

int kv_staged_read_poll(KvStagedRead *r, BraidError *err) {
    if (!r || !r->pipe) return braid_error_set(err, "staged KV move: no read");
    cudaSetDevice(r->s->mine.device);
    return kv_stage_pipe_step(r->pipe, braid_now_seconds(), err);
}

size_t kv_staged_read_bytes(const KvStagedRead *r) { return r && r->pipe ? kv_stage_pipe_bytes(r->pipe) : 0; }

void kv_staged_read_end(KvStagedRead *r) {
    if (!r) return;
    cudaSetDevice(r->s->mine.device);
    kv_stage_pipe_destroy(r->pipe); /* quiesces every ring buffer in flight */
    kv_stage_wire_destroy(r->wire);
    for (int i = 0; i < KV_STAGE_RING_SLOTS; i++)
        if (r->slot[i].drained) cudaEventDestroy(r->slot[i].drained);
    if (r->ring) r->ring->busy = false;
    free(r);
}
