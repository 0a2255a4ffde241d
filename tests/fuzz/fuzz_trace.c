/*
 * Fuzz target for the trace reader (src/sim/trace.c, docs/TRACE_FORMAT.md): the input is loaded as
 * a whole JSONL trace file. An accepted trace must keep what trace.h promises (requests sorted by
 * (t, seq), strings never NULL, block counts matching their arrays, hidden states with a width) and
 * survive regrouping its blocks; a refused one must say why. The input's first line also goes
 * through trace_parse_line on its own. Any broken promise calls abort(). Replayed over
 * corpus_trace/ plus mutations in every CI run.
 */
#include "fuzz_input_file.h"

#include <string.h>

#include "sim/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_trace(const Trace *t) {
    for (int i = 0; i < t->n; i++) {
        const TraceRequest *r = &t->reqs[i];
        if (!r->id || !r->workflow || !r->agent || !r->tenant || !r->adapter) abort();
        if (r->n_blocks < 0 || (r->n_blocks > 0 && !r->blocks)) abort();
        if (r->prompt_tokens < 0 || r->output_tokens < 0) abort();
        if (r->hidden && r->hidden_dim < 1) abort();
        if (i > 0 && (t->reqs[i - 1].t > r->t || (t->reqs[i - 1].t == r->t && t->reqs[i - 1].seq > r->seq))) abort();
    }
    for (int i = 1; i < t->n_ends; i++)
        if (t->ends[i - 1].t > t->ends[i].t) abort();
}

static void parse_first_line(const uint8_t *data, size_t size) {
    size_t n = 0;
    while (n < size && data[n] != '\n') n++;
    char *line = malloc(n + 1);
    if (!line) return;
    memcpy(line, data, n);
    line[n] = '\0';
    TraceRequest req;
    memset(&req, 0, sizeof req);
    int block_size = 0;
    BraidError err;
    err.msg[0] = '\0';
    int kind = trace_parse_line(line, &req, &block_size, &err);
    if (kind < 0 && err.msg[0] == '\0') abort();
    if (kind == TRACE_LINE_REQUEST || kind == TRACE_LINE_WORKFLOW_END) trace_request_free(&req);
    free(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_input_file(data, size, path, sizeof path);
    Trace trace;
    memset(&trace, 0, sizeof trace);
    BraidError err;
    err.msg[0] = '\0';
    if (trace_load(path, &trace, &err) == 0) {
        check_trace(&trace);
        if (trace_coarsen_blocks(&trace, 2, &err)) abort(); /* factor 2 is always valid */
        check_trace(&trace);
    } else if (err.msg[0] == '\0') {
        abort();
    }
    trace_free(&trace);
    close(fd);
    parse_first_line(data, size);
    return 0;
}
