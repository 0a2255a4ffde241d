#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int braid_error_set(BraidError *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int braid_error_wrap(BraidError *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    /* Truncation is acceptable: the message keeps its most useful, leading part. */
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t rest = sizeof err->msg - n - 3;
    size_t old_len = strnlen(old, rest);
    memcpy(err->msg + n + 2, old, old_len);
    err->msg[n + 2 + old_len] = '\0';
    return -1;
}
