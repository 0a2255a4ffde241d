/* Anthropic Messages API: the request parser (every translation rule, every 400 with the field it
 * names, the cache_control breakpoint rules) and the renderer (message object, usage from the
 * engine's numbers and pin outcomes, each streaming event, the error shape). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/api/anthropic_request.h"
#include "coord/api/anthropic_response.h"
#include "coord/api/api_request.h"
#include "coord/auth.h"

#define HEAD "{\"model\":\"m\",\"max_tokens\":16,"
#define USER_HI "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void parse_ok(const char *body, AnthropicEndpoint endpoint, ApiRequest *r) {
    ApiError e = {0};
    if (anthropic_request_parse(body, strlen(body), endpoint, r, NULL, &e)) fail_msg("refused %s: %d %s", body, e.status, e.message);
}

/* Expects a 400 (or status) whose message contains mention. */
static void reject_at(const char *file, int line, AnthropicEndpoint endpoint, const char *body, int status, const char *mention) {
    ApiRequest r;
    ApiError e = {0};
    int rc = anthropic_request_parse(body, strlen(body), endpoint, &r, NULL, &e);
    if (rc != -1 || e.status != status || !strstr(e.message, mention))
        fail_msg("%s:%d: body %s\n  -> rc %d, status %d, message '%s'\n  expected status %d with '%s'", file, line, body, rc, e.status,
                 e.message, status, mention);
    assert_null(r.messages);
    api_request_free(&r);
    /* The Anthropic error JSON is well-formed and typed by status. */
    char *text = anthropic_error_json(&e);
    json_t *root = json_loads(text, 0, NULL);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "type")), "error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(root, "error"), "type")), anthropic_error_type(status));
    assert_string_equal(json_string_value(json_object_get(json_object_get(root, "error"), "message")), e.message);
    json_decref(root);
    free(text);
}
#define REJECT(body, mention) reject_at(__FILE__, __LINE__, ANTHROPIC_MESSAGES, body, 400, mention)
#define REJECT_COUNT(body, mention) reject_at(__FILE__, __LINE__, ANTHROPIC_COUNT_TOKENS, body, 400, mention)

static void test_minimal_and_scalars(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(HEAD "\"system\":\"be brief\",\"stop_sequences\":[\"END\",\"\\n\\n\"],\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,"
                  "\"metadata\":{\"user_id\":\"u1\"},\"stream\":true," USER_HI "}",
             ANTHROPIC_MESSAGES, &r);
    assert_int_equal(r.kind, API_CHAT);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.max_tokens, 16);
    assert_int_equal(r.n_messages, 2);
    assert_string_equal(r.messages[0].role, "system");
    assert_string_equal(r.messages[0].content, "be brief");
    assert_string_equal(r.messages[1].role, "user");
    assert_string_equal(r.messages[1].content, "hi");
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "END");
    assert_true(r.temperature == 0.5 && r.top_p == 0.9 && r.top_k == 7);
    assert_true(r.stream);
    api_request_free(&r);
}

