#include "worker/cuda_weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_kernels.h"
#include "model/weight_convert.h"

static int cuda_fail(cudaError_t e, const char *what, BraidError *err) {
    return braid_error_set(err, "cuda: %s: %s", what, cudaGetErrorString(e));
}

static int device_alloc(void **p, size_t bytes, size_t *total, const char *what, BraidError *err) {
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) return braid_error_set(err, "cuda: allocating %zu MiB for %s: %s", bytes >> 20, what, cudaGetErrorString(e));
    *total += bytes;
    return 0;
}

/* Uploads the given matrices stacked by rows into one bf16 device matrix (all share cols); a
 * synthetic part (model/synthetic_model.h) is generated in place, the same bits as on the host. */
static int upload_stacked(uint16_t **dst, const WeightMatrix *const *parts, int n_parts, size_t *total, BraidError *err) {
    int64_t rows = 0, cols = parts[0]->cols;
    for (int i = 0; i < n_parts; i++) rows += parts[i]->rows;
    size_t elems = (size_t)rows * cols;
    if (device_alloc((void **)dst, elems * 2, total, parts[0]->name, err)) return -1;
    size_t offset = 0;
    for (int i = 0; i < n_parts; i++) {
        const WeightMatrix *m = parts[i];
        size_t part_elems = (size_t)m->rows * cols;
        if (!m->data) {
            if (!m->synth_seed) return braid_error_set(err, "cuda: %s has no data", m->name);
            cudaError_t e = cuda_fill_random_bf16(*dst + offset, m->rows, cols, m->synth_seed, m->synth_index0, m->synth_stride,
                                                  m->synth_scale, 0);
            if (e != cudaSuccess) return cuda_fail(e, "generating synthetic weights", err);
            offset += part_elems;
            continue;
        }
        uint16_t *host = malloc(part_elems * 2);
        if (!host) return braid_error_set(err, "cuda: out of host memory converting %s", m->name);
        int rc = weight_to_bf16(m, 0, m->rows, 0, cols, host, err);
        cudaError_t e = rc ? cudaSuccess : cudaMemcpy(*dst + offset, host, part_elems * 2, cudaMemcpyHostToDevice);
        free(host);
        if (rc) return -1;
        if (e != cudaSuccess) return cuda_fail(e, m->name, err);
        offset += part_elems;
    }
    return 0;
}

static int upload_vector(float **dst, const float *src, int n, size_t *total, const char *what, BraidError *err) {
    if (device_alloc((void **)dst, (size_t)n * sizeof(float), total, what, err)) return -1;
    cudaError_t e = src ? cudaMemcpy(*dst, src, (size_t)n * sizeof(float), cudaMemcpyHostToDevice)
                        : cuda_fill_f32(*dst, (size_t)n, 1.0f, 0);
    return e == cudaSuccess ? 0 : cuda_fail(e, what, err);
}

/* The Q, K and V biases as one (q_dim + 2 kv_dim) vector, matching the fused QKV matrix's rows. */
static int upload_qkv_bias(CudaLayerWeights *cl, const LayerWeights *L, size_t *total, BraidError *err) {
    if (!L->bq && !L->bk && !L->bv) return 0;
    int64_t q = L->wq.rows, kv = L->wk.rows, n = q + 2 * kv;
    float *host = calloc((size_t)n, sizeof *host);
    if (!host) return braid_error_set(err, "cuda: out of host memory for the QKV bias");
    if (L->bq) memcpy(host, L->bq, (size_t)q * sizeof *host);
    if (L->bk) memcpy(host + q, L->bk, (size_t)kv * sizeof *host);
    if (L->bv) memcpy(host + q + kv, L->bv, (size_t)kv * sizeof *host);
    int rc = upload_vector(&cl->bqkv, host, (int)n, total, "QKV bias", err);
    free(host);
    return rc;
}

