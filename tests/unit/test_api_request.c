/* OpenAI request parsing: every validation rule with an accepted and a refused body (status, param,
 * and a message that names the field), the error JSON, and the X-Braid-* headers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_directive.h"
#include "coord/api/api_directives.h"
#include "coord/api/api_request.h"
#include "coord/api/api_response.h"

#define SERVED "smollm2-135m"
#define CHAT_PREFIX "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define COMPLETION_PREFIX "{\"prompt\":\"Once upon a time\""

/* The error JSON must parse and hold exactly message, type, param and code. */
static void check_error_json(const ApiError *e) {
    char *text = api_error_json(e);
    assert_non_null(text);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root) fail_msg("api_error_json gave invalid JSON (%s): %s", jerr.text, text);
    json_t *inner = json_object_get(root, "error");
    assert_true(json_is_object(inner));
    assert_int_equal(json_object_size(inner), 4);
    assert_true(json_is_string(json_object_get(inner, "message")));
    assert_true(json_is_string(json_object_get(inner, "type")));
    assert_true(json_is_string(json_object_get(inner, "param")) || json_is_null(json_object_get(inner, "param")));
    assert_true(json_is_string(json_object_get(inner, "code")) || json_is_null(json_object_get(inner, "code")));
    json_decref(root);
    free(text);
}

/* Expects body to be refused with this status and param, and a message containing `mention`. */
static void reject_at(const char *file, int line, ApiKind kind, const char *body, int status, const char *param,
                      const char *mention) {
    ApiRequest r;
    ApiError e;
    memset(&e, 0, sizeof e);
    int rc = api_request_parse(body, strlen(body), kind, SERVED, &r, &e);
    if (rc != -1 || e.status != status || strcmp(e.param, param) != 0 || !strstr(e.message, mention))
        fail_msg("%s:%d: body %s\n  -> rc %d, status %d, param '%s', message '%s'\n  expected status %d, param '%s', message with '%s'",
                 file, line, body, rc, e.status, e.param, e.message, status, param, mention);
    if (status != 404 && status < 500) assert_string_equal(e.type, "invalid_request_error");
    /* On failure the request holds nothing: all fields zero, and freeing it again is harmless. */
    assert_null(r.messages);
    assert_null(r.prompts);
    assert_null(r.model);
    assert_null(r.stop);
    assert_int_equal(r.n_messages + r.n_stop, 0);
    api_request_free(&r);
    check_error_json(&e);
}
#define REJECT(kind, body, status, param, mention) reject_at(__FILE__, __LINE__, kind, body, status, param, mention)

/* Expects body to be accepted; the caller checks the fields and frees r. */
static void accept_at(const char *file, int line, ApiKind kind, const char *body, ApiRequest *r) {
    ApiError e;
    if (api_request_parse(body, strlen(body), kind, SERVED, r, &e) != 0)
        fail_msg("%s:%d: body %s refused: %d %s (param '%s')", file, line, body, e.status, e.message, e.param);
    assert_int_equal(r->kind, kind);
}
#define ACCEPT(kind, body, r) accept_at(__FILE__, __LINE__, kind, body, r)

static void test_defaults(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX "}", &r);
    assert_null(r.model);
    assert_int_equal(r.n_messages, 1);
    assert_string_equal(r.messages[0].role, "user");
    assert_string_equal(r.messages[0].content, "hi");
    assert_int_equal(r.max_tokens, -1);
    assert_true(r.temperature == 1.0 && r.top_p == 1.0);
    assert_int_equal(r.top_k, 0);
    assert_false(r.has_seed);
    assert_int_equal(r.n_stop, 0);
    assert_false(r.stream || r.include_usage || r.ignore_eos);
    assert_true(!r.workflow_id && !r.agent && !r.tenant && !r.adapter);
    api_request_free(&r);
    api_request_free(&r); /* zeroed by the first call */
    api_request_free(NULL);
}

static void test_body_json(void **state) {
    (void)state;
    REJECT(API_CHAT, "", 400, "", "empty");
    REJECT(API_CHAT, "{\"messages\": [", 400, "", "not valid JSON");
    REJECT(API_CHAT, "{\"messages\": 1,}", 400, "", "line 1 column");
    REJECT(API_CHAT, CHAT_PREFIX "} trailing", 400, "", "not valid JSON");
    REJECT(API_CHAT, CHAT_PREFIX ",\"model\":\"a\",\"model\":\"b\"}", 400, "", "duplicate");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", 400, "", "invalid UTF-8");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}", 400, "", "invalid UTF-8");
    REJECT(API_CHAT, "[1, 2]", 400, "", "must be a JSON object, got an array");
    REJECT(API_COMPLETION, "\"just a string\"", 400, "", "must be a JSON object, got a string");
    REJECT(API_COMPLETION, " 3 ", 400, "", "must be a JSON object, got 3");
    /* Not NUL-terminated: the parser reads exactly len bytes. */
    const char body[] = COMPLETION_PREFIX "}garbage";
    ApiRequest r;
    ApiError e;
    assert_int_equal(api_request_parse(body, strlen(COMPLETION_PREFIX "}"), API_COMPLETION, SERVED, &r, &e), 0);
    assert_string_equal(r.prompts[0].text, "Once upon a time");
    api_request_free(&r);
    /* Valid multi-byte UTF-8 passes through untouched. */
    ACCEPT(API_COMPLETION, "{\"prompt\":\"caf\xc3\xa9 \xe4\xb8\xad \\u00e9\"}", &r);
    assert_string_equal(r.prompts[0].text, "caf\xc3\xa9 \xe4\xb8\xad \xc3\xa9");
    api_request_free(&r);
}

