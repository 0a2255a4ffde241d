/*
 * cli_common.h — helpers shared by the subcommands: the default model path, thread setup, number
 * parsing with range checks, reading all of stdin.
 */
#ifndef BRAID_CLI_CLI_COMMON_H
#define BRAID_CLI_CLI_COMMON_H

#include <stddef.h>

#define BRAID_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* --model if given, else $BRAID_MODEL, else the default path. */
const char *cli_model_path(const char *flag_value);
/* Applies --threads (<= 0: all cores) to OpenMP and OpenBLAS; returns the count used. */
int cli_set_threads(int requested);
/* Strict number parsing: the whole string must parse and lie in [lo, hi]; else prints an error
 * naming the flag and returns -1. */
int cli_parse_int(const char *flag, const char *text, long lo, long hi, long *out);
int cli_parse_float(const char *flag, const char *text, double lo, double hi, double *out);
/* Reads stdin to a malloc'd buffer (NUL-terminated; *len excludes the NUL). NULL on failure. */
char *cli_read_stdin(size_t *len);

#endif
