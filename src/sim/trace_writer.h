/*
 * trace_writer.h — writes trace lines (docs/TRACE_FORMAT.md): one per request, with its labels,
 * lengths and the chained and position-free content hashes of its full prompt blocks, and one per
 * workflow end. The batch runner, the server (--trace-out), the load driver and the dry workload
 * generator all write through here, so every producer emits the same format.
 * Stateless; callers serialize writes to one FILE themselves.
 */
#ifndef BRAID_SIM_TRACE_WRITER_H
#define BRAID_SIM_TRACE_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    int seq;                /* arrival order */
    double t;               /* arrival time, seconds from the start of the trace */
    const char *id, *workflow, *agent, *tenant, *adapter; /* NULL is written as "" */
    const int32_t *prompt;  /* the prompt's token ids */
    int prompt_tokens;
    int output_tokens;
    int block_size;
    const float *hidden;    /* the prefill's last hidden state, written as "hidden" (base64), or NULL */
    int hidden_dim;
    bool with_tokens;       /* also write the prompt's token ids ("tokens"): braid sim's segment reuse reads them */
} TraceRecord;

/* One request line; the hashes are seeded by content_hash_namespace(tenant, adapter), as the cache's.
 * Returns 0, or -1 when out of memory or the write failed. */
int trace_write_request(FILE *f, const TraceRecord *rec);
/* {"type":"workflow_end","t":T,"workflow":W}. Returns 0 or -1. */
int trace_write_workflow_end(FILE *f, double t, const char *workflow);

#endif
