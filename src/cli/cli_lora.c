#include "cli/cli_lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_lora(const char *cmd, const char *spec, CliLora *l, bool verbose) {
    if (l->n == CLI_MAX_LORA) {
        if (verbose) fprintf(stderr, "braid %s: more than %d --lora adapters\n", cmd, CLI_MAX_LORA);
        return -1;
    }
    l->specs[l->n++] = spec; /* its NAME=PATH shape is checked when it is loaded */
    return 0;
}

int cli_parse_lora_cache(const char *cmd, const char *mode, CliLora *l, bool verbose) {
    if (strcmp(mode, "separate") == 0 || strcmp(mode, "shared") == 0 || strcmp(mode, "auto") == 0) {
        l->auto_mode = strcmp(mode, "auto") == 0;
        l->shared = l->auto_mode || strcmp(mode, "shared") == 0;
        return 0;
    }
    if (verbose) fprintf(stderr, "braid %s: --lora-cache expects separate, shared or auto, got '%s'\n", cmd, mode);
    return -1;
}

int cli_parse_residual_blocks(const char *cmd, const char *text, CliLora *l, bool verbose) {
    char *end;
    long v = strtol(text, &end, 10);
    if (*text && !*end && v >= 2 && v <= 1L << 24) {
        l->residual_blocks = v;
        return 0;
    }
    if (verbose) fprintf(stderr, "braid %s: --residual-blocks expects an integer from 2 to %ld, got '%s'\n", cmd, 1L << 24, text);
    return -1;
}

int cli_check_lora(const char *cmd, const CliLora *l, bool verbose) {
    const char *why = l->shared && l->n == 0 ? (l->auto_mode ? "--lora-cache auto needs at least one --lora adapter"
                                                              : "--lora-cache shared needs at least one --lora adapter")
                      : l->residual_blocks > 0 && !l->shared ? "--residual-blocks needs --lora-cache shared or auto"
                                                             : NULL;
    if (why && verbose) fprintf(stderr, "braid %s: %s\n", cmd, why);
    return why ? -1 : 0;
}

int cli_residual_blocks(const CliLora *l, long kv_blocks) {
    return (int)(l->residual_blocks > 0 ? l->residual_blocks : 2 * kv_blocks);
}

int cli_load_lora(const char *cmd, const CliLora *l, const ModelConfig *base, LoraSet *set, bool verbose) {
    BraidError err;
    memset(set, 0, sizeof *set);
    for (int i = 0; i < l->n; i++)
        if (lora_set_add_spec(set, l->specs[i], base, &err)) {
            if (verbose) fprintf(stderr, "braid %s: %s\n", cmd, err.msg);
            lora_set_free(set);
            return -1;
        }
    return 0;
}