static void test_blocks_and_tools(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok(HEAD "\"system\":[{\"type\":\"text\",\"text\":\"A\"},{\"type\":\"text\",\"text\":\"B\"}],"
                  "\"tools\":[{\"name\":\"get_weather\",\"description\":\"w\",\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}],"
                  "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
                  "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"weather?\"},{\"type\":\"text\",\"text\":\"Paris\"}]},"
                  "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"checking\"},"
                  "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},"
                  "{\"type\":\"text\",\"text\":\"thanks\"}]}]}",
             ANTHROPIC_MESSAGES, &r);
    assert_int_equal(r.n_messages, 5);
    assert_string_equal(r.messages[0].content, "A\n\nB");
    assert_string_equal(r.messages[1].content, "weather?\n\nParis");
    assert_string_equal(r.messages[2].role, "assistant");
    assert_string_equal(r.messages[2].content, "checking");
    assert_int_equal(json_array_size(r.messages[2].tool_calls), 1);
    const json_t *fn = json_object_get(json_array_get(r.messages[2].tool_calls, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(json_object_get(fn, "arguments"), "city")), "Paris");
    assert_string_equal(r.messages[3].role, "tool");
    assert_string_equal(r.messages[3].tool_call_id, "toolu_1");
    assert_string_equal(r.messages[3].name, "get_weather");
    assert_string_equal(r.messages[3].content, "sunny");
    assert_string_equal(r.messages[4].content, "thanks");
    assert_int_equal(r.tool_choice, API_TOOL_CHOICE_REQUIRED);
    assert_false(r.parallel_tool_calls);
    assert_int_equal(json_array_size(r.tools), 1);
    api_request_free(&r);

    /* Null fields read as absent (clients echo response blocks back with nulls). */
    parse_ok(HEAD "\"thinking\":null,\"messages\":[{\"role\":\"user\",\"content\":\"go\"},{\"role\":\"assistant\",\"content\":["
                  "{\"type\":\"text\",\"text\":\"ok\",\"citations\":null},{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{},\"caller\":null}]},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"r\"}]}],"
                  "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]}",
             ANTHROPIC_MESSAGES, &r);
    assert_int_equal(r.n_messages, 3);
    api_request_free(&r);

    /* tool_choice tool / none / auto; an is_error result; an assistant turn that only calls. */
    parse_ok(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"go\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{}}]},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"boom\",\"is_error\":true}]}]}",
             ANTHROPIC_MESSAGES, &r);
    assert_int_equal(r.tool_choice, API_TOOL_CHOICE_NAMED);
    assert_string_equal(r.tool_choice_name, "f");
    assert_true(r.messages[1].content_null);
    assert_string_equal(r.messages[2].content, "Error: boom");
    api_request_free(&r);
    parse_ok(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"none\"}," USER_HI "}",
             ANTHROPIC_MESSAGES, &r);
    assert_int_equal(r.tool_choice, API_TOOL_CHOICE_NONE);
    api_request_free(&r);
    parse_ok(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"auto\"}," USER_HI "}",
             ANTHROPIC_MESSAGES, &r);
    assert_int_equal(r.tool_choice, API_TOOL_CHOICE_AUTO);
    assert_true(r.parallel_tool_calls);
    api_request_free(&r);
}

