/* Template source to tokens: data runs, tag delimiters with whitespace control, and expression
 * tokens. Follows Jinja's lexer with trim_blocks and lstrip_blocks on and keep_trailing_newline off. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja/jinja_internal.h"
#include "model/unicode.h"

static int lex_fail(JinjaError *err, JinjaStatus st, int line, const char *fmt, const char *arg) {
    err->status = st;
    err->line = line;
    char detail[400];
    snprintf(detail, sizeof detail, fmt, arg);
    snprintf(err->msg, sizeof err->msg, "line %d: %s", line, detail);
    return -1;
}

static int push(JArena *a, JTokens *t, JToken tok, JinjaError *err) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        JToken *v = jarena_alloc(a, cap * sizeof *v);
        if (!v) return lex_fail(err, JINJA_ERR_NOMEM, tok.line, "%s", "out of memory");
        if (t->n) memcpy(v, t->v, t->n * sizeof *v);
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = tok;
    return 0;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

static int count_newlines(const char *s, size_t from, size_t to) {
    int n = 0;
    for (size_t i = from; i < to; i++) n += s[i] == '\n';
    return n;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal starting at s[*pos] (the quote); Python unicode-escape rules for backslashes. */
static int lex_string(JArena *a, const char *s, size_t n, size_t *pos, int *line, JToken *tok, JinjaError *err) {
    char q = s[*pos];
    size_t i = *pos + 1, start_line = (size_t)*line;
    size_t end = i;
    while (end < n && s[end] != q) end += s[end] == '\\' ? 2 : 1;
    if (end >= n) return lex_fail(err, JINJA_ERR_SYNTAX, (int)start_line, "%s", "unterminated string literal");
    char *o = jarena_alloc(a, end - i + 1);
    if (!o) return lex_fail(err, JINJA_ERR_NOMEM, *line, "%s", "out of memory");
    size_t k = 0;
    while (i < end) {
        char c = s[i];
        if (c == '\n') (*line)++;
        if (c != '\\') { o[k++] = c; i++; continue; }
        char e = s[i + 1];
        i += 2;
        switch (e) {
        case '\n': (*line)++; break; /* line continuation */
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case 'x': case 'u': case 'U': {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 0; d < digits; d++) {
                int h = i + (size_t)d < end ? hex_value(s[i + (size_t)d]) : -1;
                if (h < 0) return lex_fail(err, JINJA_ERR_SYNTAX, *line, "%s", "truncated \\x, \\u or \\U escape in a string literal");
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF) return lex_fail(err, JINJA_ERR_SYNTAX, *line, "%s", "escape beyond U+10FFFF in a string literal");
            i += (size_t)digits;
            k += (size_t)utf8_encode(cp, o + k); /* at most digits+2 bytes of input, at most 4 of output */
            break;
        }
        case 'N': return lex_fail(err, JINJA_ERR_UNSUPPORTED, *line, "%s", "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && i < end && s[i] >= '0' && s[i] <= '7'; d++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                k += (size_t)utf8_encode(cp, o + k);
            } else {
                o[k++] = '\\';
                i--; /* keep the character after the backslash as it is */
            }
        }
    }
    o[k] = '\0';
    tok->kind = JT_STRING;
    tok->text = o;
    tok->len = k;
    *pos = end + 1;
    return 0;
}

