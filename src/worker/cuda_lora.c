/*
 * cuda_lora.c — LoRA adapters and ForkKV residuals on the CUDA backend. Contract in cuda_lora.h.
 *
 * Each adapter's A and B matrices live in one device buffer; per (layer, projection) a row of
 * n_ids device pointers into those buffers (NULL for the base model and for projections an
 * adapter leaves alone) is what the kernels index by a token's adapter id, so one launch serves
 * every adapter of a batch. The step's per-token adapter ids come in three variants because the
 * three users differ on ForkKV tokens: Q/O deltas apply to them, K/V deltas do not (their K/V
 * deltas live as residuals), and only they store residuals.
 */
#include "worker/cuda_lora.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "worker/graph_ladder.h"
#include "worker/residual_pool.h"

/* Query rows per ResidualAttention work item of a multi-token (prefill) sequence: the kernel's
 * widest, so a tile's rebuilt keys serve the most queries. */
#define PREFILL_TILE_QUERIES CUDA_RESIDUAL_MAX_TILE_QUERIES

#define LORA_CUDA_TRY(call, what)                                                                                   \
    do {                                                                                                            \
        cudaError_t e_ = (call);                                                                                    \
        if (e_ != cudaSuccess) return braid_error_set(err, "cuda lora: %s: %s", (what), cudaGetErrorString(e_));    \
    } while (0)

static int dev_alloc(void **p, size_t bytes, size_t *total, const char *what, BraidError *err) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return braid_error_set(err, "cuda lora: allocating %zu bytes for %s: %s", bytes, what, cudaGetErrorString(e));
    }
    if (total) *total += bytes;
    return 0;
}

static int dev_upload(void *dst, const void *src, size_t bytes, const char *what, BraidError *err) {
    LORA_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), what);
    return 0;
}

/* Ranks the kernels cannot hold and a residual pool that cannot hold every adapter are refused
 * here, at start-up, rather than clamped silently by the kernels. */
static int check_config(const CudaLoraConfig *cfg, BraidError *err) {
    const LoraSet *set = cfg->set;
    for (int k = 0; k < set->n; k++)
        if (set->adapters[k].rank > CUDA_LORA_MAX_RANK)
            return braid_error_set(err, "cuda lora: adapter '%s' has rank %d; the CUDA kernels take ranks up to %d (use --device cpu)",
                                   set->adapters[k].name, set->adapters[k].rank, CUDA_LORA_MAX_RANK);
    if (cfg->residual_blocks == 0) return 0;
    int widest = lora_set_max_rank(set);
    if (cfg->residual_blocks < 2 || cfg->residual_rank < widest || cfg->residual_rank > CUDA_LORA_MAX_RANK)
        return braid_error_set(err, "cuda lora: a residual pool needs at least 2 blocks and a rank between the widest adapter's (%d) "
                                    "and %d; got %d blocks of rank %d",
                               widest, CUDA_LORA_MAX_RANK, cfg->residual_blocks, cfg->residual_rank);
    return 0;
}

/* fp32 elements adapter ad's pairs take. */
static size_t adapter_floats(const LoraAdapter *ad, const ModelConfig *c) {
    size_t n = 0;
    for (int l = 0; l < ad->n_layers; l++)
        for (int p = 0; p < LORA_PROJ_COUNT; p++) {
            if (!ad->pairs[(size_t)l * LORA_PROJ_COUNT + p].a) continue;
            int in, out;
            lora_proj_dims(c, (LoraProj)p, &in, &out);
            n += (size_t)ad->rank * in + (size_t)out * ad->rank;
        }
    return n;
}

/* Copies adapter id's pairs into one device buffer and records where each landed in the host
 * pointer tables (n_layers, LORA_PROJ_COUNT, n_ids). */
