/* Planning a request's directives on the HTTP thread; the contract is in http_directives.h. */
#include "coord/http/http_directives.h"

#include <stdlib.h>
#include <string.h>

#include "coord/adapter_select.h"
#include "coord/api/chat_render.h"
#include "coord/auto_splice.h"
#include "coord/directive_plan.h"
#include "coord/cache_retention.h"

/* Bytes the rendering of messages[0..k] shares with the whole prompt's: where message k ends. */
static int message_end(const BraidModel *m, const ApiRequest *a, int k, const char *full, size_t *end, ApiError *e) {
    char *text = api_chat_render(&m->chat, api_chat_tool_syntax(&m->chat), a, k + 1, e);
    if (!text) return -1;
    size_t n = 0;
    while (text[n] && text[n] == full[n]) n++;
    free(text);
    *end = n;
    return 0;
}

static int cache_control_pins(const BraidModel *m, const ApiRequest *a, DirectivePin *pins, int *n_pins, ApiError *e) {
    *n_pins = 0;
    if (a->kind != API_CHAT) return 0;
    char *full = NULL;
    for (int k = 0; k < a->n_messages; k++) {
        if (a->messages[k].cache_ttl_s <= 0) continue;
        if (*n_pins == API_MAX_CACHE_CONTROL) {
            free(full);
            return api_error_set(e, 400, "messages", NULL, "at most %d messages may carry cache_control", API_MAX_CACHE_CONTROL);
        }
        if (!full && !(full = api_chat_render(&m->chat, api_chat_tool_syntax(&m->chat), a, a->n_messages, e))) return -1;
        DirectivePin *p = &pins[(*n_pins)++];
        p->ttl_s = a->messages[k].cache_ttl_s;
        p->message = k;
        if (message_end(m, a, k, full, &p->end_byte, e)) {
            free(full);
            return -1;
        }
    }
    free(full);
    return 0;
}

static int plan(const HttpGenerateContext *ctx, const ApiRequest *a, TokenList *ids, CacheDirectives *out, ApiError *e) {
    memset(out, 0, sizeof *out);
    DirectivePin pins[API_MAX_CACHE_CONTROL];
    int n_pins;
    if (cache_control_pins(ctx->model, a, pins, &n_pins, e)) return -1;
    if (a->n_directives == 0 && n_pins == 0) return 0;
    if (a->kind == API_COMPLETION && a->n_prompts > 1)
        return api_error_set(e, 400, "directives", NULL, "directives apply to one prompt; send a single prompt with them");
    /* Replacements are tokenized as the prompt was: chat text with control tokens, completion text without. */
    bool parse_special = a->kind == API_CHAT;
    if (directive_plan(&ctx->model->tokenizer, parse_special, ids, a->directives, a->n_directives, pins, n_pins, out, e)) return -1;
    /* The empty-prompt check ran on the prompt as sent; a splice may still remove every token (an
     * instance cannot run an empty prompt). */
    if (ids->n == 0) {
        cache_directives_free(out);
        memset(out, 0, sizeof *out);
        return api_error_set(e, 400, "directives", NULL, "the directives' splices leave an empty prompt; keep at least one token");
    }
    return 0;
}

/* auto_splice: without a splice of the client's, the server's own against the conversation's
 * recent prompts (auto_splice.h); the prompt as sent is the one the request runs. Its runs name
 * index n_directives (one past the client's list) in the outcomes. */
static int plan_auto_splice(const HttpGenerateContext *ctx, const ApiRequest *a, const TokenList *ids, CacheDirectives *out, ApiError *e) {
    if (a->auto_splice <= CACHE_SPLICE_NONE || !ctx->auto_splice || out->splice_mode != CACHE_SPLICE_NONE) return 0;
    if (a->kind == API_COMPLETION && a->n_prompts > 1) return 0; /* one conversation, one prompt */
    int rc = auto_splice_request(ctx->auto_splice, a->tenant, adapter_cache_name(a), a->conversation_id, a->workflow_id, ids->ids, ids->n,
                                 a->auto_splice, a->n_directives, out);
    return rc < 0 ? api_error_set(e, 503, NULL, NULL, "the server is out of memory") : 0;
}

int http_plan_directives(const HttpGenerateContext *ctx, const ApiRequest *a, TokenList *ids, CacheDirectives *out, ApiError *e) {
    if (plan(ctx, a, ids, out, e)) return -1;
    if (plan_auto_splice(ctx, a, ids, out, e)) {
        cache_directives_free(out);
        return -1;
    }
    if (a->prompt_cache_retention_s > 0 && cache_retention_add_pin(out, ids->n, a->prompt_cache_retention_s, e)) return -1;
    out->conversation = cache_conversation_scope(a->conversation_id);
    return 0;
}
