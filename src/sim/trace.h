/*
 * trace.h — reads a JSONL trace (docs/TRACE_FORMAT.md) into memory for the simulator.
 *
 * Requests are sorted by (t, seq); workflow-end events by t. Unknown fields and line types are
 * ignored; malformed lines fail with the line number. Owns all strings and hash arrays; trace_free
 * releases them.
 */
#ifndef BRAID_SIM_TRACE_H
#define BRAID_SIM_TRACE_H

#include <stdint.h>

#include "common/error.h"

typedef struct {
    int seq;
    double t;
    char *id, *workflow, *agent, *tenant, *adapter; /* "" when absent */
    uint64_t ns;        /* content_hash_namespace(tenant, adapter): the seed of the block hashes */
    int prompt_tokens, output_tokens;
    int n_blocks;
    uint64_t *blocks;   /* chained hashes of the full prompt blocks */
    float *hidden;      /* the prefill's post-norm hidden state of the last prompt token, or NULL */
    int hidden_dim;     /* its width (0 when absent) */
    int32_t *tokens;    /* the prompt's token ids (prompt_tokens of them) when the line has "tokens", else NULL */
    double weight;      /* the tenant's weight in fair sharing (the line's "weight"; 0 when absent: 1) */
    struct SimDirectives *directives; /* the line's cache directives (sim_directives.h), or NULL */
} TraceRequest;

typedef struct {
    double t;
    char *workflow;
} TraceWorkflowEnd;

typedef struct {
    TraceRequest *reqs;
    int n, cap;
    TraceWorkflowEnd *ends;
    int n_ends, cap_ends;
    int block_size;
} Trace;

enum { TRACE_LINE_SKIP = 0, TRACE_LINE_REQUEST = 1, TRACE_LINE_WORKFLOW_END = 2 };

int trace_load(const char *path, Trace *trace, BraidError *err);
/* Parses one line (exposed for tests and fuzzing). Returns TRACE_LINE_REQUEST (req filled),
 * TRACE_LINE_WORKFLOW_END (only req->t and req->workflow filled), TRACE_LINE_SKIP for a line of
 * another type, or -1 with err set. */
int trace_parse_line(const char *line, TraceRequest *req, int *block_size, BraidError *err);
/* Regroups the block hashes for a block size `factor` times the trace's: the chained hash of every
 * factor-th block names the same prefix as the coarser block would. Returns 0, or -1 (factor < 1). */
int trace_coarsen_blocks(Trace *trace, int factor, BraidError *err);
/* Attaches hidden states from a hidden-state file (docs/TRACE_FORMAT.md: lines {"id", "hidden"},
 * as `braid batch --hidden-out` writes them) to the trace's requests with the same id, replacing
 * any a line carried. Every state must have one width (the trace's lines' too). *matched counts
 * the requests that got one. Errors name the file and line. */
int trace_attach_hidden(Trace *trace, const char *path, int *matched, BraidError *err);
/* The width of the trace's hidden states (0 when no request has one). */
int trace_hidden_dim(const Trace *trace);
/* Prompt token i of a request, for replays that run the scheduler: the trace's own ids when it has
 * them, else an id derived from block hash i / block_size (equal prefixes, equal ids), and past the
 * hashed blocks one unique to the request (its seq). */
int32_t trace_prompt_token(const TraceRequest *req, int i, int block_size);
void trace_request_free(TraceRequest *req);
void trace_free(Trace *trace);

#endif
