/*
 * chat_template.h — turns chat messages into the prompt text a model was trained on.
 *
 * Braid does not run Jinja: it recognizes the template families by their marker tokens in the
 * stored tokenizer.chat_template (ChatML "<|im_start|>", Llama-3 "<|start_header_id|>", Llama-2
 * "[INST]") and renders them natively. A default system prompt written into a ChatML template
 * (SmolLM2 adds one when the conversation has none) is extracted and honoured.
 * BOS is not rendered: the tokenizer adds it when the model wants one.
 * Pure functions; rendered text is malloc'd and owned by the caller.
 */
#ifndef BRAID_MODEL_CHAT_TEMPLATE_H
#define BRAID_MODEL_CHAT_TEMPLATE_H

#include <stddef.h>

#include "common/error.h"
#include "model/gguf.h"

typedef enum { CHAT_TEMPLATE_NONE = 0, CHAT_TEMPLATE_CHATML, CHAT_TEMPLATE_LLAMA3, CHAT_TEMPLATE_LLAMA2 } ChatTemplateKind;

typedef struct {
    ChatTemplateKind kind;
    char *default_system; /* owned; NULL when the template adds none */
} ChatTemplate;

typedef struct {
    const char *role; /* "system", "user", "assistant", "tool" */
    const char *content;
} ChatMessage;

/* Reads tokenizer.chat_template; a model without one gets CHAT_TEMPLATE_NONE. */
int chat_template_load(const GgufFile *file, ChatTemplate *tmpl, BraidError *err);
void chat_template_free(ChatTemplate *tmpl);
ChatTemplateKind chat_template_detect(const char *text, size_t len);
const char *chat_template_kind_name(ChatTemplateKind kind);

/* Renders messages followed by the assistant's turn opener. Returns a malloc'd string, or NULL
 * with err set (no template, unknown role, out of memory). */
char *chat_template_render(const ChatTemplate *tmpl, const ChatMessage *messages, int n, BraidError *err);

#endif