static int upload_adapter(CudaLora *cl, const LoraAdapter *ad, int id, const ModelConfig *c, const float **a_host,
                          const float **b_host, BraidError *err) {
    if (ad->n_layers != cl->n_layers)
        return braid_error_set(err, "cuda lora: adapter '%s' has %d layers, the model %d", ad->name, ad->n_layers, cl->n_layers);
    size_t floats = adapter_floats(ad, c);
    if (dev_alloc((void **)&cl->adapter_mem[id], floats * sizeof(float), &cl->adapter_bytes, ad->name, err)) return -1;
    float *at = cl->adapter_mem[id];
    for (int l = 0; l < ad->n_layers; l++)
        for (int p = 0; p < LORA_PROJ_COUNT; p++) {
            const LoraPair *pair = &ad->pairs[(size_t)l * LORA_PROJ_COUNT + p];
            if (!pair->a) continue;
            int in, out;
            lora_proj_dims(c, (LoraProj)p, &in, &out);
            size_t a_n = (size_t)ad->rank * in, b_n = (size_t)out * ad->rank, row = ((size_t)l * LORA_PROJ_COUNT + p) * cl->n_ids + id;
            if (dev_upload(at, pair->a, a_n * sizeof(float), "uploading an adapter's A", err) ||
                dev_upload(at + a_n, pair->b, b_n * sizeof(float), "uploading an adapter's B", err))
                return braid_error_wrap(err, "adapter '%s', layer %d, %s", ad->name, l, lora_proj_stem((LoraProj)p));
            a_host[row] = at;
            b_host[row] = at + a_n;
            at += a_n + b_n;
        }
    return 0;
}

/* Every adapter's matrices, then the id-indexed pointer, rank and scale tables. */
static int upload_adapters(CudaLora *cl, const LoraSet *set, const ModelConfig *c, BraidError *err) {
    size_t rows = (size_t)cl->n_layers * LORA_PROJ_COUNT * cl->n_ids;
    const float **a_host = calloc(rows, sizeof *a_host), **b_host = calloc(rows, sizeof *b_host);
    int32_t *rank = calloc((size_t)cl->n_ids, sizeof *rank);
    float *scale = calloc((size_t)cl->n_ids, sizeof *scale);
    cl->adapter_mem = calloc((size_t)cl->n_ids, sizeof *cl->adapter_mem);
    int rc = !a_host || !b_host || !rank || !scale || !cl->adapter_mem ? braid_error_set(err, "cuda lora: out of memory") : 0;
    for (int id = 1; rc == 0 && id < cl->n_ids; id++) {
        const LoraAdapter *ad = lora_set_get(set, id);
        rank[id] = ad->rank;
        scale[id] = ad->scale;
        rc = upload_adapter(cl, ad, id, c, a_host, b_host, err);
    }
    if (rc == 0)
        rc = dev_alloc((void **)&cl->a_table, rows * sizeof *a_host, &cl->adapter_bytes, "adapter tables", err) ||
             dev_alloc((void **)&cl->b_table, rows * sizeof *b_host, &cl->adapter_bytes, "adapter tables", err) ||
             dev_alloc((void **)&cl->rank, (size_t)cl->n_ids * sizeof *rank, &cl->adapter_bytes, "adapter ranks", err) ||
             dev_alloc((void **)&cl->scale, (size_t)cl->n_ids * sizeof *scale, &cl->adapter_bytes, "adapter scales", err) ||
             dev_upload(cl->a_table, a_host, rows * sizeof *a_host, "uploading adapter tables", err) ||
             dev_upload(cl->b_table, b_host, rows * sizeof *b_host, "uploading adapter tables", err) ||
             dev_upload(cl->rank, rank, (size_t)cl->n_ids * sizeof *rank, "uploading adapter ranks", err) ||
             dev_upload(cl->scale, scale, (size_t)cl->n_ids * sizeof *scale, "uploading adapter scales", err);
    free(a_host);
    free(b_host);
    free(rank);
    free(scale);
    return rc ? -1 : 0;
}

static void layout_meta(CudaLoraMeta *m, const CudaLoraConfig *cfg) {
    size_t t = (size_t)cfg->max_batch_tokens, s = (size_t)cfg->max_seqs, at = 0;
    /* Each sequence's last tile may be partial: at most one more tile per sequence than full ones. */
    m->max_pre_tiles = cfg->max_batch_tokens / PREFILL_TILE_QUERIES + cfg->max_seqs;
    m->table_stride = cfg->table_stride;
    m->tok_adapter = at; at += t;
    m->kv_adapter = at; at += t;
    m->res_adapter = at; at += t;
    m->res_slots = at; at += t;
    m->seq_adapter = at; at += s;
    m->dec_tiles = at; at += 2 * s;
    m->pre_tiles = at; at += 2 * (size_t)m->max_pre_tiles;
    m->res_tables = at; at += s * (size_t)m->table_stride;
    m->total = at;
}

