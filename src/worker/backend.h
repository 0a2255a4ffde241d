/*
 * backend.h — one instance's compute device: KV memory plus the forward pass, on CPU or CUDA.
 *
 * The engine and the single-sequence runner talk to a Backend instead of a particular device.
 * backend_forward() runs a ForwardBatch and returns, for every requested logit row, its greedy
 * token (argmax, lowest id on ties) and, for rows the caller flags, the full fp32 logits on the
 * host. The CPU backend (fp16 KV, quantized weights read in place) is the default and the test
 * oracle; the CUDA backend (bf16 weights and KV, cuBLAS, CUDA graphs for decode) is built when
 * BRAID_CUDA is on and chosen with --device cuda.
 *
 * Host KV tier (host_blocks > 0): a second pool of the same block layout in host memory (pinned
 * for CUDA). backend_apply_cache_ops() carries out the block operations the cache decided
 * (cache/cache_ops.h: COPY device->device, STORE device->host, LOAD host->device, ROTATE a device
 * block's keys by delta positions). Contract:
 *   - operations run in list order, all of them before the next backend_forward() starts; a STORE
 *     reads its device block before that forward may overwrite it, and a LOAD has completed before
 *     any forward reads its block (CUDA: copies and rotations run on a copy stream the compute
 *     stream waits on);
 *   - the whole list is validated first (ids in [1, tier size), host tier present for STORE/LOAD,
 *     known kinds, ROTATE with dst 0 and |delta| < max_context); an invalid list is refused with a
 *     message and changes nothing;
 *   - ROTATE computes in fp32 from the stored keys (CPU: fp16 pool; CUDA: bf16 pool) with the
 *     model's RoPE pairing, base, linear scaling and rope_freqs, through the same inverse
 *     frequencies the backend's forward uses, so a key rotated by Δ is the key a forward at p + Δ
 *     stores, up to the pool's rounding;
 *   - tensor parallelism: every rank applies the same list to its own shard (its KV heads).
 * Overlapped operations (backend_apply_cache_ops_overlapped, PBKV §4.3's prefetch off the critical
 * path): a list whose blocks no forward reads or writes before the next backend_sync() may run
 * beside that forward (CPU: on a copy thread when host_blocks > 0 and sync_copies is off, memcpy
 * kinds only; CUDA: on the copy stream without the compute stream waiting for it). They are
 * complete, and visible to forwards, after backend_sync(); backend_apply_cache_ops,
 * backend_read_block, backend_kv_memory and backend_destroy sync first. The caller (the engine)
 * syncs at the end of every step, so nothing is in flight between steps.
 * Owns: the KV pools (device and host tier) and all scratch of its device. Borrows the weights
 * (which must outlive it).
 * Not thread-safe: one thread of control drives a backend.
 */
#ifndef BRAID_WORKER_BACKEND_H
#define BRAID_WORKER_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/cache_ops.h"
#include "common/error.h"
#include "kernels/cpu/matmul.h"
#include "model/lora_adapter.h"
#include "model/model_weights.h"
#include "worker/forward_batch.h"

typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } BackendKind;

typedef struct {
    BackendKind kind;
    int n_blocks, block_size;
    int host_blocks;      /* host-tier blocks including the null block 0; 0 = no host tier */
    int max_batch_tokens; /* most tokens one ForwardBatch may hold */
    int max_seqs;         /* most sequences one ForwardBatch may hold */
    int max_context;      /* longest context a sequence may reach (sizes block tables) */
    int cuda_device;      /* CUDA ordinal */
    bool cuda_graphs;     /* capture decode steps as CUDA graphs (CUDA only) */
    CpuMatmulMath cpu_matmul; /* CPU only: fp32 (the zero value; the golden-tested path) or int8 activations */
    struct TpCollective *tp; /* tensor parallelism: the weights are this rank's shard; NULL = whole model */
    /* LoRA adapters a batch's seq_adapter ids name (borrowed; must outlive the backend); NULL = none.
     * Both backends run them (CUDA: worker/cuda_lora.h, ranks up to CUDA_LORA_MAX_RANK, adapter
     * batches never replayed from a graph); --tp > 1 refuses a non-empty set (adapters are not
     * sharded). */
    const LoraSet *lora;
    /* ForkKV (--lora-cache shared): residual pool blocks (incl. the null block; 0 = none) and its
     * width, the widest adapter's rank. Both backends (CPU: IEEE halves; CUDA: bf16, on the GPU). */
    int residual_blocks, residual_rank;
    /* CPU: overlapped operations run inline, before the call returns, instead of on a copy thread
     * (the zero value, false, has the thread whenever there is a host tier). */
    bool sync_copies;
    /* Optional: called between the layers of a forward on the calling thread (CPU; the CUDA backend
     * launches a step's layers asynchronously and never calls it), at most once per layer. The
     * instance leader's heartbeat: a step longer than --instance-timeout must not look like a lost node. */
    void (*step_pulse)(void *ctx);
    void *step_pulse_ctx;
} BackendConfig;

