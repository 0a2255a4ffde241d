#include "worker/cuda_kv_ipc.h"

#include <string.h>
#include <unistd.h>

static int cuda_fail(cudaError_t e, const char *what, BraidError *err) {
    return braid_error_set(err, "cuda KV IPC: %s: %s", what, cudaGetErrorString(e));
}

int cuda_kv_ipc_export(const CudaKvPool *pool, CudaKvIpcDesc *out, BraidError *err) {
    memset(out, 0, sizeof *out);
    *out = (CudaKvIpcDesc){.magic = CUDA_KV_IPC_MAGIC, .n_layers = pool->n_layers, .n_blocks = pool->n_blocks,
                           .block_size = pool->block_size, .device = pool->device, .block_layer_bytes = pool->block_layer_bytes,
                           .kv_bytes = pool->kv_bytes, .slot_pos_bytes = pool->slot_pos_bytes};
    gethostname(out->host, sizeof out->host - 1);
    cudaError_t e = cudaSetDevice(pool->device);
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&out->kv, pool->kv);
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&out->slot_pos, pool->slot_pos);
    return e == cudaSuccess ? 0 : cuda_fail(e, "exporting the pool", err);
}

int cuda_kv_ipc_open(const CudaKvIpcDesc *d, const CudaKvPool *mine, CudaKvIpcPeer *peer, BraidError *err) {
    memset(peer, 0, sizeof *peer);
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    if (d->magic != CUDA_KV_IPC_MAGIC) return braid_error_set(err, "cuda KV IPC: not a pool description");
    if (strncmp(d->host, host, sizeof host) != 0)
        return braid_error_set(err, "cuda KV IPC: the pool is on host %.64s, not this one (%s): IPC is same-node only", d->host, host);
    if (d->n_layers != mine->n_layers || d->block_size != mine->block_size || d->block_layer_bytes != mine->block_layer_bytes)
        return braid_error_set(err, "cuda KV IPC: the lender's pool geometry (%d layers, %d-token blocks, %llu bytes a block-layer) "
                                    "differs from mine (%d, %d, %zu)", d->n_layers, d->block_size,
                               (unsigned long long)d->block_layer_bytes, mine->n_layers, mine->block_size, mine->block_layer_bytes);
    cudaError_t e = cudaSetDevice(mine->device);
    if (e == cudaSuccess) e = cudaIpcOpenMemHandle(&peer->kv, d->kv, cudaIpcMemLazyEnablePeerAccess);
    if (e == cudaSuccess) e = cudaIpcOpenMemHandle((void **)&peer->slot_pos, d->slot_pos, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        cuda_kv_ipc_close(peer);
        return cuda_fail(e, "opening the lender's pool", err);
    }
    peer->desc = *d;
    return 0;
}

void cuda_kv_ipc_close(CudaKvIpcPeer *peer) {
    if (peer->kv) cudaIpcCloseMemHandle(peer->kv);
    if (peer->slot_pos) cudaIpcCloseMemHandle(peer->slot_pos);
    memset(peer, 0, sizeof *peer);
}

int cuda_kv_ipc_copy_runs(const CudaKvIpcPeer *peer, const CudaKvPool *mine, const CudaKvRun *runs, int n_runs, BraidError *err) {
    const CudaKvIpcDesc *d = &peer->desc;
    for (int k = 0; k < n_runs; k++) {
        const CudaKvRun *r = &runs[k];
        if (r->count < 1 || r->src < 1 || r->src + r->count > d->n_blocks || r->dst < 1 || r->dst + r->count > mine->n_blocks)
            return braid_error_set(err, "cuda KV IPC: run %d (%d blocks from %d to %d) leaves the pools (%d and %d blocks; block 0 is "
                                        "the null block)", k, r->count, r->src, r->dst, d->n_blocks, mine->n_blocks);
    }
    size_t blb = mine->block_layer_bytes, pos_bytes = (size_t)mine->block_size * sizeof(int32_t);
    for (int k = 0; k < n_runs; k++) {
        const CudaKvRun *r = &runs[k];
        size_t n = (size_t)r->count;
        /* A run is contiguous in every layer's K and V: one copy per (K or V, layer). */
        for (size_t layer = 0; layer < 2 * (size_t)mine->n_layers; layer++) {
            const uint8_t *src = (const uint8_t *)peer->kv + (layer * (size_t)d->n_blocks + (size_t)r->src) * blb;
            uint8_t *dst = (uint8_t *)mine->kv + (layer * (size_t)mine->n_blocks + (size_t)r->dst) * blb;
            cudaError_t e = cudaMemcpyAsync(dst, src, n * blb, cudaMemcpyDeviceToDevice, mine->stream);
            if (e != cudaSuccess) return cuda_fail(e, "copying a run", err);
        }
        cudaError_t e = cudaMemcpyAsync(mine->slot_pos + (size_t)r->dst * mine->block_size, peer->slot_pos + (size_t)r->src * d->block_size,
                                        n * pos_bytes, cudaMemcpyDeviceToDevice, mine->stream);
        if (e != cudaSuccess) return cuda_fail(e, "copying a run's positions", err);
    }
    return 0;
}
