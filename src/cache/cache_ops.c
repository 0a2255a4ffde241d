#include "cache/cache_ops.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"

int cache_ops_push(CacheOpList *l, CacheOpKind kind, int32_t src, int32_t dst, int32_t delta) {
    if (braid_grow((void **)&l->ops, &l->cap, l->n + 1, sizeof *l->ops)) return -1;
    l->ops[l->n++] = (CacheOp){.kind = (uint8_t)kind, .src = src, .dst = dst, .delta = delta};
    return 0;
}

int cache_ops_push_slots(CacheOpList *l, int32_t src, int src_slot, int32_t dst, int dst_slot, int n_slots, int32_t delta) {
    if (cache_ops_push(l, CACHE_OP_COPY_SLOTS, src, dst, delta)) return -1;
    CacheOp *op = &l->ops[l->n - 1];
    op->src_slot = (int16_t)src_slot;
    op->dst_slot = (int16_t)dst_slot;
    op->n_slots = (int16_t)n_slots;
    return 0;
}

int cache_ops_append(CacheOpList *dst, const CacheOpList *src) {
    if (src->n == 0) return 0;
    if (braid_grow((void **)&dst->ops, &dst->cap, dst->n + src->n, sizeof *dst->ops)) return -1;
    memcpy(dst->ops + dst->n, src->ops, (size_t)src->n * sizeof *src->ops);
    dst->n += src->n;
    return 0;
}

void cache_ops_clear(CacheOpList *l) { l->n = 0; }

void cache_ops_free(CacheOpList *l) {
    free(l->ops);
    memset(l, 0, sizeof *l);
}

const char *cache_op_name(int kind) {
    switch (kind) {
    case CACHE_OP_COPY: return "copy";
    case CACHE_OP_STORE: return "store";
    case CACHE_OP_LOAD: return "load";
    case CACHE_OP_ROTATE: return "rotate";
    case CACHE_OP_COPY_SLOTS: return "copy_slots";
    default: return "?";
    }
}
