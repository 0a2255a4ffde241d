#include "model/chat_template.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *find_bytes(const char *hay, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; n <= len && i + n <= len; i++)
        if (memcmp(hay + i, needle, n) == 0) return hay + i;
    return NULL;
}

ChatTemplateKind chat_template_detect(const char *text, size_t len) {
    if (find_bytes(text, len, "<|im_start|>")) return CHAT_TEMPLATE_CHATML;
    if (find_bytes(text, len, "<|start_header_id|>")) return CHAT_TEMPLATE_LLAMA3;
    if (find_bytes(text, len, "[INST]")) return CHAT_TEMPLATE_LLAMA2;
    return CHAT_TEMPLATE_NONE;
}

const char *chat_template_kind_name(ChatTemplateKind kind) {
    switch (kind) {
    case CHAT_TEMPLATE_CHATML: return "chatml";
    case CHAT_TEMPLATE_LLAMA3: return "llama3";
    case CHAT_TEMPLATE_LLAMA2: return "llama2";
    default: return "none";
    }
}

/* A ChatML template that injects a system turn writes it as a string literal
 * '<|im_start|>system\n…<|im_end|>' guarded by a check on messages[0]['role']. */
static char *extract_default_system(const char *t, size_t len) {
    /* The newline may be stored as a character or as the escape sequence inside the literal. */
    const char *marker = "<|im_start|>system\n";
    const char *start = find_bytes(t, len, marker);
    if (!start) start = find_bytes(t, len, marker = "<|im_start|>system\\n");
    if (!start || !find_bytes(t, len, "!= 'system'")) return NULL;
    start += strlen(marker);
    const char *end = find_bytes(start, len - (size_t)(start - t), "<|im_end|>");
    if (!end) return NULL;
    return strndup(start, (size_t)(end - start));
}

int chat_template_load(const GgufFile *f, ChatTemplate *tmpl, BraidError *err) {
    (void)err;
    memset(tmpl, 0, sizeof *tmpl);
    GgufString s;
    if (gguf_get_string(f, "tokenizer.chat_template", &s)) return 0;
    tmpl->kind = chat_template_detect(s.data, s.len);
    if (tmpl->kind == CHAT_TEMPLATE_CHATML) tmpl->default_system = extract_default_system(s.data, s.len);
    return 0;
}

void chat_template_free(ChatTemplate *tmpl) {
    free(tmpl->default_system);
    tmpl->default_system = NULL;
}

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} TextBuilder;

static void append(TextBuilder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(TextBuilder *b, const char *fmt, ...) {
    if (b->failed) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = (b->len + (size_t)n + 1) * 2;
        char *grown = realloc(b->buf, cap);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->buf = grown;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static int known_role(const char *role) {
    return strcmp(role, "system") == 0 || strcmp(role, "user") == 0 || strcmp(role, "assistant") == 0 ||
           strcmp(role, "tool") == 0;
}

static void render_chatml(TextBuilder *b, const ChatTemplate *t, const ChatMessage *m, int n) {
    if (t->default_system && (n == 0 || strcmp(m[0].role, "system") != 0))
        append(b, "<|im_start|>system\n%s<|im_end|>\n", t->default_system);
    for (int i = 0; i < n; i++) append(b, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
    append(b, "<|im_start|>assistant\n");
}

static void render_llama3(TextBuilder *b, const ChatMessage *m, int n) {
    for (int i = 0; i < n; i++) append(b, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", m[i].role, m[i].content);
    append(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_llama2(TextBuilder *b, const ChatMessage *m, int n) {
    const char *system = NULL;
    int first_turn = 1;
    for (int i = 0; i < n; i++) {
        if (strcmp(m[i].role, "system") == 0) {
            system = m[i].content;
        } else if (strcmp(m[i].role, "assistant") == 0) {
            append(b, " %s </s>", m[i].content);
        } else {
            if (!first_turn) append(b, "<s>");
            if (system) append(b, "[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", system, m[i].content);
            else append(b, "[INST] %s [/INST]", m[i].content);
            system = NULL;
            first_turn = 0;
        }
    }
}

char *chat_template_render(const ChatTemplate *t, const ChatMessage *m, int n, BraidError *err) {
    if (t->kind == CHAT_TEMPLATE_NONE) {
        braid_error_set(err, "chat: this model has no chat template Braid recognizes (ChatML, Llama-3, Llama-2)");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!m[i].role || !m[i].content || !known_role(m[i].role)) {
            braid_error_set(err, "chat: message %d has %s", i, !m[i].role || !m[i].content ? "no role or content" : "an unknown role");
            return NULL;
        }
    TextBuilder b = {0};
    if (t->kind == CHAT_TEMPLATE_CHATML) render_chatml(&b, t, m, n);
    else if (t->kind == CHAT_TEMPLATE_LLAMA3) render_llama3(&b, m, n);
    else render_llama2(&b, m, n);
    if (b.failed || !b.buf) {
        free(b.buf);
        braid_error_set(err, "chat: out of memory");
        return NULL;
    }
    return b.buf;
}
