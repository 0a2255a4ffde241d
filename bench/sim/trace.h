/*
 * trace.h — reads a JSONL trace (docs/TRACE_FORMAT.md) into memory for the simulator.
 *
 * Requests are sorted by (t, seq). Unknown fields and line types are ignored; malformed lines fail
 * with the line number. Owns all strings and hash arrays; trace_free releases them.
 */
#ifndef BRAID_BENCH_SIM_TRACE_H
#define BRAID_BENCH_SIM_TRACE_H

#include <stdint.h>

#include "common/error.h"

typedef struct {
    int seq;
    double t;
    char *id, *workflow, *agent;
    uint64_t ns;        /* namespace from tenant and adapter */
    int prompt_tokens, output_tokens;
    int n_blocks;
    uint64_t *blocks;   /* chained hashes of the full prompt blocks */
} TraceRequest;

typedef struct {
    TraceRequest *reqs;
    int n, cap;
    int block_size;
} Trace;

int trace_load(const char *path, Trace *trace, BraidError *err);
/* Parses one line (exposed for tests and fuzzing). Returns 1 for a request, 0 for a line to skip. */
int trace_parse_line(const char *line, TraceRequest *req, int *block_size, BraidError *err);
void trace_request_free(TraceRequest *req);
void trace_free(Trace *trace);

#endif
