/*
 * batch_input.h — reads a `braid batch` input file (JSONL) into HTTP request bodies, so that
 * `braid-bench replay` sends the server exactly what `braid batch` would compute offline.
 *
 * Each line {"id", "prompt" | "messages", "max_tokens", "temperature", "top_p", "top_k", "seed",
 * "ignore_eos", "tenant", "adapter", "workflow_id", "agent"} becomes a body for /v1/completions
 * (prompt) or /v1/chat/completions (messages). braid batch's defaults are written out where the
 * server's differ (max_tokens 128, temperature 0, seed 0), so both sides decode alike. Empty label
 * strings are left out (braid batch reads "" as no label; the server refuses an empty label). The
 * id follows braid batch: the string, the integer as text, else "line-N". Values are not range
 * checked here: the server checks them and its 400 message is the request's result. A line that
 * is not a JSON object, or has neither a prompt string nor a non-empty messages array, becomes an
 * entry with an error and no body; one bad line never stops the others.
 * Called by: replay.c. Thread-safety: none needed (read once before the clients start).
 * Memory: batch_input_free releases every entry.
 */
#ifndef BRAID_BENCH_DRIVER_BATCH_INPUT_H
#define BRAID_BENCH_DRIVER_BATCH_INPUT_H

#include <jansson.h>

#include "common/error.h"

typedef struct {
    char *id;
    const char *path;   /* "/v1/completions" or "/v1/chat/completions"; NULL for a bad line */
    json_t *body;       /* NULL for a bad line */
    char error[256];    /* why the line cannot be sent; "" for a good line */
} BatchInputEntry;

typedef struct {
    BatchInputEntry *entries; /* in file order, blank lines skipped */
    int n;
} BatchInput;

/* Returns 0, or -1 with err set when the file cannot be read or memory runs out. */
int batch_input_read(const char *path, BatchInput *out, BraidError *err);
void batch_input_free(BatchInput *in);

#endif