/* The step metadata buffers and the delta kernels' scratch. */
static int alloc_step(CudaLora *cl, const CudaLoraConfig *cfg, BraidError *err) {
    layout_meta(&cl->meta, cfg);
    if (dev_alloc((void **)&cl->shrink, (size_t)cfg->max_batch_tokens * cl->max_rank * sizeof(float), NULL, "LoRA scratch", err) ||
        dev_alloc((void **)&cl->meta_dev, cl->meta.total * sizeof(int32_t), NULL, "LoRA step metadata", err))
        return -1;
    LORA_CUDA_TRY(cudaMallocHost((void **)&cl->meta_host, cl->meta.total * sizeof(int32_t)), "pinned LoRA step metadata");
    memset(cl->meta_host, 0, cl->meta.total * sizeof(int32_t));
    return 0;
}

/* The residual pool (zeroed: a lane an adapter leaves unwritten never brings NaN into a product)
 * and ResidualAttention's partials: room for every sequence decoding with the most splits, or
 * for the most prefill tiles with one split each. */
static int alloc_residual_pool(CudaLora *cl, const CudaLoraConfig *cfg, BraidError *err) {
    if (cfg->residual_blocks == 0) return 0;
    cl->res_blocks = cfg->residual_blocks;
    cl->res_rank = cfg->residual_rank;
    cl->block_size = cfg->block_size;
    cl->res_k = calloc((size_t)cl->n_layers, sizeof *cl->res_k);
    cl->res_v = calloc((size_t)cl->n_layers, sizeof *cl->res_v);
    if (!cl->res_k || !cl->res_v) return braid_error_set(err, "cuda lora: out of memory");
    size_t layer_bytes = (size_t)cl->res_blocks * cl->block_size * cl->res_rank * sizeof(uint16_t);
    for (int l = 0; l < cl->n_layers; l++) {
        if (dev_alloc((void **)&cl->res_k[l], layer_bytes, &cl->residual_bytes, "the residual pool", err) ||
            dev_alloc((void **)&cl->res_v[l], layer_bytes, &cl->residual_bytes, "the residual pool", err))
            return braid_error_wrap(err, "%d residual blocks of %d tokens at rank %d do not fit on the GPU (use fewer --residual-blocks)",
                                    cl->res_blocks, cl->block_size, cl->res_rank);
        LORA_CUDA_TRY(cudaMemset(cl->res_k[l], 0, layer_bytes), "clearing the residual pool");
        LORA_CUDA_TRY(cudaMemset(cl->res_v[l], 0, layer_bytes), "clearing the residual pool");
    }
    int decode_rows = cfg->max_seqs * CUDA_DECODE_MAX_SPLITS, prefill_rows = cl->meta.max_pre_tiles * PREFILL_TILE_QUERIES;
    cl->partial_rows = decode_rows > prefill_rows ? decode_rows : prefill_rows;
    size_t floats = cuda_residual_partials_floats(cl->partial_rows, cl->n_heads, 1, 1, cl->head_dim, cl->res_rank);
    return dev_alloc((void **)&cl->partials, floats * sizeof(float), NULL, "ResidualAttention partials", err);
}

int cuda_lora_create(CudaLora *cl, const CudaLoraConfig *cfg, BraidError *err) {
    memset(cl, 0, sizeof *cl);
    const LoraSet *set = cfg->set;
    if (!set || set->n == 0) {
        if (cfg->residual_blocks > 0)
            return braid_error_set(err, "cuda lora: a ForkKV residual pool (--lora-cache shared) needs adapters (--lora)");
        return 0;
    }
    if (check_config(cfg, err)) return -1;
    const ModelConfig *c = cfg->model;
    cl->n_ids = set->n + 1;
    cl->max_rank = lora_set_max_rank(set);
    cl->n_layers = c->n_layers;
    cl->dim = c->dim;
    cl->q_dim = c->n_heads * c->head_dim;
    cl->kv_dim = c->n_kv_heads * c->head_dim;
    cl->n_heads = c->n_heads;
    cl->n_kv_heads = c->n_kv_heads;
    cl->head_dim = c->head_dim;
    cl->n_sms = cfg->n_sms;
    for (int p = 0; p < LORA_PROJ_COUNT; p++) lora_proj_dims(c, (LoraProj)p, &cl->proj_in[p], &cl->proj_out[p]);
    if (upload_adapters(cl, set, c, err) || alloc_step(cl, cfg, err) || alloc_residual_pool(cl, cfg, err)) {
        cuda_lora_destroy(cl);
        return -1;
    }
    return 0;
}

