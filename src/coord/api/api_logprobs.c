/* OpenAI logprobs objects; the contract is in api_logprobs.h. */
#include "coord/api/api_logprobs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coord/text_stream.h"

/* A token's bytes: the longest piece in the vocabularies Braid reads is far below this. */
#define TOKEN_TEXT_CAP 256

typedef struct {
    char bytes[TOKEN_TEXT_CAP];
    size_t len;
} TokenText;

static TokenText token_text(const Tokenizer *tok, int32_t id) {
    TokenText t;
    size_t full = tokenizer_token_bytes(tok, id, t.bytes, sizeof t.bytes);
    t.len = full < sizeof t.bytes ? full : sizeof t.bytes;
    return t;
}

/* The token's text as a JSON string of valid UTF-8. */
static json_t *token_string(const TokenText *t) {
    size_t len;
    char *clean = utf8_sanitize(t->bytes, t->len, &len);
    json_t *s = clean ? json_stringn(clean, len) : NULL;
    free(clean);
    return s;
}

static json_t *token_bytes(const TokenText *t) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < t->len; i++) json_array_append_new(a, json_integer((unsigned char)t->bytes[i]));
    return a;
}

/* JSON has no -Infinity; a token the model gives probability 0 (a -inf logit) reports -9999, as vLLM does. */
static json_t *logprob_value(float lp) { return json_real(isfinite(lp) ? lp : -9999.0); }

/* {"token", "logprob", "bytes"} for one id. */
static json_t *chat_entry(const Tokenizer *tok, int32_t id, float lp) {
    TokenText t = token_text(tok, id);
    return json_pack("{s:o?, s:o, s:o?}", "token", token_string(&t), "logprob", logprob_value(lp), "bytes", token_bytes(&t));
}

static json_t *chat_item(const Tokenizer *tok, int32_t id, const TokenLogprob *lp) {
    json_t *item = chat_entry(tok, id, lp->logprob), *top = json_array();
    for (int k = 0; top && k < lp->n_top; k++) json_array_append_new(top, chat_entry(tok, lp->top_ids[k], lp->top_logprobs[k]));
    if (item && top) json_object_set_new(item, "top_logprobs", top);
    else json_decref(top);
    return item;
}

/* The completions shape's four parallel lists. */
typedef struct {
    json_t *tokens, *token_logprobs, *top_logprobs, *text_offset;
} CompletionLists;

static void completion_item(CompletionLists *l, const Tokenizer *tok, int32_t id, const TokenLogprob *lp, size_t offset) {
    TokenText t = token_text(tok, id);
    json_array_append_new(l->tokens, token_string(&t));
    json_array_append_new(l->token_logprobs, logprob_value(lp->logprob));
    json_t *top = json_object();
    for (int k = 0; top && k < lp->n_top; k++) {
        TokenText alt = token_text(tok, lp->top_ids[k]);
        size_t len;
        char *key = utf8_sanitize(alt.bytes, alt.len, &len);
        /* Keys are strings to jansson: an alternative whose text holds a NUL cannot be a key. */
        if (key && strlen(key) == len && !json_object_get(top, key)) json_object_set_new(top, key, logprob_value(lp->top_logprobs[k]));
        free(key);
    }
    json_array_append_new(l->top_logprobs, top);
    json_array_append_new(l->text_offset, json_integer((json_int_t)offset));
}

bool api_logprobs_pending(int n, size_t text_limit, const LogprobCursor *cur) {
    return cur->done < n && cur->offset < text_limit;
}

json_t *api_logprobs_render(ApiKind kind, const Tokenizer *tok, const int32_t *tokens, const TokenLogprob *logprobs, int n,
                            size_t text_limit, LogprobCursor *cur) {
    json_t *content = kind == API_CHAT ? json_array() : NULL;
    CompletionLists l = {0};
    if (kind == API_COMPLETION) l = (CompletionLists){json_array(), json_array(), json_array(), json_array()};
    for (; cur->done < n && cur->offset < text_limit; cur->done++) {
        int32_t id = tokens[cur->done];
        if (kind == API_CHAT) json_array_append_new(content, chat_item(tok, id, &logprobs[cur->done]));
        else completion_item(&l, tok, id, &logprobs[cur->done], cur->offset);
        cur->offset += token_text(tok, id).len;
    }
    if (kind == API_CHAT) return json_pack("{s:o?}", "content", content);
    return json_pack("{s:o?, s:o?, s:o?, s:o?}", "tokens", l.tokens, "token_logprobs", l.token_logprobs, "top_logprobs",
                     l.top_logprobs, "text_offset", l.text_offset);
}
