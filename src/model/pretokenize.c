#include "model/pretokenize.h"

#include <stdlib.h>
#include <string.h>

#include "model/unicode.h"

int pretokenizer_from_name(const char *name, PreTokenizerKind *kind) {
    static const struct { const char *name; PreTokenizerKind kind; } known[] = {
        {"default", PRETOKENIZER_GPT2}, {"gpt2", PRETOKENIZER_GPT2},         {"gpt-2", PRETOKENIZER_GPT2},
        {"smollm", PRETOKENIZER_SMOLLM}, {"llama3", PRETOKENIZER_LLAMA3}, {"llama-bpe", PRETOKENIZER_LLAMA3},
        {"llama-v3", PRETOKENIZER_LLAMA3}, {"qwen2", PRETOKENIZER_QWEN2},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i].name) == 0) {
            *kind = known[i].kind;
            return 0;
        }
    return -1;
}

const char *pretokenizer_name(PreTokenizerKind kind) {
    switch (kind) {
    case PRETOKENIZER_SMOLLM: return "smollm";
    case PRETOKENIZER_LLAMA3: return "llama3";
    case PRETOKENIZER_QWEN2: return "qwen2";
    default: return "gpt2";
    }
}

/* Text decoded once into code points with their byte offsets (off has n + 1 entries). */
typedef struct {
    uint32_t *cp;
    size_t *off;
    UnicodeClass *cls;
    int n;
} CodePoints;

static int decode_all(const char *text, size_t len, CodePoints *t) {
    t->cp = malloc((len + 1) * sizeof *t->cp);
    t->off = malloc((len + 1) * sizeof *t->off);
    t->cls = malloc((len + 1) * sizeof *t->cls);
    if (!t->cp || !t->off || !t->cls) return -1;
    size_t i = 0;
    int n = 0;
    while (i < len) {
        t->off[n] = i;
        i += (size_t)utf8_decode((const uint8_t *)text + i, len - i, &t->cp[n]);
        t->cls[n] = unicode_class(t->cp[n]);
        n++;
    }
    t->off[n] = len;
    t->n = n;
    return 0;
}

static void free_all(CodePoints *t) {
    free(t->cp);
    free(t->off);
    free(t->cls);
}

static int lower_ascii(uint32_t c) { return c < 0x80 ? (int)(c | 0x20) : (int)c; }

/* 's 't 're 've 'm 'll 'd at i: returns the end, or i when absent. */
static int match_contraction(const CodePoints *t, int i, int end, int case_insensitive) {
    if (t->cp[i] != '\'' || i + 1 >= end) return i;
    uint32_t a = t->cp[i + 1], b = i + 2 < end ? t->cp[i + 2] : 0;
    if (case_insensitive) {
        a = (uint32_t)lower_ascii(a);
        b = (uint32_t)lower_ascii(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return i;
}

static int run_of(const CodePoints *t, int i, int end, UnicodeClass cls) {
    while (i < end && t->cls[i] == cls) i++;
    return i;
}

/* \s+(?!\S) then \s+ at i (t->cls[i] is SPACE). */
static int match_whitespace(const CodePoints *t, int i, int end) {
    int e = run_of(t, i, end, UCLASS_SPACE);
    if (e == end) return e;
    return e - i >= 2 ? e - 1 : i + 1;
}

static int match_gpt2(const CodePoints *t, int i, int end) {
    int e = match_contraction(t, i, end, 0);
    if (e > i) return e;
    int s = (t->cp[i] == ' ' && i + 1 < end && t->cls[i + 1] != UCLASS_SPACE) ? i + 1 : i;
    if (t->cls[s] != UCLASS_SPACE) return run_of(t, s, end, t->cls[s]);
    return match_whitespace(t, i, end);
}

static int is_newline(uint32_t c) { return c == '\r' || c == '\n'; }

/* llama3's expression, whose number alternative is \p{N}{1,max_digits} (qwen2: single digits). */
static int match_llama3(const CodePoints *t, int i, int end, int max_digits) {
    int e = match_contraction(t, i, end, 1);
    if (e > i) return e;
    UnicodeClass c = t->cls[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c == UCLASS_LETTER) return run_of(t, i, end, UCLASS_LETTER);
    if (c != UCLASS_NUMBER && !is_newline(t->cp[i]) && i + 1 < end && t->cls[i + 1] == UCLASS_LETTER)
        return run_of(t, i + 1, end, UCLASS_LETTER);
    /* \p{N}{1,3} (llama3), \p{N} (qwen2) */
    if (c == UCLASS_NUMBER) {
        e = i;
        while (e < end && e < i + max_digits && t->cls[e] == UCLASS_NUMBER) e++;
        return e;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    int s = (t->cp[i] == ' ' && i + 1 < end && t->cls[i + 1] == UCLASS_OTHER) ? i + 1 : i;
    if (t->cls[s] == UCLASS_OTHER) {
        e = run_of(t, s, end, UCLASS_OTHER);
        while (e < end && is_newline(t->cp[e])) e++;
        return e;
    }
    /* \s*[\r\n]+ : through the last newline of the whitespace run */
    int run_end = run_of(t, i, end, UCLASS_SPACE), last_newline = -1;
    for (int k = i; k < run_end; k++)
        if (is_newline(t->cp[k])) last_newline = k;
    if (last_newline >= 0) return last_newline + 1;
    return match_whitespace(t, i, end);
}

static int emit_words(const CodePoints *t, int begin, int end, PreTokenizerKind kind, const char *text,
                      PretokenizeWordFn fn, void *user) {
    for (int i = begin; i < end;) {
        int e = kind == PRETOKENIZER_LLAMA3 ? match_llama3(t, i, end, 3)
                : kind == PRETOKENIZER_QWEN2  ? match_llama3(t, i, end, 1)
                                              : match_gpt2(t, i, end);
        int rc = fn(user, text + t->off[i], t->off[e] - t->off[i]);
        if (rc) return rc;
        i = e;
    }
    return 0;
}

int pretokenize(PreTokenizerKind kind, const char *text, size_t len, PretokenizeWordFn fn, void *user) {
    if (len == 0) return 0;
    CodePoints t = {0};
    if (decode_all(text, len, &t)) {
        free_all(&t);
        return -1;
    }
    int rc = 0;
    if (kind == PRETOKENIZER_SMOLLM) {
        /* Digits first become words of their own; the pieces between them split as gpt2, each on
         * its own (so the (?!\S) lookahead sees the piece's end, not the following digit). */
        int start = 0;
        for (int i = 0; i <= t.n && rc == 0; i++) {
            if (i < t.n && t.cls[i] != UCLASS_NUMBER) continue;
            rc = emit_words(&t, start, i, PRETOKENIZER_GPT2, text, fn, user);
            if (rc == 0 && i < t.n) rc = fn(user, text + t.off[i], t.off[i + 1] - t.off[i]);
            start = i + 1;
        }
    } else {
        rc = emit_words(&t, 0, t.n, kind, text, fn, user);
    }
    free_all(&t);
    return rc;
}