static void test_chat_roles_and_content(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT,
           "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"developer\",\"content\":\"\"},"
           "{\"role\":\"user\",\"content\":\"q\",\"name\":null},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
           "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
           "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"c1\"},{\"role\":\"assistant\",\"refusal\":null}]}",
           &r);
    assert_int_equal(r.n_messages, 6);
    const char *roles[] = {"system", "developer", "user", "assistant", "tool", "assistant"};
    const char *contents[] = {"be brief", "", "q", "", "42", ""};
    for (int i = 0; i < 6; i++) {
        assert_string_equal(r.messages[i].role, roles[i]);
        assert_string_equal(r.messages[i].content, contents[i]);
    }
    api_request_free(&r);

    REJECT(API_CHAT, "{}", 400, "messages", "messages is required");
    REJECT(API_CHAT, "{\"messages\":null}", 400, "messages", "messages is required");
    REJECT(API_CHAT, "{\"messages\":\"hi\"}", 400, "messages", "messages must be an array");
    REJECT(API_CHAT, "{\"messages\":[]}", 400, "messages", "messages must hold at least one");
    REJECT(API_CHAT, "{\"messages\":[\"hi\"]}", 400, "messages[0]", "messages[0] must be an object");
    REJECT(API_CHAT, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "messages[0].role", "messages[0].role must be a string");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":7,\"content\":\"hi\"}]}", 400, "messages[0].role", "got 7");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"wizard\",\"content\":\"hi\"}]}", 400,
           "messages[1].role", "got 'wizard'");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", 400, "messages[0].content",
           "messages[0].content is required for role user");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"system\"}]}", 400, "messages[0].content", "required for role system");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content",
           "messages[0].content must be a string, null or an array of text parts, got 5");
}

static void test_chat_content_parts(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT,
           "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hello, \"},"
           "{\"type\":\"text\",\"text\":\"\"},{\"type\":\"text\",\"text\":\"world\"}]}]}",
           &r);
    assert_string_equal(r.messages[0].content, "Hello, world");
    api_request_free(&r);
    ACCEPT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[]}]}", &r);
    assert_string_equal(r.messages[0].content, "");
    api_request_free(&r);

    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}", 400,
           "messages[0].content[0]", "type 'image_url'");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},\"b\"]}]}", 400,
           "messages[0].content[1]", "messages[0].content[1] must be an object");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}", 400, "messages[0].content[0].type",
           "messages[0].content[0].type must be a string");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]}", 400,
           "messages[0].content[0].text", "messages[0].content[0].text must be a string, got 3");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400, "messages[0].content[0].text",
           "must be a string");
}

/* A chat body with n messages (malloc'd). */
static char *chat_body_with(int n) {
    static const char message[] = "{\"role\":\"user\",\"content\":\"x\"},";
    size_t cap = 32 + (size_t)n * (sizeof message - 1);
    char *body = malloc(cap);
    assert_non_null(body);
    size_t at = (size_t)snprintf(body, cap, "{\"messages\":[");
    for (int i = 0; i < n; i++, at += sizeof message - 1) memcpy(body + at, message, sizeof message - 1);
    body[at - 1] = ']'; /* replaces the last comma */
    snprintf(body + at, cap - at, "}");
    return body;
}

static void test_chat_message_count(void **state) {
    (void)state;
    ApiRequest r;
    char *body = chat_body_with(API_MAX_MESSAGES);
    ACCEPT(API_CHAT, body, &r);
    assert_int_equal(r.n_messages, API_MAX_MESSAGES);
    api_request_free(&r);
    free(body);
    body = chat_body_with(API_MAX_MESSAGES + 1);
    REJECT(API_CHAT, body, 400, "messages", "at most 4096");
    free(body);
}

static void test_completion_prompt(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_COMPLETION, "{\"prompt\":\"\"}", &r);
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "");
    assert_null(r.messages);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, "{\"prompt\":[\"one string\"]}", &r);
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "one string");
    api_request_free(&r);
    /* OpenAI's four shapes: a list of strings, token ids, a list of token-id lists, mixed. */
    ACCEPT(API_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", &r);
    assert_int_equal(r.n_prompts, 2);
    assert_string_equal(r.prompts[1].text, "b");
    api_request_free(&r);
    ACCEPT(API_COMPLETION, "{\"prompt\":[1,2,3]}", &r);
    assert_int_equal(r.n_prompts, 1);
    assert_null(r.prompts[0].text);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[2], 3);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, "{\"prompt\":[[1,2],[7],\"text\"]}", &r);
    assert_int_equal(r.n_prompts, 3);
    assert_int_equal(r.prompts[0].n_ids, 2);
    assert_int_equal(r.prompts[1].ids[0], 7);
    assert_string_equal(r.prompts[2].text, "text");
    api_request_free(&r);

    REJECT(API_COMPLETION, "{}", 400, "prompt", "prompt is required");
    REJECT(API_COMPLETION, CHAT_PREFIX "}", 400, "prompt", "prompt is required");
    REJECT(API_COMPLETION, "{\"prompt\":[\"one\"],\"messages\":7}", 400, "messages", "unknown field 'messages'");
    REJECT(API_COMPLETION, "{\"prompt\":42}", 400, "prompt", "prompt must be a string or a list of token ids, got 42");
    REJECT(API_COMPLETION, "{\"prompt\":[1,-2]}", 400, "prompt", "prompt[1] must be a token id");
    REJECT(API_COMPLETION, "{\"prompt\":[1,2.5]}", 400, "prompt", "prompt[1] must be a token id");
    REJECT(API_COMPLETION, "{\"prompt\":[[1],[]]}", 400, "prompt", "prompt[1] is an empty list of token ids");
    REJECT(API_COMPLETION, "{\"prompt\":[\"a\",{}]}", 400, "prompt", "prompt[1] must be a string or a list of token ids");
    REJECT(API_COMPLETION, "{\"prompt\":[]}", 400, "prompt", "prompt is an empty list");
}

