/* SSE framing: bytes in, data payloads out; the contract is in sse_reader.h. */
#include "sse_reader.h"

#include <stdlib.h>
#include <string.h>

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
        strbuf_append_n(&r->line, bytes, take);
        if (strbuf_failed(&r->line)) return braid_error_set(err, "sse: out of memory buffering a %zu-byte line", r->line.len + take);
        if (!nl) return 0;
        bytes += take + 1;
        n -= take + 1;
        int rc = dispatch_line(r->line.data, r->line.len, on_data, ctx, err);
        strbuf_truncate(&r->line, 0); /* emptied whatever the callback said, so a stop leaves the reader clean */
        if (rc) return -1;
    }
    return 0;
}

void sse_reader_free(SseReader *r) { strbuf_free(&r->line); }
