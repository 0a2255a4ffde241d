/* braid batch input lines to HTTP bodies; the contract is in batch_input.h. */
#include "batch_input.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* braid batch's decoding defaults where they differ from the server's (cmd_batch.c). */
#define BATCH_DEFAULT_MAX_TOKENS 128
#define BATCH_DEFAULT_TEMPERATURE 0.0
#define BATCH_DEFAULT_SEED 0

static char *entry_id(const json_t *line, int line_no) {
    const json_t *id = json_object_get(line, "id");
    char buf[64];
    if (json_is_string(id)) return strdup(json_string_value(id));
    if (json_is_integer(id)) snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(id));
    else snprintf(buf, sizeof buf, "line-%d", line_no);
    return strdup(buf);
}

/* Copies key from line to body when present (and, for labels, non-empty). */
static int copy_field(const json_t *line, json_t *body, const char *key, int skip_empty_string) {
    json_t *v = json_object_get(line, key);
    if (!v) return 0;
    if (skip_empty_string && json_is_string(v) && json_string_length(v) == 0) return 0;
    return json_object_set(body, key, v);
}

static int set_default(json_t *body, const char *key, json_t *value) {
    if (!value) return -1;
    if (json_object_get(body, key)) return json_decref(value), 0;
    return json_object_set_new(body, key, value);
}

/* Builds e->path and e->body from a line that is a JSON object; fills e->error for a bad one. */
static int build_body(const json_t *line, BatchInputEntry *e) {
    const json_t *prompt = json_object_get(line, "prompt"), *messages = json_object_get(line, "messages");
    if (json_is_string(prompt)) e->path = "/v1/completions";
    else if (json_is_array(messages) && json_array_size(messages) > 0) e->path = "/v1/chat/completions";
    else {
        snprintf(e->error, sizeof e->error, "each line needs a \"prompt\" string or a non-empty \"messages\" array");
        return 0;
    }
    static const char *const numbers[] = {"max_tokens", "temperature", "top_p", "top_k", "seed", "ignore_eos"};
    static const char *const labels[] = {"tenant", "adapter", "workflow_id", "agent", "segment_reuse"};
    json_t *body = json_object();
    int rc = body ? copy_field(line, body, json_is_string(prompt) ? "prompt" : "messages", 0) : -1;
    for (size_t i = 0; rc == 0 && i < sizeof numbers / sizeof numbers[0]; i++) rc = copy_field(line, body, numbers[i], 0);
    for (size_t i = 0; rc == 0 && i < sizeof labels / sizeof labels[0]; i++) rc = copy_field(line, body, labels[i], 1);
    if (rc == 0) rc = set_default(body, "max_tokens", json_integer(BATCH_DEFAULT_MAX_TOKENS));
    if (rc == 0) rc = set_default(body, "temperature", json_real(BATCH_DEFAULT_TEMPERATURE));
    if (rc == 0) rc = set_default(body, "seed", json_integer(BATCH_DEFAULT_SEED));
    if (rc) {
        json_decref(body);
        e->path = NULL;
        return -1;
    }
    e->body = body;
    return 0;
}

static int read_entry(const char *text, int line_no, BatchInputEntry *e) {
    json_error_t jerr;
    json_t *line = json_loads(text, 0, &jerr);
    int rc = 0;
    if (!json_is_object(line)) {
        char id[32];
        snprintf(id, sizeof id, "line-%d", line_no);
        e->id = strdup(id);
        snprintf(e->error, sizeof e->error, "line %d is not a JSON object: %s", line_no, line ? "wrong type" : jerr.text);
    } else {
        e->id = entry_id(line, line_no);
        rc = build_body(line, e);
    }
    json_decref(line);
    return rc == 0 && e->id ? 0 : -1;
}

static int grow(BatchInput *in, int *cap) {
    if (in->n < *cap) return 0;
    int next = *cap ? *cap * 2 : 64;
    BatchInputEntry *grown = realloc(in->entries, (size_t)next * sizeof *grown);
    if (!grown) return -1;
    in->entries = grown;
    *cap = next;
    return 0;
}

int batch_input_read(const char *path, BatchInput *out, BraidError *err) {
    *out = (BatchInput){0};
    FILE *f = fopen(path, "r");
    if (!f) return braid_error_set(err, "cannot open %s", path);
    char *line = NULL;
    size_t line_cap = 0;
    int line_no = 0, cap = 0, rc = 0;
    while (rc == 0 && getline(&line, &line_cap, f) > 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        if (grow(out, &cap)) {
            rc = braid_error_set(err, "%s: out of memory at line %d", path, line_no);
            break;
        }
        BatchInputEntry *e = &out->entries[out->n++];
        *e = (BatchInputEntry){0};
        if (read_entry(line, line_no, e)) rc = braid_error_set(err, "%s: out of memory at line %d", path, line_no);
    }
    if (rc == 0 && ferror(f)) rc = braid_error_set(err, "error reading %s", path);
    free(line);
    fclose(f);
    if (rc) batch_input_free(out);
    return rc;
}

void batch_input_free(BatchInput *in) {
    for (int i = 0; i < in->n; i++) {
        free(in->entries[i].id);
        json_decref(in->entries[i].body);
    }
    free(in->entries);
    *in = (BatchInput){0};
}