static int lex_number(const char *s, size_t n, size_t *pos, bool after_dot, JToken *tok, JinjaError *err, int line) {
    char buf[128];
    size_t k = 0, i = *pos;
    bool is_float = false;
    while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1])))) {
        if (s[i] != '_' && k < sizeof buf - 1) buf[k++] = s[i];
        i++;
    }
    if (!after_dot && i + 1 < n && s[i] == '.' && is_digit(s[i + 1])) {
        is_float = true;
        buf[k < sizeof buf - 1 ? k++ : k] = '.';
        i++;
        while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1])))) {
            if (s[i] != '_' && k < sizeof buf - 1) buf[k++] = s[i];
            i++;
        }
    }
    if (!after_dot && i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        if (j < n && is_digit(s[j])) {
            is_float = true;
            for (size_t m = i; m < j && k < sizeof buf - 1; m++) buf[k++] = s[m];
            i = j;
            while (i < n && is_digit(s[i])) {
                if (k < sizeof buf - 1) buf[k++] = s[i];
                i++;
            }
        }
    }
    buf[k] = '\0';
    if (k >= sizeof buf - 2) return lex_fail(err, JINJA_ERR_SYNTAX, line, "%s", "number literal too long");
    if (is_float) {
        tok->kind = JT_FLOAT;
        tok->f = strtod(buf, NULL);
    } else {
        tok->kind = JT_INT;
        int64_t v = 0;
        for (size_t m = 0; m < k; m++) {
            if (v > (INT64_MAX - (buf[m] - '0')) / 10) return lex_fail(err, JINJA_ERR_SYNTAX, line, "%s", "integer literal too large");
            v = v * 10 + (buf[m] - '0');
        }
        tok->i = v;
    }
    *pos = i;
    return 0;
}

static const struct {
    const char *text;
    JOp op;
} ops[] = {
    {"//", JOP_FLOORDIV}, {"**", JOP_POW}, {"==", JOP_EQ}, {"!=", JOP_NE}, {">=", JOP_GE}, {"<=", JOP_LE},
    {"+", JOP_ADD}, {"-", JOP_SUB}, {"*", JOP_MUL}, {"/", JOP_DIV}, {"%", JOP_MOD}, {"~", JOP_TILDE},
    {"[", JOP_LBRACKET}, {"]", JOP_RBRACKET}, {"(", JOP_LPAREN}, {")", JOP_RPAREN}, {"{", JOP_LBRACE},
    {"}", JOP_RBRACE}, {">", JOP_GT}, {"<", JOP_LT}, {"=", JOP_ASSIGN}, {".", JOP_DOT}, {":", JOP_COLON},
    {"|", JOP_PIPE}, {",", JOP_COMMA}, {";", JOP_SEMICOLON},
};

