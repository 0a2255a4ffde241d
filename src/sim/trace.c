#include "sim/trace.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
#include "common/float_b64.h"
#include "common/grow.h"
#include "common/strmap.h"
#include "sim/sim_directives.h"

#define TRACE_MAX_HIDDEN 65536

static char *dup_field(json_t *obj, const char *key) {
    const char *v = json_string_value(json_object_get(obj, key));
    return strdup(v ? v : "");
}

void trace_request_free(TraceRequest *r) {
    free(r->id);
    free(r->workflow);
    free(r->agent);
    free(r->tenant);
    free(r->adapter);
    free(r->blocks);
    free(r->hidden);
    free(r->tokens);
    sim_directives_free(r->directives);
    memset(r, 0, sizeof *r);
}

/* "tokens": prompt_tokens non-negative 32-bit ids, or absent. */
static int parse_tokens(const json_t *ids, TraceRequest *r, BraidError *err) {
    if (!ids) return 0;
    if (!json_is_array(ids) || (int)json_array_size(ids) != r->prompt_tokens)
        return braid_error_set(err, "tokens must be an array of prompt_tokens (%d) token ids", r->prompt_tokens);
    if (!(r->tokens = malloc(((size_t)r->prompt_tokens + 1) * sizeof *r->tokens))) return braid_error_set(err, "out of memory");
    for (int i = 0; i < r->prompt_tokens; i++) {
        const json_t *v = json_array_get(ids, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return braid_error_set(err, "token %d is not a non-negative 32-bit id", i);
        r->tokens[i] = (int32_t)json_integer_value(v);
    }
    return 0;
}

static int parse_request(json_t *o, TraceRequest *r, int *block_size, BraidError *err) {
    json_t *blocks = json_object_get(o, "blocks"), *bs = json_object_get(o, "block_size");
    json_t *pt = json_object_get(o, "prompt_tokens"), *ot = json_object_get(o, "output_tokens");
    if (!json_is_array(blocks) || !json_is_integer(bs) || !json_is_integer(pt) || !json_is_integer(ot))
        return braid_error_set(err, "request needs blocks, block_size, prompt_tokens and output_tokens");
    if (json_integer_value(bs) < 1 || json_integer_value(pt) < 0 || json_integer_value(ot) < 0 ||
        json_integer_value(pt) > (1 << 24) || json_integer_value(ot) > (1 << 24) || json_integer_value(bs) > 4096)
        return braid_error_set(err, "block_size, prompt_tokens or output_tokens out of range");
    if (*block_size && *block_size != (int)json_integer_value(bs))
        return braid_error_set(err, "block_size %lld differs from earlier lines (%d)", (long long)json_integer_value(bs), *block_size);
    *block_size = (int)json_integer_value(bs);
    r->prompt_tokens = (int)json_integer_value(pt);
    r->output_tokens = (int)json_integer_value(ot);
    r->n_blocks = (int)json_array_size(blocks);
    if (r->n_blocks > r->prompt_tokens / *block_size) return braid_error_set(err, "more blocks than full prompt blocks");
    r->blocks = malloc((size_t)(r->n_blocks + 1) * sizeof *r->blocks);
    if (!r->blocks) return braid_error_set(err, "out of memory");
    for (int i = 0; i < r->n_blocks; i++) {
        const char *hex = json_string_value(json_array_get(blocks, (size_t)i));
        char *end;
        if (!hex || !*hex || strlen(hex) > 16) return braid_error_set(err, "block hash %d is not a 64-bit hex string", i);
        r->blocks[i] = strtoull(hex, &end, 16);
        if (*end) return braid_error_set(err, "block hash %d is not a 64-bit hex string", i);
    }
    json_t *seq = json_object_get(o, "seq"), *t = json_object_get(o, "t");
    r->seq = json_is_integer(seq) ? (int)json_integer_value(seq) : 0;
    r->t = json_is_number(t) ? json_number_value(t) : 0.0;
    r->id = dup_field(o, "id");
    r->workflow = dup_field(o, "workflow");
    r->agent = dup_field(o, "agent");
    r->tenant = dup_field(o, "tenant");
    r->adapter = dup_field(o, "adapter");
    if (!r->id || !r->workflow || !r->agent || !r->tenant || !r->adapter) return braid_error_set(err, "out of memory");
    r->ns = content_hash_namespace(r->tenant, r->adapter);
    json_t *weight = json_object_get(o, "weight");
    r->weight = json_is_number(weight) && json_number_value(weight) > 0 ? json_number_value(weight) : 0;
    json_t *hidden = json_object_get(o, "hidden");
    if (hidden && json_is_string(hidden) && !(r->hidden = float_b64_decode(json_string_value(hidden), TRACE_MAX_HIDDEN, &r->hidden_dim)))
        return braid_error_set(err, "hidden is not base64 of at most %d finite float32 values", TRACE_MAX_HIDDEN);
    if (parse_tokens(json_object_get(o, "tokens"), r, err)) return -1;
    json_t *directives = json_object_get(o, "directives");
    if (directives && sim_directives_parse(directives, r->prompt_tokens, &r->directives, err)) return -1;
    return TRACE_LINE_REQUEST;
}

static int parse_workflow_end(json_t *o, TraceRequest *r, BraidError *err) {
    json_t *t = json_object_get(o, "t");
    const char *wf = json_string_value(json_object_get(o, "workflow"));
    if (!json_is_number(t) || !wf) return braid_error_set(err, "workflow_end needs a numeric t and a workflow string");
    r->t = json_number_value(t);
    if (!(r->workflow = strdup(wf))) return braid_error_set(err, "out of memory");
    return TRACE_LINE_WORKFLOW_END;
}

int trace_parse_line(const char *line, TraceRequest *r, int *block_size, BraidError *err) {
    memset(r, 0, sizeof *r);
    json_error_t jerr;
    json_t *o = json_loads(line, 0, &jerr);
    if (!json_is_object(o)) {
        json_decref(o);
        return braid_error_set(err, "not a JSON object (%s)", o ? "wrong type" : jerr.text);
    }
    const char *type = json_string_value(json_object_get(o, "type"));
    int rc = TRACE_LINE_SKIP;
    if (type && strcmp(type, "request") == 0) rc = parse_request(o, r, block_size, err);
    else if (type && strcmp(type, "workflow_end") == 0) rc = parse_workflow_end(o, r, err);
    if (rc <= 0) trace_request_free(r);
    json_decref(o);
    return rc;
}

static int by_time(const void *a, const void *b) {
    const TraceRequest *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Takes ownership of the parsed line's strings. */
static int store_line(Trace *trace, int kind, TraceRequest *r) {
    if (kind == TRACE_LINE_WORKFLOW_END) {
        if (braid_grow((void **)&trace->ends, &trace->cap_ends, trace->n_ends + 1, sizeof *trace->ends)) {
            trace_request_free(r);
            return -1;
        }
        trace->ends[trace->n_ends++] = (TraceWorkflowEnd){.t = r->t, .workflow = r->workflow};
        r->workflow = NULL;
        trace_request_free(r);
        return 0;
    }
    if (braid_grow((void **)&trace->reqs, &trace->cap, trace->n + 1, sizeof *trace->reqs)) {
        trace_request_free(r);
        return -1;
    }
    trace->reqs[trace->n++] = *r;
    return 0;
}

static int end_by_time(const void *a, const void *b) {
    const TraceWorkflowEnd *x = a, *y = b;
    return (x->t > y->t) - (x->t < y->t);
}

int trace_load(const char *path, Trace *trace, BraidError *err) {
    memset(trace, 0, sizeof *trace);
    FILE *f = fopen(path, "r");
    if (!f) return braid_error_set(err, "trace: cannot open %s", path);
    char *line = NULL;
    size_t cap = 0;
    int line_no = 0, rc = 0;
    while (rc == 0 && getline(&line, &cap, f) > 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        TraceRequest r;
        int got = trace_parse_line(line, &r, &trace->block_size, err);
        if (got < 0) rc = braid_error_wrap(err, "trace: %s:%d", path, line_no);
        else if (got != TRACE_LINE_SKIP && store_line(trace, got, &r)) rc = braid_error_set(err, "trace: out of memory");
    }
    free(line);
    fclose(f);
    if (rc) {
        trace_free(trace);
        return -1;
    }
    if (trace->n) qsort(trace->reqs, (size_t)trace->n, sizeof *trace->reqs, by_time);
    if (trace->n_ends) qsort(trace->ends, (size_t)trace->n_ends, sizeof *trace->ends, end_by_time);
    return 0;
}

int trace_coarsen_blocks(Trace *trace, int factor, BraidError *err) {
    if (factor < 1) return braid_error_set(err, "trace: block grouping factor %d < 1", factor);
    for (int i = 0; i < trace->n; i++) {
        TraceRequest *r = &trace->reqs[i];
        int n = r->n_blocks / factor;
        for (int b = 0; b < n; b++) r->blocks[b] = r->blocks[(b + 1) * factor - 1];
        r->n_blocks = n;
    }
    trace->block_size *= factor;
    return 0;
}

void trace_free(Trace *trace) {
    for (int i = 0; i < trace->n; i++) trace_request_free(&trace->reqs[i]);
    free(trace->reqs);
    for (int i = 0; i < trace->n_ends; i++) free(trace->ends[i].workflow);
    free(trace->ends);
    memset(trace, 0, sizeof *trace);
}

int trace_hidden_dim(const Trace *trace) {
    for (int i = 0; i < trace->n; i++)
        if (trace->reqs[i].hidden) return trace->reqs[i].hidden_dim;
    return 0;
}

/* One line of a hidden-state file into req (found by id) or nowhere. Returns 1 matched, 0 not, -1 error. */
static int attach_line(Trace *trace, StrMap *ids, const char *line, int *dim, BraidError *err) {
    json_error_t jerr;
    json_t *o = json_loads(line, 0, &jerr);
    const char *id = json_string_value(json_object_get(o, "id")), *h = json_string_value(json_object_get(o, "hidden"));
    int rc = 0, n = 0;
    int32_t at;
    float *v = NULL;
    if (!json_is_object(o) || !id || !h) rc = braid_error_set(err, "needs a string id and a string hidden");
    else if (!(v = float_b64_decode(h, TRACE_MAX_HIDDEN, &n)) || n == 0)
        rc = braid_error_set(err, "hidden is not base64 of 1..%d finite float32 values", TRACE_MAX_HIDDEN);
    else if (*dim && n != *dim) rc = braid_error_set(err, "a hidden state of %d values where earlier ones have %d", n, *dim);
    else if (strmap_get(ids, id, strlen(id), &at)) {
        *dim = n;
        free(trace->reqs[at].hidden);
        trace->reqs[at].hidden = v;
        trace->reqs[at].hidden_dim = n;
        v = NULL;
        rc = 1;
    }
    free(v);
    json_decref(o);
    return rc;
}

int trace_attach_hidden(Trace *trace, const char *path, int *matched, BraidError *err) {
    *matched = 0;
    StrMap *ids = strmap_create(trace->n > 16 ? (size_t)trace->n * 2 : 32);
    if (!ids) return braid_error_set(err, "trace: out of memory");
    for (int i = 0; i < trace->n; i++)
        if (strmap_put(ids, trace->reqs[i].id, strlen(trace->reqs[i].id), i)) {
            strmap_destroy(ids);
            return braid_error_set(err, "trace: out of memory");
        }
    FILE *f = fopen(path, "r");
    if (!f) {
        strmap_destroy(ids);
        return braid_error_set(err, "trace: cannot open hidden-state file %s", path);
    }
    int dim = trace_hidden_dim(trace), line_no = 0, rc = 0;
    char *line = NULL;
    size_t cap = 0;
    while (rc >= 0 && getline(&line, &cap, f) > 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        rc = attach_line(trace, ids, line, &dim, err);
        if (rc > 0) (*matched)++;
        if (rc < 0) braid_error_wrap(err, "trace: %s:%d", path, line_no);
    }
    free(line);
    fclose(f);
    strmap_destroy(ids);
    return rc < 0 ? -1 : 0;
}

/* murmur3's 64-bit finaliser, kept as the replays had it so derived ids (and so replay figures) stay the same. */
static uint64_t derive_token_hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

int32_t trace_prompt_token(const TraceRequest *req, int i, int block_size) {
    if (req->tokens && i < req->prompt_tokens) return req->tokens[i];
    uint64_t h = i / block_size < req->n_blocks ? derive_token_hash(req->blocks[i / block_size] + (uint64_t)(i % block_size))
                                                : derive_token_hash(((uint64_t)req->seq << 32) ^ (uint64_t)i ^ 0x5bd1e995ULL);
    return (int32_t)(h & 0x3fffffff);
}
