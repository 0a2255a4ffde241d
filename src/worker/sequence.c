#include "worker/sequence.h"

#include <stdlib.h>
#include <string.h>

#define SEQUENCE_BLOCK_SIZE 16
#define SEQUENCE_PREFILL_CHUNK 512

static int sequence_runner_init_full(SequenceRunner *r, const ModelWeights *weights, const LoraSet *lora, int adapter,
                                     int max_context, BackendKind device, CpuMatmulMath math, BraidError *err);

int sequence_runner_init(SequenceRunner *r, const ModelWeights *weights, int max_context, BackendKind device,
                         BraidError *err) {
    return sequence_runner_init_full(r, weights, NULL, 0, max_context, device, CPU_MATMUL_DEFAULT, err);
}

int sequence_runner_init_math(SequenceRunner *r, const ModelWeights *weights, int max_context, BackendKind device,
                              CpuMatmulMath math, BraidError *err) {
    return sequence_runner_init_full(r, weights, NULL, 0, max_context, device, math, err);
}

int sequence_runner_init_adapter(SequenceRunner *r, const ModelWeights *weights, const LoraSet *lora, int adapter, int max_context,
                                 BackendKind device, CpuMatmulMath math, BraidError *err) {
    return sequence_runner_init_full(r, weights, lora, adapter, max_context, device, math, err);
}

static int sequence_runner_init_full(SequenceRunner *r, const ModelWeights *weights, const LoraSet *lora, int adapter,
                                     int max_context, BackendKind device, CpuMatmulMath math, BraidError *err) {
    memset(r, 0, sizeof *r);
    if (adapter && !lora_set_get(lora, adapter)) return braid_error_set(err, "sequence: no LoRA adapter of id %d", adapter);
    r->adapter = adapter;
    r->weights = weights;
    r->max_context = max_context;
    r->prefill_chunk = SEQUENCE_PREFILL_CHUNK;
    int n_blocks = (max_context + SEQUENCE_BLOCK_SIZE - 1) / SEQUENCE_BLOCK_SIZE;
    BackendConfig bc = backend_config_default(device, &weights->cfg, n_blocks + 1, SEQUENCE_BLOCK_SIZE, r->prefill_chunk);
    bc.max_seqs = 1;
    bc.max_context = max_context;
    bc.cpu_matmul = math;
    bc.lora = lora;
    if (backend_create(&r->backend, weights, &bc, err)) return -1;
    r->block_table = malloc((size_t)n_blocks * sizeof *r->block_table);
    r->argmax = malloc((size_t)r->prefill_chunk * sizeof *r->argmax);
    if (!r->block_table || !r->argmax) {
        sequence_runner_free(r);
        return braid_error_set(err, "sequence: out of memory");
    }
    for (int i = 0; i < n_blocks; i++) r->block_table[i] = i + 1;
    return 0;
}

void sequence_runner_free(SequenceRunner *r) {
    backend_destroy(&r->backend);
    free(r->block_table);
    free(r->argmax);
    memset(r, 0, sizeof *r);
}

void sequence_runner_reset(SequenceRunner *r) { r->n_context = 0; }

static int eval_chunk(SequenceRunner *r, const int32_t *tokens, int n, bool all_logits, float *logits, BraidError *err) {
    int32_t *positions = malloc((size_t)n * sizeof *positions), *slots = malloc((size_t)n * sizeof *slots);
    int32_t *rows = malloc((size_t)n * sizeof *rows);
    if (!positions || !slots || !rows) {
        free(positions); free(slots); free(rows);
        return braid_error_set(err, "sequence: out of memory");
    }
    for (int i = 0; i < n; i++) {
        int pos = r->n_context + i;
        positions[i] = pos;
        slots[i] = r->block_table[pos / SEQUENCE_BLOCK_SIZE] * SEQUENCE_BLOCK_SIZE + pos % SEQUENCE_BLOCK_SIZE;
        rows[i] = i;
    }
    int32_t seq_start[2] = {0, n}, n_ctx = r->n_context + n;
    const int32_t *tables[1] = {r->block_table};
    ForwardBatch b = {
        .n_tokens = n, .tokens = tokens, .positions = positions, .slot_mapping = slots,
        .n_seqs = 1, .seq_start = seq_start, .block_tables = tables, .seq_n_ctx = &n_ctx,
        .n_logits = all_logits ? n : 1, .logit_rows = all_logits ? rows : &rows[n - 1],
        .seq_adapter = r->adapter ? &r->adapter : NULL,
    };
    ForwardOutput out = {.argmax = r->argmax, .logits = logits, .want_logits = NULL};
    int rc = backend_forward(&r->backend, &b, &out, err);
    if (rc == 0) r->n_context += n;
    free(positions); free(slots); free(rows);
    return rc;
}

int sequence_runner_eval(SequenceRunner *r, const int32_t *tokens, int n, bool all_logits, float *logits, BraidError *err) {
    if (n <= 0) return braid_error_set(err, "sequence: nothing to evaluate");
    if (r->n_context + n > r->max_context)
        return braid_error_set(err, "sequence: %d tokens exceed the context of %d (already %d)", n, r->max_context, r->n_context);
    size_t vocab = (size_t)r->weights->cfg.vocab_size;
    for (int done = 0; done < n;) {
        int chunk = n - done < r->prefill_chunk ? n - done : r->prefill_chunk;
        bool last = done + chunk == n;
        if (!all_logits && !last) {
            /* Intermediate chunks only fill the cache; their last row's logits are discarded. */
            float *scratch = malloc(vocab * sizeof *scratch);
            if (!scratch) return braid_error_set(err, "sequence: out of memory");
            int rc = eval_chunk(r, tokens + done, chunk, false, scratch, err);
            free(scratch);
            if (rc) return -1;
        } else if (eval_chunk(r, tokens + done, chunk, all_logits, all_logits ? logits + (size_t)done * vocab : logits, err)) {
            return -1;
        }
        done += chunk;
    }
    return 0;
}
