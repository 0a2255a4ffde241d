/*
 * cli_lora.h — the LoRA flags `braid batch` and `braid serve` share: --lora NAME=PATH (repeatable)
 * and --lora-cache separate|shared, and loading the named adapters against the model.
 *
 * --lora-cache separate (the default for now) gives every adapter its own prefix-cache namespace:
 * requests with the same tokens but different adapters never share KV blocks. `shared` (ForkKV:
 * a base cache shared by all adapters plus per-adapter residuals) is not implemented yet and is
 * refused at startup with that message.
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
    "                           shared (ForkKV) is not implemented yet\n"

typedef struct {
    const char *specs[CLI_MAX_LORA]; /* NAME=PATH, as given (borrowed from argv) */
    int n;
} CliLora;

/* Records one --lora value; -1 after a message when there are too many. */
int cli_parse_lora(const char *cmd, const char *spec, CliLora *l, bool verbose);
/* Checks --lora-cache: 0 for separate; -1 after a message for shared (not implemented yet) or anything else. */
int cli_parse_lora_cache(const char *cmd, const char *mode, bool verbose);
/* Loads every recorded adapter against the model's config into *set (empty when none); -1 after a
 * message naming the file and the problem (the set is then empty). */
int cli_load_lora(const char *cmd, const CliLora *l, const ModelConfig *base, LoraSet *set, bool verbose);

#endif
