/*
 * cache_ops.h — block operations the cache decides and a backend carries out before a forward.
 *
 * The cache (src/cache) is metadata only: when it demotes a block to the host tier, loads one back
 * or copies one, it appends an operation on block ids to a CacheOpList. The scheduler hands the
 * list to the step plan; every rank of the instance applies it, in list order, on its own KV shard
 * before that step's forward pass (backend_apply_cache_ops). List order is the contract: a STORE
 * that reads device block X comes before any later operation or forward that overwrites X, and a
 * LOAD into X completes before any forward reads X.
 *   COPY   device block src -> device block dst (K, V and recorded positions of every slot)
 *   STORE  device block src -> host block dst   (demotion: the host tier keeps a copy)
 *   LOAD   host block src   -> device block dst (load-back before a request reads it)
 *   ROTATE device block src, in place (dst 0): re-position the block by delta positions (signed).
 *          Every slot's key, in every layer and every KV head of the rank's shard, is turned by the
 *          RoPE rotation of delta positions (R(p + delta) = R(delta) R(p), angles delta·θ_i from
 *          the model's base, linear scaling and rope_freqs, in its pairing), computed in fp32 from
 *          the stored values and rounded back to the pool's storage type once; values and
 *          dimensions past rope_dim are untouched; every slot's recorded position gains delta.
 *          Whole blocks only: a partial block's unused slots are turned too, harmlessly, since
 *          attention never reads past a sequence's context. Backends refuse |delta| >= the
 *          context length; keeping the new positions in [0, context) is the caller's part (the
 *          backend does not read them back to check). Exactness is the caller's business: a rotated block equals a recompute
 *          at the new positions (up to storage rounding) only when its tokens' left context is the
 *          same there, since every layer past the first mixes in that context.
 *   COPY_SLOTS device block src, slots [src_slot, src_slot + n_slots) -> device block dst, slots
 *          [dst_slot, dst_slot + n_slots) (src != dst): the slots' values copied, their keys copied
 *          and turned by delta positions exactly as ROTATE turns them (delta 0: copied unchanged),
 *          their recorded positions copied plus delta; the other slots of dst are untouched. This
 *          is how a cached segment lands at another offset of another sequence (segment reuse):
 *          the offsets need not be block-aligned, so one segment becomes one COPY_SLOTS per
 *          source/target block overlap. Same exactness caveat as ROTATE.
 * Block ids index each tier's pool; 0 is the null block of both and never appears in an operation.
 * Not thread-safe; a list is owned by whoever created it.
 */
#ifndef BRAID_CACHE_CACHE_OPS_H
#define BRAID_CACHE_CACHE_OPS_H

#include <stdint.h>

typedef enum { CACHE_OP_COPY = 1, CACHE_OP_STORE = 2, CACHE_OP_LOAD = 3, CACHE_OP_ROTATE = 4, CACHE_OP_COPY_SLOTS = 5 } CacheOpKind;

typedef struct {
    uint8_t kind;  /* CacheOpKind */
    int32_t src;   /* COPY/STORE/ROTATE: device block; LOAD: host block */
    int32_t dst;   /* COPY/LOAD: device block; STORE: host block; ROTATE: unused (0) */
    int32_t delta; /* ROTATE, COPY_SLOTS: positions added to every slot turned (signed); else 0 */
    int16_t src_slot, dst_slot, n_slots; /* COPY_SLOTS: the slot ranges; else 0 */
} CacheOp;

typedef struct {
    CacheOp *ops;
    int n, cap;
} CacheOpList;

/* Appends one operation; -1 when out of memory (the list is unchanged). */
int cache_ops_push(CacheOpList *list, CacheOpKind kind, int32_t src, int32_t dst, int32_t delta);
/* Appends one COPY_SLOTS; -1 when out of memory. */
int cache_ops_push_slots(CacheOpList *list, int32_t src, int src_slot, int32_t dst, int dst_slot, int n_slots, int32_t delta);
/* Appends all of src to dst; -1 when out of memory. */
int cache_ops_append(CacheOpList *dst, const CacheOpList *src);
void cache_ops_clear(CacheOpList *list);
void cache_ops_free(CacheOpList *list);
/* "copy", "store", "load", "rotate", "copy_slots" or "?". */
const char *cache_op_name(int kind);

#endif
