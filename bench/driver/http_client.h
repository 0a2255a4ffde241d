/*
 * http_client.h — one completion request to a Braid (or any OpenAI-compatible) server over libcurl,
 * streamed, with its timings and usage.
 *
 * Owns: one CURL easy handle (so connections are kept alive between the requests of one client)
 * and the results it fills. Every request is sent with "stream": true and
 * "stream_options": {"include_usage": true}; the SSE stream is parsed as it arrives, so the time of
 * the first text chunk is the client-side time to first token. A 429 answer is retried after its
 * Retry-After (1 s when absent), up to max_retries times; the retries are counted, and the latency
 * runs from the first attempt, as a user would see it.
 * Keep-alive: servers close idle connections whenever they like (after N requests, right after a
 * response, mid-idle, with or without "Connection: close"); libcurl handles the framing (chunked,
 * Content-Length, or a body that ends with the connection). A request whose attempt went out on a
 * reused connection and got no byte of answer at all is resent once, on a fresh connection, and
 * counted (connection_retries); once any byte of an answer has arrived it is never resent. This
 * holds whether libcurl resends by itself (it does so for a dead reused connection; a
 * pre-request callback counts and bounds that) or gives up (then the client resends).
 * Called by: replay.c (one client per client thread) and run.c (one client per in-flight call).
 * Thread-safety: a client belongs to one thread at a time; clients are independent.
 * Memory: an HttpResult owns its text; http_result_free releases it. The body passed in stays the
 * caller's (the client adds the stream fields to it).
 */
#ifndef BRAID_BENCH_DRIVER_HTTP_CLIENT_H
#define BRAID_BENCH_DRIVER_HTTP_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

typedef struct HttpClient HttpClient;

typedef struct {
    double t_send;          /* braid_now_seconds() when the first attempt was sent */
    double t_first_text;    /* when the first chunk with non-empty text arrived; 0 if none did */
    double t_end;           /* when the answer was complete (or failed) */
    int status;             /* HTTP status of the last attempt; 0 when no answer came at all */
    int retries;            /* 429 answers waited out */
    int connection_retries; /* resends after a reused connection died before any byte of answer (0 or 1) */
    double *chunk_times;    /* (n_chunks) arrival times of the chunks that carried text, for inter-token latency; owned */
    int n_chunks;
    char *text;             /* the generated text (NUL-terminated, text_len bytes); NULL only when out of memory */
    size_t text_len;
    int prompt_tokens, completion_tokens, cached_tokens; /* from the usage chunk; -1 when none came */
    int segment_reused_tokens;                           /* Braid's usage extension; 0 when absent */
    char finish_reason[16]; /* "stop", "length", or "" when none came */
    char error[320];        /* why the request failed: the body's error.message, or the transport error; "" when it succeeded */
} HttpResult;

/* Once per process, before any thread creates a client (libcurl's global state). */
int http_client_global_init(BraidError *err);
void http_client_global_cleanup(void);

/* base_url: "http://host:port" (a trailing "/" or "/v1" is dropped). Returns NULL with err set. */
HttpClient *http_client_create(const char *base_url, int max_retries, BraidError *err);
void http_client_free(HttpClient *c);

/* POSTs body (a JSON object: "prompt" for /v1/completions, "messages" for /v1/chat/completions)
 * to base_url + path and reads the stream to its end. Returns 0 when the server answered 200 with a
 * complete stream ending in [DONE]; -1 otherwise, with out->status and out->error saying what
 * failed. out is always filled (zeroed first) and must be freed with http_result_free. */
int http_client_complete(HttpClient *c, const char *path, json_t *body, HttpResult *out);

/* POST /v1/workflows/{id}/end. Returns 0 on a 200, -1 with err set otherwise; *status gets the
 * HTTP status (0 when no answer came), so a caller can tell "not supported here" (404, 405) from
 * a failure. */
int http_client_end_workflow(HttpClient *c, const char *workflow, int *status, BraidError *err);

void http_result_free(HttpResult *r);

#endif
