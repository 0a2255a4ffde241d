/* The Anthropic Messages endpoints; the contract is in http_messages.h. */
#include "coord/http/http_messages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "coord/api/anthropic_response.h"
#include "coord/api/chat_render.h"
#include "coord/explicit_caches.h"
#include "coord/http/http_choices.h"
#include "coord/http/http_internal.h"
#include "coord/http/http_stream.h"
#include "coord/text_stream.h"

/* Seconds a stream may stay silent (a long prefill) before a ping keeps proxies from closing it. */
#define PING_INTERVAL_S 10.0

const char *http_messages_endpoint_label(AnthropicEndpoint endpoint) {
    return endpoint == ANTHROPIC_COUNT_TOKENS ? "messages_count_tokens" : "messages";
}

/* ---- replies ---- */

static enum MHD_Result queue(struct MHD_Connection *conn, int status, char *body, const char *header, const char *value) {
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) return free(body), MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (header) MHD_add_response_header(resp, header, value);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

enum MHD_Result http_messages_send_error(Metrics *metrics, struct MHD_Connection *conn, const char *endpoint, const ApiError *e,
                                         const char *retry_after) {
    if (endpoint && metrics) metrics_record_request(metrics, endpoint, e->status, 0, -1, 0, 0, 0);
    const char *header = NULL, *value = NULL;
    switch (e->status) {
    case 429: header = MHD_HTTP_HEADER_RETRY_AFTER, value = retry_after ? retry_after : "1"; break;
    case 503: header = MHD_HTTP_HEADER_RETRY_AFTER, value = retry_after ? retry_after : HTTP_RETRY_AFTER_UNAVAILABLE_S; break;
    case 405: header = MHD_HTTP_HEADER_ALLOW, value = "POST"; break;
    case 401: header = MHD_HTTP_HEADER_WWW_AUTHENTICATE, value = "Bearer"; break;
    }
    return queue(conn, e->status, anthropic_error_json(e), header, value);
}

/* ---- what a finished choice says ---- */

/* The stop sequence that ended the choice, or NULL: the text is cut where it begins, so it is the
 * one found right there in the whole decoded completion. */
static const char *matched_stop(const HttpGenerateContext *ctx, const ApiRequest *a, const Choice *c) {
    if (!c->ts.stopped) return NULL;
    size_t n = 0;
    char *all = tokenizer_decode(&ctx->model->tokenizer, c->tokens, c->progress.n_tokens, &n);
    const char *found = NULL;
    for (int i = 0; all && !found && i < a->n_stop; i++) {
        size_t k = strlen(a->stop[i]);
        if (c->ts.len + k <= n && memcmp(all + c->ts.len, a->stop[i], k) == 0) found = a->stop[i];
    }
    free(all);
    return found ? found : a->n_stop == 1 ? a->stop[0] : NULL;
}

/* Anthropic's stop_reason for OpenAI's finish_reason. */
static const char *stop_reason(const Choice *c) {
    const char *finish = choice_finish_reason(c);
    if (strcmp(finish, "tool_calls") == 0) return "tool_use";
    if (strcmp(finish, "length") == 0) return "max_tokens";
    return c->ts.stopped ? "stop_sequence" : "end_turn";
}

static AnthropicUsage usage_of(const ChoiceSet *set) {
    ApiUsage u = choices_usage(set);
    return anthropic_usage_from(&u);
}

/* ---- whole answers ---- */

static enum MHD_Result answer_whole(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const ApiRequest *a, ChoiceSet *set,
                                    const char *id, const char *model) {
    Choice *c = &set->c[0];
    while (!choice_done(c)) {
        choice_advance(ctx, a, c, false);
        if (choice_done(c) || !http_generate_client_gone(conn)) continue;
        choices_cancel_all(ctx, set);
        choices_record_metrics(ctx, "messages", set, 499, false);
        return MHD_NO;
    }
    char error[sizeof c->r->error];
    int status = 500;
    if (choice_failed(c, error, sizeof error, &status)) {
        ApiError e;
        api_error_set(&e, status, NULL, NULL, "generation failed: %s", error);
        choices_record_metrics(ctx, "messages", set, e.status, false);
        return http_messages_send_error(NULL, conn, NULL, &e, NULL);
    }
    const ToolParse *tp = choice_tool_parse(set, c);
    AnthropicAnswer ans = {.id = id, .model = model, .text = c->ts.text ? c->ts.text : "", .len = c->ts.len};
    if (tp) ans.text = tp->content, ans.len = tp->content_len, ans.tool_calls = tp->calls;
    ans.stop_reason = stop_reason(c);
    ans.stop_sequence = matched_stop(ctx, a, c);
    AnthropicUsage u = usage_of(set);
    choices_record_metrics(ctx, "messages", set, 200, true);
    return http_send_json(conn, 200, anthropic_message_json(&ans, &u));
}