void cuda_lora_destroy(CudaLora *cl) {
    for (int id = 0; cl->adapter_mem && id < cl->n_ids; id++) cudaFree(cl->adapter_mem[id]);
    free(cl->adapter_mem);
    for (int l = 0; cl->res_k && l < cl->n_layers; l++) cudaFree(cl->res_k[l]);
    for (int l = 0; cl->res_v && l < cl->n_layers; l++) cudaFree(cl->res_v[l]);
    free(cl->res_k);
    free(cl->res_v);
    void *dev[] = {(void *)cl->a_table, (void *)cl->b_table, cl->rank, cl->scale, cl->shrink, cl->partials, cl->meta_dev};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cudaFree(dev[i]);
    cudaFreeHost(cl->meta_host);
    memset(cl, 0, sizeof *cl);
}

bool cuda_lora_seq_forked(const ForwardBatch *fb, int s) { return fb->res_block_tables && fb->res_block_tables[s]; }

bool cuda_lora_batch_adapted(const ForwardBatch *fb) {
    for (int s = 0; s < fb->n_seqs; s++)
        if ((fb->seq_adapter && fb->seq_adapter[s] != 0) || cuda_lora_seq_forked(fb, s)) return true;
    return false;
}

/* Residual blocks of sequence s's context, each a block of the pool. */
static int check_residual_table(const CudaLora *cl, const ForwardBatch *fb, int s, BraidError *err) {
    int n_blocks = (fb->seq_n_ctx[s] + cl->block_size - 1) / cl->block_size;
    if (n_blocks > cl->meta.table_stride)
        return braid_error_set(err, "cuda lora: sequence %d's context of %d tokens outgrows a block table of %d blocks", s,
                               fb->seq_n_ctx[s], cl->meta.table_stride);
    for (int i = 0; i < n_blocks; i++)
        if (fb->res_block_tables[s][i] < 0 || fb->res_block_tables[s][i] >= cl->res_blocks)
            return braid_error_set(err, "cuda lora: sequence %d's residual block %d is %d, outside the pool (%d blocks)", s, i,
                                   fb->res_block_tables[s][i], cl->res_blocks);
    return 0;
}

/* The CPU backend's checks (worker/forward.c validate_batch) plus the residual tables, which
 * the GPU would otherwise read out of bounds. */
static int check_batch(const CudaLora *cl, const ForwardBatch *fb, BraidError *err) {
    int n_adapters = cl->n_ids > 0 ? cl->n_ids - 1 : 0;
    for (int s = 0; fb->seq_adapter && s < fb->n_seqs; s++)
        if (fb->seq_adapter[s] < 0 || fb->seq_adapter[s] > n_adapters)
            return braid_error_set(err, "forward: sequence %d names LoRA adapter id %d, but %d adapter(s) are loaded", s,
                                   fb->seq_adapter[s], n_adapters);
    if (!fb->res_block_tables) return 0;
    if (cl->res_blocks == 0 || !fb->res_slot_mapping)
        return braid_error_set(err, "forward: a ForkKV batch (residual tables) on a backend without a residual pool");
    int res_slots = cl->res_blocks * cl->block_size;
    for (int t = 0; t < fb->n_tokens; t++)
        if (fb->res_slot_mapping[t] >= res_slots)
            return braid_error_set(err, "forward: residual slot %d outside the pool (%d slots)", fb->res_slot_mapping[t], res_slots);
    for (int s = 0; s < fb->n_seqs; s++)
        if (cuda_lora_seq_forked(fb, s) && check_residual_table(cl, fb, s, err)) return -1;
    return 0;
}

/* Splits of a ResidualAttention launch of n_tiles tiles of tile_queries rows: decode_split_count's
 * choice, within what the partials hold. */
static int residual_splits(const CudaLora *cl, int n_tiles, int tile_queries, int max_ctx) {
    if (n_tiles == 0) return 1;
    int splits = decode_split_count(n_tiles, cl->n_kv_heads, cl->n_sms, max_ctx, CUDA_DECODE_MAX_SPLITS);
    int room = cl->partial_rows / (n_tiles * tile_queries);
    if (splits > room) splits = room;
    return splits < 1 ? 1 : splits;
}

