/* The streamed answer every completion dialect shares; the contract is in http_stream.h. */
#include "coord/http/http_stream.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* ---- the outbox ---- */

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

/* ---- the stream ---- */

/* libmicrohttpd's content reader: the outbox's bytes, refilled by the dialect whenever drained. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    HttpStream *s = cls;
    while (sse_outbox_drained(&s->box)) {
        bool more = s->next(s);
        if (s->failed) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (!more) return MHD_CONTENT_READER_END_OF_STREAM;
    }
    return (ssize_t)sse_outbox_drain(&s->box, buf, max);
}

/* The library is done with the answer: whole, or the client went away mid-stream, in which case
 * generation stops and the blocks go back. */
static void stream_free(void *cls) {
    HttpStream *s = cls;
    if (!s->complete) LOG_INFO("http", "req %llu: %s; cancelling", (unsigned long long)s->set.c[0].r->id, s->early_end);
    choices_record_metrics(s->ctx, s->endpoint, &s->set, s->complete ? 200 : 499, s->complete);
    choices_free(s->ctx, &s->set, !s->complete);
    api_request_free(&s->req);
    sse_outbox_clear(&s->box);
    free(s->dialect);
    free(s);
}

enum MHD_Result http_stream_start(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiRequest *a, ChoiceSet *set,
                                  const char *endpoint, const char *early_end, HttpStreamNext next, void *dialect) {
    HttpStream *s = calloc(1, sizeof *s);
    if (!s) {
        free(dialect);
        return MHD_NO;
    }
    *s = (HttpStream){.ctx = ctx, .endpoint = endpoint, .early_end = early_end, .next = next, .dialect = dialect};
    s->req = *a; /* the stream owns the parsed request and the choices from here on */
    memset(a, 0, sizeof *a);
    s->set = *set;
    memset(set, 0, sizeof *set);
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