static void test_model(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"model\":\"" SERVED "\"}", &r);
    assert_string_equal(r.model, SERVED);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"model\":null}", &r);
    assert_null(r.model);
    api_request_free(&r);

    ApiError e;
    const char *body = CHAT_PREFIX ",\"model\":\"gpt-4o\"}";
    assert_int_equal(api_request_parse(body, strlen(body), API_CHAT, SERVED, &r, &e), -1);
    assert_int_equal(e.status, 404);
    assert_string_equal(e.type, "invalid_request_error");
    assert_string_equal(e.code, "model_not_found");
    assert_string_equal(e.param, "model");
    assert_string_equal(e.message, "The model 'gpt-4o' does not exist; this server serves '" SERVED "'");
    check_error_json(&e);
    REJECT(API_COMPLETION, COMPLETION_PREFIX ",\"model\":\"other\"}", 404, "model", "The model 'other' does not exist");
    REJECT(API_CHAT, CHAT_PREFIX ",\"model\":3}", 400, "model", "model must be a string, got 3");
    /* A long model name is quoted only in part, and never cut inside a character. */
    REJECT(API_CHAT, CHAT_PREFIX ",\"model\":\"" "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
           "x\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
           "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"}", 404, "model", "does not exist");

    /* Without a served name, any model is accepted. */
    assert_int_equal(api_request_parse(body, strlen(body), API_CHAT, NULL, &r, &e), 0);
    assert_string_equal(r.model, "gpt-4o");
    api_request_free(&r);
}

static void test_max_tokens(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"max_tokens\":16}", &r);
    assert_int_equal(r.max_tokens, 16);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"max_completion_tokens\":7,\"max_tokens\":null}", &r);
    assert_int_equal(r.max_tokens, 7);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, COMPLETION_PREFIX ",\"max_completion_tokens\":9,\"max_tokens\":9}", &r);
    assert_int_equal(r.max_tokens, 9);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, COMPLETION_PREFIX ",\"max_tokens\":1}", &r);
    assert_int_equal(r.max_tokens, 1);
    api_request_free(&r);

    REJECT(API_CHAT, CHAT_PREFIX ",\"max_tokens\":-3}", 400, "max_tokens", "max_tokens must be a positive integer, got -3");
    REJECT(API_CHAT, CHAT_PREFIX ",\"max_tokens\":0}", 400, "max_tokens", "max_tokens must be a positive integer, got 0");
    REJECT(API_CHAT, CHAT_PREFIX ",\"max_tokens\":2.5}", 400, "max_tokens", "got 2.5");
    REJECT(API_CHAT, CHAT_PREFIX ",\"max_tokens\":16.0}", 400, "max_tokens", "got 16.0");
    REJECT(API_CHAT, CHAT_PREFIX ",\"max_tokens\":\"16\"}", 400, "max_tokens", "got a string");
    REJECT(API_CHAT, CHAT_PREFIX ",\"max_tokens\":99999999999}", 400, "max_tokens", "max_tokens must be at most");
    REJECT(API_CHAT, CHAT_PREFIX ",\"max_completion_tokens\":-1}", 400, "max_completion_tokens",
           "max_completion_tokens must be a positive integer, got -1");
    REJECT(API_CHAT, CHAT_PREFIX ",\"max_tokens\":8,\"max_completion_tokens\":9}", 400, "max_completion_tokens", "disagree");
}

static void test_temperature_top_p(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"temperature\":0,\"top_p\":1}", &r);
    assert_true(r.temperature == 0.0 && r.top_p == 1.0);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"temperature\":2,\"top_p\":0.05}", &r);
    assert_true(r.temperature == 2.0 && r.top_p == 0.05);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"temperature\":null,\"top_p\":null}", &r);
    assert_true(r.temperature == 1.0 && r.top_p == 1.0);
    api_request_free(&r);

    REJECT(API_CHAT, CHAT_PREFIX ",\"temperature\":2.5}", 400, "temperature", "temperature must be in [0, 2], got 2.5");
    REJECT(API_CHAT, CHAT_PREFIX ",\"temperature\":-0.1}", 400, "temperature", "got -0.1");
    REJECT(API_CHAT, CHAT_PREFIX ",\"temperature\":\"hot\"}", 400, "temperature", "temperature must be a number, got a string");
    REJECT(API_CHAT, CHAT_PREFIX ",\"top_p\":0}", 400, "top_p", "top_p must be in (0, 1], got 0");
    REJECT(API_CHAT, CHAT_PREFIX ",\"top_p\":1.01}", 400, "top_p", "got 1.01");
    REJECT(API_CHAT, CHAT_PREFIX ",\"top_p\":true}", 400, "top_p", "top_p must be a number, got true");
}

static void test_top_k_seed(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"top_k\":40,\"seed\":42}", &r);
    assert_int_equal(r.top_k, 40);
    assert_true(r.has_seed && r.seed == 42);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"top_k\":0,\"seed\":-1}", &r);
    assert_int_equal(r.top_k, 0);
    assert_true(r.has_seed && r.seed == UINT64_MAX);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"top_k\":null,\"seed\":null}", &r);
    assert_int_equal(r.top_k, 0);
    assert_false(r.has_seed);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"top_k\":9000000000}", &r); /* beyond any vocabulary: clamped, same effect */
    assert_true(r.top_k > 1000000);
    api_request_free(&r);

    REJECT(API_CHAT, CHAT_PREFIX ",\"top_k\":-1}", 400, "top_k", "top_k must be an integer >= 0 (0 = off), got -1");
    REJECT(API_CHAT, CHAT_PREFIX ",\"top_k\":2.5}", 400, "top_k", "got 2.5");
    REJECT(API_CHAT, CHAT_PREFIX ",\"seed\":1.5}", 400, "seed", "seed must be an integer, got 1.5");
    REJECT(API_CHAT, CHAT_PREFIX ",\"seed\":\"7\"}", 400, "seed", "seed must be an integer, got a string");
}

