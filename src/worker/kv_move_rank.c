#include "worker/kv_move_rank.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/timeutil.h"
#include "transport/control_msg.h"

/* Regions every rank registers, in this order: per tier, its K/V array then its positions. */
enum { REGION_KV = 0, REGION_POS = 1, REGIONS_PER_TIER = 2 };

int kv_move_rank_init(KvMoveRank *r, Backend *backend, BraidError *err) {
    memset(r, 0, sizeof *r);
    if (backend->cfg.kind == BACKEND_CUDA) { /* GPU pool: same-node IPC, no UCX mover */
        if (kv_move_cuda_create(&r->cuda, backend, &r->desc, err)) {
            wire_buf_free(&r->desc);
            return -1;
        }
        return 0;
    }
    if (backend_kv_memory(backend, 0, &r->mem[0], err)) return -1;
    r->have_tier[0] = true;
    BraidError host_err;
    r->have_tier[1] = backend_kv_memory(backend, 1, &r->mem[1], &host_err) == 0;
    if (kv_mover_create(&r->mover, err)) return -1;
    for (int t = 0; t < 2 && r->have_tier[t]; t++) {
        int kv_region, pos_region;
        if (kv_mover_register(r->mover, r->mem[t].kv, r->mem[t].kv_bytes, &kv_region, err) ||
            kv_mover_register(r->mover, r->mem[t].slot_pos, r->mem[t].slot_pos_bytes, &pos_region, err))
            goto fail;
        if (kv_region != t * REGIONS_PER_TIER + REGION_KV || pos_region != t * REGIONS_PER_TIER + REGION_POS) {
            braid_error_set(err, "KV moves: unexpected region numbering from the mover");
            goto fail;
        }
    }
    if (kv_mover_describe(r->mover, &r->desc, err)) goto fail;
    return 0;
fail:
    kv_move_rank_free(r);
    return -1;
}

void kv_move_rank_free(KvMoveRank *r) {
    kv_mover_destroy(r->mover);
    kv_move_cuda_destroy(r->cuda);
    wire_buf_free(&r->desc);
    memset(r, 0, sizeof *r);
}

int kv_move_rank_read(KvMoveRank *r, int lender_rank, const uint8_t *desc, size_t desc_len, const int32_t pool_blocks[2],
                      const MoveRun *runs, int n_runs, KvRankBatch *out, BraidError *err) {
    int peer;
    *out = (KvRankBatch){0};
    if (r->cuda) return kv_move_cuda_read(r->cuda, lender_rank, desc, desc_len, runs, n_runs, &out->ipc, err);
    if (kv_move_cuda_desc_is_ipc(desc, desc_len) || kv_move_cuda_desc_is_staged(desc, desc_len))
        return braid_error_set(err, "KV moves: the lender is a CUDA instance (bf16 KV) and this one is not (fp16 KV): KV layouts differ");
    KvMoveBatch **batch = &out->ucx;
    if (kv_mover_connect(r->mover, lender_rank, desc, desc_len, &peer, err) || kv_mover_batch_begin(r->mover, peer, batch, err)) return -1;
    const BackendKvMemory *dst = &r->mem[0];
    size_t blb = dst->block_layer_bytes, pos_bytes = (size_t)dst->block_size * sizeof(int32_t);
    for (int k = 0; k < n_runs; k++) {
        const MoveRun *run = &runs[k];
        size_t src_n = (size_t)pool_blocks[run->tier], sb = (size_t)run->src, db = (size_t)run->dst, n = (size_t)run->count;
        if (run->dst < 1 || db + n > (size_t)dst->n_blocks) return braid_error_set(err, "KV moves: run into device blocks %zu..%zu out of range", db, db + n);
        /* One read per layer for K and one for V: a run's blocks are contiguous in every layer. */
        for (int kv = 0; kv < 2; kv++)
            for (int l = 0; l < dst->n_layers; l++) {
                size_t layer = (size_t)kv * dst->n_layers + l;
                if (kv_mover_get(*batch, run->tier * REGIONS_PER_TIER + REGION_KV, (layer * src_n + sb) * blb,
                                 (uint8_t *)dst->kv + (layer * dst->n_blocks + db) * blb, n * blb, err))
                    return -1;
            }
        if (kv_mover_get(*batch, run->tier * REGIONS_PER_TIER + REGION_POS, sb * pos_bytes, (uint8_t *)dst->slot_pos + db * pos_bytes,
                         n * pos_bytes, err))
            return -1;
    }
    return 0;
}

int kv_rank_batch_poll(KvRankBatch *b, BraidError *err) {
    if (b->ipc) return kv_move_cuda_poll(b->ipc, err);
    return kv_mover_poll(b->ucx, err);
}

size_t kv_rank_batch_bytes(const KvRankBatch *b) { return b->ipc ? kv_move_cuda_batch_bytes(b->ipc) : b->ucx ? kv_mover_batch_bytes(b->ucx) : 0; }

