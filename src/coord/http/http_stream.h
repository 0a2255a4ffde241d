/*
 * http_stream.h — the streamed answer every completion dialect shares: OpenAI's chat/completions
 * (http_generate.c) and Anthropic's Messages (http_messages.c) each stream their choices as
 * server-sent events through one HttpStream.
 *
 * What it owns: from http_stream_start on, the parsed request, its choices, the outbox of event
 * bytes not yet handed to the HTTP library (SseOutbox), and the dialect's own state (`dialect`,
 * freed with free()). The dialect writes events; this module drains them into libmicrohttpd's
 * content reader, ends the answer (cleanly once the dialect has no more events, with an error as
 * soon as one could not be made), and when the library lets go of the answer — finished, or the
 * client left mid-stream — records the request's metrics line (200 when the dialect marked the
 * answer complete, else 499), cancels the choices still generating and frees everything.
 *
 * Called on the connection's thread; the callbacks run on it too, one at a time. Not thread-safe:
 * one stream per connection.
 */
#ifndef BRAID_COORD_HTTP_STREAM_H
#define BRAID_COORD_HTTP_STREAM_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "coord/api/api_request.h"
#include "coord/http/http_choices.h"
#include "coord/http/http_generate.h"

/* The bytes of a server-sent-event answer not yet handed to the HTTP library: the dialect fills
 * it, the stream's content reader drains it. An empty outbox holds no memory. */
typedef struct {
    char *out;
    size_t len, off;
} SseOutbox;
/* Frees what the outbox holds and leaves it empty. */
void sse_outbox_clear(SseOutbox *b);
/* Appends `text` and takes it over (freed here). NULL (out of memory) or a failed append -> false,
 * the outbox unchanged. */
bool sse_outbox_append(SseOutbox *b, char *text);
/* Whether every byte appended has been drained. */
bool sse_outbox_drained(const SseOutbox *b);
/* Copies up to `max` pending bytes into `buf`; the count copied. */
size_t sse_outbox_drain(SseOutbox *b, char *buf, size_t max);

typedef struct HttpStream HttpStream;

/* A dialect's event writer, called whenever every byte written so far has gone out: appends its
 * next events to s->box (sse_outbox_append) and returns false once the answer is over and it has
 * nothing more to write. It sets s->failed when an event could not be made (out of memory: the
 * answer ends with an error) and s->complete once the client has been given the whole answer. */
typedef bool (*HttpStreamNext)(HttpStream *s);

struct HttpStream {
    const HttpGenerateContext *ctx;
    ApiRequest req;        /* the parsed request (owned) */
    ChoiceSet set;         /* its choices (owned; at least one) */
    SseOutbox box;         /* the event bytes not yet handed to the library */
    bool failed;           /* an event could not be made: the answer ends with an error */
    bool complete;         /* the client has had the whole answer (set by the dialect) */
    const char *endpoint;  /* the metrics label (a static string) */
    const char *early_end; /* what the log says when the answer ends incomplete (a static string) */
    HttpStreamNext next;
    void *dialect;         /* the dialect's own state (owned) */
};

/* Queues a 200 text/event-stream answer whose events `next` writes. `dialect` (malloc'd) is taken
 * over in every case. When the stream itself cannot be allocated: MHD_NO, and *a and *set stay the
 * caller's. Otherwise *a and *set are taken over (left zeroed, so freeing them is a no-op) and the
 * library's answer is returned; should queueing fail, the stream is ended as a client that left. */
enum MHD_Result http_stream_start(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiRequest *a, ChoiceSet *set,
                                  const char *endpoint, const char *early_end, HttpStreamNext next, void *dialect);

#endif
