/*
 * Fuzz target for the OpenAI request parser (src/coord/api_request.c): the input is parsed as a
 * chat body and as a completion body. An accepted request must satisfy the documented invariants;
 * a refused one must have a 4xx/5xx status and render as valid error JSON. The input's first bytes
 * also go in as X-Braid-* header values. Any broken promise calls abort(), so libFuzzer and the
 * replay test (replay_main.c) report it like a crash. Built as a libFuzzer binary with
 * -DBRAID_FUZZ=ON (clang), and replayed over corpus_api_request/ plus mutations in every CI run.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coord/api/api_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SERVED_MODEL "braid-fuzz"
#define HEADER_BYTES 300 /* a little past API_MAX_LABEL_BYTES, so both sides of the limit are reached */

/* The error must be an HTTP error status and its JSON must parse with the four OpenAI keys. */
static void check_error(const ApiError *e) {
    if (e->status < 400 || e->status > 599) abort();
    char *text = api_error_json(e);
    if (!text) abort();
    json_t *root = json_loads(text, 0, NULL);
    json_t *inner = root ? json_object_get(root, "error") : NULL;
    if (!json_is_object(inner) || json_object_size(inner) != 4 || !json_is_string(json_object_get(inner, "message")) ||
        !json_is_string(json_object_get(inner, "type")))
        abort();
    json_decref(root);
    free(text);
}

static void check_label(const char *s) {
    if (s && (s[0] == '\0' || strlen(s) > API_MAX_LABEL_BYTES)) abort();
}

/* What api_request.h promises about an accepted request. */
static void check_request(const ApiRequest *r, ApiKind kind) {
    if (r->kind != kind) abort();
    if (kind == API_CHAT && (r->n_messages < 1 || r->n_messages > API_MAX_MESSAGES || r->prompts)) abort();
    if (kind == API_COMPLETION && (r->n_prompts < 1 || r->n_prompts > API_MAX_PROMPTS || r->messages)) abort();
    for (int i = 0; i < r->n_prompts; i++) {
        const ApiPrompt *p = &r->prompts[i];
        if (!p->text == !p->ids || (p->ids && p->n_ids < 1)) abort(); /* exactly one form, ids never empty */
        for (int k = 0; k < p->n_ids; k++)
            if (p->ids[k] < 0) abort();
    }
    if (r->n < 1 || r->n > API_MAX_N || r->n * (r->n_prompts ? r->n_prompts : 1) > API_MAX_CHOICES) abort();
    if (r->logprobs < -1 || r->logprobs > API_MAX_TOP_LOGPROBS) abort();
    for (int i = 0; i < r->n_messages; i++)
        if (!r->messages[i].role || !r->messages[i].content) abort();
    if (r->max_tokens != -1 && (r->max_tokens < 1 || r->max_tokens > API_MAX_TOKENS_LIMIT)) abort();
    if (!(r->temperature >= 0.0 && r->temperature <= 2.0) || !(r->top_p > 0.0 && r->top_p <= 1.0) || r->top_k < 0) abort();
    if (r->n_stop < 0 || r->n_stop > API_MAX_STOPS) abort();
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || r->stop[i][0] == '\0') abort();
    if (r->include_usage && !r->stream) abort();
    check_label(r->workflow_id);
    check_label(r->agent);
    check_label(r->tenant);
    check_label(r->adapter);
}

/* The input's first bytes as a NUL-terminated header value, as an HTTP library would hand it over. */
static void apply_input_as_headers(ApiRequest *r, const uint8_t *data, size_t size) {
    char value[HEADER_BYTES + 1];
    size_t n = size < HEADER_BYTES ? size : HEADER_BYTES;
    memcpy(value, data, n);
    value[n] = '\0';
    ApiError e;
    if (api_request_apply_headers(r, value, NULL, value, value, &e) != 0) check_error(&e);
    check_request(r, r->kind);
}

static void run_kind(const uint8_t *data, size_t size, ApiKind kind) {
    ApiRequest r;
    ApiError e;
    if (api_request_parse((const char *)data, size, kind, SERVED_MODEL, &r, &e) != 0) {
        check_error(&e);
        if (r.messages || r.prompts || r.stop || r.model) abort(); /* a refused parse leaves nothing behind */
        return;
    }
    check_request(&r, kind);
    apply_input_as_headers(&r, data, size);
    api_request_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    run_kind(data, size, API_CHAT);
    run_kind(data, size, API_COMPLETION);
    /* Raw input quoted into a message (as the HTTP layer quotes a URL) must still render as JSON. */
    ApiError e;
    api_error_set(&e, 404, NULL, NULL, "no endpoint %.*s", (int)(size < 400 ? size : 400), (const char *)data);
    check_error(&e);
    return 0;
}
