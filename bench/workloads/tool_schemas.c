/* Function schemas grown parameter by parameter until they reach their size. */
#include "tool_schemas.h"

#include "text_gen.h"
#include "token_estimate.h"
#include "wl_rng.h"

static const char *const param_types[] = {"string", "string", "string", "integer", "boolean", "number", "array"};

/* One "name": {"type": ..., "description": ...} entry, without the separator. */
static void append_parameter(StrBuf *out, WlRng *r, const char *param) {
    strbuf_appendf(out, "    \"%s", param);
    strbuf_appendf(out, "\": {\"type\": \"%s\", \"description\": \"", param_types[wl_rng_range(r, 0, 6)]);
    text_gen_sentence(out, r);
    strbuf_append(out, "\"}");
}

void tool_schema_append(StrBuf *out, const char *name, int tokens) {
    WlRng r = wl_rng_named2("tool", name);
    size_t start = out->len;
    strbuf_appendf(out, "{\"name\": \"%s\", \"description\": \"", name);
    text_gen_sentence(out, &r);
    strbuf_append(out, " ");
    text_gen_sentence(out, &r);
    strbuf_append(out, "\",\n  \"parameters\": {\"type\": \"object\", \"properties\": {\n");
    StrBuf required = {0}, param = {0};
    text_gen_identifier(&required, &r);
    int closing_tokens = 12; /* the closing line with the required list */
    for (int i = 0;; i++) {
        if (i) strbuf_append(out, ",\n");
        strbuf_truncate(&param, 0);
        if (i == 0)
            strbuf_append(&param, strbuf_str(&required));
        else
            text_gen_identifier(&param, &r);
        append_parameter(out, &r, strbuf_str(&param));
        if (strbuf_failed(out) || token_estimate(out->data + start, out->len - start) + closing_tokens >= tokens || i >= 40)
            break;
    }
    strbuf_appendf(out, "\n  }, \"required\": [\"%s\"]}}\n", strbuf_str(&required));
    if (strbuf_failed(&required) || strbuf_failed(&param)) out->failed = 1; /* report through the caller's buffer */
    strbuf_free(&required);
    strbuf_free(&param);
}