static void test_cache_control(void **state) {
    (void)state;
    ApiRequest r;
    /* Tools (1h) land on the system turn with the system's own (1h); a 5m on a user block. */
    parse_ok(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"},\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}],"
                  "\"system\":[{\"type\":\"text\",\"text\":\"S\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}],"
                  "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"long doc\",\"cache_control\":{\"type\":\"ephemeral\"}}]},"
                  "{\"role\":\"assistant\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":\"q\"}]}",
             ANTHROPIC_MESSAGES, &r);
    assert_true(r.messages[0].cache_ttl_s == 3600);
    assert_true(r.messages[1].cache_ttl_s == 300);
    assert_true(r.messages[2].cache_ttl_s == 0 && r.messages[3].cache_ttl_s == 0);
    api_request_free(&r);
    /* Without a system turn a tools breakpoint pins through the first message. */
    parse_ok(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"},\"cache_control\":{\"type\":\"ephemeral\"}}]," USER_HI "}",
             ANTHROPIC_MESSAGES, &r);
    assert_true(r.messages[0].cache_ttl_s == 300);
    api_request_free(&r);
    /* A tool_result breakpoint marks its tool message; an assistant block its assistant turn. */
    parse_ok(HEAD "\"messages\":[{\"role\":\"user\",\"content\":\"go\"},"
                  "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{},\"cache_control\":{\"type\":\"ephemeral\"}}]},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"r\",\"cache_control\":{\"type\":\"ephemeral\"}},"
                  "{\"type\":\"text\",\"text\":\"next\"}]}],\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]}",
             ANTHROPIC_MESSAGES, &r);
    assert_true(r.messages[1].cache_ttl_s == 300 && r.messages[2].cache_ttl_s == 300 && r.messages[3].cache_ttl_s == 0);
    api_request_free(&r);

    /* Top-level cache_control marks the last message; it counts and comes last in order. */
    parse_ok(HEAD "\"cache_control\":{\"type\":\"ephemeral\"},\"system\":\"s\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                  "{\"role\":\"assistant\",\"content\":\"b\"},{\"role\":\"user\",\"content\":\"c\"}]}",
             ANTHROPIC_MESSAGES, &r);
    assert_true(r.messages[0].cache_ttl_s == 0 && r.messages[1].cache_ttl_s == 0 && r.messages[3].cache_ttl_s == 300);
    api_request_free(&r);
    REJECT(HEAD "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"},"
                "\"system\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{\"type\":\"ephemeral\"}}]," USER_HI "}",
           "cache_control: a ttl=\"1h\" cache_control may not come after");
    REJECT(HEAD "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":5}," USER_HI "}", "cache_control.ttl: expected");

    const char *cc5 = "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"5m\"}";
    char body[2048];
    snprintf(body, sizeof body,
             HEAD "\"system\":[{\"type\":\"text\",\"text\":\"a\",%s},{\"type\":\"text\",\"text\":\"b\",%s},{\"type\":\"text\",\"text\":\"c\",%s},"
                  "{\"type\":\"text\",\"text\":\"d\",%s},{\"type\":\"text\",\"text\":\"e\",%s}]," USER_HI "}",
             cc5, cc5, cc5, cc5, cc5);
    REJECT(body, "A maximum of 4 blocks with cache_control");
    REJECT(HEAD "\"system\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"5m\"}}],"
                "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"1h\"}}]}]}",
           "may not come after a ttl=\"5m\"");
    REJECT(HEAD "\"system\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"10m\"}}]," USER_HI "}",
           "system[0].cache_control.ttl: expected \"5m\" or \"1h\"");
    REJECT(HEAD "\"system\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{\"type\":\"persistent\"}}]," USER_HI "}",
           "system[0].cache_control: expected {\"type\": \"ephemeral\"}");
    REJECT(HEAD "\"system\":[{\"type\":\"text\",\"text\":\"a\",\"cache_control\":{\"type\":\"ephemeral\",\"scope\":1}}]," USER_HI "}",
           "system[0].cache_control.scope: Extra inputs are not permitted");
}

