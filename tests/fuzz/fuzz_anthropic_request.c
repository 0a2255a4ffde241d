/*
 * Fuzz target for the Anthropic Messages request parser (src/coord/api/anthropic_request.c): the
 * input is parsed as a /v1/messages body and as a count_tokens body. An accepted request must be a
 * chat request satisfying api_request.h's invariants, with at most ANTHROPIC_MAX_BREAKPOINTS pinned
 * messages holding only Anthropic's TTLs; a refused one must have a 4xx/5xx status and render as
 * Anthropic's error JSON. Any broken promise calls abort(). Built as a libFuzzer binary with
 * -DBRAID_FUZZ=ON (clang), and replayed over corpus_anthropic_request/ plus mutations in CI.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coord/api/anthropic_request.h"
#include "coord/api/anthropic_response.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(const ApiError *e) {
    if (e->status < 400 || e->status > 599) abort();
    char *text = anthropic_error_json(e);
    if (!text) abort();
    json_t *root = json_loads(text, 0, NULL);
    json_t *inner = root ? json_object_get(root, "error") : NULL;
    if (!json_is_string(json_object_get(root, "type")) || !json_is_string(json_object_get(inner, "type")) ||
        !json_is_string(json_object_get(inner, "message")))
        abort();
    json_decref(root);
    free(text);
}

static void check_request(const ApiRequest *r, AnthropicEndpoint endpoint) {
    if (r->kind != API_CHAT || r->n_messages < 1 || r->prompts) abort();
    if (endpoint == ANTHROPIC_MESSAGES && (r->max_tokens < 1 || r->max_tokens > API_MAX_TOKENS_LIMIT)) abort();
    if (endpoint == ANTHROPIC_COUNT_TOKENS && r->max_tokens != -1) abort();
    if (!(r->temperature >= 0.0 && r->temperature <= 1.0) || r->n_stop > API_MAX_STOPS) abort();
    int pinned = 0;
    for (int i = 0; i < r->n_messages; i++) {
        const ApiMessage *m = &r->messages[i];
        if (!m->role || !m->content) abort();
        if (m->cache_ttl_s != 0 && m->cache_ttl_s != 300 && m->cache_ttl_s != 3600) abort();
        pinned += m->cache_ttl_s > 0;
    }
    if (pinned > ANTHROPIC_MAX_BREAKPOINTS) abort();
}

static void run(const uint8_t *data, size_t size, AnthropicEndpoint endpoint) {
    ApiRequest r;
    ApiError e;
    char *translated = (char *)1;
    if (anthropic_request_parse((const char *)data, size, endpoint, &r, &translated, &e) != 0) {
        check_error(&e);
        if (r.messages || r.n_messages || translated) abort(); /* refused: nothing left to free */
        return;
    }
    check_request(&r, endpoint);
    /* The translated body is an OpenAI chat body the OpenAI parser accepts as well. */
    ApiRequest again;
    if (!translated || api_request_parse(translated, strlen(translated), API_CHAT, NULL, &again, &e) != 0) abort();
    if (again.n_messages != r.n_messages) abort();
    api_request_free(&again);
    free(translated);
    api_request_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    run(data, size, ANTHROPIC_MESSAGES);
    run(data, size, ANTHROPIC_COUNT_TOKENS);
    return 0;
}
