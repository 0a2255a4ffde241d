#include "model/unicode.h"

static int in_ranges(const UnicodeRange *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

int unicode_is_whitespace(uint32_t cp) {
    /* The White_Space property, which regex \s matches in Unicode mode. */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

UnicodeClass unicode_class(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return UCLASS_LETTER;
        if (cp >= '0' && cp <= '9') return UCLASS_NUMBER;
        return unicode_is_whitespace(cp) ? UCLASS_SPACE : UCLASS_OTHER;
    }
    if (unicode_is_whitespace(cp)) return UCLASS_SPACE;
    if (in_ranges(unicode_letter_ranges, unicode_letter_ranges_count, cp)) return UCLASS_LETTER;
    if (in_ranges(unicode_number_ranges, unicode_number_ranges_count, cp)) return UCLASS_NUMBER;
    return UCLASS_OTHER;
}

int utf8_decode(const uint8_t *s, size_t len, uint32_t *cp) {
    uint8_t c = s[0];
    int n;
    uint32_t v, min;
    if (c < 0x80) { *cp = c; return 1; }
    if ((c & 0xE0) == 0xC0) { n = 2; v = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { n = 3; v = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { n = 4; v = c & 0x07; min = 0x10000; }
    else { *cp = 0xFFFD; return 1; }
    if ((size_t)n > len) { *cp = 0xFFFD; return 1; }
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) { *cp = 0xFFFD; return 1; }
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { *cp = 0xFFFD; return 1; }
    *cp = v;
    return n;
}

int utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int utf8_is_valid(const char *s, size_t len) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        uint32_t cp;
        int n = utf8_decode(p + i, len - i, &cp);
        if (cp == 0xFFFD && n == 1 && p[i] >= 0x80) return 0;
        i += (size_t)n;
    }
    return 1;
}