static void test_rejections(void **state) {
    (void)state;
    REJECT("", "request body is empty");
    REJECT("{", "not valid JSON");
    REJECT("[1]", "expected a JSON object");
    REJECT("{\"max_tokens\":5," USER_HI "}", "model: expected a string");
    REJECT("{\"model\":\"m\"," USER_HI "}", "max_tokens: Field required");
    REJECT("{\"model\":\"m\",\"max_tokens\":0," USER_HI "}", "max_tokens: expected an integer >= 1");
    REJECT(HEAD "\"thinking\":{\"type\":\"enabled\"}," USER_HI "}", "thinking: Extra inputs are not permitted");
    REJECT("{\"model\":\"m\",\"max_tokens\":5}", "messages: Field required");
    REJECT(HEAD "\"messages\":{}}", "messages: expected an array");
    REJECT(HEAD "\"messages\":[]}", "at least one message");
    REJECT(HEAD "\"messages\":[3]}", "messages[0]: expected an object");
    REJECT(HEAD "\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "messages[0].role: expected \"user\" or \"assistant\"");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"bob\"}]}", "messages[0].name: Extra inputs");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content: expected a string or an array");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":[]}]}", "at least one content block");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"pre\"}]}", "prefilled assistant");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}", "type 'image' are not supported");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", "messages[0].content[0].type: expected a string");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "messages[0].content[0].text: expected a string");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\",\"citations\":[{}]}]}]}", "citations are not supported");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":{}}]}]}",
           "a tool_use block may not appear in a user message");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\"}]},"
                "{\"role\":\"user\",\"content\":\"y\"}]}",
           "a tool_result block may not appear in an assistant message");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"nope\",\"content\":\"r\"}]}]}",
           "answers no tool_use block");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"content\":\"r\"}]}]}", "tool_use_id: expected a non-empty string");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":[]}]},"
                "{\"role\":\"user\",\"content\":\"y\"}]}",
           "input: expected an object");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"name\":\"f\",\"input\":{}}]},"
                "{\"role\":\"user\",\"content\":\"y\"}]}",
           ".id: expected a non-empty string");
    REJECT(HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"is_error\":1}]}]}",
           "answers no tool_use");
    REJECT(HEAD "\"system\":5," USER_HI "}", "system: expected a string or an array of text blocks");
    REJECT(HEAD "\"system\":[{\"type\":\"image\"}]," USER_HI "}", "type 'image' are not supported");
    REJECT(HEAD "\"tools\":{}," USER_HI "}", "tools: expected an array");
    REJECT(HEAD "\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]," USER_HI "}", "server tools are not");
    REJECT(HEAD "\"tools\":[{\"name\":\"f\"}]," USER_HI "}", "tools[0].input_schema: expected a JSON Schema object");
    REJECT(HEAD "\"tools\":[{\"name\":3,\"input_schema\":{}}]," USER_HI "}", "tools[0].name: expected a string");
    REJECT(HEAD "\"tools\":[{\"name\":\"f\",\"description\":1,\"input_schema\":{}}]," USER_HI "}", "tools[0].description: expected a string");
    REJECT(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{},\"strict\":true}]," USER_HI "}", "tools[0].strict: Extra inputs");
    REJECT(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":\"auto\"," USER_HI "}",
           "tool_choice: expected an object");
    REJECT(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"some\"}," USER_HI "}",
           "tool_choice.type: expected \"auto\"");
    REJECT(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"tool\"}," USER_HI "}",
           "tool_choice.name: expected a string");
    REJECT(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"auto\",\"name\":\"f\"}," USER_HI "}",
           "only a \"tool\" choice names a tool");
    REJECT(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":1}," USER_HI "}",
           "disable_parallel_tool_use: expected a boolean");
    REJECT(HEAD "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"g\"}," USER_HI "}",
           "g");
    REJECT(HEAD "\"stop_sequences\":\"x\"," USER_HI "}", "stop_sequences: expected an array");
    REJECT(HEAD "\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\",\"e\"]," USER_HI "}", "at most 4");
    REJECT(HEAD "\"stop_sequences\":[1]," USER_HI "}", "stop_sequences[0]: expected a string");
    REJECT(HEAD "\"stop_sequences\":[\"\"]," USER_HI "}", "must not be empty");
    REJECT(HEAD "\"temperature\":1.5," USER_HI "}", "temperature: expected a number in [0, 1]");
    REJECT(HEAD "\"top_p\":0," USER_HI "}", "top_p");
    REJECT(HEAD "\"top_k\":-1," USER_HI "}", "top_k");
    REJECT(HEAD "\"stream\":\"yes\"," USER_HI "}", "stream");
    REJECT(HEAD "\"metadata\":[]," USER_HI "}", "metadata: expected an object");
    REJECT(HEAD "\"metadata\":{\"session\":\"x\"}," USER_HI "}", "metadata.session: Extra inputs");
    REJECT(HEAD "\"metadata\":{\"user_id\":5}," USER_HI "}", "metadata.user_id: expected a string");
    /* count_tokens takes no generation fields; messages still required. */
    REJECT_COUNT(HEAD USER_HI "}", "max_tokens: Extra inputs are not permitted");
    REJECT_COUNT("{\"model\":\"m\"}", "messages: Field required");
}

