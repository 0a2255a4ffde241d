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
#include "coord/http/http_stream.h"

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

/* The OpenAI dialect's part of an HttpStream (http_stream.h). */
typedef struct {
    int cur;              /* the choice being streamed */
    ApiResponseHead head;
    char id[40];
    StreamPhase phase;
} CompletionStream;

static void set_event(HttpStream *s, char *json) {
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

/* The next text chunk of the current choice, or false when the choice has no more text. */
static bool next_text_event(HttpStream *s, CompletionStream *d) {
    Choice *c = &s->set.c[d->cur];
    while (d->phase == PHASE_TEXT) {
        choice_advance(s->ctx, &s->req, c, true);
        if (choice_done(c)) d->phase = s->set.tools ? PHASE_TOOLS : PHASE_FINISH;
        size_t len;
        const char *piece = choice_take_text(&s->set, c, &len);
        bool lp_due = s->req.logprobs >= 0 && api_logprobs_pending(c->progress.n_tokens, c->ts.emitted, &c->lp);
        if (len || lp_due) {
            ApiChoice ch = {.index = c->index, .text = piece, .len = len, .logprobs = choice_logprobs(s->ctx, &s->req, c, c->ts.emitted)};
            return set_event(s, api_response_chunk(&d->head, false, &ch)), true;
        }
    }
    return false;
}

/* With tools, once the choice is done: the content not yet sent and the calls, in one chunk. The
 * content streamed so far is a prefix of the parsed content (tool_parse.h). */
static bool tools_event(HttpStream *s, CompletionStream *d) {
    Choice *c = &s->set.c[d->cur];
    d->phase = PHASE_FINISH;
    const ToolParse *tp = choice_tool_parse(&s->set, c);
    if (!tp) return false;
    size_t sent = c->ts.emitted < tp->content_len ? c->ts.emitted : tp->content_len;
    size_t rest = tp->content ? tp->content_len - sent : 0;
    if (!rest && !tp->calls) return false;
    ApiChoice ch = {.index = c->index, .text = rest ? tp->content + sent : NULL, .len = rest, .tool_calls = tp->calls};
    return set_event(s, api_response_chunk(&d->head, false, &ch)), true;
}

/* The stream's event writer (HttpStreamNext): the next SSE event into s->box; false when the
 * stream is over. */
static bool next_event(HttpStream *s) {
    CompletionStream *d = s->dialect;
    Choice *c = d->cur < s->set.n ? &s->set.c[d->cur] : NULL;
    switch (d->phase) {
    case PHASE_ROLE:
        d->phase = PHASE_TEXT;
        if (d->head.kind == API_CHAT) {
            ApiChoice ch = {.index = c->index, .text = ""};
            return set_event(s, api_response_chunk(&d->head, true, &ch)), true;
        }
        /* completions have no role chunk */
        /* fall through */
    case PHASE_TEXT:
        if (next_text_event(s, d)) return true;
        /* fall through */
    case PHASE_TOOLS:
        if (tools_event(s, d)) return true; /* nothing to send without tools */
        /* fall through */
    case PHASE_FINISH: {
        d->phase = ++d->cur < s->set.n ? PHASE_ROLE : PHASE_USAGE;
        char error[sizeof c->r->error];
        int status = 500;
        if (choice_failed(c, error, sizeof error, &status)) return set_event(s, error_event(status, error)), true;
        ApiChoice ch = {.index = c->index, .text = "", .finish_reason = choice_finish_reason(c)};
        return set_event(s, api_response_chunk(&d->head, false, &ch)), true;
    }
    case PHASE_USAGE:
        d->phase = PHASE_DONE;
        if (s->req.include_usage) {
            ApiUsage u = choices_usage(&s->set);
            return set_event(s, api_response_usage_chunk(&d->head, &u)), true;
        }
        /* fall through */
    case PHASE_DONE:
        d->phase = PHASE_END;
        s->complete = true; /* every choice has had its finish: the answer counts as given */
        sse_outbox_clear(&s->box);
        if (!sse_outbox_append(&s->box, strdup("data: [DONE]\n\n"))) s->failed = true;
        return true;
    case PHASE_END: break;
    }
    return false;
}

static enum MHD_Result answer_stream(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiRequest *a, ChoiceSet *set,
                                     const ApiResponseHead *head, const char *endpoint) {
    CompletionStream *d = calloc(1, sizeof *d);
    if (!d) return MHD_NO;
    d->head = *head;
    snprintf(d->id, sizeof d->id, "%s", head->id);
    d->head.id = d->id;
    return http_stream_start(ctx, conn, a, set, endpoint, "client disconnected mid-stream", next_event, d);
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
