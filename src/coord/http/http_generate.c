/* The completion endpoints: request → tokens → coordinator, then the answer, whole or as SSE. */
#define _GNU_SOURCE /* POLLRDHUP */
#include "coord/http/http_generate.h"

#include "cache/kv_cache.h"

#include <errno.h>
#include <stdint.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "coord/api/api_response.h"
#include "coord/explicit_caches.h"
#include "coord/http/http_internal.h"
#include "coord/http/http_choices.h"

int http_generate_max_model_len(const HttpGenerateContext *ctx) {
    int context = ctx->model->weights.cfg.context_length, pool = 0, block = 0;
    coordinator_pool(ctx->coord, &pool, &block);
    return pool > 0 && pool < context ? pool : context;
}

/* ---- whole answers ---- */

/* Whether the client of a non-streaming request has closed its socket: poll() reports the peer's
 * FIN (POLLRDHUP) or an error, or a peek reads end-of-file. A client that half-closes its sending
 * side while still waiting for the answer would count as gone; HTTP clients do not do that. */
bool http_generate_client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return false;
    struct pollfd p = {.fd = info->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
    char byte;
    return (p.revents & POLLIN) && recv(p.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static enum MHD_Result send_whole(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const ApiRequest *a, ChoiceSet *set,
                                  const ApiResponseHead *head, const char *endpoint) {
    char error[sizeof set->c[0].r->error];
    for (int i = 0; i < set->n; i++) {
        int status = 500;
        if (!choice_failed(&set->c[i], error, sizeof error, &status)) continue;
        ApiError e;
        api_error_set(&e, status, NULL, NULL, "generation failed: %s", error);
        return http_send_error(ctx->metrics, conn, endpoint, &e);
    }
    ApiChoice *out = set->n > 0 ? calloc((size_t)set->n, sizeof *out) : NULL;
    if (!out) return MHD_NO;
    for (int i = 0; i < set->n; i++) {
        Choice *c = &set->c[i];
        out[i] = (ApiChoice){.index = c->index, .text = c->ts.text ? c->ts.text : "", .len = c->ts.len,
                             .logprobs = choice_logprobs(ctx, a, c, c->ts.stopped ? c->ts.len : SIZE_MAX)};
        const ToolParse *tp = choice_tool_parse(set, c);
        if (tp) out[i].text = tp->content, out[i].len = tp->content_len, out[i].tool_calls = tp->calls;
        out[i].finish_reason = choice_finish_reason(c);
    }
    ApiUsage u = choices_usage(set);
    choices_record_metrics(ctx, endpoint, set, 200, true);
    enum MHD_Result rc = http_send_json(conn, 200, api_response_full(head, out, set->n, &u));
    free(out);
    return rc;
}

static enum MHD_Result answer_whole(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiRequest *a, ChoiceSet *set,
                                    const ApiResponseHead *head, const char *endpoint) {
    for (int i = 0; i < set->n; i++) {
        Choice *c = &set->c[i];
        while (!choice_done(c)) {
            choice_advance(ctx, a, c, false); /* stop strings are checked as tokens arrive so a match ends generation early */
            if (choice_done(c) || !http_generate_client_gone(conn)) continue;
            choices_cancel_all(ctx, set);
            choices_record_metrics(ctx, endpoint, set, 499, false);
            return MHD_NO; /* nobody to answer: close the connection */
        }
    }
    return send_whole(ctx, conn, a, set, head, endpoint);
}

/* ---- streaming ---- */

/* Each choice streams in turn (role, text, with tools the rest of the content and the calls, finish),
 * then the usage chunk and [DONE]; the choices generate concurrently on the instances meanwhile, so
 * a later choice's text is mostly ready. */
typedef enum { PHASE_ROLE, PHASE_TEXT, PHASE_TOOLS, PHASE_FINISH, PHASE_USAGE, PHASE_DONE, PHASE_END } StreamPhase;

typedef struct {
    const HttpGenerateContext *ctx;
    ApiRequest req;
    ChoiceSet set;
    int cur;              /* the choice being streamed */
    ApiResponseHead head;
    char id[40];
    const char *endpoint;
    StreamPhase phase;
    SseOutbox box;        /* the SSE event being written */
    bool failed;          /* out of memory: the stream ends with an error */
} Stream;

static void set_event(Stream *s, char *json) {
    sse_outbox_clear(&s->box);
    char *event = NULL;
    if (json) {
        size_t n = strlen(json);
        event = malloc(n + 9);
        if (event) sprintf(event, "data: %s\n\n", json);
        free(json);
    }
    if (!sse_outbox_append(&s->box, event)) s->failed = true;
}

static char *error_event(int status, const char *message) {
    ApiError e;
    api_error_set(&e, status ? status : 500, NULL, NULL, "generation failed: %s", message);
    return api_error_json(&e);
}

/* The next piece of text the client may have: all that is ready, or with tools only what cannot
 * belong to a call (tool_parse.h). */
static const char *take_text(Stream *s, Choice *c, size_t *len) {
    if (!s->set.tools) return text_stream_take(&c->ts, len);
    size_t safe = choice_tool_streamable(&s->set, c);
    *len = safe > c->ts.emitted ? safe - c->ts.emitted : 0;
    const char *piece = c->ts.text ? c->ts.text + c->ts.emitted : "";
    c->ts.emitted += *len;
    return piece;
}

/* The next text chunk of the current choice, or false when the choice has no more text. */
static bool next_text_event(Stream *s) {
    Choice *c = &s->set.c[s->cur];
    while (s->phase == PHASE_TEXT) {
        choice_advance(s->ctx, &s->req, c, true);
        if (choice_done(c)) s->phase = s->set.tools ? PHASE_TOOLS : PHASE_FINISH;
        size_t len;
        const char *piece = take_text(s, c, &len);
        bool lp_due = s->req.logprobs >= 0 && api_logprobs_pending(c->progress.n_tokens, c->ts.emitted, &c->lp);
        if (len || lp_due) {
            ApiChoice ch = {.index = c->index, .text = piece, .len = len, .logprobs = choice_logprobs(s->ctx, &s->req, c, c->ts.emitted)};
            return set_event(s, api_response_chunk(&s->head, false, &ch)), true;
        }
    }
    return false;
}

/* With tools, once the choice is done: the content not yet sent and the calls, in one chunk. The
 * content streamed so far is a prefix of the parsed content (tool_parse.h). */
static bool tools_event(Stream *s) {
    Choice *c = &s->set.c[s->cur];
    s->phase = PHASE_FINISH;
    const ToolParse *tp = choice_tool_parse(&s->set, c);
    if (!tp) return false;
    size_t sent = c->ts.emitted < tp->content_len ? c->ts.emitted : tp->content_len;
    size_t rest = tp->content ? tp->content_len - sent : 0;
    if (!rest && !tp->calls) return false;
    ApiChoice ch = {.index = c->index, .text = rest ? tp->content + sent : NULL, .len = rest, .tool_calls = tp->calls};
    return set_event(s, api_response_chunk(&s->head, false, &ch)), true;
}

/* Produces the next SSE event into s->box; false when the stream is over. */
static bool next_event(Stream *s) {
    Choice *c = s->cur < s->set.n ? &s->set.c[s->cur] : NULL;
    switch (s->phase) {
    case PHASE_ROLE:
        s->phase = PHASE_TEXT;
        if (s->head.kind == API_CHAT) {
            ApiChoice ch = {.index = c->index, .text = ""};
            return set_event(s, api_response_chunk(&s->head, true, &ch)), true;
        }
        /* completions have no role chunk */
        /* fall through */
    case PHASE_TEXT:
        if (next_text_event(s)) return true;
        /* fall through */
    case PHASE_TOOLS:
        if (tools_event(s)) return true; /* nothing to send without tools */
        /* fall through */
    case PHASE_FINISH: {
        s->phase = ++s->cur < s->set.n ? PHASE_ROLE : PHASE_USAGE;
        char error[sizeof c->r->error];
        int status = 500;
        if (choice_failed(c, error, sizeof error, &status)) return set_event(s, error_event(status, error)), true;
        ApiChoice ch = {.index = c->index, .text = "", .finish_reason = choice_finish_reason(c)};
        return set_event(s, api_response_chunk(&s->head, false, &ch)), true;
    }
    case PHASE_USAGE:
        s->phase = PHASE_DONE;
        if (s->req.include_usage) {
            ApiUsage u = choices_usage(&s->set);
            return set_event(s, api_response_usage_chunk(&s->head, &u)), true;
        }
        /* fall through */
    case PHASE_DONE:
        s->phase = PHASE_END;
        sse_outbox_clear(&s->box);
        if (!sse_outbox_append(&s->box, strdup("data: [DONE]\n\n"))) s->failed = true;
        return true;
    case PHASE_END: break;
    }
    return false;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    Stream *s = cls;
    while (sse_outbox_drained(&s->box)) {
        if (!next_event(s)) return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->failed) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    return (ssize_t)sse_outbox_drain(&s->box, buf, max);
}

static void stream_free(void *cls) {
    Stream *s = cls;
    bool complete = s->phase == PHASE_END;
    /* The client went away mid-stream: stop generating and give the blocks back. */
    if (!complete) LOG_INFO("http", "req %llu: client disconnected mid-stream; cancelling", (unsigned long long)s->set.c[0].r->id);
    choices_record_metrics(s->ctx, s->endpoint, &s->set, complete ? 200 : 499, complete);
    choices_free(s->ctx, &s->set, !complete);
    api_request_free(&s->req);
    sse_outbox_clear(&s->box);
    free(s);
}

static enum MHD_Result answer_stream(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiRequest *a, ChoiceSet *set,
                                     const ApiResponseHead *head, const char *endpoint) {
    Stream *s = calloc(1, sizeof *s);
    if (!s) return MHD_NO;
    s->ctx = ctx;
    s->req = *a; /* the stream owns the parsed request and the choices from here on */
    memset(a, 0, sizeof *a);
    s->set = *set;
    memset(set, 0, sizeof *set);
    s->head = *head;
    snprintf(s->id, sizeof s->id, "%s", head->id);
    s->head.id = s->id;
    s->endpoint = endpoint;
    return http_queue_event_stream(conn, stream_read, s, stream_free);
}

void sse_outbox_clear(SseOutbox *b) {
    free(b->out);
    *b = (SseOutbox){0};
}

bool sse_outbox_append(SseOutbox *b, char *text) {
    if (!text) return false;
    size_t n = strlen(text);
    char *grown = realloc(b->out, b->len + n + 1);
    if (!grown) {
        free(text);
        return false;
    }
    memcpy(grown + b->len, text, n + 1);
    b->out = grown;
    b->len += n;
    free(text);
    return true;
}

bool sse_outbox_drained(const SseOutbox *b) { return b->off == b->len; }

size_t sse_outbox_drain(SseOutbox *b, char *buf, size_t max) {
    size_t n = b->len - b->off < max ? b->len - b->off : max;
    if (n) memcpy(buf, b->out + b->off, n);
    b->off += n;
    return n;
}

enum MHD_Result http_queue_event_stream(struct MHD_Connection *conn, MHD_ContentReaderCallback read, void *cls,
                                        MHD_ContentReaderFreeCallback release) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, read, cls, release);
    if (!resp) {
        release(cls);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* ---- the endpoint ---- */

/* Each prompt once (not once per choice), in the namespace it ran in: the manifest's counts. */
static void record_prompts(const HttpGenerateContext *ctx, const ApiRequest *a, const ChoiceSet *set) {
    for (int i = 0; ctx->manifest && i < set->n; i += set->per_prompt)
        if (manifest_recorder_observe(ctx->manifest, a->tenant, a->adapter, set->c[i].r->prompt, set->c[i].r->n_prompt))
            LOG_WARN("manifest", "req %llu: out of memory recording its chunks", (unsigned long long)set->c[i].r->id);
}

/* With an API key the key decides the tenant: a request naming none runs in the key's; one naming
 * another must be a namespace the key shares. Adapters must be ones the key lists. A key's
 * segment_reuse= is its tenant's opt-in: the default of its requests (as far as the server
 * allows) and the most they may ask for. */
static int apply_key(const HttpGenerateContext *ctx, const AuthKey *key, ApiRequest *a, ApiError *e) {
    if (!key) return 0;
    int tenant_mode = auth_key_segment_reuse(key);
    if (tenant_mode >= 0 && a->segment_reuse > tenant_mode)
        return api_error_set(e, 403, "segment_reuse", "segment_reuse_not_allowed",
                             "this API key's tenant allows segment_reuse up to \"%s\"", segment_reuse_name((SegmentReuseMode)tenant_mode));
    if (tenant_mode >= 0 && a->segment_reuse < 0) a->segment_reuse = tenant_mode < ctx->segment_reuse ? tenant_mode : ctx->segment_reuse;
    if (a->auto_splice < 0) a->auto_splice = auth_key_auto_splice(key); /* the tenant's default (-1: none) */
    const char *tenant = auth_key_tenant(key);
    if (a->tenant && !auth_key_allows_tenant(key, a->tenant))
        return api_error_set(e, 403, "tenant", "tenant_not_allowed",
                             "this API key belongs to tenant '%s' and does not share tenant '%.64s'; leave tenant out or name '%s'",
                             tenant, a->tenant, tenant);
    if (a->adapter && !auth_key_allows_adapter(key, a->adapter))
        return api_error_set(e, 403, "adapter", "adapter_not_allowed", "this API key may not use adapter '%.64s'", a->adapter);
    if (!a->tenant && !(a->tenant = strdup(tenant))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    return 0;
}

int http_generate_admit(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const AuthKey *key, ApiRequest *a, ApiError *e) {
    const char *hdr[4];
    static const char *const names[4] = {"X-Braid-Workflow", "X-Braid-Agent", "X-Braid-Tenant", "X-Braid-Adapter"};
    for (int i = 0; i < 4; i++) hdr[i] = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, names[i]);
    int rc = api_request_apply_headers(a, hdr[0], hdr[1], hdr[2], hdr[3], e);
    if (rc == 0) rc = adapter_select(a, ctx->served_model, ctx->lora, e);
    if (rc == 0) rc = apply_key(ctx, key, a, e);
    return rc;
}

enum MHD_Result http_generate(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiKind kind, const AuthKey *key,
                              const char *body, size_t len) {
    const char *endpoint = kind == API_CHAT ? "chat" : "completions";
    ApiRequest a;
    ApiError e;
    /* Any model name parses; adapter_select decides whether it is the base model, an adapter or a 404. */
    if (api_request_parse(body, len, kind, NULL, &a, &e)) return http_send_error(ctx->metrics, conn, endpoint, &e);
    ChoiceSet set = {0};
    int rc = http_generate_admit(ctx, conn, key, &a, &e);
    if (rc == 0) rc = explicit_caches_apply(ctx->caches, &a, body, len, explicit_caches_now(), &e); /* "cache_id": start from it */
    if (rc == 0) rc = choices_build(ctx, &a, &set, &e);
    if (rc == 0) rc = choices_submit(ctx, &set, &e);
    if (rc == 0) record_prompts(ctx, &a, &set);
    if (rc) {
        choices_free(ctx, &set, true);
        api_request_free(&a);
        return http_send_error(ctx->metrics, conn, endpoint, &e);
    }
    char id[40];
    snprintf(id, sizeof id, "%s-%llu", kind == API_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)set.c[0].r->id);
    /* Answers name what ran: the adapter when the client picked one by its model name (vLLM's way). */
    ApiResponseHead head = {.kind = kind, .id = id, .model = a.model && a.adapter ? a.adapter : ctx->served_model, .created = time(NULL)};
    enum MHD_Result result =
        a.stream ? answer_stream(ctx, conn, &a, &set, &head, endpoint) : answer_whole(ctx, conn, &a, &set, &head, endpoint);
    choices_free(ctx, &set, false);
    api_request_free(&a);
    return result;
}