/* Expression tokens of one tag, from *pos to its end delimiter (consumed, with its whitespace rule). */
static int lex_tag(JArena *a, const char *s, size_t n, size_t *pos, int *line, bool block, bool *line_starting, JTokens *out,
                   JinjaError *err) {
    int depth = 0, open_line = *line;
    size_t i = *pos;
    for (;;) {
        while (i < n && is_space(s[i])) {
            if (s[i] == '\n') (*line)++;
            i++;
        }
        if (i >= n)
            return lex_fail(err, JINJA_ERR_SYNTAX, open_line, "unexpected end of template: the tag opened here is missing its '%s'",
                            block ? "%}" : "}}");
        if (depth == 0) {
            char close = block ? '%' : '}';
            size_t at = i;
            char mod = 0;
            if ((s[i] == '-' || (block && s[i] == '+')) && i + 2 < n + 1 && i + 1 < n && s[i + 1] == close) {
                mod = s[i];
                at = i + 1;
            }
            if (at + 1 < n && s[at] == close && s[at + 1] == '}') {
                JToken t = {.kind = block ? JT_BLOCK_END : JT_VAR_END, .line = *line};
                if (push(a, out, t, err)) return -1;
                i = at + 2;
                char last = '}';
                if (mod == '-') {
                    while (i < n && is_space(s[i])) {
                        if (s[i] == '\n') (*line)++;
                        last = s[i++];
                    }
                } else if (block && mod == 0 && i < n && s[i] == '\n') {
                    (*line)++;
                    last = s[i++];
                }
                *line_starting = last == '\n';
                *pos = i;
                return 0;
            }
        }
        JToken t = {.line = *line};
        char c = s[i];
        if (is_name_start(c)) {
            size_t st = i;
            while (i < n && is_name_char(s[i])) i++;
            t.kind = JT_NAME;
            t.text = jarena_strndup(a, s + st, i - st);
            t.len = i - st;
            if (!t.text) return lex_fail(err, JINJA_ERR_NOMEM, *line, "%s", "out of memory");
        } else if (is_digit(c)) {
            bool after_dot = out->n > 0 && out->v[out->n - 1].kind == JT_OP && out->v[out->n - 1].op == JOP_DOT;
            if (lex_number(s, n, &i, after_dot, &t, err, *line)) return -1;
        } else if (c == '\'' || c == '"') {
            if (lex_string(a, s, n, &i, line, &t, err)) return -1;
        } else {
            size_t k;
            for (k = 0; k < sizeof ops / sizeof ops[0]; k++) {
                size_t l = strlen(ops[k].text);
                if (i + l <= n && memcmp(s + i, ops[k].text, l) == 0) break;
            }
            if (k == sizeof ops / sizeof ops[0]) {
                char shown[8];
                snprintf(shown, sizeof shown, (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f ? "%c" : "\\x%02x", c & 0xff);
                return lex_fail(err, JINJA_ERR_SYNTAX, *line, "unexpected character '%s' in a tag", shown);
            }
            t.kind = JT_OP;
            t.op = ops[k].op;
            i += strlen(ops[k].text);
            if (t.op == JOP_LBRACKET || t.op == JOP_LPAREN || t.op == JOP_LBRACE) {
                if (++depth > JINJA_MAX_PARSE_DEPTH) return lex_fail(err, JINJA_ERR_LIMIT, *line, "%s", "brackets nested too deeply");
            } else if (t.op == JOP_RBRACKET || t.op == JOP_RPAREN || t.op == JOP_RBRACE) {
                if (depth == 0) {
                    const char *txt = t.op == JOP_RBRACKET ? "]" : t.op == JOP_RPAREN ? ")" : "}";
                    return lex_fail(err, JINJA_ERR_SYNTAX, *line, "unexpected '%s'", txt);
                }
                depth--;
            }
        }
        if (push(a, out, t, err)) return -1;
    }
}

/* At s[i] (just after "{%" and its -/+ modifier): "raw" alone in the tag? Returns the index just
 * after the tag's "%}" and sets *strip when it ended with "-%}"; 0 when this is not a raw tag. */
static size_t match_raw_begin(const char *s, size_t n, size_t i, bool *strip) {
    while (i < n && is_space(s[i])) i++;
    if (i + 3 > n || memcmp(s + i, "raw", 3) != 0 || (i + 3 < n && is_name_char(s[i + 3]))) return 0;
    i += 3;
    while (i < n && is_space(s[i])) i++;
    *strip = i < n && s[i] == '-';
    if (*strip) i++;
    if (i + 2 > n || s[i] != '%' || s[i + 1] != '}') return 0;
    return i + 2;
}

/* The first "{% endraw %}" (with -/+ modifiers) at or after i: its start, its "%}" end, and the
 * modifiers before (*open_mod) and after (*close_mod). Returns false when there is none. */
static bool find_raw_end(const char *s, size_t n, size_t i, size_t *start, size_t *end, char *open_mod, char *close_mod) {
    for (; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t k = i + 2;
        *open_mod = k < n && (s[k] == '-' || s[k] == '+') ? s[k] : 0;
        if (*open_mod) k++;
        while (k < n && is_space(s[k])) k++;
        if (k + 6 > n || memcmp(s + k, "endraw", 6) != 0) continue;
        k += 6;
        while (k < n && is_space(s[k])) k++;
        *close_mod = k < n && (s[k] == '-' || s[k] == '+') ? s[k] : 0;
        if (*close_mod) k++;
        if (k + 2 > n || s[k] != '%' || s[k + 1] != '}') continue;
        *start = i;
        *end = k + 2;
        return true;
    }
    return false;
}

int jinja_lex(JArena *a, const char *src, size_t len, JTokens *out, JinjaError *err) {
    memset(out, 0, sizeof *out);
    char *s = jarena_alloc(a, len + 1);
    if (!s) return lex_fail(err, JINJA_ERR_NOMEM, 0, "%s", "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--; /* keep_trailing_newline=False */
    s[n] = '\0';
    size_t pos = 0;
    int line = 1;
    bool line_starting = true;
    while (pos < n) {
        size_t t = pos;
        while (t + 1 < n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= n) t = n;
        size_t data_end = t;
        char kind = t < n ? s[t + 1] : 0, mod = 0;
        if (t < n && t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+')) mod = s[t + 2];
        if (t < n) {
            if (mod == '-') {
                while (data_end > pos && is_space(s[data_end - 1])) data_end--;
            } else if (mod != '+' && kind != '{') { /* lstrip_blocks */
                size_t l = data_end;
                while (l > pos && s[l - 1] != '\n') l--;
                bool ws = data_end > l;
                for (size_t k = l; k < data_end && ws; k++) ws = is_space(s[k]);
                if ((l > pos || line_starting) && ws) data_end = l;
            }
        }
        if (data_end > pos) {
            JToken d = {.kind = JT_DATA, .line = line, .text = s + pos, .len = data_end - pos};
            if (push(a, out, d, err)) return -1;
        }
        line += count_newlines(s, pos, t);
        if (t >= n) break;
        pos = t + 2 + (mod ? 1 : 0);
        if (kind == '#') {
            size_t e = pos;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) return lex_fail(err, JINJA_ERR_SYNTAX, line, "%s", "missing end of comment tag '#}'");
            char cmod = e > pos && (s[e - 1] == '-' || s[e - 1] == '+') ? s[e - 1] : 0;
            line += count_newlines(s, pos, e);
            pos = e + 2;
            char last = '}';
            if (cmod == '-') {
                while (pos < n && is_space(s[pos])) {
                    if (s[pos] == '\n') line++;
                    last = s[pos++];
                }
            } else if (cmod == 0 && pos < n && s[pos] == '\n') {
                line++;
                last = s[pos++];
            }
            line_starting = last == '\n';
            continue;
        }
        bool block = kind == '%', raw_strip = false;
        size_t raw_body = block ? match_raw_begin(s, n, pos, &raw_strip) : 0;
        if (raw_body) { /* {% raw %}...{% endraw %}: the text between, as it is */
            size_t body = raw_body, end_start, end_end;
            char open_mod, close_mod;
            if (raw_strip)
                while (body < n && is_space(s[body])) body++;
            bool body_line_starting = body > raw_body && s[body - 1] == '\n'; /* the tag's match ended a line */
            if (!find_raw_end(s, n, body, &end_start, &end_end, &open_mod, &close_mod))
                return lex_fail(err, JINJA_ERR_SYNTAX, line, "%s", "'{% raw %}' is never closed (expected '{% endraw %}')");
            size_t data_stop = end_start;
            if (open_mod == '-') {
                while (data_stop > body && is_space(s[data_stop - 1])) data_stop--;
            } else if (open_mod != '+') {
                size_t l = data_stop;
                while (l > body && s[l - 1] != '\n') l--;
                bool ws = data_stop > l;
                for (size_t k = l; k < data_stop && ws; k++) ws = is_space(s[k]);
                if ((l > body || body_line_starting) && ws) data_stop = l;
            }
            if (data_stop > body) {
                JToken d = {.kind = JT_DATA, .line = line + count_newlines(s, t, body), .text = s + body, .len = data_stop - body};
                if (push(a, out, d, err)) return -1;
            }
            line += count_newlines(s, t, end_end);
            pos = end_end;
            char last = '}';
            if (close_mod == '-') {
                while (pos < n && is_space(s[pos])) {
                    if (s[pos] == '\n') line++;
                    last = s[pos++];
                }
            } else if (close_mod == 0 && pos < n && s[pos] == '\n') {
                line++;
                last = s[pos++];
            }
            line_starting = last == '\n';
            continue;
        }
        JToken b = {.kind = block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, .line = line};
        if (push(a, out, b, err)) return -1;
        if (lex_tag(a, s, n, &pos, &line, block, &line_starting, out, err)) return -1;
    }
    JToken eof = {.kind = JT_EOF, .line = line};
    return push(a, out, eof, err);
}
