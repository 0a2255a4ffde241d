/* Trace lines: the scalar fields through jansson (escaping), the hash arrays appended as text. */
#include "sim/trace_writer.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
#include "common/float_b64.h"

static const char *or_empty(const char *s) { return s ? s : ""; }

static void write_hashes(FILE *f, const char *key, const uint64_t *h, int n) {
    fprintf(f, ",\"%s\":[", key);
    for (int i = 0; i < n; i++) fprintf(f, i ? ",\"%016llx\"" : "\"%016llx\"", (unsigned long long)h[i]);
    fputc(']', f);
}

int trace_write_request(FILE *f, const TraceRecord *rec) {
    json_t *o = json_pack("{s:s, s:i, s:f, s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i}", "type", "request", "seq", rec->seq, "t",
                          rec->t, "id", or_empty(rec->id), "workflow", or_empty(rec->workflow), "agent", or_empty(rec->agent),
                          "tenant", or_empty(rec->tenant), "adapter", or_empty(rec->adapter), "prompt_tokens", rec->prompt_tokens,
                          "output_tokens", rec->output_tokens, "block_size", rec->block_size);
    if (o && rec->hidden && rec->hidden_dim > 0) {
        char *b64 = float_b64_encode(rec->hidden, rec->hidden_dim);
        if (!b64 || json_object_set_new(o, "hidden", json_string(b64))) {
            json_decref(o);
            o = NULL;
        }
        free(b64);
    }
    if (o && rec->with_tokens) {
        json_t *ids = json_array();
        for (int i = 0; ids && i < rec->prompt_tokens; i++)
            if (json_array_append_new(ids, json_integer(rec->prompt[i]))) json_decref(ids), ids = NULL;
        if (!ids || json_object_set_new(o, "tokens", ids)) {
            json_decref(o);
            o = NULL;
        }
    }
    char *head = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    int n_blocks = rec->block_size > 0 ? rec->prompt_tokens / rec->block_size : 0;
    uint64_t *chained = malloc((size_t)(n_blocks + 1) * sizeof *chained), *chunk = malloc((size_t)(n_blocks + 1) * sizeof *chunk);
    int rc = -1;
    if (head && chained && chunk) {
        uint64_t ns = content_hash_namespace(rec->tenant, rec->adapter);
        content_hash_blocks(ns, rec->prompt, n_blocks, rec->block_size, chained, chunk);
        head[strlen(head) - 1] = '\0'; /* reopen the object to append the hash arrays */
        fputs(head, f);
        write_hashes(f, "blocks", chained, n_blocks);
        write_hashes(f, "chunks", chunk, n_blocks);
        rc = fputs("}\n", f) == EOF ? -1 : 0;
    }
    free(head);
    free(chained);
    free(chunk);
    return rc;
}

int trace_write_workflow_end(FILE *f, double t, const char *workflow) {
    json_t *o = json_pack("{s:s, s:f, s:s}", "type", "workflow_end", "t", t, "workflow", or_empty(workflow));
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    int rc = line && fprintf(f, "%s\n", line) > 0 ? 0 : -1;
    free(line);
    return rc;
}
