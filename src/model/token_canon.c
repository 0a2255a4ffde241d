#include "model/token_canon.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/strmap.h"

/* The length of a whitespace marker at s (0 when none): ASCII blanks, U+0120 "Ġ", U+010A "Ċ",
 * U+0109 "ĉ" (GPT-2 byte-level space, newline, tab), U+2581 "▁" (SentencePiece space). */
static size_t blank_at(const unsigned char *s, size_t n) {
    if (n >= 1 && (s[0] == ' ' || s[0] == '\n' || s[0] == '\t' || s[0] == '\r')) return 1;
    if (n >= 2 && s[0] == 0xC4 && (s[1] == 0xA0 || s[1] == 0x8A || s[1] == 0x89)) return 2;
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x96 && s[2] == 0x81) return 3;
    return 0;
}

/* The piece's trimmed, lowercased text into buf (cap bytes); its length. */
static size_t canonical_text(const GgufString *piece, char *buf, size_t cap) {
    const unsigned char *s = (const unsigned char *)piece->data;
    size_t n = (size_t)piece->len, k;
    while (n > 0 && (k = blank_at(s, n)) > 0) s += k, n -= k;
    size_t out = 0;
    for (size_t i = 0; i < n && out < cap;) {
        if ((k = blank_at(s + i, n - i)) > 0) { /* inner blanks: one space */
            if (out > 0 && buf[out - 1] != ' ') buf[out++] = ' ';
            i += k;
            continue;
        }
        unsigned char ch = s[i++];
        buf[out++] = (char)(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
    }
    while (out > 0 && buf[out - 1] == ' ') out--;
    return out;
}

static bool all_digits(const char *s, size_t n) {
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

int token_canon_build(const Tokenizer *tok, int32_t **out, BraidError *err) {
    int n = tok->n_vocab;
    int32_t *map = malloc((size_t)(n > 0 ? n : 1) * sizeof *map);
    StrMap *first = strmap_create((size_t)(n > 0 ? n : 1));
    if (!map || !first) goto oom;
    int32_t digits = -1;
    for (int id = 0; id < n; id++) {
        map[id] = id;
        int32_t type = tok->types ? tok->types[id] : TOKEN_TYPE_NORMAL;
        if (type != TOKEN_TYPE_NORMAL) continue; /* control, byte, unknown: their own class */
        char buf[256];
        size_t len = canonical_text(&tok->pieces[id], buf, sizeof buf);
        if (len == 0) continue; /* all blank: blanks stay distinct from each other */
        if (all_digits(buf, len)) {
            if (digits < 0) digits = id;
            map[id] = digits;
            continue;
        }
        int32_t seen;
        if (strmap_get(first, buf, len, &seen)) map[id] = seen;
        else if (strmap_put(first, buf, len, id)) goto oom;
    }
    strmap_destroy(first);
    *out = map;
    return 0;
oom:
    free(map);
    if (first) strmap_destroy(first);
    return braid_error_set(err, "token canon: out of memory for %d tokens", n);
}
