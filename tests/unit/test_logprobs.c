/* Logprobs end to end in pieces (issue 22, point 3): the sampler's log-softmax and top alternatives
 * on known logits, their trip through a TOKENS message (and the decoder's refusals), and the OpenAI
 * objects rendered with the real tokenizer, whole and incrementally up to a text limit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coord/api/api_logprobs.h"
#include "model/gguf.h"
#include "test_paths.h"
#include "transport/control_msg.h"
#include "worker/sampler.h"

static void test_sampler_logprobs(void **state) {
    (void)state;
    float logits[5] = {1.0f, 3.0f, 2.0f, 3.0f, -INFINITY};
    double z = log(exp(1.0) + 2 * exp(3.0) + exp(2.0));
    TokenLogprob lp;
    sampler_logprobs(logits, 5, 2, 3, &lp);
    assert_true(fabs(lp.logprob - (2.0 - z)) < 1e-5);
    assert_int_equal(lp.n_top, 3);
    /* Most likely first, lowest id first on the tie between 1 and 3. */
    assert_int_equal(lp.top_ids[0], 1);
    assert_int_equal(lp.top_ids[1], 3);
    assert_int_equal(lp.top_ids[2], 2);
    assert_true(fabs(lp.top_logprobs[0] - (3.0 - z)) < 1e-5 && fabs(lp.top_logprobs[2] - lp.logprob) < 1e-6);
    /* A token the model rules out has probability 0; counts clamp to the vocabulary and the limit. */
    sampler_logprobs(logits, 5, 4, 99, &lp);
    assert_true(isinf(lp.logprob) && lp.logprob < 0);
    assert_int_equal(lp.n_top, 5);
    sampler_logprobs(logits, 5, 0, 0, &lp);
    assert_int_equal(lp.n_top, 0);
    /* The probabilities of the whole vocabulary sum to 1. */
    double total = 0;
    for (int i = 0; i < 5; i++) {
        sampler_logprobs(logits, 5, i, 0, &lp);
        total += exp(lp.logprob);
    }
    assert_true(fabs(total - 1.0) < 1e-5);
}

static void test_tokens_message_logprobs(void **state) {
    (void)state;
    uint64_t ids[3] = {7, 8, 7};
    int32_t toks[3] = {100, 200, 300};
    uint8_t has[3] = {1, 0, 1};
    TokenLogprob lps[3] = {{.logprob = -0.5f, .n_top = 2, .top_ids = {100, 5}, .top_logprobs = {-0.5f, -1.5f}}, {.logprob = 0},
                           {.logprob = -2.0f, .n_top = 0}};
    WireBuf b = {0};
    msg_tokens_encode(&b, &(MsgTokens){.n = 3, .req_ids = ids, .tokens = toks, .has_logprob = has, .logprobs = lps});
    MsgTokens t;
    WireReader r = wire_reader(b.data, b.len);
    assert_int_equal(msg_tokens_decode(&r, &t), 0);
    assert_int_equal(t.n, 3);
    assert_true(t.has_logprob[0] && !t.has_logprob[1] && t.has_logprob[2]);
    assert_true(t.logprobs[0].logprob == -0.5f && t.logprobs[0].n_top == 2 && t.logprobs[0].top_ids[1] == 5 &&
                t.logprobs[0].top_logprobs[1] == -1.5f);
    assert_true(t.logprobs[2].logprob == -2.0f && t.logprobs[2].n_top == 0);
    msg_tokens_free(&t);
    /* Truncated anywhere: refused. */
    for (size_t cut = 0; cut < b.len; cut++) {
        r = wire_reader(b.data, cut);
        assert_int_equal(msg_tokens_decode(&r, &t), -1);
    }
    wire_buf_free(&b);
    /* More alternatives than the limit (written by hand: the encoder clamps): refused. */
    WireBuf big = {0};
    wire_put_i32(&big, 1);
    wire_put_u64(&big, 7);
    wire_put_i32(&big, 100);
    wire_put_u8(&big, 1);
    wire_put_f32(&big, -0.5f);
    wire_put_i32(&big, TOKEN_LOGPROB_MAX_TOP + 1);
    for (int k = 0; k < TOKEN_LOGPROB_MAX_TOP + 1; k++) wire_put_i32(&big, k);
    for (int k = 0; k < TOKEN_LOGPROB_MAX_TOP + 1; k++) wire_put_f32(&big, -1.0f);
    r = wire_reader(big.data, big.len);
    assert_int_equal(msg_tokens_decode(&r, &t), -1);
    wire_buf_free(&big);
    /* ... while the same bytes with the limit itself decode. */
    WireBuf edge = {0};
    lps[0].n_top = TOKEN_LOGPROB_MAX_TOP + 5; /* the encoder clamps to the limit */
    msg_tokens_encode(&edge, &(MsgTokens){.n = 1, .req_ids = ids, .tokens = toks, .has_logprob = has, .logprobs = lps});
    r = wire_reader(edge.data, edge.len);
    assert_int_equal(msg_tokens_decode(&r, &t), 0);
    assert_int_equal(t.logprobs[0].n_top, TOKEN_LOGPROB_MAX_TOP);
    msg_tokens_free(&t);
    wire_buf_free(&edge);
    /* SUBMIT carries the request for them. */
    int32_t prompt[2] = {1, 2};
    WireBuf sb = {0};
    msg_submit_encode(&sb, &(MsgSubmit){.req_id = 1, .tokens = prompt, .n_tokens = 2, .want_logprobs = 1, .logprobs_top = 4});
    MsgSubmit s;
    r = wire_reader(sb.data, sb.len);
    assert_int_equal(msg_submit_decode(&r, &s), 0);
    assert_true(s.want_logprobs == 1 && s.logprobs_top == 4);
    msg_submit_free(&s);
    wire_buf_free(&sb);
}

