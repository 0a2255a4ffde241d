#include "cli/cli_lora.h"

#include <stdio.h>
#include <string.h>

int cli_parse_lora(const char *cmd, const char *spec, CliLora *l, bool verbose) {
    if (l->n == CLI_MAX_LORA) {
        if (verbose) fprintf(stderr, "braid %s: more than %d --lora adapters\n", cmd, CLI_MAX_LORA);
        return -1;
    }
    l->specs[l->n++] = spec; /* its NAME=PATH shape is checked when it is loaded */
    return 0;
}

int cli_parse_lora_cache(const char *cmd, const char *mode, bool verbose) {
    if (strcmp(mode, "separate") == 0) return 0;
    if (verbose) {
        if (strcmp(mode, "shared") == 0)
            fprintf(stderr, "braid %s: --lora-cache shared (ForkKV) is not implemented yet; use --lora-cache separate\n", cmd);
        else
            fprintf(stderr, "braid %s: --lora-cache expects separate or shared, got '%s'\n", cmd, mode);
    }
    return -1;
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
