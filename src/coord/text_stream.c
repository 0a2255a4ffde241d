#include "coord/text_stream.h"

#include <stdlib.h>
#include <string.h>

/* Bytes in the UTF-8 sequence a lead byte starts, or 0 for a byte that cannot start one. */
static int utf8_seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Length of the valid sequence at s (0 if invalid); *truncated when it is a valid start cut off by the end. */
static int utf8_valid_at(const unsigned char *s, size_t avail, bool *truncated) {
    *truncated = false;
    int n = utf8_seq_len(s[0]);
    if (n == 0) return 0;
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= avail) {
            *truncated = true;
            return 0;
        }
        if ((s[i] & 0xC0) != 0x80) return 0;
    }
    /* Overlong forms, surrogates and code points past U+10FFFF. */
    if (n == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) return 0;
    if (n == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))) return 0;
    return n;
}

size_t utf8_complete_prefix(const char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        bool truncated;
        int n = utf8_valid_at((const unsigned char *)s + i, len - i, &truncated);
        if (truncated) return i;
        i += n ? (size_t)n : 1; /* an invalid byte is complete: it will be replaced, not waited for */
    }
    return len;
}

char *utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    char *out = malloc(len * 3 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        bool truncated;
        int n = utf8_valid_at((const unsigned char *)s + i, len - i, &truncated);
        if (n) {
            memcpy(out + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

/* Longest tail of text[0, len) that is a proper prefix of some stop string: it must wait. */
static size_t stop_holdback(const char *text, size_t len, char *const *stops, int n_stops) {
    size_t hold = 0;
    for (int s = 0; s < n_stops; s++) {
        size_t sl = strlen(stops[s]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k > hold; k--)
            if (k <= len && memcmp(text + len - k, stops[s], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* Earliest position where any stop string starts, at or after `from`; len when none. */
static size_t first_stop(const char *text, size_t len, size_t from, char *const *stops, int n_stops) {
    size_t best = len;
    for (int s = 0; s < n_stops; s++) {
        size_t sl = strlen(stops[s]);
        if (!sl) continue;
        for (size_t i = from; i + sl <= len && i < best; i++)
            if (memcmp(text + i, stops[s], sl) == 0) {
                best = i;
                break;
            }
    }
    return best;
}

int text_stream_update(TextStream *ts, const Tokenizer *tok, const int32_t *tokens, int n, char *const *stops, int n_stops,
                       bool final) {
    if (ts->stopped) return 0;
    size_t raw_len = 0;
    char *raw = n > 0 ? tokenizer_decode(tok, tokens, n, &raw_len) : calloc(1, 1);
    if (!raw) return -1;
    size_t complete = final ? raw_len : utf8_complete_prefix(raw, raw_len), len = 0;
    char *text = utf8_sanitize(raw, complete, &len);
    free(raw);
    if (!text) return -1;
    free(ts->text);
    ts->text = text;
    ts->len = len;
    /* A stop string can only start in text not yet sent: sent text never held one. */
    size_t scan_from = ts->emitted;
    size_t cut = first_stop(text, len, scan_from, stops, n_stops);
    if (cut < len) {
        ts->len = cut;
        ts->text[cut] = '\0';
        ts->ready = cut;
        ts->stopped = true;
        return 0;
    }
    size_t ready = final ? len : len - stop_holdback(text, len, stops, n_stops);
    if (ready < ts->emitted) ready = ts->emitted;
    ts->ready = ready;
    return 0;
}

const char *text_stream_take(TextStream *ts, size_t *len) {
    *len = ts->ready > ts->emitted ? ts->ready - ts->emitted : 0;
    const char *p = ts->text ? ts->text + ts->emitted : "";
    ts->emitted += *len;
    return p;
}

void text_stream_free(TextStream *ts) {
    free(ts->text);
    memset(ts, 0, sizeof *ts);
}