/* Renders with the real tokenizer: "Hello world" as its tokens. */
static void test_render(void **state) {
    (void)state;
    GgufFile *f;
    Tokenizer tok;
    BraidError err;
    if (gguf_open(test_model_path(), &f, &err) || tokenizer_load(f, &tok, &err)) fail_msg("%s", err.msg);
    TokenList ids = {0};
    const char *text = "Hello world again";
    if (tokenizer_encode(&tok, text, strlen(text), false, false, &ids, &err)) fail_msg("%s", err.msg);
    assert_int_equal(ids.n, 3);
    TokenLogprob lps[3];
    for (int i = 0; i < 3; i++)
        lps[i] = (TokenLogprob){.logprob = -0.25f * (float)(i + 1), .n_top = 1, .top_ids = {ids.ids[i]}, .top_logprobs = {-0.1f}};

    /* Chat, whole: every token, its bytes and its alternative. */
    LogprobCursor cur = {0};
    json_t *chat = api_logprobs_render(API_CHAT, &tok, ids.ids, lps, 3, SIZE_MAX, &cur);
    json_t *content = json_object_get(chat, "content");
    assert_int_equal(json_array_size(content), 3);
    json_t *second = json_array_get(content, 1);
    assert_string_equal(json_string_value(json_object_get(second, "token")), " world");
    assert_true(fabs(json_real_value(json_object_get(second, "logprob")) + 0.5) < 1e-6);
    assert_int_equal(json_array_size(json_object_get(second, "bytes")), 6);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(second, "bytes"), 0)), ' ');
    assert_int_equal(json_array_size(json_object_get(second, "top_logprobs")), 1);
    json_decref(chat);

    /* Completions, incrementally: the text sent so far decides which tokens are reported. */
    cur = (LogprobCursor){0};
    json_t *part = api_logprobs_render(API_COMPLETION, &tok, ids.ids, lps, 3, 5, &cur); /* "Hello" sent */
    assert_int_equal(json_array_size(json_object_get(part, "tokens")), 1);
    assert_true(api_logprobs_pending(3, 7, &cur));
    json_decref(part);
    part = api_logprobs_render(API_COMPLETION, &tok, ids.ids, lps, 3, 7, &cur); /* " w" started the second */
    json_t *tokens = json_object_get(part, "tokens");
    assert_int_equal(json_array_size(tokens), 1);
    assert_string_equal(json_string_value(json_array_get(tokens, 0)), " world");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(part, "text_offset"), 0)), 5);
    json_t *top = json_array_get(json_object_get(part, "top_logprobs"), 0);
    assert_true(fabs(json_real_value(json_object_get(top, " world")) + 0.1) < 1e-6);
    assert_false(api_logprobs_pending(3, 11, &cur)); /* a stop string cut the text at 11: " again" is never reported */
    json_decref(part);
    free(ids.ids);
    tokenizer_free(&tok);
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_logprobs),
        cmocka_unit_test(test_tokens_message_logprobs),
        cmocka_unit_test(test_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
