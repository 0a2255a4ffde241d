/* The shared reference document, section by section, and the mock tool replies. */
#include "lora_context.h"

#include "text_gen.h"
#include "token_estimate.h"
#include "workload_kind.h"

enum { SECTION_TOKENS = 300 };

char *lora_context_build(const WorkloadParams *p, int *tokens, BraidError *err) {
    int want = wl_scaled(p, p->context_tokens);
    WlRng r = wl_rng_named("lora-shared-context");
    StrBuf b = {0};
    strbuf_append(&b, "# Reference document (shared by every agent)\n\n");
    int have = token_estimate(strbuf_str(&b), b.len);
    for (int k = 1; have < want && !strbuf_failed(&b); k++) {
        size_t start = b.len;
        strbuf_appendf(&b, "## Section %d: ", k);
        text_gen_title(&b, &r, wl_rng_range(&r, 2, 4));
        strbuf_append(&b, "\n");
        int room = want - have, section = room < SECTION_TOKENS + SECTION_TOKENS / 2 ? room : SECTION_TOKENS;
        text_gen(&b, &r, k % 3 == 0 ? TEXT_ENCYCLOPEDIA : TEXT_PROSE, section);
        have += token_estimate(b.data + start, b.len - start);
    }
    strbuf_append(&b, "\n");
    char *text = strbuf_take(&b);
    if (!text) {
        braid_error_set(err, "out of memory building the %d-token shared context", want);
        return NULL;
    }
    *tokens = token_estimate_str(text);
    return text;
}

int lora_prompt_cap(const WorkloadParams *p, int context_tokens) {
    int dynamic = wl_scaled(p, LORA_DYNAMIC_TOKENS);
    return context_tokens + (dynamic > LORA_DYNAMIC_FLOOR ? dynamic : LORA_DYNAMIC_FLOOR);
}

void lora_tool_reply(StrBuf *out, WlRng *r, const WorkloadParams *p) {
    text_gen(out, r, TEXT_PROSE, wl_scaled(p, LORA_TOOL_REPLY_TOKENS));
}
