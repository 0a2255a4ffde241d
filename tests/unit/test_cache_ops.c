/*
 * Cache operations on the CPU backend with the real model (backend_apply_cache_ops):
 * - a prompt's blocks stored to the host tier, overwritten on the device by another prompt, then
 *   loaded back into different device blocks decode the next token with bit-identical logits;
 * - COPY reproduces a block's bytes exactly (kv_pool_copy_block) and, on the backend, its logits;
 * - invalid lists (null block, ids out of range, no host tier, a ROTATE past the context length,
 *   unknown kinds) return -1 with a message and change nothing, even when valid operations come
 *   before the bad one (ROTATE itself: tests/unit/test_rotate.c).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "test_paths.h"
#include "worker/backend.h"
#include "cache_op_asserts.h"
#include "worker/kv_pool.h"
#include "worker/sampler.h"

#define BS 16
#define PROMPT 48 /* three full blocks: the decode at position 48 writes a fourth block */
#define DEV_BLOCKS 16
#define HOST_BLOCKS 8

static BraidModel model;
static int32_t prompt_p[PROMPT], prompt_q[PROMPT];

static int first_tokens(const char *text, int32_t *out) {
    TokenList list = {0};
    BraidError err;
    if (tokenizer_encode(&model.tokenizer, text, strlen(text), false, false, &list, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    int ok = list.n >= PROMPT;
    if (ok) memcpy(out, list.ids, PROMPT * sizeof *out);
    else fprintf(stderr, "prompt too short: %d tokens\n", list.n);
    free(list.ids);
    return ok ? 0 : -1;
}

static int setup(void **state) {
    (void)state;
    BraidError err;
    if (braid_model_load(test_model_path(), &model, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return first_tokens("You are the planner agent. Break the task into small steps and list them in order. Keep every "
                        "step short, number the steps, and never skip a step even when it looks obvious to you. When "
                        "a step fails, say which one and stop there instead of guessing what should come next.",
                        prompt_p) ||
                   first_tokens("The tester agent reports how many tests failed and why, in one line per failing test. "
                                "It never guesses at causes and it always names the file and the line of each failure. "
                                "Passing tests are counted but not listed, and flaky ones are marked as such.",
                                prompt_q)
               ? -1
               : 0;
}

static int teardown(void **state) {
    (void)state;
    braid_model_free(&model);
    return 0;
}

static void make_backend(Backend *b, int host_blocks) {
    BackendConfig cfg = backend_config_default(BACKEND_CPU, &model.weights.cfg, DEV_BLOCKS, BS, 64);
    cfg.host_blocks = host_blocks;
    BraidError err;
    if (backend_create(b, &model.weights, &cfg, &err)) fail_msg("%s", err.msg);
}

/* Prefills the prompt into blocks table[0..2]; returns its greedy next token. */
static int32_t prefill(Backend *b, const int32_t *ids, const int32_t *table) {
    int32_t pos[PROMPT], slots[PROMPT], start[] = {0, PROMPT}, ctx[] = {PROMPT}, row[] = {PROMPT - 1}, next;
    for (int t = 0; t < PROMPT; t++) pos[t] = t, slots[t] = table[t / BS] * BS + t % BS;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = PROMPT, .tokens = ids, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    ForwardOutput out = {.argmax = &next};
    BraidError err;
    if (backend_forward(b, &fb, &out, &err)) fail_msg("%s", err.msg);
    return next;
}

/* Decodes `token` at position PROMPT over table[0..3] (it writes slot 0 of table[3]); returns the
 * logits (caller frees). */
static float *decode(Backend *b, int32_t token, const int32_t *table) {
    int32_t pos[] = {PROMPT}, slots[] = {table[3] * BS}, start[] = {0, 1}, ctx[] = {PROMPT + 1}, row[] = {0}, next;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = 1, .tokens = &token, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    float *logits = malloc((size_t)model.weights.cfg.vocab_size * sizeof *logits);
    assert_non_null(logits);
    ForwardOutput out = {.argmax = &next, .logits = logits};
    BraidError err;
    if (backend_forward(b, &fb, &out, &err)) fail_msg("%s", err.msg);
    assert_int_equal(next, sampler_argmax(logits, model.weights.cfg.vocab_size));
    return logits;
}

static bool same_logits(const float *a, const float *b) {
    return memcmp(a, b, (size_t)model.weights.cfg.vocab_size * sizeof *a) == 0;
}

/* (a) + (c): store, overwrite, refuse bad lists without side effects, load into other blocks. */
static void test_store_load_round_trip(void **state) {
    (void)state;
    Backend b;
    make_backend(&b, HOST_BLOCKS);
    assert_true(b.host_kv_bytes == kv_pool_block_bytes(&model.weights.cfg, BS) * HOST_BLOCKS);
    const int32_t orig[] = {1, 2, 3, 4}, copied[] = {9, 10, 11, 12}, loaded[] = {5, 6, 7, 8};
    int32_t next = prefill(&b, prompt_p, orig);
    float *ref = decode(&b, next, orig);
    /* Store to host blocks in another order than the device's, then check COPY on the backend. */
    const CacheOp store[] = {{CACHE_OP_STORE, 1, 6, 0, 0, 0, 0}, {CACHE_OP_STORE, 2, 7, 0, 0, 0, 0}, {CACHE_OP_STORE, 3, 2, 0, 0, 0, 0}};
    apply_ok(&b, store, 3);
    const CacheOp copy[] = {{CACHE_OP_COPY, 1, 9, 0, 0, 0, 0}, {CACHE_OP_COPY, 2, 10, 0, 0, 0, 0}, {CACHE_OP_COPY, 3, 11, 0, 0, 0, 0}};
    apply_ok(&b, copy, 3);
    float *via_copy = decode(&b, next, copied);
    assert_true(same_logits(ref, via_copy));
    /* Another prompt overwrites the device blocks: the same decode now sees another context. */
    prefill(&b, prompt_q, orig);
    float *overwritten = decode(&b, next, orig);
    assert_false(same_logits(ref, overwritten));
    /* Bad lists, each after valid loads that would restore the context if they were applied. */
    CacheOp bad[4] = {{CACHE_OP_LOAD, 6, 1, 0, 0, 0, 0}, {CACHE_OP_LOAD, 7, 2, 0, 0, 0, 0}, {CACHE_OP_LOAD, 2, 3, 0, 0, 0, 0}, {0}};
    struct { CacheOp op; const char *expect; } cases[] = {
        {{CACHE_OP_LOAD, 0, 4, 0, 0, 0, 0}, "null block"},
        {{CACHE_OP_LOAD, 3, 0, 0, 0, 0, 0}, "null block"},
        {{CACHE_OP_LOAD, HOST_BLOCKS, 4, 0, 0, 0, 0}, "out of range"},
        {{CACHE_OP_STORE, 4, HOST_BLOCKS, 0, 0, 0, 0}, "out of range"},
        {{CACHE_OP_COPY, 4, DEV_BLOCKS, 0, 0, 0, 0}, "out of range"},
        {{CACHE_OP_COPY, -1, 4, 0, 0, 0, 0}, "out of range"},
        {{CACHE_OP_COPY, 4, 4, 0, 0, 0, 0}, "onto itself"},
        {{CACHE_OP_ROTATE, 4, 0, 1 << 20, 0, 0, 0}, "context length"},
        {{CACHE_OP_COPY_SLOTS, 4, 4, 0, 0, 0, 1}, "onto itself"},
        {{CACHE_OP_COPY_SLOTS, 4, 5, 0, 10, 0, BS - 9}, "does not fit"},
        {{CACHE_OP_COPY_SLOTS, 4, 5, 0, 0, 0, 0}, "does not fit"},
        {{CACHE_OP_COPY_SLOTS, 4, 5, 1 << 20, 0, 0, 1}, "context length"},
        {{17, 4, 5, 0, 0, 0, 0}, "unknown"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bad[3] = cases[i].op;
        apply_refused(&b, bad, 4, cases[i].expect);
    }
    apply_refused(&b, bad, -1, "invalid");
    float *after_refusals = decode(&b, next, orig);
    assert_true(same_logits(overwritten, after_refusals));
    /* An empty list is a no-op. */
    apply_ok(&b, NULL, 0);
    /* Load back into different device blocks: the decode over them matches the original. */
    const CacheOp load[] = {{CACHE_OP_LOAD, 6, 5, 0, 0, 0, 0}, {CACHE_OP_LOAD, 7, 6, 0, 0, 0, 0}, {CACHE_OP_LOAD, 2, 7, 0, 0, 0, 0}};
    apply_ok(&b, load, 3);
    float *via_load = decode(&b, next, loaded);
    assert_true(same_logits(ref, via_load));
    free(ref);
    free(via_copy);
    free(overwritten);
    free(after_refusals);
    free(via_load);
    backend_destroy(&b);
}

/* (c) without a host tier: STORE and LOAD are refused; a host tier of one block is refused. */
static void test_no_host_tier(void **state) {
    (void)state;
    Backend b;
    make_backend(&b, 0);
    assert_true(b.host_kv_bytes == 0);
    const CacheOp load[] = {{CACHE_OP_LOAD, 1, 2, 0, 0, 0, 0}}, store[] = {{CACHE_OP_STORE, 2, 1, 0, 0, 0, 0}}, copy[] = {{CACHE_OP_COPY, 2, 3, 0, 0, 0, 0}};
    apply_refused(&b, load, 1, "no host KV tier");
    apply_refused(&b, store, 1, "no host KV tier");
    apply_ok(&b, copy, 1);
    backend_destroy(&b);
    BackendConfig cfg = backend_config_default(BACKEND_CPU, &model.weights.cfg, DEV_BLOCKS, BS, 64);
    BraidError err = {{0}};
    cfg.host_blocks = 1;
    assert_int_equal(backend_create(&b, &model.weights, &cfg, &err), -1);
    assert_non_null(strstr(err.msg, "host KV tier"));
    cfg.host_blocks = -3;
    assert_int_equal(backend_create(&b, &model.weights, &cfg, &err), -1);
}

/* (b) kv_pool_copy_block moves exactly one block's K, V and positions, within or across pools. */
static void test_copy_block_bytes(void **state) {
    (void)state;
    const ModelConfig *c = &model.weights.cfg;
    KvPool dev, host;
    BraidError err;
    if (kv_pool_create(&dev, c, 6, 4, &err) || kv_pool_create(&host, c, 3, 4, &err)) fail_msg("%s", err.msg);
    size_t block_elems = (size_t)c->n_kv_heads * 4 * c->head_dim, layer_elems = 6 * block_elems;
    for (int l = 0; l < c->n_layers; l++)
        for (size_t i = 0; i < layer_elems; i++) {
            dev.k[l][i] = (uint16_t)(i * 7 + l);
            dev.v[l][i] = (uint16_t)(i * 13 + l + 1);
        }
    for (int i = 0; i < 6 * 4; i++) dev.slot_pos[i] = 100 + i;
    kv_pool_copy_block(&dev, 2, &host, 1);  /* store */
    kv_pool_copy_block(&host, 1, &dev, 5);  /* load elsewhere */
    kv_pool_copy_block(&dev, 3, &dev, 4);   /* copy within the pool */
    for (int l = 0; l < c->n_layers; l++) {
        assert_memory_equal(host.k[l] + block_elems, dev.k[l] + 2 * block_elems, block_elems * 2);
        assert_memory_equal(dev.v[l] + 5 * block_elems, dev.v[l] + 2 * block_elems, block_elems * 2);
        assert_memory_equal(dev.k[l] + 4 * block_elems, dev.k[l] + 3 * block_elems, block_elems * 2);
        /* Neighbours untouched: host blocks 0 and 2 are still zero. */
        for (size_t i = 0; i < block_elems; i++) assert_true(host.k[l][i] == 0 && host.v[l][2 * block_elems + i] == 0);
    }
    const int32_t block2[] = {108, 109, 110, 111}, block3[] = {112, 113, 114, 115};
    assert_memory_equal(dev.slot_pos + 5 * 4, block2, sizeof block2);
    assert_memory_equal(dev.slot_pos + 4 * 4, block3, sizeof block3);
    assert_memory_equal(host.slot_pos + 4, block2, sizeof block2);
    assert_int_equal(dev.slot_pos[3 * 4 - 1], 111);
    kv_pool_destroy(&dev);
    kv_pool_destroy(&host);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_block_bytes),
        cmocka_unit_test(test_no_host_tier),
        cmocka_unit_test(test_store_load_round_trip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