/* A ForkKV sequence's residual table row and ResidualAttention work items. */
static void pack_forked(CudaLora *cl, const ForwardBatch *fb, int s, int *max_dec_ctx, int *max_pre_ctx) {
    const CudaLoraMeta *L = &cl->meta;
    int32_t *m = cl->meta_host;
    CudaLoraStep *st = &cl->step;
    int n_q = fb->seq_start[s + 1] - fb->seq_start[s], n_blocks = (fb->seq_n_ctx[s] + cl->block_size - 1) / cl->block_size;
    memcpy(m + L->res_tables + (size_t)s * L->table_stride, fb->res_block_tables[s], (size_t)n_blocks * sizeof(int32_t));
    st->any_residual = true;
    if (n_q == 1) {
        m[L->dec_tiles + 2 * st->n_dec_tiles] = s;
        m[L->dec_tiles + 2 * st->n_dec_tiles + 1] = 0;
        st->n_dec_tiles++;
        if (fb->seq_n_ctx[s] > *max_dec_ctx) *max_dec_ctx = fb->seq_n_ctx[s];
        return;
    }
    for (int r0 = 0; r0 < n_q; r0 += PREFILL_TILE_QUERIES) {
        m[L->pre_tiles + 2 * st->n_pre_tiles] = s;
        m[L->pre_tiles + 2 * st->n_pre_tiles + 1] = r0;
        st->n_pre_tiles++;
    }
    if (fb->seq_n_ctx[s] > *max_pre_ctx) *max_pre_ctx = fb->seq_n_ctx[s];
}

static void pack_step(CudaLora *cl, const ForwardBatch *fb) {
    const CudaLoraMeta *L = &cl->meta;
    int32_t *m = cl->meta_host;
    CudaLoraStep *st = &cl->step;
    *st = (CudaLoraStep){.n_tokens = fb->n_tokens};
    int max_dec_ctx = 0, max_pre_ctx = 0;
    for (int s = 0; s < fb->n_seqs; s++) {
        int id = fb->seq_adapter ? fb->seq_adapter[s] : 0;
        bool forked = cuda_lora_seq_forked(fb, s);
        m[L->seq_adapter + s] = id;
        for (int t = fb->seq_start[s]; t < fb->seq_start[s + 1]; t++) {
            m[L->tok_adapter + t] = id;
            m[L->kv_adapter + t] = forked ? 0 : id;
            m[L->res_adapter + t] = forked ? id : 0;
            m[L->res_slots + t] = forked ? fb->res_slot_mapping[t] : -1;
        }
        st->any_adapter |= id != 0;
        st->any_kv_delta |= id != 0 && !forked;
        if (forked) pack_forked(cl, fb, s, &max_dec_ctx, &max_pre_ctx);
    }
    st->dec_splits = residual_splits(cl, st->n_dec_tiles, 1, max_dec_ctx);
    st->pre_splits = residual_splits(cl, st->n_pre_tiles, PREFILL_TILE_QUERIES, max_pre_ctx);
}

