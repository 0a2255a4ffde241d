/* The model's chat template on top of the Jinja engine; the contract is in chat_template.h. */
#include "model/chat_template.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHAT_TEMPLATE_MAX_BYTES (4u << 20) /* a template larger than this is refused */

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
    return len ? CHAT_TEMPLATE_OTHER : CHAT_TEMPLATE_NONE;
}

const char *chat_template_kind_name(ChatTemplateKind kind) {
    switch (kind) {
    case CHAT_TEMPLATE_CHATML: return "chatml";
    case CHAT_TEMPLATE_LLAMA3: return "llama3";
    case CHAT_TEMPLATE_LLAMA2: return "llama2";
    case CHAT_TEMPLATE_OTHER: return "jinja";
    default: return "none";
    }
}

/* For braid info only: a ChatML template that injects a system turn writes it as a string literal
 * '<|im_start|>system\n…<|im_end|>' guarded by a check on messages[0]['role']. */
static char *extract_default_system(const char *t, size_t len) {
    const char *marker = "<|im_start|>system\n";
    const char *start = find_bytes(t, len, marker);
    if (!start) start = find_bytes(t, len, marker = "<|im_start|>system\\n");
    if (!start || !find_bytes(t, len, "!= 'system'")) return NULL;
    start += strlen(marker);
    const char *end = find_bytes(start, len - (size_t)(start - t), "<|im_end|>");
    if (!end || memchr(start, '\'', (size_t)(end - start))) return NULL;
    return strndup(start, (size_t)(end - start));
}

const char *chat_template_source(const ChatTemplate *t) { return t->source; }
bool chat_template_reads_tools(const ChatTemplate *t) { return t->reads_tools; }

static void release(ChatTemplate *t) {
    free(t->default_system);
    free(t->source);
    free(t->origin);
    free(t->error);
    jinja_free(t->compiled);
    t->default_system = t->source = t->origin = t->error = NULL;
    t->compiled = NULL;
    t->kind = CHAT_TEMPLATE_NONE;
    t->reads_tools = false;
}

void chat_template_free(ChatTemplate *t) {
    release(t);
    free(t->bos_token);
    free(t->eos_token);
    t->bos_token = t->eos_token = NULL;
    t->strip_bos = false;
}

int chat_template_load_text(ChatTemplate *t, const char *text, size_t len, const char *origin, const char *bos, const char *eos,
                            BraidError *err) {
    if (len > CHAT_TEMPLATE_MAX_BYTES)
        return braid_error_set(err, "chat template (%s): %zu bytes is larger than the %u allowed", origin, len, CHAT_TEMPLATE_MAX_BYTES);
    if (memchr(text, '\0', len)) return braid_error_set(err, "chat template (%s): contains a NUL byte", origin);
    JinjaTemplate *compiled;
    JinjaError jerr;
    if (jinja_compile(text, len, &compiled, &jerr))
        return braid_error_set(err, "chat template (%s) does not compile: %s", origin, jerr.msg);
    char *source = strndup(text, len), *origin_copy = strdup(origin);
    char *bos_copy = bos ? strdup(bos) : NULL, *eos_copy = eos ? strdup(eos) : NULL;
    if (!source || !origin_copy || (bos && !bos_copy) || (eos && !eos_copy)) {
        free(source);
        free(origin_copy);
        free(bos_copy);
        free(eos_copy);
        jinja_free(compiled);
        return braid_error_set(err, "chat template (%s): out of memory", origin);
    }
    release(t);
    if (bos) {
        free(t->bos_token);
        t->bos_token = bos_copy;
    }
    if (eos) {
        free(t->eos_token);
        t->eos_token = eos_copy;
    }
    t->source = source;
    t->origin = origin_copy;
    t->compiled = compiled;
    t->kind = chat_template_detect(text, len);
    t->reads_tools = jinja_reads_variable(compiled, "tools");
    if (t->kind == CHAT_TEMPLATE_CHATML) t->default_system = extract_default_system(text, len);
    return 0;
}

