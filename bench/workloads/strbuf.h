/*
 * strbuf.h — a growable NUL-terminated string for assembling prompts and filler text.
 *
 * Out of memory is sticky: once an append fails, every later append is a no-op and
 * strbuf_failed() says so, so a builder can append freely and check once at the end.
 * The buffer is owned by the StrBuf until strbuf_take() hands it to the caller. Not thread-safe.
 */
#ifndef BRAID_BENCH_WORKLOADS_STRBUF_H
#define BRAID_BENCH_WORKLOADS_STRBUF_H

#include <stddef.h>

typedef struct {
    char *data; /* NUL-terminated when len > 0 or after the first append; may be NULL when empty */
    size_t len, cap;
    int failed;
} StrBuf;

void strbuf_append(StrBuf *b, const char *s);
void strbuf_append_n(StrBuf *b, const char *s, size_t n);
void strbuf_appendf(StrBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void strbuf_append_char(StrBuf *b, char c);
/* Drops everything after the first n bytes (n <= len). */
void strbuf_truncate(StrBuf *b, size_t n);
int strbuf_failed(const StrBuf *b);
/* The text so far ("" when empty); valid until the next append. */
const char *strbuf_str(const StrBuf *b);
/* Hands the buffer to the caller (free() it) and resets b; NULL when an append had failed. */
char *strbuf_take(StrBuf *b);
void strbuf_free(StrBuf *b);

#endif