void kv_rank_batch_end(KvRankBatch *b) {
    kv_move_cuda_batch_end(b->ipc);
    kv_mover_batch_end(b->ucx);
    *b = (KvRankBatch){0};
}

int kv_move_rank_link(const KvMoveRank *r) { return r->cuda ? MOVE_LINK_CUDA_IPC : MOVE_LINK_HOST; }

int kv_rank_batch_link(const KvRankBatch *b) { return b->ipc ? kv_move_cuda_batch_link(b->ipc) : b->ucx ? MOVE_LINK_HOST : MOVE_LINK_NONE; }

int kv_move_rank_lend_fence(KvMoveRank *r, BraidError *err) { return r->cuda ? kv_move_cuda_lend_fence(r->cuda, err) : 0; }

/* Reads the plan's runs and waits for them up to its timeout; the bytes read, or 0 when they failed. */
static size_t read_all(KvMoveRank *r, const StepMove *mv) {
    KvRankBatch batch = {0};
    BraidError e;
    if ((!r->mover && !r->cuda) ||
        kv_move_rank_read(r, mv->lender_rank, mv->desc, mv->desc_len, mv->pool_blocks, mv->runs, mv->n_runs, &batch, &e)) {
        kv_rank_batch_end(&batch);
        return 0;
    }
    double deadline = braid_now_seconds() + mv->timeout_s;
    int st;
    while ((st = kv_rank_batch_poll(&batch, &e)) == 0 && braid_now_seconds() < deadline) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    size_t bytes = st == 1 ? kv_rank_batch_bytes(&batch) : 0;
    kv_rank_batch_end(&batch);
    return bytes;
}

int kv_move_rank_serve(KvMoveRank *r, Backend *backend, const StepMsg *plan, MPI_Comm tp_comm, BraidError *err) {
    if (plan->ops.n > 0 && backend_apply_cache_ops(backend, plan->ops.ops, plan->ops.n, err)) return -1;
    size_t bytes = read_all(r, &plan->move);
    WireBuf b = {0};
    wire_put_u64(&b, plan->move.xfer_id);
    wire_put_u8(&b, bytes > 0);
    wire_put_u64(&b, bytes);
    int rc = b.failed || MPI_Send(b.data, (int)b.len, MPI_BYTE, 0, TAG_MOVE_DONE, tp_comm) != MPI_SUCCESS ? -1 : 0;
    wire_buf_free(&b);
    return rc ? braid_error_set(err, "tp peer: answering a move plan failed") : 0;
}

int kv_moves_gather(MPI_Comm tp_comm, const WireBuf *mine, WireBuf *all, BraidError *err) {
    int rank, size, len = mine ? (int)mine->len : 0;
    if (MPI_Comm_rank(tp_comm, &rank) != MPI_SUCCESS || MPI_Comm_size(tp_comm, &size) != MPI_SUCCESS)
        return braid_error_set(err, "KV moves: MPI_Comm_rank/size failed");
    int *lens = rank == 0 ? calloc((size_t)size, sizeof *lens) : NULL, *displs = rank == 0 ? calloc((size_t)size, sizeof *displs) : NULL;
    if (rank == 0 && (!lens || !displs)) {
        free(lens), free(displs);
        return braid_error_set(err, "KV moves: out of memory");
    }
    int rc = MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, tp_comm) == MPI_SUCCESS ? 0 : -1;
    size_t total = 0;
    for (int i = 0; rank == 0 && i < size; i++) displs[i] = (int)total, total += (size_t)lens[i];
    uint8_t *bytes = rank == 0 ? malloc(total + 1) : NULL;
    if (rc == 0 && MPI_Gatherv(mine ? mine->data : NULL, len, MPI_BYTE, bytes, lens, displs, MPI_BYTE, 0, tp_comm) != MPI_SUCCESS) rc = -1;
    int every = 1;
    if (rc == 0 && rank == 0) {
        wire_put_i32(all, size);
        for (int i = 0; i < size; i++) {
            every &= lens[i] > 0;
            wire_put_u64(all, (uint64_t)lens[i]);
            wire_put(all, bytes + displs[i], (size_t)lens[i]);
        }
    }
    free(lens), free(displs), free(bytes);
    if (rc) return braid_error_set(err, "KV moves: gathering the ranks' descriptions failed (MPI)");
    return rank == 0 ? every : 0;
}

int kv_move_desc_at(const uint8_t *list, size_t list_len, int i, const uint8_t **desc, size_t *len, int *count) {
    WireReader r = wire_reader(list, list_len);
    int n = wire_get_i32(&r);
    if (count) *count = r.failed ? 0 : n;
    if (r.failed || i < 0 || i >= n) return -1;
    for (int k = 0; k <= i; k++) {
        uint64_t l = wire_get_u64(&r);
        if (r.failed || l > r.len - r.off) return -1;
        *desc = list + r.off;
        *len = (size_t)l;
        r.off += (size_t)l;
    }
    return 0;
}
