/*
 * Fuzz target for the chat-template engine (src/model/jinja): each input is compiled as a Jinja
 * template and, when it compiles, rendered with a small conversation (system, user, an assistant
 * tool call, a tool result), two tools and add_generation_prompt, under tight limits (10 000 loop
 * iterations, 64 KiB of output, 16 MiB of values, 16 nested macro calls) so every input finishes
 * fast. Promises checked: a refusal (compile or render) has a status and a message, and a compile
 * error a line; a render that succeeds returns text of the reported length within the output
 * bound; compiling the same input twice gives the same verdict. Any broken promise calls abort().
 * Seeds in corpus_chat_template/ are the golden templates (tests/golden/templates) and small
 * snippets; replayed as fuzz_chat_template_replay in every CI run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok, const char *promise, const char *detail) {
    if (ok) return;
    fprintf(stderr, "fuzz_chat_template: broken promise: %s (%s)\n", promise, detail ? detail : "");
    abort();
}

static const char vars_json[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call00001\", \"type\": \"function\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"call00001\", \"content\": \"18 C \\u00e9\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather.\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"search\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"documents\": null, \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 64 * 1024) return 0;
    JinjaTemplate *t;
    JinjaError err;
    if (jinja_compile((const char *)data, size, &t, &err)) {
        require(err.status != JINJA_OK && err.msg[0], "a compile error has a status and a message", NULL);
        require(err.line >= 0, "a compile error has a line", err.msg);
        JinjaTemplate *again;
        JinjaError err2;
        require(jinja_compile((const char *)data, size, &again, &err2) != 0, "compiling twice gives the same verdict", err.msg);
        return 0;
    }
    (void)jinja_reads_variable(t, "tools");
    json_error_t je;
    json_t *vars = json_loads(vars_json, 0, &je);
    require(vars != NULL, "the fixed variables parse", je.text);
    JinjaLimits lim = jinja_default_limits();
    lim.max_loop_iterations = 10000;
    lim.max_output_bytes = 64 * 1024;
    lim.max_memory_bytes = 16u << 20;
    lim.max_call_depth = 16;
    lim.now_unix = 1700000000;
    size_t len = 0;
    char *out = jinja_render(t, vars, &lim, &len, &err);
    if (out) {
        require(len <= lim.max_output_bytes, "output within max_output_bytes", NULL);
        require(out[len] == '\0', "output NUL-terminated at its length", NULL);
        free(out);
    } else {
        require(err.status != JINJA_OK && (err.msg[0] || err.status == JINJA_ERR_RAISED), "a render error has a status and a message", NULL);
    }
    json_decref(vars);
    jinja_free(t);
    return 0;
}
