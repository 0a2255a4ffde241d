/* The completion endpoints: request → tokens → coordinator, then the answer, whole or as SSE. */
#define _GNU_SOURCE /* POLLRDHUP */
#include "coord/http_generate.h"

#include "cache/kv_cache.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "cache/content_hash.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "coord/api_response.h"
#include "coord/http_internal.h"
#include "coord/coord_request.h"
#include "coord/text_stream.h"
#include "transport/control_msg.h"

/* ---- building the request ---- */

static int tokenize_prompt(const BraidModel *m, const ApiRequest *a, TokenList *ids, ApiError *e) {
    BraidError err;
    if (a->kind == API_COMPLETION) {
        if (tokenizer_encode(&m->tokenizer, a->prompt, strlen(a->prompt), false, m->tokenizer.add_bos, ids, &err))
            return api_error_set(e, 400, "prompt", NULL, "cannot tokenize the prompt: %s", err.msg);
        return 0;
    }
    ChatMessage *msgs = calloc((size_t)a->n_messages, sizeof *msgs);
    if (!msgs) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    for (int i = 0; i < a->n_messages; i++) msgs[i] = (ChatMessage){.role = a->messages[i].role, .content = a->messages[i].content};
    char *text = chat_template_render(&m->chat, msgs, a->n_messages, &err);
    free(msgs);
    if (!text) return api_error_set(e, 400, "messages", NULL, "cannot apply the chat template: %s", err.msg);
    int rc = tokenizer_encode(&m->tokenizer, text, strlen(text), true, m->tokenizer.add_bos, ids, &err);
    free(text);
    if (rc) return api_error_set(e, 400, "messages", NULL, "cannot tokenize the messages: %s", err.msg);
    return 0;
}

int http_generate_max_model_len(const HttpGenerateContext *ctx) {
    int context = ctx->model->weights.cfg.context_length, pool = 0, block = 0;
    coordinator_pool(ctx->coord, &pool, &block);
    return pool > 0 && pool < context ? pool : context;
}

/* Fits max_tokens to the context and the KV pool, or says why the request cannot run. */
static int resolve_max_tokens(const HttpGenerateContext *ctx, const ApiRequest *a, int n_prompt, int *max_tokens, ApiError *e) {
    int context = ctx->model->weights.cfg.context_length, limit = http_generate_max_model_len(ctx);
    const char *what = limit < context ? "the KV pool" : "the model's context";
    if (n_prompt >= limit)
        return api_error_set(e, 400, a->kind == API_CHAT ? "messages" : "prompt", "context_length_exceeded",
                             "the prompt is %d tokens; %s holds %d, leaving no room to generate", n_prompt, what, limit);
    if (a->max_tokens < 0) {
        *max_tokens = limit - n_prompt;
        return 0;
    }
    if (n_prompt + a->max_tokens > limit)
        return api_error_set(e, 400, "max_tokens", "context_length_exceeded",
                             "max_tokens = %d plus the prompt's %d tokens exceeds %s (%d tokens); lower max_tokens",
                             a->max_tokens, n_prompt, what, limit);
    *max_tokens = a->max_tokens;
    return 0;
}

/* The request's segment reuse: what it asked for, if the server allows that much; else exact (or
 * off when the server has it off). Approximate reuse is never on unless both ask for it. */
static int resolve_segment_reuse(const HttpGenerateContext *ctx, const ApiRequest *a, int *mode, ApiError *e) {
    int server = ctx->segment_reuse;
    if (a->segment_reuse < 0) {
        *mode = server < SEGMENT_REUSE_EXACT ? server : SEGMENT_REUSE_EXACT;
        return 0;
    }
    if (a->segment_reuse > server)
        return api_error_set(e, 400, "segment_reuse", NULL, "segment_reuse \"%s\" is not enabled on this server (it allows \"%s\"; "
                             "start it with --segment-reuse approx to allow approximate reuse)",
                             segment_reuse_name((SegmentReuseMode)a->segment_reuse), segment_reuse_name((SegmentReuseMode)server));
    *mode = a->segment_reuse;
    return 0;
}

