/*
 * lora_adapter.h — LoRA adapters in the GGUF adapter layout llama.cpp uses, checked against a base model.
 *
 * File layout (what tools/train_lora.py writes and llama.cpp's convert_lora_to_gguf.py writes):
 *   general.type = "adapter", adapter.type = "lora", adapter.lora.alpha (float);
 *   per adapted projection of layer N, a pair of F32 / F16 / BF16 tensors
 *     blk.N.attn_{q,k,v,output}.weight.lora_a   ne = [in, rank]   (row-major (rank, in))
 *     blk.N.attn_{q,k,v,output}.weight.lora_b   ne = [rank, out]  (row-major (out, rank))
 *   where in/out are the base matrix's input/output widths. lora_b's rows follow the base matrix's
 *   row order, so for Q/K of a llama GGUF they carry the same RoPE permutation as the base weights.
 * The delta of a projection is  y += scale · (x · Aᵀ) · Bᵀ  with scale = alpha / rank.
 * Projections without a pair are not adapted; the MLP and any other tensor in the file are refused
 * (Braid would silently ignore them otherwise).
 *
 * Loading checks general.type, adapter.type, alpha (finite, > 0), every tensor's name, type, and
 * shape against the base model's dims, one rank shared by all pairs, and every value finite; a
 * file that fails is refused with a message naming the file and, where it applies, the tensor.
 * Owns: fp32 copies of A and B (the GGUF mapping is closed after load) and the adapter's name.
 * A path "synthetic:RANK[:SEED]" loads no file: random pairs of the base's shape (synthetic_lora.h).
 * Thread-safety: read-only after load.
 */
#ifndef BRAID_MODEL_LORA_ADAPTER_H
#define BRAID_MODEL_LORA_ADAPTER_H

#include <stddef.h>

#include "common/error.h"
#include "model/model_config.h"

/* Largest rank accepted: far above any real adapter; bounds what a hostile file can ask for and
 * the forward's per-token scratch. */
#define LORA_MAX_RANK 1024

/* The projections an adapter may adapt, in the order of the attention block. */
typedef enum { LORA_PROJ_Q = 0, LORA_PROJ_K, LORA_PROJ_V, LORA_PROJ_O, LORA_PROJ_COUNT } LoraProj;

typedef struct {
    float *a; /* (rank, in)  NULL when this projection is not adapted */
    float *b; /* (out, rank) */
} LoraPair;

typedef struct {
    char *name;    /* owned; what requests name the adapter by */
    int rank;
    float alpha;
    float scale;   /* alpha / rank */
    int n_layers;
    LoraPair *pairs; /* (n_layers, LORA_PROJ_COUNT) */
    size_t bytes;  /* fp32 memory the pairs take */
    /* Unloaded at run time (POST /v1/unload_lora_adapter): its pairs are freed, its name is kept so
     * a reader that raced the unload still reads valid memory; find/get skip it, its id is never
     * reused (a request cannot reach the cache blocks it left behind). */
    int retired;
    /* Which load of this name it is (1 = the first: every --lora adapter and a name's first run-time
     * load; k = its k-th load after k - 1 unloads). A generation above 1 qualifies the adapter's
     * cache namespace (lora_cache_name), so a reloaded name never sees the K/V its predecessor left. */
    unsigned generation;
} LoraAdapter;

/* Cache namespaces of adapters. A request names an adapter by its name; the prefix cache, the
 * residual tree and the routing hashes key its K/V by its cache name: the name itself for
 * generation 1 (so start-up adapters hash as they always did), else "NAME" LORA_GENERATION_SEP
 * "gK". The separator is a control character, which no run-time adapter name may hold
 * (coord/http/http_lora.h), so a cache name never equals another adapter's name. The coordinator sends
 * instances the cache name; lora_set_find resolves a suffixed one only to the live adapter of that
 * exact generation, so a request that raced an unload and reload of its adapter gets "unknown
 * adapter", never the other generation's weights. */
#define LORA_GENERATION_SEP '\x1f'
#define LORA_CACHE_NAME_MAX 300 /* bytes of a cache name, NUL included (names are at most 256 bytes) */
/* Writes adapter `name`'s cache name for `generation` into out; -1 when it does not fit. */
int lora_cache_name(const char *name, unsigned generation, char *out, size_t cap);
/* Whether `cache_name` (a name or a cache name) belongs to adapter `name`, whatever the generation. */
int lora_name_is(const char *cache_name, const char *name);

/* The adapters one server loaded (--lora, in order, then those loaded at run time). Adapter id k
 * (1-based) is adapters[k - 1]; id 0 is the base model. Every rank loads the --lora list in the same
 * order, so those ids agree; requests name adapters, so ids need not agree across processes.
 * The array is allocated once at LORA_SET_CAPACITY slots and never moves, so readers on other
 * threads (the coordinator's HTTP threads) may read it while one writer appends (lora_set_install
 * publishes n after filling the slot) or retires (lora_set_retire). */
#define LORA_SET_CAPACITY 256
typedef struct {
    int n;
    LoraAdapter *adapters;
} LoraSet;

/* Loads `path` as adapter `name` for a base model of config `base`. */
int lora_adapter_load(const char *path, const char *name, const ModelConfig *base, LoraAdapter *out, BraidError *err);
void lora_adapter_free(LoraAdapter *a);

/* Parses one --lora value "NAME=PATH" and loads it into the set (names must be unique). */
int lora_set_add_spec(LoraSet *set, const char *spec, const ModelConfig *base, BraidError *err);
/* Takes *ad over into the next free slot (published last); -1 with err when the set is full or the
 * name is already live. Returns its id via *id when non-NULL. */
int lora_set_install(LoraSet *set, LoraAdapter *ad, int *id, BraidError *err);
/* Retires the live adapter `name` (frees its pairs, keeps its name); -1 when there is none. */
int lora_set_retire(LoraSet *set, const char *name);
/* 1 when `name` names a retired adapter and no live one. */
int lora_set_was_retired(const LoraSet *set, const char *name);
/* The adapter id (1-based) named `name`, 0 for NULL or "" (the base model), -1 when unknown. A plain
 * name finds the live adapter of that name (whatever its generation); a cache name with a
 * generation suffix (lora_cache_name) finds it only when the generation matches. */
int lora_set_find(const LoraSet *set, const char *name);
/* The generation the next load of `name` gets: 1 + the retired adapters of that name. */
unsigned lora_set_next_generation(const LoraSet *set, const char *name);
/* The largest rank in the set (0 when empty or NULL): the ForkKV residual pool's width. */
int lora_set_max_rank(const LoraSet *set);
/* The adapter of id k (1..n), or NULL for the base model / an id out of range. */
const LoraAdapter *lora_set_get(const LoraSet *set, int id);
void lora_set_free(LoraSet *set);

/* The in/out widths of a projection of the base model. */
void lora_proj_dims(const ModelConfig *base, LoraProj proj, int *in, int *out);
/* "attn_q", "attn_k", "attn_v", "attn_output": the GGUF tensor stem of a projection. */
const char *lora_proj_stem(LoraProj proj);

#endif