/* ---- streaming ---- */

typedef enum { PHASE_START, PHASE_TEXT, PHASE_BLOCKS, PHASE_END_MESSAGE, PHASE_END } StreamPhase;

/* The Messages dialect's part of an HttpStream (http_stream.h). */
typedef struct {
    char id[40], model[API_MAX_LABEL_BYTES + 1];
    StreamPhase phase;
    bool text_open;   /* content block 0 (text) is started and not stopped */
    int next_block;   /* the index the next content block gets */
    double last_sent_s; /* when the last events went out (braid_now_seconds) */
} MessagesStream;

/* Appends an event (taken over; NULL = out of memory, which ends the stream). */
static void emit(HttpStream *s, char *ev) {
    if (!sse_outbox_append(&s->box, ev)) s->failed = true;
}

static void emit_text(HttpStream *s, MessagesStream *d, const char *text, size_t len) {
    if (!len) return;
    if (!d->text_open) {
        emit(s, anthropic_event_text_start(d->next_block));
        d->text_open = true;
    }
    emit(s, anthropic_event_text_delta(d->next_block, text, len));
}

static void close_text(HttpStream *s, MessagesStream *d) {
    if (!d->text_open) return;
    emit(s, anthropic_event_block_stop(d->next_block++));
    d->text_open = false;
}

/* Text deltas until the choice is done; a ping when nothing was sent for PING_INTERVAL_S. */
static void text_events(HttpStream *s, MessagesStream *d) {
    Choice *c = &s->set.c[0];
    while (s->box.len == 0) {
        choice_advance(s->ctx, &s->req, c, true);
        bool done = choice_done(c);
        size_t len;
        const char *piece = choice_take_text(&s->set, c, &len);
        emit_text(s, d, piece, len);
        if (done) {
            d->phase = PHASE_BLOCKS;
            return;
        }
        if (s->box.len == 0 && braid_now_seconds() - d->last_sent_s >= PING_INTERVAL_S) emit(s, anthropic_event_ping());
    }
}

/* Once the choice is done: the text not yet sent, then each tool call as a tool_use block. */
static void block_events(HttpStream *s, MessagesStream *d) {
    Choice *c = &s->set.c[0];
    d->phase = PHASE_END_MESSAGE;
    char error[sizeof c->r->error];
    int status = 500;
    if (choice_failed(c, error, sizeof error, &status)) {
        ApiError e;
        api_error_set(&e, status, NULL, NULL, "generation failed: %s", error);
        emit(s, anthropic_event_error(&e));
        d->phase = PHASE_END;
        return;
    }
    const ToolParse *tp = choice_tool_parse(&s->set, c);
    if (tp && tp->content) {
        size_t sent = c->ts.emitted < tp->content_len ? c->ts.emitted : tp->content_len;
        emit_text(s, d, tp->content + sent, tp->content_len - sent);
    }
    size_t calls = tp ? json_array_size(tp->calls) : 0;
    if (!d->text_open && d->next_block == 0 && calls == 0) emit(s, anthropic_event_text_start(d->next_block)), d->text_open = true;
    close_text(s, d);
    for (size_t i = 0; i < calls; i++) {
        const json_t *call = json_array_get(tp->calls, i);
        emit(s, anthropic_event_tool_start(d->next_block, call));
        emit(s, anthropic_event_input_json_delta(d->next_block, call));
        emit(s, anthropic_event_block_stop(d->next_block++));
    }
}

/* The stream's event writer (HttpStreamNext): the next events into s->box; false when the stream
 * is over or an event could not be made. */
static bool next_events(HttpStream *s) {
    MessagesStream *d = s->dialect;
    sse_outbox_clear(&s->box);
    while (s->box.len == 0 && !s->failed) {
        switch (d->phase) {
        case PHASE_START:
            emit(s, anthropic_event_message_start(d->id, d->model, s->set.c[0].r->n_prompt));
            emit(s, anthropic_event_ping());
            d->phase = PHASE_TEXT;
            break;
        case PHASE_TEXT: text_events(s, d); break;
        case PHASE_BLOCKS: block_events(s, d); break;
        case PHASE_END_MESSAGE: {
            Choice *c = &s->set.c[0];
            AnthropicUsage u = usage_of(&s->set);
            emit(s, anthropic_event_message_delta(stop_reason(c), matched_stop(s->ctx, &s->req, c), &u));
            emit(s, anthropic_event_message_stop());
            d->phase = PHASE_END;
            break;
        }
        case PHASE_END: return false;
        }
    }
    s->complete = d->phase == PHASE_END && !s->failed; /* the last events made: the answer counts as given */
    d->last_sent_s = braid_now_seconds();
    return !s->failed;
}