static void test_count_tokens_body(void **state) {
    (void)state;
    ApiRequest r;
    parse_ok("{\"model\":\"m\",\"system\":\"s\",\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]," USER_HI "}",
             ANTHROPIC_COUNT_TOKENS, &r);
    assert_int_equal(r.n_messages, 2);
    assert_int_equal(r.max_tokens, -1);
    assert_non_null(r.tools);
    api_request_free(&r);
}

/* ---- renderer ---- */

static void test_usage_from_engine(void **state) {
    (void)state;
    /* Nothing cached, no pins: all input. */
    ApiUsage u = {.prompt_tokens = 100, .completion_tokens = 7};
    AnthropicUsage a = anthropic_usage_from(&u);
    assert_int_equal(a.input_tokens, 100);
    assert_int_equal(a.cache_read_input_tokens + a.cache_creation_input_tokens, 0);
    assert_int_equal(a.output_tokens, 7);
    /* A 1h pin through 48 tokens and a 5m pin through 80, 16 already cached: 32 + 32 created. */
    u.cached_tokens = 16;
    u.directive_outcomes = "[{\"index\":-2,\"op\":\"pin\",\"outcome\":\"accepted\",\"tokens\":80,\"ttl_s\":300},"
                           "{\"index\":-1,\"op\":\"pin\",\"outcome\":\"accepted\",\"tokens\":48,\"ttl_s\":3600}]";
    a = anthropic_usage_from(&u);
    assert_int_equal(a.cache_read_input_tokens, 16);
    assert_int_equal(a.ephemeral_1h_input_tokens, 32);
    assert_int_equal(a.ephemeral_5m_input_tokens, 32);
    assert_int_equal(a.cache_creation_input_tokens, 64);
    assert_int_equal(a.input_tokens, 20);
    /* The second turn: the pinned prefix is read, nothing new created. */
    u.cached_tokens = 80;
    a = anthropic_usage_from(&u);
    assert_int_equal(a.cache_read_input_tokens, 80);
    assert_int_equal(a.cache_creation_input_tokens, 0);
    assert_int_equal(a.input_tokens, 20);
    /* Refused pins and directive (index >= 0) pins create nothing; clipped ones count what they hold. */
    u.cached_tokens = 0;
    u.directive_outcomes = "[{\"index\":-1,\"op\":\"pin\",\"outcome\":\"rejected\",\"reason\":\"budget\",\"tokens\":0},"
                           "{\"index\":0,\"op\":\"pin\",\"outcome\":\"accepted\",\"tokens\":64,\"ttl_s\":300},"
                           "{\"index\":-2,\"op\":\"pin\",\"outcome\":\"clipped\",\"tokens\":32,\"asked_tokens\":96,\"ttl_s\":300}]";
    a = anthropic_usage_from(&u);
    assert_int_equal(a.cache_creation_input_tokens, 32);
    assert_int_equal(a.ephemeral_5m_input_tokens, 32);
    assert_int_equal(a.input_tokens, 68);
    /* Garbage outcomes are ignored, never trusted. */
    u.directive_outcomes = "not json";
    a = anthropic_usage_from(&u);
    assert_int_equal(a.cache_creation_input_tokens, 0);
    assert_int_equal(a.input_tokens, 100);
}

static json_t *load(char *text) {
    assert_non_null(text);
    json_t *o = json_loads(text, 0, NULL);
    if (!o) fail_msg("not JSON: %s", text);
    free(text);
    return o;
}