int chat_template_load_file(ChatTemplate *t, const char *path, const char *bos, const char *eos, BraidError *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return braid_error_set(err, "chat template %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            if (cap > CHAT_TEMPLATE_MAX_BYTES + 1) cap = CHAT_TEMPLATE_MAX_BYTES + 1;
            char *grown = len < cap ? realloc(buf, cap) : NULL;
            if (!grown) break;
            buf = grown;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int read_error = ferror(f);
    fclose(f);
    int rc;
    if (read_error || !buf) rc = braid_error_set(err, "chat template %s: cannot read the file", path);
    else if (len > CHAT_TEMPLATE_MAX_BYTES) rc = braid_error_set(err, "chat template %s: larger than %u bytes", path, CHAT_TEMPLATE_MAX_BYTES);
    else rc = chat_template_load_text(t, buf, len, path, bos, eos, err);
    free(buf);
    return rc;
}

/* Token text of the id stored under key, or "" when the model has none. */
static char *token_text(const GgufFile *f, const char *key) {
    int64_t id;
    const GgufValue *tokens = gguf_find(f, "tokenizer.ggml.tokens");
    if (gguf_get_int(f, key, &id) || !tokens || tokens->type != GGUF_TYPE_ARRAY || tokens->arr.elem_type != GGUF_TYPE_STRING ||
        id < 0 || (uint64_t)id >= tokens->arr.count)
        return strdup("");
    GgufString s = tokens->arr.strings[id];
    return strndup(s.data, s.len);
}

int chat_template_load(const GgufFile *f, ChatTemplate *t, BraidError *err) {
    memset(t, 0, sizeof *t);
    t->bos_token = token_text(f, "tokenizer.ggml.bos_token_id");
    t->eos_token = token_text(f, "tokenizer.ggml.eos_token_id");
    if (!t->bos_token || !t->eos_token) {
        chat_template_free(t);
        return braid_error_set(err, "chat template: out of memory");
    }
    GgufString s;
    if (gguf_get_string(f, "tokenizer.chat_template", &s)) return 0;
    BraidError why;
    if (chat_template_load_text(t, s.data, s.len, "tokenizer.chat_template", NULL, NULL, &why) == 0) return 0;
    /* Kept, not fatal: --chat-template may replace it; chat_template_check and renders report it. */
    t->source = strndup(s.data, s.len);
    t->origin = strdup("tokenizer.chat_template");
    t->error = strdup(why.msg);
    if (!t->source || !t->origin || !t->error) {
        chat_template_free(t);
        return braid_error_set(err, "chat template: out of memory");
    }
    t->kind = chat_template_detect(s.data, s.len);
    return 0;
}

int chat_template_check(const ChatTemplate *t, BraidError *err) {
    if (!t->error) return 0;
    return braid_error_set(err, "%s; give a template that compiles with --chat-template FILE", t->error);
}

/* transformers (render_jinja_template) gives a message whose reasoning is under reasoning_content,
 * thinking or reasoning that reasoning under both names templates read: {"thinking": r, **message,
 * "reasoning_content": r}. Returns a new reference: messages itself when no message has any. */
static json_t *alias_reasoning(const json_t *messages) {
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    size_t i;
    json_t *m;
    bool any = false;
    json_array_foreach(messages, i, m) for (int k = 0; k < 3 && !any; k++) {
        json_t *r = json_is_object(m) ? json_object_get(m, fields[k]) : NULL;
        any = r && !json_is_null(r);
    }
    if (!any) return json_incref((json_t *)messages);
    json_t *out = json_array();
    json_array_foreach(messages, i, m) {
        json_t *r = NULL;
        for (int k = 0; k < 3 && json_is_object(m) && !r; k++) {
            r = json_object_get(m, fields[k]);
            if (json_is_null(r)) r = NULL;
        }
        json_t *copy = m;
        if (r) {
            copy = json_object();
            if (!copy || json_object_set(copy, "thinking", r) || json_object_update(copy, m) || json_object_set(copy, "reasoning_content", r)) {
                json_decref(copy);
                json_decref(out);
                return NULL;
            }
        } else {
            json_incref(copy);
        }
        if (!out || json_array_append_new(out, copy)) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

char *chat_template_render_vars(const ChatTemplate *t, const json_t *messages, const json_t *tools, bool add_generation_prompt,
                                const json_t *extra_vars, BraidError *err) {
    if (t->error) {
        chat_template_check(t, err);
        return NULL;
    }
    if (!t->compiled) {
        braid_error_set(err, "chat: this model has no chat template (tokenizer.chat_template); give one with --chat-template FILE");
        return NULL;
    }
    if (!json_is_array(messages)) {
        braid_error_set(err, "chat: messages must be a JSON array");
        return NULL;
    }
    json_t *vars = json_object();
    if (!vars) {
        braid_error_set(err, "chat: out of memory");
        return NULL;
    }
    int bad = extra_vars && json_is_object(extra_vars) ? json_object_update(vars, (json_t *)extra_vars) : 0;
    json_t *aliased = alias_reasoning(messages);
    bad |= !aliased || json_object_set_new(vars, "messages", aliased);
    bad |= json_object_set_new(vars, "tools", tools ? json_incref((json_t *)tools) : json_null());
    bad |= json_object_set_new(vars, "documents", json_null());
    bad |= json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    bad |= json_object_set_new(vars, "bos_token", json_string(t->bos_token ? t->bos_token : ""));
    bad |= json_object_set_new(vars, "eos_token", json_string(t->eos_token ? t->eos_token : ""));
    if (bad) {
        json_decref(vars);
        braid_error_set(err, "chat: cannot build the template's variables (out of memory or a token that is not UTF-8)");
        return NULL;
    }
    JinjaError jerr;
    size_t len = 0;
    char *text = jinja_render(t->compiled, vars, NULL, &len, &jerr);
    json_decref(vars);
    if (!text) {
        if (jerr.status == JINJA_ERR_RAISED) braid_error_set(err, "the chat template raised: %s", jerr.msg);
        else braid_error_set(err, "chat template (%s): %s", t->origin ? t->origin : "?", jerr.msg);
        return NULL;
    }
    size_t bos_len = t->bos_token ? strlen(t->bos_token) : 0;
    if (t->strip_bos && bos_len && len >= bos_len && memcmp(text, t->bos_token, bos_len) == 0)
        memmove(text, text + bos_len, len - bos_len + 1);
    return text;
}

char *chat_template_render_json(const ChatTemplate *t, const json_t *messages, const json_t *tools, bool add_generation_prompt,
                                BraidError *err) {
    return chat_template_render_vars(t, messages, tools, add_generation_prompt, NULL, err);
}

char *chat_template_render(const ChatTemplate *t, const ChatMessage *m, int n, BraidError *err) {
    if (!t->compiled || t->error) return chat_template_render_json(t, NULL, NULL, true, err);
    json_t *msgs = json_array();
    int bad = !msgs;
    for (int i = 0; i < n && !bad; i++) {
        if (!m[i].role) {
            json_decref(msgs);
            braid_error_set(err, "chat: message %d has no role", i);
            return NULL;
        }
        json_t *o = json_object();
        bad = !o || json_object_set_new(o, "role", json_string(m[i].role)) ||
              json_object_set_new(o, "content", m[i].content ? json_string(m[i].content) : json_null());
        if (bad) json_decref(o);
        else bad = json_array_append_new(msgs, o);
        if (bad) {
            json_decref(msgs);
            braid_error_set(err, "chat: message %d: out of memory or text that is not UTF-8", i);
            return NULL;
        }
    }
    if (bad) {
        braid_error_set(err, "chat: out of memory");
        return NULL;
    }
    char *text = chat_template_render_json(t, msgs, NULL, true, err);
    json_decref(msgs);
    return text;
}
