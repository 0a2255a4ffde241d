/* Adapters at run time (issue 32, item 4): the endpoints' body parser (coord/http/http_lora.h), the key
 * file's `admin` word (coord/auth.h) and who may call (http_lora_check_caller: admin key, or no keys
 * and --allow-runtime-lora), the adapter set's install / retire (model/lora_adapter.h: ids
 * never reused, a retired name unreachable and not reloadable) and the leader's LORA_LOAD /
 * LORA_UNLOAD handling (worker/leader_lora.h: unknown name, busy adapter, --tp > 1, CUDA, a missing
 * file, a malformed message all answered ok = 0 with the reason). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/auth.h"
#include "coord/http/http_lora.h"
#include "worker/leader_lora.h"

static char name[HTTP_LORA_MAX_NAME + 1], path[HTTP_LORA_MAX_PATH + 1];

static int parse(const char *body, bool unload, ApiError *e) { return http_lora_parse(body, strlen(body), unload, name, path, e); }

static void test_parse_accepts_vllm_bodies(void **state) {
    (void)state;
    ApiError e;
    assert_int_equal(parse("{\"lora_name\": \"sql\", \"lora_path\": \"/a/sql.gguf\"}", false, &e), 0);
    assert_string_equal(name, "sql");
    assert_string_equal(path, "/a/sql.gguf");
    assert_int_equal(parse("{\"lora_name\": \"sql\"}", true, &e), 0);
    assert_string_equal(name, "sql");
    /* vLLM clients may send more fields (load_inplace, ...): ignored */
    assert_int_equal(parse("{\"lora_name\": \"x\", \"lora_path\": \"p\", \"load_inplace\": false}", false, &e), 0);
}

static void test_parse_refuses_bad_bodies(void **state) {
    (void)state;
    ApiError e;
    const char *bad_load[] = {"", "nope", "[]", "{}", "{\"lora_name\": \"x\"}", "{\"lora_path\": \"p\"}", "{\"lora_name\": 3, \"lora_path\": \"p\"}",
                              "{\"lora_name\": \"\", \"lora_path\": \"p\"}", "{\"lora_name\": \"x\", \"lora_path\": \"\"}",
                              "{\"lora_name\": \"a\\nb\", \"lora_path\": \"p\"}", "{\"lora_name\": \"x\", \"lora_name\": \"y\", \"lora_path\": \"p\"}"};
    for (size_t i = 0; i < sizeof bad_load / sizeof *bad_load; i++) {
        memset(&e, 0, sizeof e);
        assert_int_equal(parse(bad_load[i], false, &e), -1);
        assert_int_equal(e.status, 400);
    }
    assert_int_equal(parse("{\"lora_path\": \"p\"}", true, &e), -1);
    assert_non_null(strstr(e.message, "lora_name"));
    char longname[400];
    memset(longname, 'a', 300);
    longname[300] = '\0';
    char body[600];
    snprintf(body, sizeof body, "{\"lora_name\": \"%s\"}", longname);
    assert_int_equal(parse(body, true, &e), -1);
    assert_non_null(strstr(e.message, "longer than"));
}

static void test_auth_admin_word(void **state) {
    (void)state;
    const char text[] = "sk-admin-0123456789abcdef tenant=ops admin\nsk-user-0123456789abcdef tenant=alice adapters=*\n";
    BraidError err;
    AuthKeys *keys = auth_keys_parse(text, strlen(text), "t", &err);
    assert_non_null(keys);
    assert_true(auth_key_admin(auth_keys_lookup(keys, "sk-admin-0123456789abcdef")));
    assert_false(auth_key_admin(auth_keys_lookup(keys, "sk-user-0123456789abcdef")));
    assert_false(auth_key_admin(NULL));
    auth_keys_free(keys);
    ApiError e;
    keys = auth_keys_parse(text, strlen(text), "t", &err);
    assert_int_equal(http_lora_check_caller(keys, auth_keys_lookup(keys, "sk-admin-0123456789abcdef"), false, &e), 0);
    assert_int_equal(http_lora_check_caller(keys, auth_keys_lookup(keys, "sk-user-0123456789abcdef"), true, &e), -1);
    assert_int_equal(e.status, 403);
    assert_non_null(strstr(e.message, "admin"));
    assert_int_equal(http_lora_check_caller(NULL, NULL, false, &e), -1); /* an open server: off by default */
    assert_int_equal(e.status, 403);
    assert_non_null(strstr(e.message, "--allow-runtime-lora"));
    assert_int_equal(http_lora_check_caller(NULL, NULL, true, &e), 0);
    auth_keys_free(keys);
    const char twice[] = "sk-admin-0123456789abcdef tenant=ops admin admin\n";
    assert_null(auth_keys_parse(twice, strlen(twice), "t", &err));
    assert_non_null(strstr(err.msg, "admin given twice"));
    const char other_word[] = "sk-admin-0123456789abcdef tenant=ops administrator\n";
    assert_null(auth_keys_parse(other_word, strlen(other_word), "t", &err));
}

