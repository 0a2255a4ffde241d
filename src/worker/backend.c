#include "worker/backend.h"

#include <string.h>

BackendConfig backend_config_default(BackendKind kind, const ModelConfig *model, int n_blocks, int block_size,
                                     int max_batch_tokens) {
    return (BackendConfig){
        .kind = kind, .n_blocks = n_blocks, .block_size = block_size, .max_batch_tokens = max_batch_tokens,
        .max_seqs = 256, .max_context = model->context_length, .cuda_device = 0, .cuda_graphs = true,
    };
}

int backend_create(Backend *b, const ModelWeights *weights, const BackendConfig *cfg, BraidError *err) {
    memset(b, 0, sizeof *b);
    if (cfg->n_blocks < 2 || cfg->block_size < 1 || cfg->max_batch_tokens < 1 || cfg->max_seqs < 1 || cfg->max_context < 1)
        return braid_error_set(err, "backend: invalid sizes (%d blocks of %d, %d batch tokens, %d sequences, context %d)",
                               cfg->n_blocks, cfg->block_size, cfg->max_batch_tokens, cfg->max_seqs, cfg->max_context);
    if (cfg->host_blocks < 0 || cfg->host_blocks == 1)
        return braid_error_set(err, "backend: a host KV tier needs at least 2 blocks (block 0 is the null block), got %d; "
                                    "use 0 for none", cfg->host_blocks);
    b->cfg = *cfg;
    b->weights = weights;
    return cfg->kind == BACKEND_CUDA ? backend_cuda_create(b, err) : backend_cpu_create(b, err);
}

static int check_batch_shape(const Backend *b, const ForwardBatch *batch, BraidError *err) {
    if (batch->n_tokens > b->cfg.max_batch_tokens)
        return braid_error_set(err, "%s backend: batch of %d tokens exceeds its limit of %d", b->ops->name, batch->n_tokens,
                               b->cfg.max_batch_tokens);
    if (batch->n_seqs > b->cfg.max_seqs)
        return braid_error_set(err, "%s backend: batch of %d sequences exceeds its limit of %d", b->ops->name, batch->n_seqs,
                               b->cfg.max_seqs);
    for (int s = 0; s < batch->n_seqs; s++)
        if (batch->seq_n_ctx[s] > b->cfg.max_context)
            return braid_error_set(err, "%s backend: sequence %d reaches %d tokens, beyond the configured context of %d",
                                   b->ops->name, s, batch->seq_n_ctx[s], b->cfg.max_context);
    return 0;
}

int backend_forward(Backend *b, const ForwardBatch *batch, ForwardOutput *out, BraidError *err) {
    if (check_batch_shape(b, batch, err)) return -1;
    return b->ops->forward(b, batch, out, err);
}

/* 0 when id is a usable block of a tier of `size` blocks (0 is the null block of every tier). */
static int check_block(int32_t id, int size, const char *tier, const char *role, int i, const CacheOp *op, BraidError *err) {
    if (id >= 1 && id < size) return 0;
    return braid_error_set(err, "cache op %d (%s %d -> %d): %s block %d is %s (the %s tier has blocks 1..%d)", i,
                           cache_op_name(op->kind), op->src, op->dst, role, id, id == 0 ? "the null block" : "out of range",
                           tier, size - 1);
}

static int no_host_tier(const CacheOp *op, int i, BraidError *err) {
    return braid_error_set(err, "cache op %d (%s %d -> %d): there is no host KV tier (host_blocks is 0)", i, cache_op_name(op->kind),
                           op->src, op->dst);
}

/* 0 when the operation can be carried out; -1 with a message naming it otherwise. */
static int check_cache_op(const Backend *b, const CacheOp *op, int i, BraidError *err) {
    int dev = b->cfg.n_blocks, host = b->cfg.host_blocks;
    switch (op->kind) {
    case CACHE_OP_COPY:
        if (check_block(op->src, dev, "device", "source", i, op, err) || check_block(op->dst, dev, "device", "target", i, op, err))
            return -1;
        if (op->src == op->dst) return braid_error_set(err, "cache op %d: copy of device block %d onto itself", i, op->src);
        return 0;
    case CACHE_OP_STORE: /* device -> host */
        if (host == 0) return no_host_tier(op, i, err);
        return check_block(op->src, dev, "device", "source", i, op, err) || check_block(op->dst, host, "host", "target", i, op, err)
                   ? -1
                   : 0;
    case CACHE_OP_LOAD: /* host -> device */
        if (host == 0) return no_host_tier(op, i, err);
        return check_block(op->src, host, "host", "source", i, op, err) || check_block(op->dst, dev, "device", "target", i, op, err)
                   ? -1
                   : 0;
    case CACHE_OP_ROTATE: /* one device block, in place */
        if (check_block(op->src, dev, "device", "source", i, op, err)) return -1;
        if (op->dst != 0)
            return braid_error_set(err, "cache op %d: rotate of device block %d names a target block %d (must be 0: it "
                                        "rotates in place)", i, op->src, op->dst);
        /* Old and new positions both lie in [0, max_context), so |delta| is below it; a larger one
         * is a corrupt plan, and would also take positions past fp32's exact integers. */
        if (op->delta <= -b->cfg.max_context || op->delta >= b->cfg.max_context)
            return braid_error_set(err, "cache op %d: rotate of device block %d by %d positions: |delta| must be below "
                                        "the context length %d", i, op->src, op->delta, b->cfg.max_context);
        return 0;
    case CACHE_OP_COPY_SLOTS: /* slots of one device block into another, keys turned by delta */
        if (check_block(op->src, dev, "device", "source", i, op, err) || check_block(op->dst, dev, "device", "target", i, op, err))
            return -1;
        if (op->src == op->dst) return braid_error_set(err, "cache op %d: copy_slots of device block %d onto itself", i, op->src);
        if (op->n_slots < 1 || op->src_slot < 0 || op->dst_slot < 0 || op->src_slot + op->n_slots > b->cfg.block_size ||
            op->dst_slot + op->n_slots > b->cfg.block_size)
            return braid_error_set(err, "cache op %d: copy_slots of %d slots from slot %d to slot %d does not fit blocks of %d slots",
                                   i, op->n_slots, op->src_slot, op->dst_slot, b->cfg.block_size);
        if (op->delta <= -b->cfg.max_context || op->delta >= b->cfg.max_context)
            return braid_error_set(err, "cache op %d: copy_slots by %d positions: |delta| must be below the context length %d", i,
                                   op->delta, b->cfg.max_context);
        return 0;
    default:
        return braid_error_set(err, "cache op %d: unknown operation kind %d", i, (int)op->kind);
    }
}

