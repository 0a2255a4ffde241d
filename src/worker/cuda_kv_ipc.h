/*
 * cuda_kv_ipc.h — KV blocks between two CUDA instances on one node through CUDA IPC: the lender
 * exports its device pool (one allocation, backend_cuda.c) as a fixed-size description holding
 * cudaIpcGetMemHandle handles of the pool and of its slot positions plus the pool's geometry;
 * the description travels on the control plane as plain bytes; the borrower opens it
 * (cudaIpcOpenMemHandle: the lender's memory mapped into the borrower's address space) and copies
 * runs of blocks device to device into its own pool (cudaMemcpyAsync per layer's K and V and the
 * positions, on the borrower's compute stream, so its next forward sees them).
 *
 * Contract: both pools have the same shard geometry (model, TP degree, block size); only block
 * counts differ. The lender must not overwrite a block while a borrower copies it (the move
 * protocol pins them). Opening fails across nodes (the description names its host) and within the
 * process that exported it (CUDA refuses). Built only with CUDA; the move protocol
 * (worker/kv_moves.h) uses it through worker/kv_move_cuda.h.
 */
#ifndef BRAID_WORKER_CUDA_KV_IPC_H
#define BRAID_WORKER_CUDA_KV_IPC_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "worker/backend.h"

/* A CUDA backend's device pool: every layer's K then every layer's V, (n_blocks, block_layer_bytes)
 * each, in one allocation, and the slots' positions (n_blocks, block_size) int32 in another. */
typedef struct {
    void *kv;
    size_t kv_bytes;
    int32_t *slot_pos;
    size_t slot_pos_bytes;
    int n_layers, n_blocks, block_size;
    size_t block_layer_bytes;
    cudaStream_t stream; /* the backend's compute stream */
    int device;
    /* The host tier (pinned host memory; staged moves only: IPC maps the device pool alone): planes
     * K0 V0 K1 V1 ... of (host_blocks, block_layer_bytes) from host_kv, positions (host_blocks,
     * block_size) at host_slot_pos; host_blocks 0 when there is none. Its copies (STORE/LOAD) run on
     * copy_stream. */
    void *host_kv;
    int32_t *host_slot_pos;
    int host_blocks;
    cudaStream_t copy_stream;
} CudaKvPool;

#define CUDA_KV_IPC_MAGIC 0x4b564950u /* "KVIP" */

typedef struct {
    uint32_t magic;
    int32_t n_layers, n_blocks, block_size, device;
    uint64_t block_layer_bytes, kv_bytes, slot_pos_bytes;
    char host[64];
    cudaIpcMemHandle_t kv, slot_pos;
} CudaKvIpcDesc;

/* An opened lender pool (the borrower's mapping of it). */
typedef struct {
    CudaKvIpcDesc desc;
    void *kv;
    int32_t *slot_pos;
} CudaKvIpcPeer;

/* A run of count blocks from the lender's src on to the borrower's dst on. */
typedef struct {
    int32_t src, dst, count;
} CudaKvRun;

/* The CUDA backend's device pool; -1 with err when b is not a CUDA backend (backend_cuda.c). */
int backend_cuda_kv_pool(Backend *b, CudaKvPool *out, BraidError *err);
int cuda_kv_ipc_export(const CudaKvPool *pool, CudaKvIpcDesc *out, BraidError *err);
/* Checks the description (magic, this host, geometry against mine) and maps the lender's memory. */
int cuda_kv_ipc_open(const CudaKvIpcDesc *desc, const CudaKvPool *mine, CudaKvIpcPeer *peer, BraidError *err);
void cuda_kv_ipc_close(CudaKvIpcPeer *peer);
/* Queues the runs' copies on mine->stream (ranges checked first; nothing queued on a bad run). */
int cuda_kv_ipc_copy_runs(const CudaKvIpcPeer *peer, const CudaKvPool *mine, const CudaKvRun *runs, int n_runs, BraidError *err);

#endif
