/* Chat templates: detection from stored templates, native rendering, default system prompt. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat_template.h"
#include "model/gguf.h"
#include "test_paths.h"

static const ChatMessage conversation[] = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"},
};

static void expect_render(ChatTemplateKind kind, const char *expected) {
    ChatTemplate t = {.kind = kind};
    BraidError err;
    char *out = chat_template_render(&t, conversation, 4, &err);
    assert_non_null(out);
    assert_string_equal(out, expected);
    free(out);
}

static void test_detect(void **state) {
    (void)state;
    const char *chatml = "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}";
    const char *llama3 = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>...";
    const char *llama2 = "{% if messages[0]['role'] == 'system' %}...[INST] {{ m['content'] }} [/INST]";
    assert_int_equal(chat_template_detect(chatml, strlen(chatml)), CHAT_TEMPLATE_CHATML);
    assert_int_equal(chat_template_detect(llama3, strlen(llama3)), CHAT_TEMPLATE_LLAMA3);
    assert_int_equal(chat_template_detect(llama2, strlen(llama2)), CHAT_TEMPLATE_LLAMA2);
    assert_int_equal(chat_template_detect("{{ messages }}", 14), CHAT_TEMPLATE_NONE);
    assert_string_equal(chat_template_kind_name(CHAT_TEMPLATE_CHATML), "chatml");
}

static void test_render_formats(void **state) {
    (void)state;
    expect_render(CHAT_TEMPLATE_CHATML,
                  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
    expect_render(CHAT_TEMPLATE_LLAMA3,
                  "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render(CHAT_TEMPLATE_LLAMA2,
                  "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] 2+2? [/INST]");
}

static void test_errors(void **state) {
    (void)state;
    ChatTemplate none = {.kind = CHAT_TEMPLATE_NONE}, chatml = {.kind = CHAT_TEMPLATE_CHATML};
    BraidError err;
    assert_null(chat_template_render(&none, conversation, 1, &err));
    assert_non_null(strstr(err.msg, "no chat template"));
    ChatMessage bad[1] = {{"wizard", "x"}};
    assert_null(chat_template_render(&chatml, bad, 1, &err));
    assert_non_null(strstr(err.msg, "unknown role"));
}

static void test_real_model_default_system(void **state) {
    (void)state;
    GgufFile *f;
    BraidError err;
    if (gguf_open(test_model_path(), &f, &err)) fail_msg("%s", err.msg);
    ChatTemplate t;
    assert_int_equal(chat_template_load(f, &t, &err), 0);
    assert_int_equal(t.kind, CHAT_TEMPLATE_CHATML);
    assert_non_null(t.default_system);
    assert_string_equal(t.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    ChatMessage user[1] = {{"user", "What is the capital of France?"}};
    char *out = chat_template_render(&t, user, 1, &err);
    assert_string_equal(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                             "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    ChatMessage with_system[2] = {{"system", "Be terse."}, {"user", "Hi"}};
    out = chat_template_render(&t, with_system, 2, &err);
    assert_string_equal(out, "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    chat_template_free(&t);
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_render_formats),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_real_model_default_system),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
