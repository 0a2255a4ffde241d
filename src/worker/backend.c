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
