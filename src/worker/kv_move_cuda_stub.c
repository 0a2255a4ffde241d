/* kv_move_cuda_stub.c — kv_move_cuda.h in a build without CUDA: no CUDA rank exists, so creating
 * one refuses; the pure description check stays (a CPU rank must recognise a CUDA lender's). */
#include "worker/kv_move_cuda.h"

#include <string.h>

#define IPC_MAGIC 0x4b564950u /* CUDA_KV_IPC_MAGIC of worker/cuda_kv_ipc.h */
#define IPC_DESC_MIN 4
#define STAGED_MAGIC 0x4b565354u /* KV_STAGE_MAGIC of worker/kv_move_cuda_staged.h */

bool kv_move_cuda_desc_is_ipc(const uint8_t *desc, size_t len) {
    uint32_t magic;
    if (!desc || len < IPC_DESC_MIN) return false;
    memcpy(&magic, desc, sizeof magic);
    return magic == IPC_MAGIC;
}

int kv_move_cuda_create(KvMoveCuda **out, Backend *backend, WireBuf *desc, BraidError *err) {
    (void)backend, (void)desc;
    *out = NULL;
    return braid_error_set(err, "KV moves: this build has no CUDA");
}

void kv_move_cuda_destroy(KvMoveCuda *c) { (void)c; }

int kv_move_cuda_read(KvMoveCuda *c, int lender_rank, const uint8_t *desc, size_t desc_len, const MoveRun *runs, int n_runs,
                      KvMoveCudaBatch **out, BraidError *err) {
    (void)c, (void)lender_rank, (void)desc, (void)desc_len, (void)runs, (void)n_runs;
    *out = NULL;
    return braid_error_set(err, "KV moves: this build has no CUDA");
}

int kv_move_cuda_poll(KvMoveCudaBatch *b, BraidError *err) {
    (void)b;
    return braid_error_set(err, "KV moves: this build has no CUDA");
}

size_t kv_move_cuda_batch_bytes(const KvMoveCudaBatch *b) {
    (void)b;
    return 0;
}

void kv_move_cuda_batch_end(KvMoveCudaBatch *b) { (void)b; }

int kv_move_cuda_lend_fence(KvMoveCuda *c, BraidError *err) {
    (void)c;
    return braid_error_set(err, "KV moves: this build has no CUDA");
}

bool kv_move_cuda_desc_is_staged(const uint8_t *desc, size_t len) {
    uint32_t magic;
    if (!desc || len < IPC_DESC_MIN) return false;
    memcpy(&magic, desc, sizeof magic);
    return magic == STAGED_MAGIC;
}

int kv_move_cuda_batch_link(const KvMoveCudaBatch *b) {
    (void)b;
    return 0;
}

int kv_move_cuda_stage_loan(KvMoveCuda *c, const uint8_t *tiers, const int32_t *blocks, int n, uint64_t xfer_id, WireBuf *desc_list,
                            int *window, int *n_staged, BraidError *err) {
    (void)c, (void)tiers, (void)blocks, (void)n, (void)xfer_id, (void)desc_list;
    *window = -1, *n_staged = 0;
    return braid_error_set(err, "KV moves: this build has no CUDA");
}

void kv_move_cuda_unstage(KvMoveCuda *c, int window) { (void)c, (void)window; }