static void test_message_json(void **state) {
    (void)state;
    json_t *calls = json_loads("[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]", 0, NULL);
    AnthropicUsage u = {.input_tokens = 3, .cache_read_input_tokens = 5, .cache_creation_input_tokens = 2, .ephemeral_1h_input_tokens = 2,
                        .output_tokens = 4};
    AnthropicAnswer a = {.id = "msg_1", .model = "m", .text = "hello", .len = 5, .tool_calls = calls, .stop_reason = "tool_use"};
    json_t *o = load(anthropic_message_json(&a, &u));
    assert_string_equal(json_string_value(json_object_get(o, "type")), "message");
    assert_string_equal(json_string_value(json_object_get(o, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(o, "stop_reason")), "tool_use");
    assert_true(json_is_null(json_object_get(o, "stop_sequence")));
    json_t *content = json_object_get(o, "content");
    assert_int_equal(json_array_size(content), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 0), "text")), "hello");
    json_t *tu = json_array_get(content, 1);
    assert_string_equal(json_string_value(json_object_get(tu, "type")), "tool_use");
    assert_string_equal(json_string_value(json_object_get(tu, "id")), "call_1");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(tu, "input"), "x")), 1);
    json_t *usage = json_object_get(o, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage, "input_tokens")), 3);
    assert_int_equal(json_integer_value(json_object_get(usage, "cache_read_input_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(usage, "cache_creation_input_tokens")), 2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(usage, "cache_creation"), "ephemeral_1h_input_tokens")), 2);
    assert_int_equal(json_integer_value(json_object_get(usage, "output_tokens")), 4);
    json_decref(o);
    /* Only calls: no text block. No calls and no text: one empty text block. A stop sequence. */
    a.text = NULL, a.len = 0;
    o = load(anthropic_message_json(&a, &u));
    assert_int_equal(json_array_size(json_object_get(o, "content")), 1);
    json_decref(o);
    a.tool_calls = NULL, a.stop_reason = "stop_sequence", a.stop_sequence = "END";
    o = load(anthropic_message_json(&a, &u));
    assert_int_equal(json_array_size(json_object_get(o, "content")), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(o, "content"), 0), "type")), "text");
    assert_string_equal(json_string_value(json_object_get(o, "stop_sequence")), "END");
    json_decref(o);
    json_decref(calls);
    o = load(anthropic_count_json(42));
    assert_int_equal(json_integer_value(json_object_get(o, "input_tokens")), 42);
    json_decref(o);
}

/* "event: T\ndata: {...}\n\n" with data.type == T; returns data. */
static json_t *event_data(char *ev, const char *type) {
    assert_non_null(ev);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "event: %s\ndata: ", type);
    if (strncmp(ev, prefix, strlen(prefix)) != 0) fail_msg("event %s does not start with %s", ev, prefix);
    size_t n = strlen(ev);
    assert_true(n > 2 && ev[n - 1] == '\n' && ev[n - 2] == '\n');
    json_t *o = json_loadb(ev + strlen(prefix), n - strlen(prefix) - 2, 0, NULL);
    if (!o) fail_msg("bad data in %s", ev);
    assert_string_equal(json_string_value(json_object_get(o, "type")), type);
    free(ev);
    return o;
}

static void test_events(void **state) {
    (void)state;
    json_t *o = event_data(anthropic_event_message_start("msg_1", "m", 12), "message_start");
    json_t *msg = json_object_get(o, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "id")), "msg_1");
    assert_int_equal(json_array_size(json_object_get(msg, "content")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(msg, "usage"), "input_tokens")), 12);
    assert_true(json_is_null(json_object_get(json_object_get(msg, "usage"), "cache_read_input_tokens")));
    json_decref(o);
    json_decref(event_data(anthropic_event_ping(), "ping"));
    o = event_data(anthropic_event_text_start(0), "content_block_start");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "content_block"), "type")), "text");
    json_decref(o);
    o = event_data(anthropic_event_text_delta(0, "h\"i", 3), "content_block_delta");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "delta"), "type")), "text_delta");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "delta"), "text")), "h\"i");
    json_decref(o);
    json_t *call = json_loads("{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}", 0, NULL);
    o = event_data(anthropic_event_tool_start(1, call), "content_block_start");
    assert_int_equal(json_integer_value(json_object_get(o, "index")), 1);
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "content_block"), "name")), "f");
    assert_int_equal(json_object_size(json_object_get(json_object_get(o, "content_block"), "input")), 0);
    json_decref(o);
    o = event_data(anthropic_event_input_json_delta(1, call), "content_block_delta");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "delta"), "type")), "input_json_delta");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "delta"), "partial_json")), "{\"x\":1}");
    json_decref(o);
    json_decref(call);
    json_decref(event_data(anthropic_event_block_stop(1), "content_block_stop"));
    AnthropicUsage u = {.input_tokens = 1, .cache_read_input_tokens = 11, .output_tokens = 5};
    o = event_data(anthropic_event_message_delta("end_turn", NULL, &u), "message_delta");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "delta"), "stop_reason")), "end_turn");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "usage"), "cache_read_input_tokens")), 11);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "usage"), "output_tokens")), 5);
    json_decref(o);
    json_decref(event_data(anthropic_event_message_stop(), "message_stop"));
    ApiError e;
    api_error_set(&e, 503, NULL, NULL, "instance died");
    o = event_data(anthropic_event_error(&e), "error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "type")), "overloaded_error");
    json_decref(o);
}

