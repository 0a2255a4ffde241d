/*
 * error.h — error reporting with context, for every module.
 *
 * Contract: functions that can fail return 0 on success and a negative value on failure, and fill a
 * caller-owned BraidError with a human-readable message naming what went wrong and where. Nothing
 * below main() prints-and-exits; the caller decides what to do with the message.
 * Thread-safety: a BraidError belongs to one caller; the functions keep no state.
 */
#ifndef BRAID_COMMON_ERROR_H
#define BRAID_COMMON_ERROR_H

#include <stddef.h>

typedef struct BraidError {
    char msg[512];
} BraidError;

/* Formats the message into err (if err is non-NULL) and returns -1, so callers can write
 * `return braid_error_set(err, "gguf: %s: truncated header", path);`. */
int braid_error_set(BraidError *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message, for adding context while unwinding. Returns -1. */
int braid_error_wrap(BraidError *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