typedef struct {
    int32_t *argmax;             /* (n_logits) greedy token of each logit row; always filled */
    float *logits;               /* (n_logits, vocab) host; rows flagged below are filled, or NULL */
    const uint8_t *want_logits;  /* (n_logits) 1 = copy this row's logits to `logits`; NULL = all rows */
    /* Post-norm hidden states (the output head's input): rows flagged in want_hidden are copied
     * to hidden + row * dim as fp32 (CUDA: from bf16). NULL want_hidden = none. */
    float *hidden;               /* (n_logits, dim) host */
    const uint8_t *want_hidden;
    /* Grammar masks (grammar/grammar.h): rows flagged in want_mask allow only the tokens whose bits
     * are set in mask + row * mask_words (bit t of word t / 32); their argmax is taken over those
     * tokens only (CPU on the host, CUDA on the device before the ids are copied back). The logits
     * copied to `logits` stay the model's raw ones. NULL want_mask = no masks. */
    const uint32_t *mask;
    const uint8_t *want_mask;
    int mask_words;
} ForwardOutput;

typedef struct BackendOps BackendOps;

/* Where one KV tier lives in host-addressable memory (KV block moves, worker/kv_moves.h): every
 * layer's K then every layer's V, each (n_blocks, block_elems) halves, in one contiguous region
 * (kv_pool.h), and the slots' recorded positions (n_blocks, block_size). */
typedef struct {
    void *kv;
    size_t kv_bytes;
    int32_t *slot_pos;
    size_t slot_pos_bytes;
    int n_layers, n_blocks, block_size;
    size_t block_layer_bytes; /* one block of one layer's K (or V) */
} BackendKvMemory;

typedef struct {
    const BackendOps *ops;
    BackendConfig cfg;
    const ModelWeights *weights;
    size_t kv_bytes;      /* device memory the KV pool takes */
    size_t host_kv_bytes; /* host memory the host KV tier takes (0 without one) */
    size_t residual_kv_bytes; /* memory the ForkKV residual pool takes (0 without one) */
    size_t weight_bytes;  /* device memory the weights take (0 when read in place) */
    /* Host->device copies the backend timed (LOADs; CPU only, 0 elsewhere), for PBKV's S_bw
     * (worker/prefetch_budget.h): bytes and seconds since creation, and the overlapped operations
     * run so far. Settled after backend_sync(). */
    double load_bytes, load_seconds;
    uint64_t overlapped_ops;
    struct CopyThread *copier; /* CPU with a copy thread: tests may hold it (copy_thread.h); else NULL */
    void *impl;
} Backend;

struct BackendOps {
    const char *name;
    int (*forward)(Backend *b, const ForwardBatch *batch, ForwardOutput *out, BraidError *err);
    /* Called with n >= 1 operations already validated by backend_apply_cache_ops. */
    int (*apply_cache_ops)(Backend *b, const CacheOp *ops, int n, BraidError *err);
    /* Optional (NULL: run as apply_cache_ops): the same, validated, overlapping later forwards. */
    int (*apply_cache_ops_overlapped)(Backend *b, const CacheOp *ops, int n, BraidError *err);
    /* Optional: completes the overlapped operations (see the contract above). */
    int (*sync)(Backend *b, BraidError *err);
    /* Called with a block already range-checked by backend_read_block. */
    int (*read_block)(Backend *b, int32_t block, float *keys, float *values, int32_t *positions, BraidError *err);
    /* Optional (NULL: this backend's KV cannot be moved): a tier's memory, 0 or -1 when the tier is off. */
    int (*kv_memory)(Backend *b, int tier, BackendKvMemory *out);
    void (*destroy)(Backend *b);
};

/* Fills a config with defaults for `kind` (max_seqs 256, max_context = model context). */
BackendConfig backend_config_default(BackendKind kind, const ModelConfig *model, int n_blocks, int block_size,
                                     int max_batch_tokens);
int backend_create(Backend *b, const ModelWeights *weights, const BackendConfig *cfg, BraidError *err);
int backend_forward(Backend *b, const ForwardBatch *batch, ForwardOutput *out, BraidError *err);
/* Carries out n block operations in list order before the next forward (see the contract above).
 * n == 0 is a no-op. Returns -1 with a message naming the offending operation when any id is out
 * of its tier's range or is the null block 0, a STORE/LOAD meets a backend without a host tier, a
 * COPY names the same block twice, a ROTATE has a nonzero dst or |delta| >= cfg.max_context, or
 * an operation is of unknown kind; then nothing is applied. */
int backend_apply_cache_ops(Backend *b, const CacheOp *ops, int n, BraidError *err);
/* The same validation; the operations may run beside the following forwards until backend_sync()
 * (see the contract above): only for blocks none of those forwards reads or writes. */
int backend_apply_cache_ops_overlapped(Backend *b, const CacheOp *ops, int n, BraidError *err);
/* Overlapped operations complete (CPU: waits for the copy thread; CUDA: the compute stream waits
 * for the copy stream). 0, or -1 with err. */
int backend_sync(Backend *b, BraidError *err);
/* Reads back device block `block` (1..n_blocks-1) for tests and benchmarks: keys and values, each
 * (n_layers, n_kv_heads of this rank, block_size, head_dim), widened to fp32 exactly from the
 * pool's storage, and the positions (block_size) recorded for its slots (any may be NULL). Waits
 * for all work queued on the device (CUDA), so it is slow; never on a serving path. */
int backend_read_block(Backend *b, int32_t block, float *keys, float *values, int32_t *positions, BraidError *err);
/* A tier's KV memory (0 device, 1 host) for block moves; -1 with err when the backend cannot lend
 * it (the CUDA backend's pool is GPU memory) or the tier is off. */
int backend_kv_memory(Backend *b, int tier, BackendKvMemory *out, BraidError *err);
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
