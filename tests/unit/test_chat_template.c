/* Chat templates: loading from the GGUF and from files, rendering messages and tools through the
 * Jinja engine, BOS handling, the old ChatMessage wrapper, and errors (no template, a template
 * that does not compile, raise_exception). Byte-for-byte parity with transformers is
 * tests/golden/test_golden_templates.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/chat_template.h"
#include "model/gguf.h"
#include "gguf_writer.h"
#include "model/model.h"
#include "test_paths.h"

static const ChatMessage conversation[] = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"},
};

static void load(ChatTemplate *t, const char *text) {
    BraidError err;
    if (chat_template_load_text(t, text, strlen(text), "test", "<s>", "</s>", &err)) fail_msg("%s", err.msg);
}

static void test_detect(void **state) {
    (void)state;
    const char *chatml = "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}";
    const char *llama3 = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>...";
    const char *llama2 = "{% if messages[0]['role'] == 'system' %}...[INST] {{ m['content'] }} [/INST]";
    assert_int_equal(chat_template_detect(chatml, strlen(chatml)), CHAT_TEMPLATE_CHATML);
    assert_int_equal(chat_template_detect(llama3, strlen(llama3)), CHAT_TEMPLATE_LLAMA3);
    assert_int_equal(chat_template_detect(llama2, strlen(llama2)), CHAT_TEMPLATE_LLAMA2);
    assert_int_equal(chat_template_detect("{{ messages }}", 14), CHAT_TEMPLATE_OTHER);
    assert_string_equal(chat_template_kind_name(CHAT_TEMPLATE_CHATML), "chatml");
    assert_string_equal(chat_template_kind_name(CHAT_TEMPLATE_OTHER), "jinja");
}

static void test_render_old_api(void **state) {
    (void)state;
    ChatTemplate t = {0};
    load(&t, "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>{% endif %}");
    BraidError err;
    char *out = chat_template_render(&t, conversation, 4, &err);
    assert_non_null(out);
    assert_string_equal(out, "<s><|system|>Be brief.</s><|user|>Hi</s><|assistant|>Hello!</s><|user|>2+2?</s><|assistant|>");
    free(out);
    /* With the tokenizer adding BOS, the template's own BOS is dropped: exactly one BOS in the prompt. */
    t.strip_bos = true;
    out = chat_template_render(&t, conversation, 1, &err);
    assert_string_equal(out, "<|system|>Be brief.</s><|assistant|>");
    free(out);
    ChatMessage null_content[1] = {{"assistant", NULL}};
    out = chat_template_render(&t, null_content, 1, &err);
    assert_string_equal(out, "<|assistant|>None</s><|assistant|>");
    free(out);
    chat_template_free(&t);
}

static void test_render_json_with_tools(void **state) {
    (void)state;
    ChatTemplate t = {0};
    load(&t, "{%- if tools %}TOOLS:{% for tool in tools %}{{ tool.function.name }}={{ tool | tojson }};{% endfor %}{{ '\\n' }}{% endif -%}"
             "{%- for m in messages %}[{{ m.role }}]{{ m.content if m.content is not none }}"
             "{% for c in m.tool_calls | default([]) %}<call>{{ c.function.name }}{{ c.function.arguments | tojson }}</call>{% endfor %}"
             "{% endfor %}{{ '[assistant]' if add_generation_prompt }}");
    assert_true(chat_template_reads_tools(&t));
    json_error_t je;
    json_t *messages = json_loads("[{\"role\":\"user\",\"content\":\"Weather?\"},"
                                  "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                                  "\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}}]},"
                                  "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"18 C\"}]",
                                  0, &je);
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}}]", 0, &je);
    assert_non_null(messages);
    assert_non_null(tools);
    BraidError err;
    char *out = chat_template_render_json(&t, messages, tools, true, &err);
    assert_non_null(out);
    assert_string_equal(out, "TOOLS:get_weather={\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}};\n"
                             "[user]Weather?[assistant]<call>get_weather{\"city\": \"Paris\", \"days\": 2}</call>[tool]18 C[assistant]");
    free(out);
    out = chat_template_render_json(&t, messages, NULL, false, &err); /* tools absent: None, falsy */
    assert_string_equal(out, "[user]Weather?[assistant]<call>get_weather{\"city\": \"Paris\", \"days\": 2}</call>[tool]18 C");
    free(out);
    json_t *extra = json_pack("{s:b}", "enable_thinking", 1);
    ChatTemplate t2 = {0};
    load(&t2, "{{ 'think' if enable_thinking else 'plain' }}/{{ messages | length }}");
    assert_false(chat_template_reads_tools(&t2));
    out = chat_template_render_vars(&t2, messages, NULL, true, extra, &err);
    assert_string_equal(out, "think/3");
    free(out);
    json_decref(extra);
    chat_template_free(&t2);
    json_decref(messages);
    json_decref(tools);
    chat_template_free(&t);
}