static void test_error_types(void **state) {
    (void)state;
    assert_string_equal(anthropic_error_type(400), "invalid_request_error");
    assert_string_equal(anthropic_error_type(401), "authentication_error");
    assert_string_equal(anthropic_error_type(403), "permission_error");
    assert_string_equal(anthropic_error_type(404), "not_found_error");
    assert_string_equal(anthropic_error_type(413), "request_too_large");
    assert_string_equal(anthropic_error_type(415), "invalid_request_error");
    assert_string_equal(anthropic_error_type(429), "rate_limit_error");
    assert_string_equal(anthropic_error_type(500), "api_error");
    assert_string_equal(anthropic_error_type(503), "overloaded_error");
    /* A message cut mid-character is still valid JSON. */
    ApiError e;
    api_error_set(&e, 400, NULL, NULL, "bad \xc3");
    char *text = anthropic_error_json(&e);
    json_t *o = json_loads(text, 0, NULL);
    assert_non_null(o);
    json_decref(o);
    free(text);
}

/* x-api-key: the bare key finds the same AuthKey the Bearer header does; blanks around it are
 * ignored; a wrong, empty or missing key finds none. */
static void test_x_api_key_lookup(void **state) {
    (void)state;
    const char *text = "sk-acme-0123456789abcdef tenant=acme\nsk-globex-0123456789abcdef tenant=globex\n";
    BraidError err;
    AuthKeys *keys = auth_keys_parse(text, strlen(text), "test", &err);
    assert_non_null(keys);
    const AuthKey *bearer = auth_keys_authenticate(keys, "Bearer sk-globex-0123456789abcdef");
    assert_non_null(bearer);
    assert_ptr_equal(auth_keys_lookup(keys, "sk-globex-0123456789abcdef"), bearer);
    assert_ptr_equal(auth_keys_lookup(keys, " sk-globex-0123456789abcdef\t"), bearer);
    assert_string_equal(auth_key_tenant(auth_keys_lookup(keys, "sk-acme-0123456789abcdef")), "acme");
    assert_null(auth_keys_lookup(keys, "sk-acme-0123456789abcdeF"));
    assert_null(auth_keys_lookup(keys, "sk-acme-0123456789abcde"));
    assert_null(auth_keys_lookup(keys, ""));
    assert_null(auth_keys_lookup(keys, NULL));
    assert_null(auth_keys_lookup(keys, "Bearer sk-acme-0123456789abcdef")); /* a bare key, not a header */
    auth_keys_free(keys);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_and_scalars), cmocka_unit_test(test_blocks_and_tools), cmocka_unit_test(test_cache_control),
        cmocka_unit_test(test_rejections),          cmocka_unit_test(test_count_tokens_body), cmocka_unit_test(test_usage_from_engine),
        cmocka_unit_test(test_message_json),        cmocka_unit_test(test_events),            cmocka_unit_test(test_error_types),
        cmocka_unit_test(test_x_api_key_lookup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