static enum MHD_Result answer_stream(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiRequest *a, ChoiceSet *set,
                                     const char *id, const char *model) {
    MessagesStream *d = calloc(1, sizeof *d);
    if (!d) return MHD_NO;
    snprintf(d->id, sizeof d->id, "%s", id);
    snprintf(d->model, sizeof d->model, "%s", model);
    return http_stream_start(ctx, conn, a, set, "messages", "Messages stream ended early", next_events, d);
}

/* ---- the endpoints ---- */

/* count_tokens: the prompt's tokens exactly as generation would run it (template, tools, BOS). */
static enum MHD_Result count_tokens(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const ApiRequest *a) {
    ApiError e;
    char *text = api_chat_render(&ctx->model->chat, api_chat_tool_syntax(&ctx->model->chat), a, a->n_messages, &e);
    if (!text) return http_messages_send_error(ctx->metrics, conn, "messages_count_tokens", &e, NULL);
    TokenList ids = {0};
    BraidError err;
    int rc = tokenizer_encode(&ctx->model->tokenizer, text, strlen(text), true, ctx->model->tokenizer.add_bos, &ids, &err);
    free(text);
    if (rc) {
        api_error_set(&e, 400, "messages", NULL, "cannot tokenize the messages: %s", err.msg);
        return http_messages_send_error(ctx->metrics, conn, "messages_count_tokens", &e, NULL);
    }
    int n = ids.n;
    free(ids.ids);
    metrics_record_request(ctx->metrics, "messages_count_tokens", 200, 0, -1, 0, 0, 0);
    return http_send_json(conn, 200, anthropic_count_json(n));
}

/* Each prompt's chunks in the manifest (as the OpenAI endpoints count them). */
static void record_prompt(const HttpGenerateContext *ctx, const ApiRequest *a, const ChoiceSet *set) {
    if (ctx->manifest && manifest_recorder_observe(ctx->manifest, a->tenant, a->adapter, set->c[0].r->prompt, set->c[0].r->n_prompt))
        LOG_WARN("manifest", "req %llu: out of memory recording its chunks", (unsigned long long)set->c[0].r->id);
}

enum MHD_Result http_messages(const HttpGenerateContext *ctx, struct MHD_Connection *conn, AnthropicEndpoint endpoint, const AuthKey *key,
                              const char *body, size_t len) {
    const char *label = http_messages_endpoint_label(endpoint);
    ApiRequest a;
    ApiError e;
    char *translated;
    if (anthropic_request_parse(body, len, endpoint, &a, &translated, &e)) return http_messages_send_error(ctx->metrics, conn, label, &e, NULL);
    ChoiceSet set = {0};
    int rc = http_generate_admit(ctx, conn, key, &a, &e);
    /* "cache_id": the request starts from an explicit cache's messages, as a chat completion does. */
    if (rc == 0) rc = explicit_caches_apply(ctx->caches, &a, translated, strlen(translated), explicit_caches_now(), &e);
    free(translated);
    if (rc == 0 && endpoint == ANTHROPIC_COUNT_TOKENS) {
        enum MHD_Result result = count_tokens(ctx, conn, &a);
        api_request_free(&a);
        return result;
    }
    if (rc == 0) rc = choices_build(ctx, &a, &set, &e);
    if (rc == 0) rc = choices_submit(ctx, &set, &e);
    if (rc == 0) record_prompt(ctx, &a, &set);
    if (rc) {
        choices_free(ctx, &set, true);
        api_request_free(&a);
        return http_messages_send_error(ctx->metrics, conn, label, &e, NULL);
    }
    char id[40];
    snprintf(id, sizeof id, "msg_braid_%llu", (unsigned long long)set.c[0].r->id);
    const char *model = a.model && a.adapter ? a.adapter : ctx->served_model;
    enum MHD_Result result = a.stream ? answer_stream(ctx, conn, &a, &set, id, model) : answer_whole(ctx, conn, &a, &set, id, model);
    choices_free(ctx, &set, false);
    api_request_free(&a);
    return result;
}