int cuda_lora_prepare(CudaLora *cl, const ForwardBatch *fb, cudaStream_t stream, BraidError *err) {
    if (check_batch(cl, fb, err)) return -1;
    if (cl->n_ids == 0) { /* only id 0 passed the check: nothing to do */
        cl->step = (CudaLoraStep){.n_tokens = fb->n_tokens};
        return 0;
    }
    pack_step(cl, fb);
    size_t ints = cl->meta.res_tables + (cl->step.any_residual ? (size_t)fb->n_seqs * cl->meta.table_stride : 0);
    LORA_CUDA_TRY(cudaMemcpyAsync(cl->meta_dev, cl->meta_host, ints * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
                  "uploading the LoRA step metadata");
    return 0;
}

/* Projection proj of `layer` across every adapter, as the kernels take it. */
static CudaLoraProjection projection(const CudaLora *cl, int layer, LoraProj proj) {
    size_t row = ((size_t)layer * LORA_PROJ_COUNT + proj) * cl->n_ids;
    return (CudaLoraProjection){.a = cl->a_table + row, .b = cl->b_table + row, .rank = cl->rank, .scale = cl->scale,
                                .n_ids = cl->n_ids, .max_rank = cl->max_rank};
}

/* y (n, out; row stride y_stride) += the deltas of proj on x (n, in) for the tokens whose id in
 * the metadata array at offset `ids` is an adapter. */
static int add_delta(CudaLora *cl, int layer, LoraProj proj, size_t ids, const uint16_t *x, float *y, int y_stride,
                     cudaStream_t stream, BraidError *err) {
    CudaLoraProjection p = projection(cl, layer, proj);
    cudaError_t e = cuda_lora_delta(&p, cl->meta_dev + ids, x, cl->step.n_tokens, cl->proj_in[proj], y, y_stride,
                                    cl->proj_out[proj], cl->shrink, stream);
    if (e != cudaSuccess)
        return braid_error_set(err, "cuda lora: layer %d %s delta: %s", layer, lora_proj_stem(proj), cudaGetErrorString(e));
    return 0;
}

static CudaResidualLayer residual_layer(const CudaLora *cl, int layer) {
    return (CudaResidualLayer){.k = cl->res_k[layer], .v = cl->res_v[layer], .block_size = cl->block_size, .rank = cl->res_rank};
}

int cuda_lora_project(CudaLora *cl, int layer, const uint16_t *x, float *qkv, cudaStream_t stream, BraidError *err) {
    const CudaLoraStep *st = &cl->step;
    const CudaLoraMeta *L = &cl->meta;
    int qkv_dim = cl->q_dim + 2 * cl->kv_dim;
    if (st->any_adapter && add_delta(cl, layer, LORA_PROJ_Q, L->tok_adapter, x, qkv, qkv_dim, stream, err)) return -1;
    if (st->any_kv_delta &&
        (add_delta(cl, layer, LORA_PROJ_K, L->kv_adapter, x, qkv + cl->q_dim, qkv_dim, stream, err) ||
         add_delta(cl, layer, LORA_PROJ_V, L->kv_adapter, x, qkv + cl->q_dim + cl->kv_dim, qkv_dim, stream, err)))
        return -1;
    if (!st->any_residual) return 0;
    CudaLoraProjection k = projection(cl, layer, LORA_PROJ_K), v = projection(cl, layer, LORA_PROJ_V);
    CudaResidualLayer res = residual_layer(cl, layer);
    cudaError_t e = cuda_lora_residual_store(&k, &v, cl->meta_dev + L->res_adapter, x, st->n_tokens, cl->dim,
                                             cl->meta_dev + L->res_slots, &res, stream);
    if (e != cudaSuccess) return braid_error_set(err, "cuda lora: layer %d residual store: %s", layer, cudaGetErrorString(e));
    return 0;
}

int cuda_lora_attend(CudaLora *cl, int layer, const CudaAttention *base, const CudaRopeShape *rope, cudaStream_t stream,
                     BraidError *err) {
    const CudaLoraStep *st = &cl->step;
    if (!st->any_residual) return 0;
    assert(base->table_stride == cl->meta.table_stride); /* residual rows are read at the base tables' stride */
    const int32_t *m = cl->meta_dev;
    CudaResidualAttention ra = {.base = *base, .res = residual_layer(cl, layer), .res_block_tables = m + cl->meta.res_tables,
                                .seq_adapter = m + cl->meta.seq_adapter, .k_proj = projection(cl, layer, LORA_PROJ_K),
                                .v_proj = projection(cl, layer, LORA_PROJ_V), .rope = *rope};
    /* The decode launch finishes (same stream) before the prefill launch reuses the partials. */
    cudaError_t e = cuda_residual_attention(&ra, m + cl->meta.dec_tiles, st->n_dec_tiles, 1, st->dec_splits, cl->partials, stream);
    if (e == cudaSuccess)
        e = cuda_residual_attention(&ra, m + cl->meta.pre_tiles, st->n_pre_tiles, PREFILL_TILE_QUERIES, st->pre_splits,
                                    cl->partials, stream);
    if (e != cudaSuccess) return braid_error_set(err, "cuda lora: layer %d ResidualAttention: %s", layer, cudaGetErrorString(e));
    return 0;
}

int cuda_lora_add_output(CudaLora *cl, int layer, const uint16_t *att, float *x, cudaStream_t stream, BraidError *err) {
    if (!cl->step.any_adapter) return 0;
    return add_delta(cl, layer, LORA_PROJ_O, cl->meta.tok_adapter, att, x, cl->dim, stream, err);
}
