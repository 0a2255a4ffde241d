/*
 * sse_reader.h — splits a Server-Sent Events byte stream into the payloads of its "data:" lines.
 *
 * Owns: the bytes of a line not yet complete (the network hands the stream over in arbitrary
 * pieces, so a line can be split anywhere, even inside a UTF-8 character). Each complete line
 * "data: PAYLOAD" is handed to the callback with the payload (the one optional space after the
 * colon removed, "\r\n" endings accepted); comments, blank lines and other fields are skipped.
 * Called by: http_client.c from libcurl's write callback.
 * Thread-safety: one SseReader per stream, used by one thread.
 */
#ifndef BRAID_BENCH_DRIVER_SSE_READER_H
#define BRAID_BENCH_DRIVER_SSE_READER_H

#include <stddef.h>

#include "common/error.h"
#include "strbuf.h"

typedef struct {
    StrBuf line; /* the incomplete line so far */
} SseReader;

/* Called with one payload (NUL-terminated, len bytes); returns 0 to go on, -1 to stop the stream
 * (then it has set err). */
typedef int (*SseDataFn)(void *ctx, const char *payload, size_t len, BraidError *err);

/* Feeds n bytes; calls on_data for every complete data line. Returns 0, or -1 with err set when
 * out of memory or when the callback stopped. */
int sse_reader_feed(SseReader *r, const char *bytes, size_t n, SseDataFn on_data, void *ctx, BraidError *err);

void sse_reader_free(SseReader *r);

#endif