static void test_n(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"n\":1}", &r);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"n\":null}", &r);
    api_request_free(&r);

    ACCEPT(API_CHAT, CHAT_PREFIX ",\"n\":3}", &r);
    assert_int_equal(r.n, 3);
    api_request_free(&r);
    REJECT(API_CHAT, CHAT_PREFIX ",\"n\":0}", 400, "n", "n must be an integer in [1, 16], got 0");
    REJECT(API_CHAT, CHAT_PREFIX ",\"n\":17}", 400, "n", "n must be an integer in [1, 16], got 17");
    REJECT(API_COMPLETION, COMPLETION_PREFIX ",\"n\":\"1\"}", 400, "n", "got a string");
    /* n x prompts is bounded too. */
    REJECT(API_COMPLETION, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\"],\"n\":16}", 400, "n", "asks for 80 choices");
}

static void test_stream(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"stream\":true}", &r);
    assert_true(r.stream && !r.include_usage);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}", &r);
    assert_true(r.stream && r.include_usage);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"stream\":true,\"stream_options\":{}}", &r);
    assert_true(r.stream && !r.include_usage);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"stream\":null,\"stream_options\":null}", &r);
    assert_false(r.stream);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, COMPLETION_PREFIX ",\"stream\":false}", &r);
    assert_false(r.stream);
    api_request_free(&r);

    REJECT(API_CHAT, CHAT_PREFIX ",\"stream\":\"yes\"}", 400, "stream", "stream must be a boolean");
    REJECT(API_CHAT, CHAT_PREFIX ",\"stream\":1}", 400, "stream", "got 1");
    REJECT(API_CHAT, CHAT_PREFIX ",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options",
           "stream_options is only allowed when stream is true");
    REJECT(API_CHAT, CHAT_PREFIX ",\"stream\":false,\"stream_options\":{}}", 400, "stream_options", "only allowed when stream is true");
    REJECT(API_CHAT, CHAT_PREFIX ",\"stream\":true,\"stream_options\":true}", 400, "stream_options",
           "stream_options must be an object, got true");
    REJECT(API_CHAT, CHAT_PREFIX ",\"stream\":true,\"stream_options\":{\"include_usage\":\"yes\"}}", 400,
           "stream_options.include_usage", "stream_options.include_usage must be a boolean");
}

static void test_stop(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"stop\":null}", &r);
    assert_int_equal(r.n_stop, 0);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"stop\":\"\\n\\n\"}", &r);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n\n");
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"stop\":\"\"}", &r);
    assert_int_equal(r.n_stop, 0);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, COMPLETION_PREFIX ",\"stop\":[\"a\",\"\",\"END\",\"b\"]}", &r);
    assert_int_equal(r.n_stop, 3);
    assert_string_equal(r.stop[0], "a");
    assert_string_equal(r.stop[1], "END");
    assert_string_equal(r.stop[2], "b");
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"stop\":[]}", &r);
    assert_int_equal(r.n_stop, 0);
    api_request_free(&r);

    REJECT(API_CHAT, CHAT_PREFIX ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", "stop holds at most 4 strings, got 5");
    REJECT(API_CHAT, CHAT_PREFIX ",\"stop\":[\"a\",1]}", 400, "stop[1]", "stop[1] must be a string, got 1");
    REJECT(API_CHAT, CHAT_PREFIX ",\"stop\":[null]}", 400, "stop[0]", "stop[0] must be a string, got null");
    REJECT(API_CHAT, CHAT_PREFIX ",\"stop\":7}", 400, "stop", "stop must be a string or an array of strings, got 7");
}

static void test_labels_and_ignore_eos(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"workflow_id\":\"wf-1\",\"agent\":\"planner\",\"tenant\":\"acme\",\"adapter\":\"lora-a\",\"ignore_eos\":true}",
           &r);
    assert_string_equal(r.workflow_id, "wf-1");
    assert_string_equal(r.agent, "planner");
    assert_string_equal(r.tenant, "acme");
    assert_string_equal(r.adapter, "lora-a");
    assert_true(r.ignore_eos);
    api_request_free(&r);

    char body[600];
    char label[API_MAX_LABEL_BYTES + 2];
    memset(label, 'a', sizeof label - 1);
    label[API_MAX_LABEL_BYTES] = '\0';
    snprintf(body, sizeof body, CHAT_PREFIX ",\"tenant\":\"%s\"}", label);
    ACCEPT(API_CHAT, body, &r);
    assert_int_equal(strlen(r.tenant), API_MAX_LABEL_BYTES);
    api_request_free(&r);
    label[API_MAX_LABEL_BYTES] = 'a';
    label[API_MAX_LABEL_BYTES + 1] = '\0';
    snprintf(body, sizeof body, CHAT_PREFIX ",\"tenant\":\"%s\"}", label);
    REJECT(API_CHAT, body, 400, "tenant", "tenant must be 1 to 256 bytes, got 257");

    REJECT(API_CHAT, CHAT_PREFIX ",\"workflow_id\":\"\"}", 400, "workflow_id", "workflow_id must be 1 to 256 bytes, got 0");
    REJECT(API_CHAT, CHAT_PREFIX ",\"agent\":\"a\\nb\"}", 400, "agent", "agent must not contain control characters");
    REJECT(API_CHAT, CHAT_PREFIX ",\"adapter\":\"\\u007f\"}", 400, "adapter", "adapter must not contain control characters");
    REJECT(API_CHAT, CHAT_PREFIX ",\"workflow_id\":12}", 400, "workflow_id", "workflow_id must be a string, got 12");
    REJECT(API_CHAT, CHAT_PREFIX ",\"ignore_eos\":\"yes\"}", 400, "ignore_eos", "ignore_eos must be a boolean");
}

