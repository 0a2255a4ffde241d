/*
 * float_b64.h — a float vector as text: base64 (RFC 4648, with padding) of its little-endian IEEE
 * float32 bytes. Hidden states travel this way in trace lines and the hidden-state files of
 * `braid batch --hidden-out` (docs/TRACE_FORMAT.md), compact and exact.
 * Pure functions; the caller owns what they return.
 */
#ifndef BRAID_COMMON_FLOAT_B64_H
#define BRAID_COMMON_FLOAT_B64_H

#include <stddef.h>

/* A NUL-terminated malloc'd string, or NULL when out of memory. */
char *float_b64_encode(const float *v, int n);
/* Decodes text into a malloc'd array of *n floats. Returns NULL (and *n = 0) when text is not
 * valid padded base64 of a whole number of floats (at most max_n), a value is not finite, or out
 * of memory. */
float *float_b64_decode(const char *text, int max_n, int *n);

#endif
