/* kv_move_cuda.c — kv_move_cuda.h: same node over CUDA IPC (worker/cuda_kv_ipc.h), across nodes through
 * pinned host staging over UCX (worker/kv_move_cuda_staged.h). */
#include "worker/kv_move_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "transport/control_msg.h"
#include "worker/cuda_kv_ipc.h"
#include "worker/kv_move_cuda_staged.h"

/* One lender rank's pool, opened once and kept. */
typedef struct {
    int lender_rank;
    bool open;
    CudaKvIpcDesc desc; /* what was opened (a different one from the same rank replaces it) */
    CudaKvIpcPeer peer;
} OpenedPool;

struct KvMoveCuda {
    CudaKvPool mine;
    KvStaging *staging; /* moves across nodes; NULL when its streams could not be made (such moves fail) */
    char staging_why[sizeof(((BraidError *)0)->msg)];
    OpenedPool *opened;
    int n_opened, cap_opened;
};

struct KvMoveCudaBatch {
    cudaEvent_t landed;     /* IPC: after the copies on the compute stream */
    KvStagedRead *staged;   /* staged: the pipeline (landed, bytes and link are its) */
    size_t bytes;
};

static int cuda_fail(cudaError_t e, const char *what, BraidError *err) {
    return braid_error_set(err, "KV moves (CUDA): %s: %s", what, cudaGetErrorString(e));
}

bool kv_move_cuda_desc_is_staged(const uint8_t *desc, size_t len) { return kv_staging_desc_is_staged(desc, len); }

bool kv_move_cuda_desc_is_ipc(const uint8_t *desc, size_t len) {
    uint32_t magic;
    if (!desc || len != sizeof(CudaKvIpcDesc)) return false;
    memcpy(&magic, desc, sizeof magic);
    return magic == CUDA_KV_IPC_MAGIC;
}

int kv_move_cuda_create(KvMoveCuda **out, Backend *backend, WireBuf *desc, BraidError *err) {
    *out = NULL;
    KvMoveCuda *c = calloc(1, sizeof *c);
    if (!c) return braid_error_set(err, "KV moves (CUDA): out of memory");
    CudaKvIpcDesc d;
    if (backend_cuda_kv_pool(backend, &c->mine, err) || cuda_kv_ipc_export(&c->mine, &d, err)) {
        free(c);
        return -1;
    }
    wire_put(desc, &d, sizeof d);
    if (desc->failed) {
        free(c);
        return braid_error_set(err, "KV moves (CUDA): out of memory");
    }
    BraidError staging_err;
    if (kv_staging_create(&c->staging, &c->mine, &staging_err)) /* IPC still works; cross-node moves will say why not */
        snprintf(c->staging_why, sizeof c->staging_why, "%s", staging_err.msg);
    *out = c;
    return 0;
}

void kv_move_cuda_destroy(KvMoveCuda *c) {
    if (!c) return;
    cudaSetDevice(c->mine.device);
    cudaStreamSynchronize(c->mine.stream); /* no copy may still read a mapping being closed */
    kv_staging_destroy(c->staging);
    for (int i = 0; i < c->n_opened; i++)
        if (c->opened[i].open) cuda_kv_ipc_close(&c->opened[i].peer);
    free(c->opened);
    free(c);
}

/* The opened pool of the lender rank, opening (or reopening) it when needed. */
static const CudaKvIpcPeer *open_lender(KvMoveCuda *c, int lender_rank, const CudaKvIpcDesc *d, BraidError *err) {
    OpenedPool *slot = NULL;
    for (int i = 0; i < c->n_opened; i++)
        if (c->opened[i].lender_rank == lender_rank) slot = &c->opened[i];
    if (slot && slot->open && memcmp(&slot->desc, d, sizeof *d) == 0) return &slot->peer;
    if (slot && slot->open) { /* the rank restarted with a new pool: copies from the old mapping must finish first */
        cudaStreamSynchronize(c->mine.stream);
        cuda_kv_ipc_close(&slot->peer);
        slot->open = false;
    } else if (!slot) {
        if (braid_grow((void **)&c->opened, &c->cap_opened, c->n_opened + 1, sizeof *c->opened)) {
            braid_error_set(err, "KV moves (CUDA): out of memory");
            return NULL;
        }
        slot = &c->opened[c->n_opened++];
        memset(slot, 0, sizeof *slot);
        slot->lender_rank = lender_rank;
    }
    if (cuda_kv_ipc_open(d, &c->mine, &slot->peer, err)) return NULL; /* the slot stays closed: the next try opens again */
    slot->desc = *d;
    slot->open = true;
    return &slot->peer;
}

/* A loan staged by a lender on another node: read through pinned host buffers over UCX. */
static int read_staged(KvMoveCuda *c, int lender_rank, const uint8_t *desc, size_t desc_len, const MoveRun *runs, int n_runs, KvMoveCudaBatch **out,
                       BraidError *err) {
    if (!c->staging) return braid_error_set(err, "KV moves (CUDA): staged moves are off here: %s", c->staging_why);
    KvMoveCudaBatch *b = calloc(1, sizeof *b);
    if (!b) return braid_error_set(err, "KV moves (CUDA): out of memory");
    if (kv_staged_read_start(c->staging, lender_rank, desc, desc_len, runs, n_runs, &b->staged, err)) {
        free(b);
        return -1;
    }
    b->bytes = kv_staged_read_bytes(b->staged);
    *out = b;
    return 0;
}

