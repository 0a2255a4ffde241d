#include "worker/leader_lora.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"

static void put_result(WireBuf *reply, bool ok, const char *name, const char *why) {
    wire_put_u8(reply, ok ? 1 : 0);
    wire_put_str(reply, name ? name : "");
    wire_put_str(reply, why ? why : "");
}

/* Loads `path` as `name` into the set, or fills why. */
static int load_one(const LeaderLoraCtx *ctx, const char *name, const char *path, unsigned generation, char *why, size_t cap) {
    if (ctx->tp_size > 1) {
        snprintf(why, cap, "LoRA adapters are not sharded for tensor parallelism yet (this instance runs --tp %d)", ctx->tp_size);
        return -1;
    }
    if (ctx->device != BACKEND_CPU) {
        snprintf(why, cap, "adapters at run time need the CPU backend (the CUDA backend copies adapters to the device at start-up; use --lora)");
        return -1;
    }
    BraidError err;
    LoraAdapter ad;
    if (lora_adapter_load(path, name, ctx->base, &ad, &err)) {
        snprintf(why, cap, "%s", err.msg);
        return -1;
    }
    ad.generation = generation;
    int rc = 0;
    if (ctx->residual_rank > 0 && ad.rank > ctx->residual_rank) {
        snprintf(why, cap, "adapter '%s' has rank %d, above the residual pool's rank %d (--lora-cache shared|auto sizes it at start-up from the --lora adapters)",
                 name, ad.rank, ctx->residual_rank);
        rc = -1;
    } else if (lora_set_install(ctx->set, &ad, NULL, &err)) {
        snprintf(why, cap, "%s", err.msg);
        rc = -1;
    }
    if (rc) lora_adapter_free(&ad);
    return rc;
}

/* Retires `name` and drops its cache namespaces (both trees); the blocks freed go to ctx->dropped_blocks. */
static int retire(LeaderLoraCtx *ctx, const char *name) {
    const LoraAdapter *a = lora_set_get(ctx->set, lora_set_find(ctx->set, name));
    char cache_name[LORA_CACHE_NAME_MAX];
    if (!a || lora_cache_name(a->name, a->generation, cache_name, sizeof cache_name)) return -1;
    if (lora_set_retire(ctx->set, name)) return -1;
    int kept = 0, kept_residual = 0;
    ctx->dropped_blocks = ctx->cache ? kv_cache_drop_adapter(ctx->cache, cache_name, &kept) : 0;
    if (ctx->residual_tree) ctx->dropped_blocks += kv_cache_drop_adapter(ctx->residual_tree, cache_name, &kept_residual);
    LOG_INFO("leader", "adapter '%s': its cache dropped (%d blocks freed, %d still held)", name, ctx->dropped_blocks, kept + kept_residual);
    return 0;
}

int leader_lora_apply(LeaderLoraCtx *ctx, bool unload, const uint8_t *data, size_t len,
                      int (*busy)(void *busy_ctx, const char *name), void *busy_ctx, WireBuf *reply) {
    WireReader rd = wire_reader(data, len);
    char *name = wire_get_str(&rd), *path = unload ? NULL : wire_get_str(&rd);
    int32_t generation = 1;
    if (!unload && !rd.failed && rd.off < rd.len) generation = wire_get_i32(&rd); /* absent: an older coordinator's first load */
    char why[512] = "";
    int rc = -1;
    ctx->dropped_blocks = 0;
    if (rd.failed || !name || !name[0] || (!unload && (!path || !path[0])) || generation < 1) {
        snprintf(why, sizeof why, "malformed %s message", unload ? "lora_unload" : "lora_load");
    } else if (!unload) {
        rc = load_one(ctx, name, path, (unsigned)generation, why, sizeof why);
    } else if (lora_set_find(ctx->set, name) <= 0) {
        snprintf(why, sizeof why, "adapter '%s' is not loaded", name);
    } else if (busy && busy(busy_ctx, name) > 0) {
        snprintf(why, sizeof why, "adapter '%s' has %d request(s) in flight", name, busy(busy_ctx, name));
    } else {
        rc = retire(ctx, name);
    }
    if (rc) LOG_WARN("leader", "%s of adapter '%s' refused: %s", unload ? "unload" : "load", name ? name : "?", why);
    else LOG_INFO("leader", "adapter '%s' %s", name, unload ? "unloaded" : "loaded");
    put_result(reply, rc == 0, name, why);
    free(name);
    free(path);
    return rc;
}