/* Inside a message role, content, name, tool_calls, tool_call_id and cache_control are read; any
 * other non-null field would be dropped unseen by the chat template, so it is refused by its path. */
static void test_message_fields_refused(void **state) {
    (void)state;
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"name\":\"\"}]}", 400, "messages[0].name",
           "messages[0].name must be a non-empty string");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"tool_calls\":[]}]}", 400, "messages[0].tool_calls",
           "only allowed on assistant messages");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"x\"}]}", 400,
           "messages[0].tool_call_id", "no earlier assistant message's tool_calls holds");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"contents\":\"typo\"}]}", 400,
           "messages[0].contents", "messages[0].contents is not supported");
}

#define TOOL_GET_WEATHER \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of a city\"," \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}"
#define TOOL_CONVERSATION \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}," \
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\"," \
    "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}," \
    "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"18 C\"}]"

/* Tools, tool_choice, parallel_tool_calls, response_format and the tool parts of messages. */
static void test_tools_fields(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, TOOL_CONVERSATION ",\"tools\":[" TOOL_GET_WEATHER "]}", &r);
    assert_non_null(r.tools);
    assert_int_equal(r.tool_choice, API_TOOL_CHOICE_AUTO);
    assert_true(r.parallel_tool_calls);
    assert_true(r.messages[1].content_null);
    /* arguments arrive as a string and are parsed into an object for the template */
    json_t *args = json_object_get(json_object_get(json_array_get(r.messages[1].tool_calls, 0), "function"), "arguments");
    assert_true(json_is_object(args));
    assert_string_equal(json_string_value(json_object_get(args, "city")), "Paris");
    assert_string_equal(r.messages[2].tool_call_id, "call_1");
    assert_string_equal(r.messages[2].name, "get_weather"); /* filled from the call it answers */
    api_request_free(&r);

    ACCEPT(API_CHAT, CHAT_PREFIX ",\"tools\":[" TOOL_GET_WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
                     "\"parallel_tool_calls\":false}", &r);
    assert_int_equal(r.tool_choice, API_TOOL_CHOICE_NAMED);
    assert_string_equal(r.tool_choice_name, "get_weather");
    assert_false(r.parallel_tool_calls);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"tools\":[" TOOL_GET_WEATHER "],\"tool_choice\":\"none\"}", &r);
    assert_int_equal(r.tool_choice, API_TOOL_CHOICE_NONE);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"answer\",\"strict\":true,"
                     "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}}", &r);
    assert_int_equal(r.response_format, API_FORMAT_JSON_SCHEMA);
    assert_non_null(r.response_schema);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"response_format\":{\"type\":\"json_object\"}}", &r);
    assert_int_equal(r.response_format, API_FORMAT_JSON_OBJECT);
    api_request_free(&r);

    static const struct {
        const char *body, *param, *mention;
    } refused[] = {
        {CHAT_PREFIX ",\"tools\":{}}", "tools", "tools must be an array"},
        {CHAT_PREFIX ",\"tools\":[{\"type\":\"retrieval\"}]}", "tools[0].type", "must be \"function\""},
        {CHAT_PREFIX ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bad name\"}}]}", "tools[0].function.name",
         "a-z, A-Z, 0-9"},
        {CHAT_PREFIX ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}",
         "tools[0].function.parameters", "JSON Schema object"},
        {CHAT_PREFIX ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parametres\":{}}}]}",
         "tools[0].function.parametres", "not a field"},
        {CHAT_PREFIX ",\"tools\":[" TOOL_GET_WEATHER "," TOOL_GET_WEATHER "]}", "tools", "names must be unique"},
        {CHAT_PREFIX ",\"tool_choice\":\"required\"}", "tool_choice", "needs tools"},
        {CHAT_PREFIX ",\"tools\":[" TOOL_GET_WEATHER "],\"tool_choice\":\"sometimes\"}", "tool_choice", "must be \"none\""},
        {CHAT_PREFIX ",\"tools\":[" TOOL_GET_WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}",
         "tool_choice", "not in tools"},
        {CHAT_PREFIX ",\"parallel_tool_calls\":1}", "parallel_tool_calls", "a boolean"},
        {CHAT_PREFIX ",\"response_format\":{\"type\":\"xml\"}}", "response_format.type", "must be \"text\""},
        {CHAT_PREFIX ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}", "response_format.json_schema.name",
         "1 to 64 characters"},
        {CHAT_PREFIX ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":"
                     "{\"type\":\"object\",\"patternProperties\":{}}}}}",
         "response_format.json_schema.schema", "patternProperties"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
         "\"function\":{\"name\":\"f\",\"arguments\":\"{not json\"}}]}]}",
         "messages[1].tool_calls[0].function.arguments", "JSON object encoded as a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
         "messages[1].tool_calls[0].id", "non-empty string"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"42\"}]}", "messages[0].tool_call_id", "required on a tool message"},
        {CHAT_PREFIX ",\"functions\":[]}", "functions", "send tools instead"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) REJECT(API_CHAT, refused[i].body, 400, refused[i].param, refused[i].mention);
}

