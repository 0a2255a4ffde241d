/*
 * prompt_trace.h — the trace of a live run (docs/TRACE_FORMAT.md), for `braid sim` to replay.
 *
 * Owns: the model's tokenizer (read from the GGUF file; no weights are loaded) and the trace file.
 * Each request's prompt is tokenized exactly as the server's /v1/completions tokenizes a plain
 * prompt (special-token text not parsed, BOS as the model asks: src/coord/http/http_generate.c), so the
 * block hashes match the ones the server computed. Lines are written through src/sim's
 * trace_writer as requests finish, so they are in finish order with arrival times and seq numbers
 * (readers sort, as for the server's own trace).
 * Called by: run.c, from any of its threads. Thread-safety: every function may be called from
 * several threads at once (tokenizing is concurrent; writes are serialized inside).
 */
#ifndef BRAID_BENCH_DRIVER_PROMPT_TRACE_H
#define BRAID_BENCH_DRIVER_PROMPT_TRACE_H

#include "common/error.h"

typedef struct PromptTrace PromptTrace;

typedef struct {
    int seq;            /* arrival order */
    double t;           /* arrival (send) time, seconds from the start of the run */
    const char *id, *workflow, *agent, *tenant, *adapter;
    const char *prompt; /* the prompt text as sent */
    int output_tokens;
} PromptTraceRequest;

/* Loads the tokenizer from model_path and creates out_path. block_size: the server's KV block size.
 * Returns NULL with err set. */
PromptTrace *prompt_trace_open(const char *model_path, const char *out_path, int block_size, BraidError *err);

/* Tokenizes and writes one request line; *prompt_tokens gets the token count (to check against the
 * server's usage). Returns 0, or -1 with err set. */
int prompt_trace_request(PromptTrace *t, const PromptTraceRequest *req, int *prompt_tokens, BraidError *err);

/* Writes a workflow-end line. Returns 0, or -1 with err set. */
int prompt_trace_workflow_end(PromptTrace *t, double t_s, const char *workflow, BraidError *err);

/* Flushes and closes the file, frees everything. Returns 0, or -1 with err set when a write failed
 * (t is freed either way). NULL is fine. */
int prompt_trace_close(PromptTrace *t, BraidError *err);

#endif
