/* SSE framing: bytes in, data payloads out; the contract is in sse_reader.h. */
#include "sse_reader.h"

#include <stdlib.h>
#include <string.h>

static int append(SseReader *r, const char *bytes, size_t n, BraidError *err) {
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 1024;
        while (cap < r->len + n + 1) cap *= 2;
        char *grown = realloc(r->line, cap);
        if (!grown) return braid_error_set(err, "sse: out of memory buffering a %zu-byte line", r->len + n);
        r->line = grown;
        r->cap = cap;
    }
    memcpy(r->line + r->len, bytes, n);
    r->len += n;
    r->line[r->len] = '\0';
    return 0;
}

/* One complete line (without its '\n'): hands a data payload to the callback, skips the rest. */
static int dispatch_line(char *line, size_t len, SseDataFn on_data, void *ctx, BraidError *err) {
    if (len > 0 && line[len - 1] == '\r') line[--len] = '\0';
    static const char field[] = "data:";
    if (len < sizeof field - 1 || memcmp(line, field, sizeof field - 1) != 0) return 0;
    char *payload = line + sizeof field - 1;
    if (*payload == ' ') payload++;
    return on_data(ctx, payload, len - (size_t)(payload - line), err);
}

int sse_reader_feed(SseReader *r, const char *bytes, size_t n, SseDataFn on_data, void *ctx, BraidError *err) {
    while (n > 0) {
        const char *nl = memchr(bytes, '\n', n);
        size_t take = nl ? (size_t)(nl - bytes) : n;
        if (append(r, bytes, take, err)) return -1;
        if (!nl) return 0;
        bytes += take + 1;
        n -= take + 1;
        size_t len = r->len;
        r->len = 0; /* reset before the callback so a stop leaves the reader clean */
        if (dispatch_line(r->line, len, on_data, ctx, err)) return -1;
    }
    return 0;
}

void sse_reader_free(SseReader *r) {
    free(r->line);
    *r = (SseReader){0};
}