/* Cache directives (issue 18): shapes accepted and refused, each by its path. */
static void test_directives(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_COMPLETION,
           "{\"prompt\":\"p\",\"directives\":[{\"op\":\"splice\",\"span\":[1,3],\"replacement\":\"x\",\"mode\":\"forget\"},"
           "{\"op\":\"pin\",\"ttl\":\"1h\"},{\"op\":\"share\",\"span\":{\"match\":\"ab\",\"occurrence\":2},\"with\":[\"t1\"]},"
           "{\"op\":\"evict\",\"span\":{\"match\":\"z\"}},{\"op\":\"decay\"}]}",
           &r);
    assert_int_equal(r.n_directives, 5);
    assert_true(r.directives[0].op == API_DIRECTIVE_SPLICE && r.directives[0].has_span && r.directives[0].start == 1 &&
                r.directives[0].end == 3 && r.directives[0].mode == CACHE_SPLICE_FORGET);
    assert_true(r.directives[1].op == CACHE_HINT_PIN && r.directives[1].ttl_s == 3600 && !r.directives[1].has_span);
    assert_true(r.directives[2].op == CACHE_HINT_SHARE && r.directives[2].occurrence == 2 && r.directives[2].n_with == 1);
    api_request_free(&r);
    ACCEPT(API_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"s\",\"cache_control\":{\"type\":\"ephemeral\"}},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}]}]}",
           &r);
    assert_true(r.messages[0].cache_ttl_s == 300 && r.messages[1].cache_ttl_s == 3600);
    api_request_free(&r);
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"directives\":{}}", 400, "directives", "array");
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"directives\":[{\"op\":\"fold\"}]}", 400, "directives[0].op", "one of");
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"directives\":[{\"op\":\"pin\"},{\"op\":\"splice\",\"replacement\":\"x\"}]}", 400,
           "directives[1].span", "required");
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"directives\":[{\"op\":\"splice\",\"span\":[3,1],\"replacement\":\"x\"}]}", 400,
           "directives[0].span", "start <= end");
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"directives\":[{\"op\":\"splice\",\"span\":[0,1],\"replacement\":\"x\",\"mode\":\"fast\"}]}",
           400, "directives[0].mode", "amortize");
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"directives\":[{\"op\":\"pin\",\"ttl\":\"2d\"}]}", 400, "directives[0].ttl", "duration");
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"directives\":[{\"op\":\"pin\",\"with\":\"all\"}]}", 400, "directives[0].with",
           "not a field of a pin directive");
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"directives\":[{\"op\":\"share\"}]}", 400, "directives[0].with", "tenant names");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"cache_control\":{\"type\":\"forever\"}}]}", 400,
           "messages[0].cache_control", "ephemeral");
    /* issue 36: the conversation a splice's savings last for, and the server's own splices */
    ACCEPT(API_COMPLETION, "{\"prompt\":\"p\",\"conversation_id\":\"c1\",\"auto_splice\":\"forget\"}", &r);
    assert_string_equal(r.conversation_id, "c1");
    assert_int_equal(r.auto_splice, CACHE_SPLICE_FORGET);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, "{\"prompt\":\"p\"}", &r);
    assert_null(r.conversation_id);
    assert_int_equal(r.auto_splice, -1);
    api_request_free(&r);
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"auto_splice\":true}", 400, "auto_splice", "amortize");
    REJECT(API_COMPLETION, "{\"prompt\":\"p\",\"conversation_id\":\"\"}", 400, "conversation_id", "1 to");
}

/* Every field is honoured, accepted at its no-op value, or a 400 naming it (issue 22's rule). */
static void test_unhonoured_fields_refused(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT,
           CHAT_PREFIX ",\"frequency_penalty\":0,\"presence_penalty\":0.0,\"user\":\"u\",\"tool_choice\":\"none\","
                       "\"response_format\":{\"type\":\"text\"},\"logit_bias\":{},\"tools\":null,\"parallel_tool_calls\":false}",
           &r);
    assert_int_equal(r.n_messages, 1);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, COMPLETION_PREFIX ",\"echo\":false,\"suffix\":\"\",\"best_of\":2,\"n\":2}", &r);
    api_request_free(&r);

    /* Each refused body: the field named in param and what the message says. */
    static const struct {
        ApiKind kind;
        const char *body, *param, *mention;
    } refused[] = {
        {API_CHAT, CHAT_PREFIX ",\"frequency_penalty\":0.5}", "frequency_penalty", "only 0 is accepted"},
        {API_CHAT, CHAT_PREFIX ",\"presence_penalty\":\"x\"}", "presence_penalty", "only 0 is accepted"},
        {API_CHAT, CHAT_PREFIX ",\"logit_bias\":{\"1\":2}}", "logit_bias", "only an empty object"},
        {API_CHAT, CHAT_PREFIX ",\"metadata\":{\"a\":1}}", "metadata", "unknown field 'metadata'"},
        {API_CHAT, CHAT_PREFIX ",\"echo\":false}", "echo", "unknown field 'echo' for a chat completion"},
        {API_COMPLETION, COMPLETION_PREFIX ",\"echo\":true}", "echo", "only false is accepted"},
        {API_COMPLETION, COMPLETION_PREFIX ",\"suffix\":\"end\"}", "suffix", "suffix is not supported"},
        {API_COMPLETION, COMPLETION_PREFIX ",\"best_of\":3}", "best_of", "best_of equal to n"},
        {API_COMPLETION, COMPLETION_PREFIX ",\"top_logprobs\":2}", "top_logprobs", "unknown field"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        REJECT(refused[i].kind, refused[i].body, 400, refused[i].param, refused[i].mention);
}

/* logprobs: chat takes a boolean and top_logprobs, completions a count; both up to 20. */
static void test_logprobs_fields(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_CHAT, CHAT_PREFIX "}", &r);
    assert_int_equal(r.logprobs, -1);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"logprobs\":true}", &r);
    assert_int_equal(r.logprobs, 0);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"logprobs\":true,\"top_logprobs\":5}", &r);
    assert_int_equal(r.logprobs, 5);
    api_request_free(&r);
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"logprobs\":false}", &r);
    assert_int_equal(r.logprobs, -1);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, COMPLETION_PREFIX ",\"logprobs\":3}", &r);
    assert_int_equal(r.logprobs, 3);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, COMPLETION_PREFIX ",\"logprobs\":0}", &r);
    assert_int_equal(r.logprobs, 0);
    api_request_free(&r);

    REJECT(API_CHAT, CHAT_PREFIX ",\"top_logprobs\":2}", 400, "top_logprobs", "needs logprobs set to true");
    REJECT(API_CHAT, CHAT_PREFIX ",\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs", "in [0, 20], got 21");
    REJECT(API_CHAT, CHAT_PREFIX ",\"logprobs\":3}", 400, "logprobs", "a boolean");
    REJECT(API_COMPLETION, COMPLETION_PREFIX ",\"logprobs\":true}", 400, "logprobs", "in [0, 20], got true");
    REJECT(API_COMPLETION, COMPLETION_PREFIX ",\"logprobs\":-1}", 400, "logprobs", "in [0, 20]");
}

