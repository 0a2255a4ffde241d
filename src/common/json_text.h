/*
 * json_text.h — writing JSON string literals to a stream (JSONL logs: --events, traces of names).
 * Names in those logs come from clients, so quotes, backslashes and control characters are escaped;
 * other bytes (UTF-8) pass through. Thread-safe as far as the FILE is.
 */
#ifndef BRAID_COMMON_JSON_TEXT_H
#define BRAID_COMMON_JSON_TEXT_H

#include <stdio.h>

/* Writes s (NULL = "") as a quoted JSON string. */
void json_text_string(FILE *f, const char *s);

#endif
