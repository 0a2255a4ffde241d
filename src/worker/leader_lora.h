/*
 * leader_lora.h — an instance leader's side of adapters at run time (POST /v1/load_lora_adapter,
 * /v1/unload_lora_adapter; coord/lora_admin.h): it takes LORA_LOAD / LORA_UNLOAD from the
 * coordinator, changes its rank's LoraSet (the one its engine and CPU backend read), and answers
 * LORA_RESULT (u8 ok, str name, str error).
 *
 * A load runs the same checks as --lora at start-up (lora_adapter_load: layout, shapes, ranks,
 * finite values) plus what start-up checks elsewhere: --tp 1 and the CPU backend (the CUDA backend
 * copies adapters to the device when it is created), and under --lora-cache shared|auto a rank no
 * larger than the residual pool's (fixed at start-up). An unload is refused while a request the
 * leader holds names the adapter. The leader calls this between engine steps, on the rank's only
 * thread, so no step reads the set while it changes.
 *
 * LORA_LOAD is (str name, str path[, i32 generation]): the coordinator numbers the loads of a name
 * (model/lora_adapter.h, lora_cache_name), so a reloaded name's K/V live in a namespace of their own;
 * without the field the generation is 1. An unload retires the adapter, then drops its cache
 * namespaces at once (kv_cache_drop_adapter on the prefix cache and, under ForkKV, the residual
 * tree): its pins end and every block nobody holds is freed, instead of waiting for LRU.
 */
#ifndef BRAID_WORKER_LEADER_LORA_H
#define BRAID_WORKER_LEADER_LORA_H

#include <stdbool.h>

#include "cache/kv_cache.h"
#include "model/lora_adapter.h"
#include "transport/wire.h"
#include "worker/backend.h"

typedef struct {
    LoraSet *set;            /* this rank's adapters (the engine's cfg.lora) */
    const ModelConfig *base;
    int tp_size;
    BackendKind device;
    int residual_rank;       /* --lora-cache shared|auto: the residual pool's rank; 0 otherwise */
    KvCache *cache;          /* the instance's prefix cache (NULL: nothing to drop) */
    KvCache *residual_tree;  /* ForkKV's residual tree (NULL when off) */
    int dropped_blocks;      /* out: blocks an unload freed from both trees */
} LeaderLoraCtx;

/* Applies one LORA_LOAD (unload = false) or LORA_UNLOAD message body; busy(name) says how many held
 * requests name an adapter. Encodes the LORA_RESULT into *reply. Returns 0 when it succeeded. */
int leader_lora_apply(LeaderLoraCtx *ctx, bool unload, const uint8_t *data, size_t len,
                      int (*busy)(void *busy_ctx, const char *name), void *busy_ctx, WireBuf *reply);

#endif