static CoordRequest *build_request(const HttpGenerateContext *ctx, const ApiRequest *a, ApiError *e) {
    int segment_mode = 0;
    if (resolve_segment_reuse(ctx, a, &segment_mode, e)) return NULL;
    TokenList ids = {0};
    if (tokenize_prompt(ctx->model, a, &ids, e)) return NULL;
    int max_tokens = 0;
    if (ids.n == 0) {
        api_error_set(e, 400, a->kind == API_CHAT ? "messages" : "prompt", NULL, "the prompt is empty");
    } else if (resolve_max_tokens(ctx, a, ids.n, &max_tokens, e) == 0) {
        CoordRequest *r = coord_request_create();
        int pool, block;
        coordinator_pool(ctx->coord, &pool, &block);
        int n_blocks = block > 0 ? ids.n / block : 0;
        uint64_t *chunk = malloc(((size_t)n_blocks + 1) * sizeof *chunk);
        if (r) r->block_hashes = malloc(((size_t)n_blocks + 1) * sizeof *r->block_hashes);
        if (r && chunk && r->block_hashes && (!a->workflow_id || (r->workflow = strdup(a->workflow_id))) &&
            (!a->agent || (r->agent = strdup(a->agent))) && (!a->tenant || (r->tenant = strdup(a->tenant))) &&
            (!a->adapter || (r->adapter = strdup(a->adapter)))) {
            r->prompt = ids.ids;
            r->n_prompt = ids.n;
            r->max_tokens = max_tokens;
            r->temperature = (float)a->temperature;
            r->top_p = (float)a->top_p;
            r->top_k = a->top_k;
            r->seed = api_request_sampling_seed(a, atomic_fetch_add(ctx->seed_counter, 1));
            r->ignore_eos = a->ignore_eos;
            r->segment_mode = (uint8_t)segment_mode;
            /* The same seed the instance's cache uses, so the router's index and the prompt agree. */
            content_hash_blocks(content_hash_namespace(a->tenant, a->adapter), r->prompt, n_blocks, block, r->block_hashes, chunk);
            r->n_hashes = n_blocks;
            free(chunk);
            return r;
        }
        free(chunk);
        coord_request_release(r);
        api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    }
    free(ids.ids);
    return NULL;
}

/* ---- following the request ---- */

/* What the HTTP thread has seen of a request. */
typedef struct {
    int n_tokens;
    bool finished;
} Progress;

/* Waits until the request has more than `seen` tokens, has finished, or a second has passed (so
 * the caller can check on its client); copies the tokens into *tokens. */
static Progress wait_progress(CoordRequest *r, int seen, int32_t **tokens, int *cap) {
    pthread_mutex_lock(&r->mu);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 1;
    while (!r->finished && r->n_tokens == seen)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) == ETIMEDOUT) break;
    Progress p = {.n_tokens = r->n_tokens, .finished = r->finished};
    if (p.n_tokens > *cap) {
        int32_t *grown = realloc(*tokens, (size_t)p.n_tokens * 2 * sizeof *grown);
        if (grown) *tokens = grown, *cap = p.n_tokens * 2;
        else p.n_tokens = *cap; /* keep what fits; the next wait picks up the rest */
    }
    memcpy(*tokens, r->tokens, (size_t)p.n_tokens * sizeof **tokens);
    pthread_mutex_unlock(&r->mu);
    return p;
}

static const char *finish_name(const CoordRequest *r, bool stopped) {
    if (stopped) return "stop";
    return r->finish_reason == FINISH_LENGTH ? "length" : "stop";
}

static ApiUsage usage_of(const CoordRequest *r, int completion_tokens) {
    return (ApiUsage){.prompt_tokens = r->n_prompt, .completion_tokens = completion_tokens, .cached_tokens = r->cached_tokens,
                      .cached_tokens_host = r->cached_tokens_host, .segment_reused_tokens = r->reused_tokens};
}

/* Seconds from submission to the first token. A request that finished sets its first token's time at
 * the latest with the finish (coord_request_finish), so `otherwise` is only a backstop for an
 * answered request without one, counted rather than dropped from the TTFT histogram. */
static double first_token_seconds(CoordRequest *r, double otherwise) {
    pthread_mutex_lock(&r->mu);
    double t = r->t_first_token;
    pthread_mutex_unlock(&r->mu);
    return t > 0 ? t - r->t_submit : otherwise;
}

/* After a stop-string cancel: the instance's FINISH (with the usage numbers) follows shortly. */
static void wait_finished(CoordRequest *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->finished) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* ---- whole answers ---- */

/* Whether the client of a non-streaming request has closed its socket: poll() reports the peer's
 * FIN (POLLRDHUP) or an error, or a peek reads end-of-file. A client that half-closes its sending
 * side while still waiting for the answer would count as gone; HTTP clients do not do that. */