int backend_sync(Backend *b, BraidError *err) {
    if (!b->ops || !b->ops->sync) return 0;
    if (b->ops->sync(b, err)) return braid_error_wrap(err, "%s backend: completing overlapped cache operations", b->ops->name);
    return 0;
}

static int check_cache_op_list(Backend *b, const CacheOp *ops, int n, BraidError *err) {
    if (n < 0 || !ops) return braid_error_set(err, "%s backend: invalid cache operation list (%d operations)", b->ops->name, n);
    for (int i = 0; i < n; i++)
        if (check_cache_op(b, &ops[i], i, err)) return braid_error_wrap(err, "%s backend", b->ops->name);
    return 0;
}

int backend_apply_cache_ops(Backend *b, const CacheOp *ops, int n, BraidError *err) {
    if (backend_sync(b, err)) return -1; /* list order: earlier overlapped operations come first */
    if (n == 0) return 0;
    if (check_cache_op_list(b, ops, n, err)) return -1;
    if (b->ops->apply_cache_ops(b, ops, n, err)) return braid_error_wrap(err, "%s backend: applying %d cache operations", b->ops->name, n);
    return 0;
}

int backend_apply_cache_ops_overlapped(Backend *b, const CacheOp *ops, int n, BraidError *err) {
    if (n == 0) return 0;
    if (!b->ops->apply_cache_ops_overlapped) return backend_apply_cache_ops(b, ops, n, err);
    if (check_cache_op_list(b, ops, n, err)) return -1;
    if (b->ops->apply_cache_ops_overlapped(b, ops, n, err))
        return braid_error_wrap(err, "%s backend: applying %d overlapped cache operations", b->ops->name, n);
    return 0;
}

int backend_read_block(Backend *b, int32_t block, float *keys, float *values, int32_t *positions, BraidError *err) {
    if (block < 1 || block >= b->cfg.n_blocks)
        return braid_error_set(err, "%s backend: cannot read device block %d (blocks 1..%d)", b->ops->name, block,
                               b->cfg.n_blocks - 1);
    if (backend_sync(b, err)) return -1;
    if (b->ops->read_block(b, block, keys, values, positions, err))
        return braid_error_wrap(err, "%s backend: reading device block %d", b->ops->name, block);
    return 0;
}

int backend_kv_memory(Backend *b, int tier, BackendKvMemory *out, BraidError *err) {
    const char *tier_name = tier == 0 ? "device" : "host";
    if (!b->ops->kv_memory)
        return braid_error_set(err, "%s backend: its %s KV tier cannot be lent to other instances (not host memory)", b->ops->name, tier_name);
    if (backend_sync(b, err)) return -1;
    if (b->ops->kv_memory(b, tier, out)) return braid_error_set(err, "%s backend: no %s KV tier", b->ops->name, tier_name);
    return 0;
}

void backend_destroy(Backend *b) {
    if (b->ops) b->ops->destroy(b);
    memset(b, 0, sizeof *b);
}

int backend_parse_kind(const char *text, BackendKind *kind, BraidError *err) {
    if (strcmp(text, "cpu") == 0) {
        *kind = BACKEND_CPU;
    } else if (strcmp(text, "cuda") == 0) {
        *kind = BACKEND_CUDA;
    } else if (strcmp(text, "auto") == 0) {
        *kind = backend_cuda_available() ? BACKEND_CUDA : BACKEND_CPU;
    } else {
        return braid_error_set(err, "unknown device '%s' (expected cpu, cuda or auto)", text);
    }
    return 0;
}

const char *backend_kind_name(BackendKind kind) { return kind == BACKEND_CUDA ? "cuda" : "cpu"; }
