/*
 * backend.h — one instance's compute device: KV memory plus the forward pass, on CPU or CUDA.
 *
 * The engine and the single-sequence runner talk to a Backend instead of a particular device.
 * backend_forward() runs a ForwardBatch and returns, for every requested logit row, its greedy
 * token (argmax, lowest id on ties) and, for rows the caller flags, the full fp32 logits on the
 * host. The CPU backend (fp16 KV, quantized weights read in place) is the default and the test
 * oracle; the CUDA backend (bf16 weights and KV, cuBLAS, CUDA graphs for decode) is built when
 * BRAID_CUDA is on and chosen with --device cuda.
 * Owns: the KV pool and all scratch of its device. Borrows the weights (which must outlive it).
 * Not thread-safe: one thread of control drives a backend.
 */
#ifndef BRAID_WORKER_BACKEND_H
#define BRAID_WORKER_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/cpu/matmul.h"
#include "model/model_weights.h"
#include "worker/forward_batch.h"

typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } BackendKind;

typedef struct {
    BackendKind kind;
    int n_blocks, block_size;
    int max_batch_tokens; /* most tokens one ForwardBatch may hold */
    int max_seqs;         /* most sequences one ForwardBatch may hold */
    int max_context;      /* longest context a sequence may reach (sizes block tables) */
    int cuda_device;      /* CUDA ordinal */
    bool cuda_graphs;     /* capture decode steps as CUDA graphs (CUDA only) */
    CpuMatmulMath cpu_matmul; /* CPU only: fp32 (the zero value; the golden-tested path) or int8 activations */
    struct TpCollective *tp; /* tensor parallelism: the weights are this rank's shard; NULL = whole model */
} BackendConfig;

typedef struct {
    int32_t *argmax;             /* (n_logits) greedy token of each logit row; always filled */
    float *logits;               /* (n_logits, vocab) host; rows flagged below are filled, or NULL */
    const uint8_t *want_logits;  /* (n_logits) 1 = copy this row's logits to `logits`; NULL = all rows */
} ForwardOutput;

typedef struct BackendOps BackendOps;

typedef struct {
    const BackendOps *ops;
    BackendConfig cfg;
    const ModelWeights *weights;
    size_t kv_bytes;      /* device memory the KV pool takes */
    size_t weight_bytes;  /* device memory the weights take (0 when read in place) */
    void *impl;
} Backend;

struct BackendOps {
    const char *name;
    int (*forward)(Backend *b, const ForwardBatch *batch, ForwardOutput *out, BraidError *err);
    void (*destroy)(Backend *b);
};

/* Fills a config with defaults for `kind` (max_seqs 256, max_context = model context). */
BackendConfig backend_config_default(BackendKind kind, const ModelConfig *model, int n_blocks, int block_size,
                                     int max_batch_tokens);
int backend_create(Backend *b, const ModelWeights *weights, const BackendConfig *cfg, BraidError *err);
int backend_forward(Backend *b, const ForwardBatch *batch, ForwardOutput *out, BraidError *err);
void backend_destroy(Backend *b);

/* "cpu", "cuda" or "auto" (cuda when this build has it and a GPU is visible, else cpu). */
int backend_parse_kind(const char *text, BackendKind *kind, BraidError *err);
const char *backend_kind_name(BackendKind kind);
/* True when this build includes the CUDA backend and at least one GPU is visible. */
bool backend_cuda_available(void);

/* Per-backend constructors, called by backend_create. */
int backend_cpu_create(Backend *b, BraidError *err);
int backend_cuda_create(Backend *b, BraidError *err);

#endif