static int upload_layer(CudaLayerWeights *cl, const LayerWeights *L, const ModelConfig *c, size_t *total, BraidError *err) {
    const WeightMatrix *qkv[] = {&L->wq, &L->wk, &L->wv}, *gate_up[] = {&L->w_gate, &L->w_up};
    const WeightMatrix *wo[] = {&L->wo}, *down[] = {&L->w_down};
    return upload_stacked(&cl->wqkv, qkv, 3, total, err) || upload_stacked(&cl->wo, wo, 1, total, err) ||
           upload_stacked(&cl->w_gate_up, gate_up, 2, total, err) || upload_stacked(&cl->w_down, down, 1, total, err) ||
           upload_vector(&cl->attn_norm, L->attn_norm, c->dim, total, "attn_norm", err) ||
           upload_vector(&cl->ffn_norm, L->ffn_norm, c->dim, total, "ffn_norm", err) || upload_qkv_bias(cl, L, total, err) ||
           (L->q_norm && upload_vector(&cl->q_norm, L->q_norm, c->head_dim, total, "attn_q_norm", err)) ||
           (L->k_norm && upload_vector(&cl->k_norm, L->k_norm, c->head_dim, total, "attn_k_norm", err));
}

/* The CPU backend's inverse frequencies (worker/forward.c via cpu_rope_angles), computed once. */
static int upload_rope(CudaWeights *cw, const ModelWeights *w, BraidError *err) {
    const ModelConfig *c = &w->cfg;
    int half = c->rope_dim / 2;
    float *inv = malloc((size_t)half * sizeof *inv);
    if (!inv) return braid_error_set(err, "cuda: out of memory");
    for (int i = 0; i < half; i++) {
        inv[i] = 1.0f / powf(c->rope_base, (float)(2 * i) / (float)c->rope_dim);
        if (w->rope_freq_factors) inv[i] /= w->rope_freq_factors[i];
    }
    int rc = upload_vector(&cw->rope_inv_freq, inv, half, &cw->bytes, "rope frequencies", err);
    free(inv);
    return rc;
}

int cuda_weights_upload(CudaWeights *cw, const ModelWeights *w, BraidError *err) {
    memset(cw, 0, sizeof *cw);
    const ModelConfig *c = &w->cfg;
    cw->layers = calloc((size_t)c->n_layers, sizeof *cw->layers);
    if (!cw->layers) return braid_error_set(err, "cuda: out of memory");
    cw->n_layers = c->n_layers;
    for (int l = 0; l < c->n_layers; l++)
        if (upload_layer(&cw->layers[l], &w->layers[l], c, &cw->bytes, err))
            return braid_error_wrap(err, "uploading layer %d", l);
    const WeightMatrix *embd[] = {&w->token_embd}, *out[] = {&w->output};
    if (upload_stacked(&cw->token_embd, embd, 1, &cw->bytes, err)) return -1;
    if (w->output_tied) {
        cw->output = cw->token_embd;
    } else if (upload_stacked(&cw->output, out, 1, &cw->bytes, err)) {
        return -1;
    }
    if (upload_vector(&cw->output_norm, w->output_norm, c->dim, &cw->bytes, "output_norm", err) || upload_rope(cw, w, err))
        return -1;
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : cuda_fail(e, "uploading weights", err);
}

void cuda_weights_free(CudaWeights *cw) {
    if (cw->layers)
        for (int l = 0; l < cw->n_layers; l++) {
            CudaLayerWeights *cl = &cw->layers[l];
            cudaFree(cl->wqkv); cudaFree(cl->wo); cudaFree(cl->w_gate_up); cudaFree(cl->w_down);
            cudaFree(cl->attn_norm); cudaFree(cl->ffn_norm);
            cudaFree(cl->bqkv); cudaFree(cl->q_norm); cudaFree(cl->k_norm);
        }
    free(cw->layers);
    if (cw->output != cw->token_embd) cudaFree(cw->output);
    cudaFree(cw->token_embd);
    cudaFree(cw->output_norm);
    cudaFree(cw->rope_inv_freq);
    memset(cw, 0, sizeof *cw);
}
