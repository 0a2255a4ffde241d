/*
 * text_stream.h — turns a request's growing list of generated token ids into text a client can be
 * sent piece by piece, and applies OpenAI `stop` strings.
 *
 * Each update decodes the completion so far and decides how much of it is safe to hand out: never
 * the bytes of an unfinished UTF-8 character, and never a tail that could still grow into a stop
 * string. When a stop string appears, the text is cut before it and the stream is marked stopped
 * (the caller then cancels generation). Emitted text is valid UTF-8: invalid bytes a byte-level
 * tokenizer can produce become U+FFFD.
 * Owns its buffers (text_stream_free). Not thread-safe: one request's HTTP thread.
 */
#ifndef BRAID_COORD_TEXT_STREAM_H
#define BRAID_COORD_TEXT_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"

typedef struct {
    char *text;      /* the decoded completion (sanitized), cut at a stop string once one matched */
    size_t len;
    size_t ready;    /* bytes of text that may be sent */
    size_t emitted;  /* bytes already taken */
    bool stopped;    /* a stop string matched */
} TextStream;

/* Re-decodes tokens[0, n) (the completion only). final: generation ended, release everything.
 * Returns 0, or -1 when out of memory. */
int text_stream_update(TextStream *ts, const Tokenizer *tok, const int32_t *tokens, int n, char *const *stops, int n_stops,
                       bool final);
/* The next piece to send (text[emitted, ready)); marks it taken. *len 0 when nothing new. */
const char *text_stream_take(TextStream *ts, size_t *len);
void text_stream_free(TextStream *ts);

/* Length of s's longest prefix that is complete, valid UTF-8 once an incomplete trailing
 * character is set aside (for holding back a character split across tokens). */
size_t utf8_complete_prefix(const char *s, size_t len);
/* A malloc'd copy with every invalid UTF-8 sequence replaced by U+FFFD; NULL when out of memory. */
char *utf8_sanitize(const char *s, size_t len, size_t *out_len);

#endif