int kv_move_cuda_read(KvMoveCuda *c, int lender_rank, const uint8_t *desc, size_t desc_len, const MoveRun *runs, int n_runs,
                      KvMoveCudaBatch **out, BraidError *err) {
    *out = NULL;
    if (kv_staging_desc_is_staged(desc, desc_len)) return read_staged(c, lender_rank, desc, desc_len, runs, n_runs, out, err);
    if (!kv_move_cuda_desc_is_ipc(desc, desc_len))
        return braid_error_set(err, "KV moves (CUDA): the lender is not a CUDA instance (its KV pool is host memory of another layout)");
    CudaKvIpcDesc d;
    memcpy(&d, desc, sizeof d);
    CudaKvRun *ipc_runs = malloc(((size_t)n_runs + 1) * sizeof *ipc_runs);
    if (!ipc_runs) return braid_error_set(err, "KV moves (CUDA): out of memory");
    size_t bytes = 0, run_bytes = 2 * (size_t)c->mine.n_layers * c->mine.block_layer_bytes + (size_t)c->mine.block_size * sizeof(int32_t);
    for (int k = 0; k < n_runs; k++) {
        if (runs[k].tier != 0) {
            free(ipc_runs);
            return braid_error_set(err, "KV moves (CUDA): run %d is in the lender's host tier (only device blocks move over IPC)", k);
        }
        ipc_runs[k] = (CudaKvRun){.src = runs[k].src, .dst = runs[k].dst, .count = runs[k].count};
        bytes += (size_t)runs[k].count * run_bytes;
    }
    KvMoveCudaBatch *b = calloc(1, sizeof *b);
    const CudaKvIpcPeer *peer = b ? open_lender(c, lender_rank, &d, err) : NULL;
    int rc = -1;
    cudaError_t e;
    if (!b) braid_error_set(err, "KV moves (CUDA): out of memory");
    else if (!peer) braid_error_wrap(err, "KV moves (CUDA): lender rank %d", lender_rank);
    else if ((e = cudaEventCreateWithFlags(&b->landed, cudaEventDisableTiming)) != cudaSuccess) cuda_fail(e, "creating an event", err);
    else if (cuda_kv_ipc_copy_runs(peer, &c->mine, ipc_runs, n_runs, err) == 0) {
        if ((e = cudaEventRecord(b->landed, c->mine.stream)) != cudaSuccess) cuda_fail(e, "recording the copies", err);
        else rc = 0;
    }
    free(ipc_runs);
    if (rc) {
        kv_move_cuda_batch_end(b);
        return -1;
    }
    b->bytes = bytes;
    *out = b;
    return 0;
}

int kv_move_cuda_poll(KvMoveCudaBatch *b, BraidError *err) {
    if (!b) return braid_error_set(err, "KV moves (CUDA): no batch");
    if (b->staged) return kv_staged_read_poll(b->staged, err);
    cudaError_t e = cudaEventQuery(b->landed);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    return cuda_fail(e, "a copy failed", err);
}

size_t kv_move_cuda_batch_bytes(const KvMoveCudaBatch *b) { return b ? b->bytes : 0; }

void kv_move_cuda_batch_end(KvMoveCudaBatch *b) {
    if (!b) return;
    kv_staged_read_end(b->staged);
    if (b->landed) cudaEventDestroy(b->landed); /* legal while pending: the copies still land */
    free(b);
}

int kv_move_cuda_lend_fence(KvMoveCuda *c, BraidError *err) {
    cudaError_t e = cudaSetDevice(c->mine.device);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->mine.stream);
    if (e == cudaSuccess && c->mine.copy_stream) e = cudaStreamSynchronize(c->mine.copy_stream); /* STOREs into lent host blocks */
    return e == cudaSuccess ? 0 : cuda_fail(e, "finishing the lender's queued work", err);
}

int kv_move_cuda_batch_link(const KvMoveCudaBatch *b) { return b && b->staged ? MOVE_LINK_CUDA_STAGED : MOVE_LINK_CUDA_IPC; }

int kv_move_cuda_stage_loan(KvMoveCuda *c, const uint8_t *tiers, const int32_t *blocks, int n, uint64_t xfer_id, WireBuf *desc_list,
                            int *window, int *n_staged, BraidError *err) {
    *window = -1, *n_staged = 0;
    if (!c->staging) return braid_error_set(err, "KV moves (CUDA): staged moves are off here: %s", c->staging_why);
    return kv_staging_stage(c->staging, tiers, blocks, n, xfer_id, desc_list, window, n_staged, err);
}

void kv_move_cuda_unstage(KvMoveCuda *c, int window) {
    if (c) kv_staging_unstage(c->staging, window);
}
