/*
 * cli_lora.h — the LoRA flags `braid batch` and `braid serve` share: --lora NAME=PATH (repeatable)
 * and --lora-cache separate|shared, and loading the named adapters against the model.
 *
 * --lora-cache separate (the default) gives every adapter its own prefix-cache namespace:
 * requests with the same tokens but different adapters never share KV blocks. `shared` is ForkKV
 * (worker/sched_forkkv.h): one base cache for every adapter plus per-adapter rank-r residuals in
 * a pool of --residual-blocks blocks (default twice --kv-blocks: a residual block is kv_dim/rank
 * times smaller than a base block, 12x for SmolLM2-135M at rank 16, so that is 1/6 of the base
 * pool's memory). `auto` allocates the same pools and decides per adapted request whether it forks
 * (as shared) or takes a separate cache of its adapter in the base pool (as separate), by a cost
 * model measured at start-up and on the live requests (worker/forkkv_cost.h).
 * Errors are printed on stderr, prefixed "braid <command>: " (only when verbose: under mpirun
 * every rank parses, rank 0 speaks).
 */
#ifndef BRAID_CLI_CLI_LORA_H
#define BRAID_CLI_CLI_LORA_H

#include <stdbool.h>

#include "model/lora_adapter.h"
#include "model/model_config.h"

#define CLI_MAX_LORA 64

#define CLI_LORA_FLAGS_USAGE                                                                                         \
    "  --lora NAME=PATH         load a LoRA adapter (llama.cpp's GGUF adapter layout, e.g. adapters/*.gguf;\n" \
    "                           repeatable, at most 64); a request runs it when it names NAME as \"adapter\" (or,\n" \
    "                           in serve, the X-Braid-Adapter header or \"model\"); CPU backend and --tp 1 only\n"     \
    "  --lora-cache MODE        separate (default): a prefix cache per adapter, no KV shared across adapters;\n"     \
    "                           shared (ForkKV): one base cache for all adapters + small per-adapter residuals;\n"   \
    "                           auto: shared's pools, each request forks or takes a separate cache by a measured\n" \
    "                           cost model (attention penalty vs memory saved)\n"                                      \
    "  --residual-blocks N      ForkKV residual pool blocks with --lora-cache shared|auto (default 2 x --kv-blocks)\n"

typedef struct {
    const char *specs[CLI_MAX_LORA]; /* NAME=PATH, as given (borrowed from argv) */
    int n;
    bool shared;          /* --lora-cache shared or auto (the ForkKV pools) */
    bool auto_mode;       /* --lora-cache auto */
    long residual_blocks; /* --residual-blocks; 0 = the default */
} CliLora;

/* Records one --lora value; -1 after a message when there are too many. */
int cli_parse_lora(const char *cmd, const char *spec, CliLora *l, bool verbose);
/* Records --lora-cache separate|shared|auto; -1 after a message for anything else. */
int cli_parse_lora_cache(const char *cmd, const char *mode, CliLora *l, bool verbose);
/* Records --residual-blocks (an integer >= 2); -1 after a message otherwise. */
int cli_parse_residual_blocks(const char *cmd, const char *text, CliLora *l, bool verbose);
/* After parsing: shared needs an adapter, --residual-blocks needs shared; -1 after a message. */
int cli_check_lora(const char *cmd, const CliLora *l, bool verbose);
/* The residual pool size to use with a base pool of kv_blocks. */
int cli_residual_blocks(const CliLora *l, long kv_blocks);
/* Loads every recorded adapter against the model's config into *set (empty when none); -1 after a
 * message naming the file and the problem (the set is then empty). */
int cli_load_lora(const char *cmd, const CliLora *l, const ModelConfig *base, LoraSet *set, bool verbose);

#endif