/* A hand-made adapter of one layer, rank 2, with its Q pair set. */
static LoraAdapter fake_adapter(const char *n) {
    LoraAdapter a = {.name = strdup(n), .rank = 2, .alpha = 2, .scale = 1, .n_layers = 1};
    a.pairs = calloc(LORA_PROJ_COUNT, sizeof *a.pairs);
    a.pairs[0].a = calloc(4, sizeof(float));
    a.pairs[0].b = calloc(4, sizeof(float));
    return a;
}

static void test_set_install_retire(void **state) {
    (void)state;
    LoraSet set = {0};
    BraidError err;
    LoraAdapter a = fake_adapter("a"), b = fake_adapter("b"), a2 = fake_adapter("a");
    int id;
    assert_int_equal(lora_set_install(&set, &a, &id, &err), 0);
    assert_int_equal(id, 1);
    assert_null(a.name); /* taken over */
    assert_int_equal(lora_set_install(&set, &b, &id, &err), 0);
    assert_int_equal(id, 2);
    assert_int_equal(lora_set_install(&set, &a2, &id, &err), -1); /* a live name */
    assert_non_null(strstr(err.msg, "already loaded"));
    lora_adapter_free(&a2);
    assert_int_equal(lora_set_find(&set, "a"), 1);
    assert_int_equal(lora_set_retire(&set, "a"), 0);
    assert_int_equal(lora_set_find(&set, "a"), -1);
    assert_null(lora_set_get(&set, 1));
    assert_non_null(lora_set_get(&set, 2));
    assert_true(lora_set_was_retired(&set, "a"));
    assert_false(lora_set_was_retired(&set, "b"));
    assert_int_equal(lora_set_retire(&set, "a"), -1);
    assert_int_equal(lora_set_max_rank(&set), 2);
    LoraAdapter c = fake_adapter("c");
    assert_int_equal(lora_set_install(&set, &c, &id, &err), 0);
    assert_int_equal(id, 3); /* ids are never reused */
    lora_set_free(&set);
}

static int busy_count;
static int busy(void *ctx, const char *n) {
    (void)ctx, (void)n;
    return busy_count;
}

/* Runs one message through leader_lora_apply; returns the reply's ok and copies its error. */
static int apply(LeaderLoraCtx *ctx, bool unload, const char *n, const char *p, char *why, size_t cap) {
    WireBuf msg = {0}, reply = {0};
    if (n) wire_put_str(&msg, n);
    if (p) wire_put_str(&msg, p);
    leader_lora_apply(ctx, unload, msg.data, msg.len, busy, NULL, &reply);
    WireReader rd = wire_reader(reply.data, reply.len);
    int ok = wire_get_u8(&rd);
    char *rname = wire_get_str(&rd), *rwhy = wire_get_str(&rd);
    assert_false(rd.failed);
    snprintf(why, cap, "%s", rwhy);
    free(rname), free(rwhy);
    wire_buf_free(&msg), wire_buf_free(&reply);
    return ok;
}

static void test_leader_apply(void **state) {
    (void)state;
    LoraSet set = {0};
    BraidError err;
    LoraAdapter a = fake_adapter("a");
    assert_int_equal(lora_set_install(&set, &a, NULL, &err), 0);
    ModelConfig base = {0};
    LeaderLoraCtx ctx = {.set = &set, .base = &base, .tp_size = 1, .device = BACKEND_CPU};
    char why[512];
    assert_int_equal(apply(&ctx, true, "zzz", NULL, why, sizeof why), 0);
    assert_non_null(strstr(why, "not loaded"));
    busy_count = 2;
    assert_int_equal(apply(&ctx, true, "a", NULL, why, sizeof why), 0);
    assert_non_null(strstr(why, "in flight"));
    assert_int_equal(lora_set_find(&set, "a"), 1);
    busy_count = 0;
    assert_int_equal(apply(&ctx, true, "a", NULL, why, sizeof why), 1);
    assert_int_equal(lora_set_find(&set, "a"), -1);
    assert_int_equal(apply(&ctx, false, "b", "/nonexistent/b.gguf", why, sizeof why), 0);
    assert_non_null(strstr(why, "b.gguf"));
    assert_int_equal(apply(&ctx, false, "b", NULL, why, sizeof why), 0); /* no path */
    assert_non_null(strstr(why, "malformed"));
    ctx.tp_size = 2;
    assert_int_equal(apply(&ctx, false, "b", "/x.gguf", why, sizeof why), 0);
    assert_non_null(strstr(why, "tensor parallelism"));
    ctx.tp_size = 1, ctx.device = BACKEND_CUDA;
    assert_int_equal(apply(&ctx, false, "b", "/x.gguf", why, sizeof why), 0);
    assert_non_null(strstr(why, "CPU backend"));
    assert_int_equal(lora_set_find(&set, "b"), -1);
    lora_set_free(&set);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_accepts_vllm_bodies), cmocka_unit_test(test_parse_refuses_bad_bodies),
        cmocka_unit_test(test_auth_admin_word),           cmocka_unit_test(test_set_install_retire),
        cmocka_unit_test(test_leader_apply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
