/*
 * chat_template.h — turns chat messages (and tools) into the prompt text a model was trained on.
 *
 * Owns: the model's chat template — the Jinja text stored in the GGUF (tokenizer.chat_template) or
 * given with --chat-template FILE — compiled once by the engine in src/model/jinja, plus the
 * BOS/EOS token text the template sees. Rendering matches Hugging Face transformers'
 * apply_chat_template(..., tokenize=False) byte for byte (tests/golden/templates): the variables
 * are messages, tools (None when not given), documents (None), add_generation_prompt, bos_token,
 * eos_token, plus raise_exception(), strftime_now(), namespace(), range() and dict().
 * BOS: templates such as Llama-3's print {{ bos_token }} themselves, while the tokenizer also adds
 * BOS when the model wants one (tokenizer.add_bos). When strip_bos is set (braid_model_load sets it
 * to tokenizer.add_bos), a leading bos_token is removed from the rendered text, so the prompt gets
 * exactly one BOS — the tokenizer's.
 * A model without a template loads fine and every render fails with a clear error. A stored
 * template that does not compile also loads (so --chat-template can replace it), with the compile
 * error kept in `error`: chat_template_check reports it, every render fails with it, and the
 * commands that render chats (generate --chat, batch, serve) stop at start-up with it
 * (cli_apply_chat_template) — never a silent fallback.
 * `kind` is only a coarse family tag for `braid info`; rendering never depends on it.
 * Callers: braid_model_load (src/model/model.c), the CLI (generate, batch, info, serve's
 * --chat-template), the coordinator (src/coord/http/http_choices.c, http_directives.c).
 * Thread-safety: read-only after load; any number of threads may render at once.
 * Memory: rendered text is malloc'd and owned by the caller; the ChatTemplate owns its strings and
 * compiled template until chat_template_free.
 */
#ifndef BRAID_MODEL_CHAT_TEMPLATE_H
#define BRAID_MODEL_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/error.h"
#include "model/gguf.h"
#include "model/jinja/jinja.h"

typedef enum {
    CHAT_TEMPLATE_NONE = 0, /* the model has no template */
    CHAT_TEMPLATE_CHATML,   /* <|im_start|> */
    CHAT_TEMPLATE_LLAMA3,   /* <|start_header_id|> */
    CHAT_TEMPLATE_LLAMA2,   /* [INST] */
    CHAT_TEMPLATE_OTHER,    /* any other Jinja template */
} ChatTemplateKind;

typedef struct {
    ChatTemplateKind kind;     /* family tag for braid info */
    char *default_system;      /* a default system prompt a ChatML template writes (braid info); NULL when none */
    char *source;              /* the Jinja text in use; NULL when the model has none */
    char *origin;              /* where it came from: "tokenizer.chat_template" or the file's path */
    JinjaTemplate *compiled;   /* NULL when source is NULL */
    char *bos_token, *eos_token; /* token text the template sees ("" when the model has none) */
    bool strip_bos;            /* remove a leading bos_token from renders (the tokenizer adds BOS) */
    bool reads_tools;          /* the template references `tools` */
    char *error;               /* why the stored template does not compile (construct, line); NULL when it does */
} ChatTemplate;

typedef struct {
    const char *role; /* "system", "user", "assistant", "tool", ... */
    const char *content; /* NULL renders as None */
} ChatMessage;

/* Reads tokenizer.chat_template and the BOS/EOS token text (tokenizer.ggml.bos_token_id /
 * eos_token_id into tokenizer.ggml.tokens) and compiles the template. A model without a template
 * gets kind CHAT_TEMPLATE_NONE and source NULL; one that does not compile gets source set,
 * compiled NULL and `error` naming the construct and line (neither is a load error; see
 * chat_template_check). strip_bos starts false (braid_model_load sets it). -1 only when out of memory. */
int chat_template_load(const GgufFile *file, ChatTemplate *tmpl, BraidError *err);
/* 0 when the template in use compiled (or the model has none); else -1 with err naming the origin,
 * the construct and the line. */
int chat_template_check(const ChatTemplate *tmpl, BraidError *err);

/* Replaces what tmpl holds (zeroed or loaded) with the template text[0..len). origin names it in
 * errors; bos/eos NULL keep the token text tmpl already has (the model's), strip_bos is kept.
 * On error tmpl is left as it was. */
int chat_template_load_text(ChatTemplate *tmpl, const char *text, size_t len, const char *origin, const char *bos, const char *eos,
                            BraidError *err);
/* The same from a file holding a Jinja template (--chat-template FILE). */
int chat_template_load_file(ChatTemplate *tmpl, const char *path, const char *bos, const char *eos, BraidError *err);
void chat_template_free(ChatTemplate *tmpl);

ChatTemplateKind chat_template_detect(const char *text, size_t len);
const char *chat_template_kind_name(ChatTemplateKind kind);
/* The Jinja text in use; NULL when the model has none. */
const char *chat_template_source(const ChatTemplate *tmpl);
/* True when the template references the `tools` variable. */
bool chat_template_reads_tools(const ChatTemplate *tmpl);

/* messages: JSON array of message objects as the template expects them (role, content (string or
 * null), and optionally tool_calls [{id, type: "function", function: {name, arguments (object)}}],
 * tool_call_id, name); tools: JSON array of OpenAI tool objects, or NULL (None in the template, as
 * transformers passes it). Returns malloc'd text, or NULL with err set: "the chat template raised:
 * MSG" for raise_exception(MSG), else "chat template (ORIGIN): line N: what failed". */
char *chat_template_render_json(const ChatTemplate *t, const json_t *messages, const json_t *tools, bool add_generation_prompt,
                                BraidError *err);
/* As chat_template_render_json, with the members of extra_vars (a JSON object, or NULL) as further
 * variables (e.g. enable_thinking, date_string); the fixed ones above take precedence. */
char *chat_template_render_vars(const ChatTemplate *t, const json_t *messages, const json_t *tools, bool add_generation_prompt,
                                const json_t *extra_vars, BraidError *err);

/* Renders text-only messages followed by the assistant's turn opener (add_generation_prompt true):
 * a thin wrapper over chat_template_render_json. Returns a malloc'd string, or NULL with err set
 * (no template, a message without a role, the template's own error, out of memory). */
char *chat_template_render(const ChatTemplate *tmpl, const ChatMessage *messages, int n, BraidError *err);

#endif