static void test_errors(void **state) {
    (void)state;
    ChatTemplate none = {0};
    BraidError err;
    assert_null(chat_template_render(&none, conversation, 1, &err));
    assert_non_null(strstr(err.msg, "no chat template"));
    assert_null(chat_template_source(&none));
    /* A template that does not compile: the construct and the line. */
    ChatTemplate t = {0};
    const char *bad = "line one\n{% for m in messages %}\n{{ m.content | no_such_filter }}\n{% endfor %}";
    assert_int_equal(chat_template_load_text(&t, bad, strlen(bad), "bad.jinja", "", "", &err), -1);
    assert_non_null(strstr(err.msg, "bad.jinja"));
    assert_non_null(strstr(err.msg, "line 3"));
    assert_non_null(strstr(err.msg, "no_such_filter"));
    const char *unclosed = "{% if x %}\nyes";
    assert_int_equal(chat_template_load_text(&t, unclosed, strlen(unclosed), "u.jinja", "", "", &err), -1);
    assert_non_null(strstr(err.msg, "endif"));
    assert_null(t.compiled); /* left as it was */
    /* raise_exception: the template's message. */
    load(&t, "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user message') }}{% endif %}ok");
    assert_null(chat_template_render(&t, conversation, 1, &err));
    assert_string_equal(err.msg, "the chat template raised: Conversations must start with a user message");
    char *out = chat_template_render(&t, conversation + 1, 1, &err);
    assert_string_equal(out, "ok");
    free(out);
    /* A render error names the line and what failed. */
    load(&t, "a\n{{ messages[0].content.nope.deeper }}");
    assert_null(chat_template_render(&t, conversation, 1, &err));
    assert_non_null(strstr(err.msg, "line 2"));
    assert_non_null(strstr(err.msg, "nope"));
    chat_template_free(&t);
    ChatMessage no_role[1] = {{NULL, "x"}};
    load(&t, "{{ messages }}");
    assert_null(chat_template_render(&t, no_role, 1, &err));
    assert_non_null(strstr(err.msg, "no role"));
    chat_template_free(&t);
}

static void test_load_file(void **state) {
    (void)state;
    char path[] = "/tmp/braid_chat_template_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ChatTemplate t = {0};
    BraidError err;
    t.bos_token = strdup("<BOS>");
    t.strip_bos = false;
    assert_int_equal(chat_template_load_file(&t, path, NULL, "</s>", &err), 0);
    assert_string_equal(chat_template_source(&t), text);
    assert_string_equal(t.bos_token, "<BOS>"); /* kept: bos NULL */
    char *out = chat_template_render(&t, conversation + 1, 2, &err);
    assert_string_equal(out, "<BOS>user: Hi\nassistant: Hello!\n"); /* the source's one trailing newline is dropped */
    free(out);
    chat_template_free(&t);
    unlink(path);
    assert_int_equal(chat_template_load_file(&t, "/nonexistent/template.jinja", NULL, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/template.jinja"));
}

/* A GGUF whose template does not compile: the model still loads (so --chat-template can replace
 * it), the error is kept with the construct and line, and renders fail with it. BOS/EOS text comes
 * from the token list. */
static void test_gguf_template_errors_and_tokens(void **state) {
    (void)state;
    GgufWriter w;
    gw_init(&w);
    gw_kv_str(&w, "tokenizer.chat_template", "{{ bos_token }}\n{% for m in messages %}{{ m.content | explode }}{% endfor %}");
    gw_kv_array_begin(&w, "tokenizer.ggml.tokens", 8 /* string */, 3);
    gw_arr_str(&w, "<unk>");
    gw_arr_str(&w, "<BOS>");
    gw_arr_str(&w, "<EOS>");
    gw_kv_u32(&w, "tokenizer.ggml.bos_token_id", 1);
    gw_kv_u32(&w, "tokenizer.ggml.eos_token_id", 2);
    size_t size;
    uint8_t *bytes = gw_finish(&w, &size);
    GgufFile *f;
    BraidError err;
    if (gguf_open_memory(bytes, size, &f, &err)) fail_msg("%s", err.msg);
    ChatTemplate t;
    assert_int_equal(chat_template_load(f, &t, &err), 0);
    assert_string_equal(t.bos_token, "<BOS>");
    assert_string_equal(t.eos_token, "<EOS>");
    assert_non_null(t.error);
    assert_int_equal(chat_template_check(&t, &err), -1);
    assert_non_null(strstr(err.msg, "tokenizer.chat_template"));
    assert_non_null(strstr(err.msg, "line 2"));
    assert_non_null(strstr(err.msg, "explode"));
    assert_null(chat_template_render(&t, conversation, 1, &err));
    assert_non_null(strstr(err.msg, "explode"));
    /* --chat-template replaces it and keeps the model's token text. */
    const char *good = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}";
    assert_int_equal(chat_template_load_text(&t, good, strlen(good), "override.jinja", NULL, NULL, &err), 0);
    assert_int_equal(chat_template_check(&t, &err), 0);
    char *out = chat_template_render(&t, conversation, 1, &err);
    assert_string_equal(out, "<BOS>Be brief.<EOS>");
    free(out);
    chat_template_free(&t);
    gguf_close(f);
    free(bytes);
}

static void test_real_model(void **state) {
    (void)state;
    BraidModel m;
    BraidError err;
    if (braid_model_load(test_model_path(), &m, &err)) fail_msg("%s", err.msg);
    ChatTemplate *t = &m.chat;
    assert_int_equal(t->kind, CHAT_TEMPLATE_CHATML);
    assert_non_null(t->default_system);
    assert_string_equal(t->default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    assert_string_equal(t->eos_token, "<|im_end|>");
    assert_false(t->reads_tools);
    ChatMessage user[1] = {{"user", "What is the capital of France?"}};
    char *out = chat_template_render(t, user, 1, &err);
    assert_string_equal(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                             "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    ChatMessage with_system[2] = {{"system", "Be terse."}, {"user", "Hi"}};
    out = chat_template_render(t, with_system, 2, &err);
    assert_string_equal(out, "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    braid_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_render_old_api),
        cmocka_unit_test(test_render_json_with_tools),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_gguf_template_errors_and_tokens),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