static bool client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return false;
    struct pollfd p = {.fd = info->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
    char byte;
    return (p.revents & POLLIN) && recv(p.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static enum MHD_Result answer_whole(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiRequest *a, CoordRequest *r,
                                    const ApiResponseHead *head, const char *endpoint) {
    TextStream ts = {0};
    int32_t *tokens = NULL;
    int cap = 0;
    Progress p = {0};
    for (;;) {
        p = wait_progress(r, p.n_tokens, &tokens, &cap);
        /* Stop strings are checked as tokens arrive so a match ends generation early. */
        if (a->n_stop > 0 || p.finished) text_stream_update(&ts, &ctx->model->tokenizer, tokens, p.n_tokens, a->stop, a->n_stop, p.finished);
        if (ts.stopped) {
            coordinator_cancel(ctx->coord, r->id);
            wait_finished(r);
            break;
        }
        if (p.finished) break;
        if (client_gone(conn)) {
            coordinator_cancel(ctx->coord, r->id);
            wait_finished(r);
            free(tokens);
            text_stream_free(&ts);
            double ttft = first_token_seconds(r, -1);
            metrics_record_request(ctx->metrics, endpoint, 499, braid_now_seconds() - r->t_submit, ttft, r->n_prompt,
                                   r->cached_tokens, p.n_tokens);
            return MHD_NO; /* nobody to answer: close the connection */
        }
    }
    free(tokens);
    double latency = braid_now_seconds() - r->t_submit, ttft = first_token_seconds(r, latency);
    pthread_mutex_lock(&r->mu);
    bool failed = r->finished && r->finish_reason == FINISH_ERROR;
    char error[sizeof r->error];
    memcpy(error, r->error, sizeof error);
    int status = r->error_status ? r->error_status : 500; /* 503: its instance died, another try may succeed */
    pthread_mutex_unlock(&r->mu);
    enum MHD_Result rc;
    if (failed) {
        ApiError e;
        api_error_set(&e, status, NULL, NULL, "generation failed: %s", error);
        rc = http_send_error(ctx->metrics, conn, endpoint, &e);
    } else {
        ApiUsage u = usage_of(r, p.n_tokens);
        metrics_record_request(ctx->metrics, endpoint, 200, latency, ttft, u.prompt_tokens, u.cached_tokens, u.completion_tokens);
        rc = http_send_json(conn, 200, api_response_full(head, ts.text ? ts.text : "", ts.len, finish_name(r, ts.stopped), &u));
    }
    text_stream_free(&ts);
    return rc;
}

/* ---- streaming ---- */

typedef enum { PHASE_ROLE, PHASE_TEXT, PHASE_FINISH, PHASE_USAGE, PHASE_DONE, PHASE_END } StreamPhase;

typedef struct {
    const HttpGenerateContext *ctx;
    ApiRequest req;
    CoordRequest *r;
    ApiResponseHead head;
    char id[40];
    const char *endpoint;
    TextStream ts;
    int32_t *tokens;
    int cap_tokens;
    Progress progress;
    StreamPhase phase;
    char *out;            /* the SSE event being written */
    size_t out_len, out_off;
} Stream;

static void set_event(Stream *s, char *json) {
    free(s->out);
    s->out = NULL;
    s->out_len = s->out_off = 0;
    if (!json) return;
    size_t n = strlen(json);
    s->out = malloc(n + 9);
    if (s->out) s->out_len = (size_t)sprintf(s->out, "data: %s\n\n", json);
    free(json);
}

static char *error_event(int status, const char *message) {
    ApiError e;
    api_error_set(&e, status ? status : 500, NULL, NULL, "generation failed: %s", message);
    return api_error_json(&e);
}

/* Produces the next SSE event into s->out; false when the stream is over. */
static bool next_event(Stream *s) {
    CoordRequest *r = s->r;
    switch (s->phase) {
    case PHASE_ROLE:
        s->phase = PHASE_TEXT;
        if (s->head.kind == API_CHAT) return set_event(s, api_response_chunk(&s->head, true, "", 0, NULL)), true;
        /* fall through: completions have no role chunk */
    case PHASE_TEXT:
        while (s->phase == PHASE_TEXT) {
            s->progress = wait_progress(r, s->progress.n_tokens, &s->tokens, &s->cap_tokens);
            text_stream_update(&s->ts, &s->ctx->model->tokenizer, s->tokens, s->progress.n_tokens, s->req.stop, s->req.n_stop,
                               s->progress.finished);
            if (s->ts.stopped) coordinator_cancel(s->ctx->coord, r->id), wait_finished(r);
            if (s->ts.stopped || s->progress.finished) s->phase = PHASE_FINISH;
            size_t len;
            const char *piece = text_stream_take(&s->ts, &len);
            if (len) return set_event(s, api_response_chunk(&s->head, false, piece, len, NULL)), true;
        }
        /* fall through */
    case PHASE_FINISH: {
        s->phase = PHASE_USAGE;
        pthread_mutex_lock(&r->mu);
        bool failed = r->finished && r->finish_reason == FINISH_ERROR && !s->ts.stopped;
        char *json = failed ? error_event(r->error_status, r->error) : NULL;
        pthread_mutex_unlock(&r->mu);
        if (!failed) json = api_response_chunk(&s->head, false, "", 0, finish_name(r, s->ts.stopped));
        return set_event(s, json), true;
    }
    case PHASE_USAGE:
        s->phase = PHASE_DONE;
        if (s->req.include_usage) {
            ApiUsage u = usage_of(r, s->progress.n_tokens);
            return set_event(s, api_response_usage_chunk(&s->head, &u)), true;
        }
        /* fall through */
    case PHASE_DONE:
        s->phase = PHASE_END;
        free(s->out);
        s->out = strdup("data: [DONE]\n\n");
        s->out_len = s->out ? strlen(s->out) : 0;
        s->out_off = 0;
        return true;
    case PHASE_END: break;
    }
    return false;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    Stream *s = cls;
    while (s->out_off == s->out_len) {
        if (!next_event(s)) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!s->out) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = s->out_len - s->out_off < max ? s->out_len - s->out_off : max;
    memcpy(buf, s->out + s->out_off, n);
    s->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    Stream *s = cls;
    CoordRequest *r = s->r;
    bool complete = s->phase == PHASE_END;
    if (!complete) {
        /* The client went away mid-stream: stop generating and give its blocks back. */
        LOG_INFO("http", "req %llu: client disconnected mid-stream; cancelling", (unsigned long long)r->id);
        coordinator_cancel(s->ctx->coord, r->id);
    }
    double latency = braid_now_seconds() - r->t_submit, ttft = first_token_seconds(r, complete ? latency : -1);
    metrics_record_request(s->ctx->metrics, s->endpoint, complete ? 200 : 499, latency, ttft, r->n_prompt, r->cached_tokens,
                           s->progress.n_tokens);
    coord_request_release(r);
    api_request_free(&s->req);
    text_stream_free(&s->ts);
    free(s->tokens);
    free(s->out);
    free(s);
}

static enum MHD_Result answer_stream(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiRequest *a, CoordRequest *r,
                                     const ApiResponseHead *head, const char *endpoint) {
    Stream *s = calloc(1, sizeof *s);
    if (!s) return MHD_NO;
    s->ctx = ctx;
    s->req = *a; /* the stream owns the parsed request from here on */
    memset(a, 0, sizeof *a);
    s->r = r;
    coord_request_retain(r);
    s->head = *head;
    snprintf(s->id, sizeof s->id, "%s", head->id);
    s->head.id = s->id;
    s->endpoint = endpoint;
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
    if (!resp) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* ---- the endpoint ---- */

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

enum MHD_Result http_generate(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiKind kind, const AuthKey *key,
                              const char *body, size_t len) {
    const char *endpoint = kind == API_CHAT ? "chat" : "completions";
    ApiRequest a;
    ApiError e;
    if (api_request_parse(body, len, kind, ctx->served_model, &a, &e)) return http_send_error(ctx->metrics, conn, endpoint, &e);
    const char *hdr[4];
    static const char *const names[4] = {"X-Braid-Workflow", "X-Braid-Agent", "X-Braid-Tenant", "X-Braid-Adapter"};
    for (int i = 0; i < 4; i++) hdr[i] = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, names[i]);
    CoordRequest *r = NULL;
    if (api_request_apply_headers(&a, hdr[0], hdr[1], hdr[2], hdr[3], &e) == 0 && apply_key(ctx, key, &a, &e) == 0)
        r = build_request(ctx, &a, &e);
    if (!r) {
        api_request_free(&a);
        return http_send_error(ctx->metrics, conn, endpoint, &e);
    }
    r->restartable = !a.stream && a.n_stop == 0; /* answer_whole reads tokens only at the finish then */
    SubmitResult sr = coordinator_submit(ctx->coord, r);
    if (sr != SUBMIT_OK) {
        if (sr == SUBMIT_BUSY) api_error_set(&e, 429, NULL, "rate_limit_exceeded", "the server's queue is full; retry shortly");
        else api_error_set(&e, 503, NULL, NULL, "the server is %s and takes no new requests", coordinator_state(ctx->coord));
        coord_request_release(r);
        api_request_free(&a);
        return http_send_error(ctx->metrics, conn, endpoint, &e);
    }
    char id[40];
    snprintf(id, sizeof id, "%s-%llu", kind == API_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)r->id);
    ApiResponseHead head = {.kind = kind, .id = id, .model = ctx->served_model, .created = time(NULL)};
    enum MHD_Result rc = a.stream ? answer_stream(ctx, conn, &a, r, &head, endpoint) : answer_whole(ctx, conn, &a, r, &head, endpoint);
    coord_request_release(r);
    api_request_free(&a);
    return rc;
}