/* A failure after strings were copied (a bad field late in the body) frees them; ASan checks it. */
static void test_late_failure_frees(void **state) {
    (void)state;
    REJECT(API_CHAT,
           "{\"model\":\"" SERVED "\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}],"
           "\"stop\":[\"x\",\"y\"],\"workflow_id\":\"w\",\"agent\":\"a\",\"tenant\":\"t\",\"adapter\":\"\"}",
           400, "adapter", "adapter must be 1 to 256 bytes");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":{}}]}", 400,
           "messages[1].content", "messages[1].content must be");
    REJECT(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stop\":[\"x\"],\"ignore_eos\":0}", 400, "ignore_eos",
           "ignore_eos must be a boolean (true or false), got 0");
}

static void test_error_set_and_json(void **state) {
    (void)state;
    ApiError e;
    assert_int_equal(api_error_set(&e, 413, NULL, NULL, "request body exceeds %d bytes", 1024), -1);
    assert_int_equal(e.status, 413);
    assert_string_equal(e.type, "invalid_request_error");
    assert_string_equal(e.param, "");
    assert_string_equal(e.message, "request body exceeds 1024 bytes");
    api_error_set(&e, 429, NULL, "rate_limit_exceeded", "busy");
    assert_string_equal(e.type, "rate_limit_error");
    api_error_set(&e, 503, NULL, NULL, "down");
    assert_string_equal(e.type, "server_error");

    api_error_set(&e, 400, "max_tokens", "context_length_exceeded", "say \"%s\"\n\ttab \\ done", "quoted");
    char *text = api_error_json(&e);
    assert_non_null(text);
    json_t *root = json_loads(text, 0, NULL);
    assert_non_null(root);
    json_t *inner = json_object_get(root, "error");
    assert_int_equal(json_object_size(inner), 4);
    assert_string_equal(json_string_value(json_object_get(inner, "message")), "say \"quoted\"\n\ttab \\ done");
    assert_string_equal(json_string_value(json_object_get(inner, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(inner, "param")), "max_tokens");
    assert_string_equal(json_string_value(json_object_get(inner, "code")), "context_length_exceeded");
    json_decref(root);
    free(text);

    /* Empty param and code become null. */
    api_error_set(&e, 404, NULL, NULL, "no endpoint");
    text = api_error_json(&e);
    root = json_loads(text, 0, NULL);
    inner = json_object_get(root, "error");
    assert_true(json_is_null(json_object_get(inner, "param")) && json_is_null(json_object_get(inner, "code")));
    json_decref(root);
    free(text);

    /* Bytes that are not UTF-8 (a client's URL, a message cut mid-character) still give valid JSON. */
    api_error_set(&e, 404, NULL, NULL, "no endpoint GET /v1/\xff\xfe\xc3 (\xed\xa0\x80) \xc3\xa9");
    text = api_error_json(&e);
    root = json_loads(text, 0, NULL);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(json_object_get(root, "error"), "message")),
                        "no endpoint GET /v1/\?\?\? (\?\?\?) \xc3\xa9"); /* \? dodges trigraphs */
    json_decref(root);
    free(text);

    /* A message longer than the buffer is cut; the JSON stays valid. */
    char long_text[1000];
    for (size_t i = 0; i + 2 < sizeof long_text; i += 2) memcpy(long_text + i, "\xc3\xa9", 2);
    long_text[sizeof long_text - 1 - (sizeof long_text - 1) % 2] = '\0';
    api_error_set(&e, 400, "x", NULL, "x%s", long_text);
    check_error_json(&e);
}

