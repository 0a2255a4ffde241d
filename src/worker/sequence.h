/*
 * sequence.h — runs one sequence through the forward pass on a private KV pool.
 *
 * The single-stream path used by `braid generate`, the golden tests and the CPU microbenchmark:
 * tokens are appended at consecutive positions, prefill goes in chunks, and the block table is the
 * identity over a pool sized for max_context tokens. The serving engine (scheduler + shared pool)
 * builds ForwardBatches itself instead.
 * Owns: its backend (KV pool and forward scratch on the chosen device). Not thread-safe (one runner per thread of control).
 */
#ifndef BRAID_WORKER_SEQUENCE_H
#define BRAID_WORKER_SEQUENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "model/model_weights.h"
#include "worker/backend.h"

typedef struct {
    const ModelWeights *weights;
    Backend backend;
    int32_t *argmax;      /* (prefill_chunk) */
    int32_t *block_table; /* identity: logical block i is pool block i + 1 (block 0 is null) */
    int max_context;
    int n_context;        /* tokens already in the KV cache */
    int prefill_chunk;
    int32_t adapter;      /* LoRA adapter id the sequence runs (model/lora_adapter.h; 0 = base model) */
} SequenceRunner;

int sequence_runner_init(SequenceRunner *r, const ModelWeights *weights, int max_context, BackendKind device,
                         BraidError *err);
/* The same with the CPU matmul arithmetic chosen (sequence_runner_init takes CPU_MATMUL_DEFAULT);
 * ignored on CUDA. */
int sequence_runner_init_math(SequenceRunner *r, const ModelWeights *weights, int max_context, BackendKind device,
                              CpuMatmulMath math, BraidError *err);
/* The same, running LoRA adapter `adapter` (1..lora->n) of `lora` (borrowed, outlives the runner)
 * in the CPU arithmetic `math`; adapter 0 is the base model. */
int sequence_runner_init_adapter(SequenceRunner *r, const ModelWeights *weights, const LoraSet *lora, int adapter, int max_context,
                                 BackendKind device, CpuMatmulMath math, BraidError *err);
void sequence_runner_free(SequenceRunner *r);
void sequence_runner_reset(SequenceRunner *r);

/* Appends tokens[0..n) at positions n_context.. and computes logits: for every token when
 * all_logits (logits is (n, vocab)), else for the last one only (logits is (vocab)). Fails when the
 * context would exceed max_context. */
int sequence_runner_eval(SequenceRunner *r, const int32_t *tokens, int n, bool all_logits, float *logits, BraidError *err);

#endif
