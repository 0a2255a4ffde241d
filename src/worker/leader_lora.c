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
static int load_one(const LeaderLoraCtx *ctx, const char *name, const char *path, char *why, size_t cap) {
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

int leader_lora_apply(const LeaderLoraCtx *ctx, bool unload, const uint8_t *data, size_t len,
                      int (*busy)(void *busy_ctx, const char *name), void *busy_ctx, WireBuf *reply) {
    WireReader rd = wire_reader(data, len);
    char *name = wire_get_str(&rd), *path = unload ? NULL : wire_get_str(&rd);
    char why[512] = "";
    int rc = -1;
    if (rd.failed || !name || !name[0] || (!unload && (!path || !path[0]))) {
        snprintf(why, sizeof why, "malformed %s message", unload ? "lora_unload" : "lora_load");
    } else if (!unload) {
        rc = load_one(ctx, name, path, why, sizeof why);
    } else if (lora_set_find(ctx->set, name) <= 0) {
        snprintf(why, sizeof why, "adapter '%s' is not loaded", name);
    } else if (busy && busy(busy_ctx, name) > 0) {
        snprintf(why, sizeof why, "adapter '%s' has %d request(s) in flight", name, busy(busy_ctx, name));
    } else {
        rc = lora_set_retire(ctx->set, name);
    }
    if (rc) LOG_WARN("leader", "%s of adapter '%s' refused: %s", unload ? "unload" : "load", name ? name : "?", why);
    else LOG_INFO("leader", "adapter '%s' %s", name, unload ? "unloaded" : "loaded");
    put_result(reply, rc == 0, name, why);
    free(name);
    free(path);
    return rc;
}