static void test_headers(void **state) {
    (void)state;
    ApiRequest r;
    ApiError e;
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"agent\":\"from-body\"}", &r);
    assert_int_equal(api_request_apply_headers(&r, "wf-9", "from-body", "acme", NULL, &e), 0); /* the same value twice is fine */
    assert_string_equal(r.workflow_id, "wf-9");
    assert_string_equal(r.agent, "from-body");
    assert_string_equal(r.tenant, "acme");
    assert_null(r.adapter);
    assert_int_equal(api_request_apply_headers(&r, NULL, NULL, NULL, NULL, &e), 0);
    assert_int_equal(api_request_apply_headers(&r, NULL, NULL, NULL, "lora-\xc3\xa9", &e), 0);
    assert_string_equal(r.adapter, "lora-\xc3\xa9");
    api_request_free(&r);

    struct {
        const char *values[4];
        const char *param, *mention;
    } bad[] = {
        {{"", NULL, NULL, NULL}, "workflow_id", "header X-Braid-Workflow must be 1 to 256 bytes, got 0"},
        {{NULL, "a\tb", NULL, NULL}, "agent", "header X-Braid-Agent must not contain control characters"},
        {{NULL, NULL, "t\x7f", NULL}, "tenant", "header X-Braid-Tenant must not contain control characters"},
        {{NULL, NULL, NULL, "\xff"}, "adapter", "header X-Braid-Adapter is not valid UTF-8"},
        {{"ok", NULL, "ok", "\xc3"}, "adapter", "not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ACCEPT(API_CHAT, CHAT_PREFIX "}", &r);
        memset(&e, 0, sizeof e);
        assert_int_equal(api_request_apply_headers(&r, bad[i].values[0], bad[i].values[1], bad[i].values[2], bad[i].values[3], &e), -1);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, bad[i].param);
        if (!strstr(e.message, bad[i].mention)) fail_msg("header case %zu: message '%s'", i, e.message);
        /* Nothing was applied, not even the valid values before the bad one. */
        assert_true(!r.workflow_id && !r.agent && !r.tenant && !r.adapter);
        check_error_json(&e);
        api_request_free(&r);
    }

    /* Body and header disagreeing is a 400 naming both, for every label (the tenant above all: the
     * body used to win silently, putting the request in a namespace the header did not ask for). */
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"tenant\":\"acme\",\"adapter\":\"a\"}", &r);
    memset(&e, 0, sizeof e);
    assert_int_equal(api_request_apply_headers(&r, "wf", NULL, "globex", NULL, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "tenant");
    assert_non_null(strstr(e.message, "tenant in the body ('acme') and header X-Braid-Tenant ('globex') disagree"));
    assert_null(r.workflow_id); /* nothing applied */
    assert_int_equal(api_request_apply_headers(&r, NULL, NULL, NULL, "b", &e), -1);
    assert_string_equal(e.param, "adapter");
    check_error_json(&e);
    api_request_free(&r);

    /* Too long, and refused even where the body already set the field. */
    char long_value[API_MAX_LABEL_BYTES + 2];
    memset(long_value, 'w', sizeof long_value - 1);
    long_value[sizeof long_value - 1] = '\0';
    ACCEPT(API_CHAT, CHAT_PREFIX ",\"workflow_id\":\"w\"}", &r);
    assert_int_equal(api_request_apply_headers(&r, long_value, NULL, NULL, NULL, &e), -1);
    assert_string_equal(e.param, "workflow_id");
    assert_non_null(strstr(e.message, "got 257"));
    assert_string_equal(r.workflow_id, "w");
    api_request_free(&r);
}

/* usage.prompt_tokens_details: OpenAI's cached_tokens is every cached prompt token (both tiers);
 * Braid's cached_tokens_device / cached_tokens_host split it, in whole answers and the stream's
 * usage chunk alike. */
static void test_usage_per_tier(void **state) {
    (void)state;
    ApiResponseHead head = {.kind = API_COMPLETION, .id = "cmpl-1", .model = "m", .created = 1};
    ApiUsage u = {.prompt_tokens = 100, .completion_tokens = 5, .cached_tokens = 64, .cached_tokens_host = 16};
    ApiChoice choice = {.text = "hi", .len = 2, .finish_reason = "stop"};
    char *bodies[2] = {api_response_full(&head, &choice, 1, &u), api_response_usage_chunk(&head, &u)};
    for (int i = 0; i < 2; i++) {
        assert_non_null(bodies[i]);
        json_t *o = json_loads(bodies[i], 0, NULL);
        assert_non_null(o);
        json_t *usage = json_object_get(o, "usage"), *details = json_object_get(usage, "prompt_tokens_details");
        assert_int_equal(json_integer_value(json_object_get(usage, "prompt_tokens")), 100);
        assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), 105);
        assert_int_equal(json_integer_value(json_object_get(details, "cached_tokens")), 64);
        assert_int_equal(json_integer_value(json_object_get(details, "cached_tokens_device")), 48);
        assert_int_equal(json_integer_value(json_object_get(details, "cached_tokens_host")), 16);
        json_decref(o);
        free(bodies[i]);
    }
}

/* A request's seed reproduces; without one every draw differs, also for the same salt. */
static void test_sampling_seed(void **state) {
    (void)state;
    ApiRequest r;
    ACCEPT(API_COMPLETION, COMPLETION_PREFIX ",\"seed\":42}", &r);
    assert_int_equal(api_request_sampling_seed(&r, 0), 42);
    assert_int_equal(api_request_sampling_seed(&r, 7), 42);
    api_request_free(&r);
    ACCEPT(API_COMPLETION, COMPLETION_PREFIX "}", &r);
    enum { N = 64 };
    uint64_t seen[N];
    for (int i = 0; i < N; i++) {
        seen[i] = api_request_sampling_seed(&r, (uint64_t)(i % 2)); /* salts repeat; seeds must not */
        for (int j = 0; j < i; j++)
            if (seen[j] == seen[i]) fail_msg("unseeded draws %d and %d gave the same seed %llu", j, i, (unsigned long long)seen[i]);
    }
    api_request_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message_fields_refused),
        cmocka_unit_test(test_sampling_seed),
        cmocka_unit_test(test_usage_per_tier),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_body_json),
        cmocka_unit_test(test_chat_roles_and_content),
        cmocka_unit_test(test_chat_content_parts),
        cmocka_unit_test(test_chat_message_count),
        cmocka_unit_test(test_completion_prompt),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_max_tokens),
        cmocka_unit_test(test_temperature_top_p),
        cmocka_unit_test(test_top_k_seed),
        cmocka_unit_test(test_n),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_stop),
        cmocka_unit_test(test_labels_and_ignore_eos),
        cmocka_unit_test(test_unhonoured_fields_refused),
        cmocka_unit_test(test_logprobs_fields),
        cmocka_unit_test(test_tools_fields),
        cmocka_unit_test(test_directives),
        cmocka_unit_test(test_late_failure_frees),
        cmocka_unit_test(test_error_set_and_json),
        cmocka_unit_test(test_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
