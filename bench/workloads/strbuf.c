/* Growable string with a sticky out-of-memory flag. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes room for `extra` more bytes plus the terminator; sets the sticky flag on failure. */
static int reserve(StrBuf *b, size_t extra) {
    if (b->failed) return -1;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = 1;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

void strbuf_append_n(StrBuf *b, const char *s, size_t n) {
    if (reserve(b, n)) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void strbuf_append(StrBuf *b, const char *s) { strbuf_append_n(b, s, strlen(s)); }

void strbuf_append_char(StrBuf *b, char c) { strbuf_append_n(b, &c, 1); }

void strbuf_appendf(StrBuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if (reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void strbuf_truncate(StrBuf *b, size_t n) {
    if (n >= b->len) return;
    b->len = n;
    b->data[n] = '\0';
}

int strbuf_failed(const StrBuf *b) { return b->failed; }

const char *strbuf_str(const StrBuf *b) { return b->data && !b->failed ? b->data : ""; }

char *strbuf_take(StrBuf *b) {
    if (b->failed) {
        strbuf_free(b);
        return NULL;
    }
    char *s = b->data ? b->data : strdup("");
    *b = (StrBuf){0};
    return s;
}

void strbuf_free(StrBuf *b) {
    free(b->data);
    *b = (StrBuf){0};
}
