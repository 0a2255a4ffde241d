/* Issue 32's closing gaps, unit level:
 *  - a reloaded run-time adapter gets a cache namespace of its own (model/lora_adapter.h
 *    lora_cache_name: name + generation; lora_set_find resolves a cache name only to its own
 *    generation; lora_set_next_generation numbers the loads of a name);
 *  - an unload drops the adapter's namespaces at once (cache/kv_cache.h kv_cache_drop_adapter, run
 *    by worker/leader_lora.h on LORA_UNLOAD): pins end, unheld blocks are freed, other adapters and
 *    the base stay; LORA_LOAD's generation field reaches the leader's set;
 *  - the UNPIN hint (kv_cache_unpin; directive {"op": "unpin"}): pinned blocks become evictable;
 *  - the per-tenant prefill bucket of explicit caches (explicit_caches_take_prefill): a burst of
 *    EXPLICIT_CACHES_PER_TENANT, then 429 with a Retry-After, per tenant, refilled by time;
 *  - the roster of run-time adapters a restarted instance is sent again (coord/lora_roster.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/kv_cache.h"
#include "coord/api/api_directives.h"
#include "coord/explicit_caches.h"
#include "coord/lora_roster.h"
#include "model/lora_adapter.h"
#include "worker/leader_lora.h"

#define BS 4

static LoraAdapter fake_adapter(const char *n, unsigned generation) {
    LoraAdapter a = {.name = strdup(n), .rank = 2, .alpha = 2, .scale = 1, .n_layers = 1, .generation = generation};
    a.pairs = calloc(LORA_PROJ_COUNT, sizeof *a.pairs);
    a.pairs[0].a = calloc(4, sizeof(float));
    a.pairs[0].b = calloc(4, sizeof(float));
    return a;
}

static void test_generations(void **state) {
    (void)state;
    char cn[LORA_CACHE_NAME_MAX];
    assert_int_equal(lora_cache_name("sql", 1, cn, sizeof cn), 0);
    assert_string_equal(cn, "sql"); /* first loads hash as they always did */
    assert_int_equal(lora_cache_name("sql", 3, cn, sizeof cn), 0);
    assert_string_equal(cn, "sql\x1fg3");
    assert_true(lora_name_is(cn, "sql"));
    assert_true(lora_name_is("sql", "sql"));
    assert_false(lora_name_is(cn, "sq"));
    assert_false(lora_name_is("sqlx", "sql"));
    assert_int_equal(lora_cache_name("sql", 3, cn, 4), -1);

    LoraSet set = {0};
    BraidError err;
    assert_int_equal(lora_set_next_generation(&set, "sql"), 1);
    LoraAdapter a = fake_adapter("sql", 1);
    assert_int_equal(lora_set_install(&set, &a, NULL, &err), 0);
    assert_int_equal(lora_set_retire(&set, "sql"), 0);
    assert_int_equal(lora_set_next_generation(&set, "sql"), 2);
    LoraAdapter b = fake_adapter("sql", 2);
    assert_int_equal(lora_set_install(&set, &b, NULL, &err), 0); /* a retired name loads again */
    assert_int_equal(lora_set_find(&set, "sql"), 2);              /* the plain name: the live one */
    assert_int_equal(lora_set_find(&set, "sql\x1fg2"), 2);        /* its cache name */
    assert_int_equal(lora_set_find(&set, "sql\x1fg3"), -1);       /* another generation: never */
    assert_int_equal(lora_set_find(&set, "sql\x1fgx"), -1);       /* malformed */
    LoraAdapter dup = fake_adapter("sql", 3);
    assert_int_equal(lora_set_install(&set, &dup, NULL, &err), -1); /* still one live adapter per name */
    lora_adapter_free(&dup);
    assert_int_equal(lora_set_next_generation(&set, "sql"), 3);
    assert_int_equal(lora_set_next_generation(&set, "other"), 1);
    lora_set_free(&set);
}

/* ---- caches ---- */

static void init_cache(KvCache *c, int device_blocks) {
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = device_blocks};
    if (kv_cache_init(c, &cfg, &err)) fail_msg("%s", err.msg);
}

static CacheIdentity ident(KvCache *c, const char *tenant, const char *adapter) {
    CacheIdentity id;
    BraidError err;
    if (kv_cache_identity(c, tenant, adapter, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
    return id;
}

/* Computes and commits n_blocks blocks of tokens in id's namespace, then releases them (cached). */
static void serve(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_blocks) {
    BraidError err;
    KvCacheMatch m;
    int32_t table[64];
    assert_int_equal(kv_cache_match(c, id, tokens, n_blocks * BS + 1, &m, &err), 0);
    int got = kv_cache_acquire(c, &m, table, &err);
    assert_true(got >= 0);
    assert_int_equal(kv_cache_reserve(c, n_blocks - got, table + got), 0);
    RadixNode *lock = m.node;
    assert_int_equal(kv_cache_commit(c, id, tokens, n_blocks, table, &lock, false, &err), 0);
    kv_cache_release(c, lock, table, n_blocks);
    if (kv_cache_check(c, &err)) fail_msg("%s", err.msg);
}

static int cached_blocks(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens) {
    BraidError err;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, id, tokens, n_tokens, &m, &err), 0);
    kv_cache_release(c, m.node, NULL, 0); /* a match locks its path */
    return m.device_blocks + m.host_blocks;
}

static void test_drop_adapter(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, 64);
    int32_t t[16];
    for (int i = 0; i < 16; i++) t[i] = 100 + i;
    CacheIdentity old = ident(&c, "alice", "sql"), old_bob = ident(&c, "bob", "sql"), other = ident(&c, "alice", "coder"),
                  base = ident(&c, "alice", NULL), next = ident(&c, "alice", "sql\x1fg2");
    serve(&c, &old, t, 3);
    serve(&c, &old_bob, t, 2);
    serve(&c, &other, t, 3);
    serve(&c, &base, t, 3);
    KvHintOutcome out;
    BraidError err;
    assert_int_equal(kv_cache_pin(&c, &old, t, 3 * BS, 600, 100, &out, &err), 0);
    assert_int_equal(out.blocks, 3);
    assert_int_equal(kv_cache_pinned(&c), 3);
    int cached_before = kv_cache_cached(&c, CACHE_TIER_DEVICE);
    assert_int_equal(cached_blocks(&c, &next, t, 13), 0); /* a new generation never sees the old K/V */
    int kept = -1;
    assert_int_equal(kv_cache_drop_adapter(&c, "sql", &kept), 5); /* alice's 3 (pinned) + bob's 2 */
    assert_int_equal(kept, 0);
    if (kv_cache_check(&c, &err)) fail_msg("%s", err.msg);
    assert_int_equal(kv_cache_pinned(&c), 0); /* the pin went with the adapter */
    assert_int_equal(kv_cache_cached(&c, CACHE_TIER_DEVICE), cached_before - 5);
    assert_int_equal(cached_blocks(&c, &old, t, 13), 0);
    assert_int_equal(cached_blocks(&c, &old_bob, t, 13), 0);
    assert_int_equal(cached_blocks(&c, &other, t, 13), 3); /* other adapters and the base stay */
    assert_int_equal(cached_blocks(&c, &base, t, 13), 3);
    assert_int_equal(kv_cache_drop_adapter(&c, "never-seen", &kept), 0);
    assert_int_equal(kv_cache_drop_adapter(&c, NULL, &kept), 0); /* the base is never dropped */
    kv_cache_free(&c);
}

static void test_unpin(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, 16);
    int32_t t[16];
    for (int i = 0; i < 16; i++) t[i] = 7 + i;
    CacheIdentity id = ident(&c, "alice", NULL);
    serve(&c, &id, t, 3);
    KvHintOutcome out;
    BraidError err;
    assert_int_equal(kv_cache_pin(&c, &id, t, 3 * BS, 3600, 100, &out, &err), 0);
    assert_int_equal(kv_cache_pinned(&c), 3);
    assert_int_equal(kv_cache_pinned_by(&c, id.tenant), 3);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 16), 0); /* pinned: nothing evictable */
    assert_int_equal(cached_blocks(&c, &id, t, 13), 3);
    assert_int_equal(kv_cache_unpin(&c, &id, t, 3 * BS, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_ACCEPTED);
    assert_int_equal(out.blocks, 3);
    assert_int_equal(kv_cache_pinned(&c), 0);
    assert_int_equal(kv_cache_pinned_by(&c, id.tenant), 0); /* the budget comes back */
    assert_int_equal(kv_cache_unpin(&c, &id, t, 3 * BS, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_REJECTED); /* nothing pinned any more */
    /* Evictable now: the policy may take them. */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 3), 3);
    assert_int_equal(cached_blocks(&c, &id, t, 13), 0);
    kv_cache_free(&c);
}

static void test_unpin_directive_parses(void **state) {
    (void)state;
    ApiDirective *d;
    int n;
    ApiError e;
    json_t *v = json_loads("[{\"op\": \"unpin\"}, {\"op\": \"pin\", \"ttl\": \"1h\"}, {\"op\": \"unpin\", \"span\": [0, 32]}]", 0, NULL);
    assert_int_equal(api_directives_parse(v, &d, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(d[0].op, CACHE_HINT_UNPIN);
    assert_int_equal(d[1].op, CACHE_HINT_PIN);
    assert_int_equal(d[2].op, CACHE_HINT_UNPIN);
    assert_true(d[2].has_span);
    api_directives_free(d, n);
    json_decref(v);
    v = json_loads("[{\"op\": \"unpin\", \"ttl\": 5}]", 0, NULL);
    assert_int_equal(api_directives_parse(v, &d, &n, &e), -1); /* unpin takes no ttl */
    assert_int_equal(e.status, 400);
    json_decref(v);
    assert_string_equal(cache_hint_op_name(CACHE_HINT_UNPIN), "unpin");
}

/* ---- the leader's unload ---- */

static int no_busy(void *ctx, const char *n) {
    (void)ctx, (void)n;
    return 0;
}

static int apply(LeaderLoraCtx *ctx, bool unload, const char *n) {
    WireBuf msg = {0}, reply = {0};
    wire_put_str(&msg, n);
    leader_lora_apply(ctx, unload, msg.data, msg.len, no_busy, NULL, &reply);
    WireReader rd = wire_reader(reply.data, reply.len);
    int ok = wire_get_u8(&rd);
    wire_buf_free(&msg), wire_buf_free(&reply);
    return ok;
}

static void test_leader_unload_drops_cache(void **state) {
    (void)state;
    LoraSet set = {0};
    BraidError err;
    LoraAdapter a = fake_adapter("sql", 2); /* a reloaded adapter: its namespace is its cache name */
    assert_int_equal(lora_set_install(&set, &a, NULL, &err), 0);
    KvCache c, residual;
    init_cache(&c, 32);
    init_cache(&residual, 32);
    int32_t t[16];
    for (int i = 0; i < 16; i++) t[i] = 40 + i;
    CacheIdentity sep = ident(&c, "alice", "sql\x1fg2"), res = ident(&residual, "alice", "sql\x1fg2"), base = ident(&c, "alice", NULL);
    serve(&c, &sep, t, 2);
    serve(&c, &base, t, 2);
    serve(&residual, &res, t, 3);
    ModelConfig cfg = {0};
    LeaderLoraCtx ctx = {.set = &set, .base = &cfg, .tp_size = 1, .device = BACKEND_CPU, .cache = &c, .residual_tree = &residual};
    assert_int_equal(apply(&ctx, true, "sql"), 1);
    assert_int_equal(ctx.dropped_blocks, 5);
    assert_int_equal(cached_blocks(&c, &sep, t, 13), 0);
    assert_int_equal(cached_blocks(&residual, &res, t, 13), 0);
    assert_int_equal(cached_blocks(&c, &base, t, 13), 2);
    assert_int_equal(lora_set_find(&set, "sql"), -1);
    kv_cache_free(&c);
    kv_cache_free(&residual);
    lora_set_free(&set);
}

/* ---- explicit caches: the prefill bucket ---- */

static void test_cache_prefill_rate(void **state) {
    (void)state;
    ExplicitCaches *r = explicit_caches_create();
    assert_non_null(r);
    double retry = -1, now = 1000;
    ApiError e;
    for (int i = 0; i < 100; i++) assert_int_equal(explicit_caches_take_prefill(r, "alice", now, &retry, &e), 0); /* no limit by default */
    explicit_caches_set_create_rate(r, 0.5);
    for (int i = 0; i < EXPLICIT_CACHES_PER_TENANT; i++) assert_int_equal(explicit_caches_take_prefill(r, "bob", now, &retry, &e), 0);
    memset(&e, 0, sizeof e);
    assert_int_equal(explicit_caches_take_prefill(r, "bob", now, &retry, &e), -1);
    assert_int_equal(e.status, 429);
    assert_string_equal(e.code, "cache_rate_limited");
    assert_true(retry > 1.9 && retry <= 2.0); /* one token at 0.5/s */
    assert_int_equal(explicit_caches_take_prefill(r, "carol", now, &retry, &e), 0); /* other tenants unaffected */
    assert_int_equal(explicit_caches_take_prefill(r, "bob", now + 1, &retry, &e), -1);
    assert_true(retry > 0.9 && retry <= 1.0);
    assert_int_equal(explicit_caches_take_prefill(r, "bob", now + 2.01, &retry, &e), 0); /* refilled */
    assert_int_equal(explicit_caches_take_prefill(r, "bob", now + 2.02, &retry, &e), -1);
    /* Bounded memory: with every tracked bucket short, a new tenant waits too. */
    for (int i = 0; i < EXPLICIT_CACHES_RATE_TENANTS; i++) {
        char t[32];
        snprintf(t, sizeof t, "t%d", i);
        for (int k = 0; k < EXPLICIT_CACHES_PER_TENANT; k++) (void)explicit_caches_take_prefill(r, t, now + 3, &retry, &e);
    }
    assert_int_equal(explicit_caches_take_prefill(r, "newcomer", now + 3, &retry, &e), -1);
    assert_int_equal(explicit_caches_take_prefill(r, "newcomer", now + 3 + 2 * EXPLICIT_CACHES_PER_TENANT + 1, &retry, &e), 0);
    explicit_caches_destroy(r);
}

/* ---- explicit caches: the state file ---- */

static void test_cache_state_file(void **state) {
    (void)state;
    char dir[] = "/tmp/braid-gaps32-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char why[600], id[EXPLICIT_CACHE_ID_BYTES], id2[EXPLICIT_CACHE_ID_BYTES], path[700];
    snprintf(path, sizeof path, "%s/%s", dir, EXPLICIT_CACHES_STATE_FILE);
    double now = 2000;
    ApiError e;
    ExplicitCaches *r = explicit_caches_create();
    assert_int_equal(explicit_caches_open_state(r, dir, now, why, sizeof why), 0); /* no file yet: empty, and written */
    json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"the contract\"}]", 0, NULL);
    assert_int_equal(explicit_caches_reserve(r, "alice", msgs, NULL, 3600, now, id, &e), 0);
    explicit_caches_commit(r, id, 42, "{\"op\":\"pin\"}", now);
    assert_int_equal(explicit_caches_reserve(r, "bob", NULL, "short lived", 10, now, id2, &e), 0);
    explicit_caches_commit(r, id2, 7, NULL, now);
    assert_int_equal(explicit_caches_set_ttl(r, "alice", id, 7200, now + 1, &e), 0);
    explicit_caches_destroy(r); /* a coordinator restart */

    ExplicitCaches *r2 = explicit_caches_create();
    assert_int_equal(explicit_caches_open_state(r2, dir, now + 100, why, sizeof why), 0);
    assert_non_null(strstr(why, "1 cache(s) restored")); /* bob's expired meanwhile */
    ExplicitCacheInfo c;
    assert_int_equal(explicit_caches_get(r2, "alice", id, now + 100, "id", &c, &e), 0);
    assert_true(c.ready);
    assert_int_equal(c.tokens, 42);
    assert_true(c.expires_at > now + 7200);
    assert_true(json_equal(c.messages, msgs));
    assert_null(c.pin_outcome); /* the K/V is not there after a restart: no pin claimed */
    explicit_cache_info_free(&c);
    assert_int_equal(explicit_caches_get(r2, "bob", id2, now + 100, "id", &c, &e), -1);
    assert_int_equal(explicit_caches_get(r2, "mallory", id, now + 100, "id", &c, &e), -1); /* tenancy kept */
    assert_int_equal(explicit_caches_delete(r2, "alice", id, now + 101, &e), 0);
    explicit_caches_destroy(r2);

    ExplicitCaches *r3 = explicit_caches_create();
    assert_int_equal(explicit_caches_open_state(r3, dir, now + 102, why, sizeof why), 0);
    assert_int_equal(explicit_caches_get(r3, "alice", id, now + 102, "id", &c, &e), -1); /* the delete was persisted */
    explicit_caches_destroy(r3);

    FILE *f = fopen(path, "w"); /* a torn or foreign file: refused, the registry starts empty */
    fputs("{not json", f);
    fclose(f);
    ExplicitCaches *r4 = explicit_caches_create();
    assert_int_equal(explicit_caches_open_state(r4, dir, now, why, sizeof why), -1);
    assert_non_null(strstr(why, "starting empty"));
    explicit_caches_destroy(r4);
    json_decref(msgs);
    unlink(path);
    char tmp[720];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_equal(access(tmp, F_OK), -1); /* no temporary file left behind */
    rmdir(dir);
}

/* ---- the roster ---- */

static void test_roster(void **state) {
    (void)state;
    LoraRoster r = {0};
    assert_int_equal(lora_roster_put(&r, "a", "/a.gguf", 1), 0);
    assert_int_equal(lora_roster_put(&r, "b", "/b.gguf", 1), 0);
    assert_int_equal(lora_roster_put(&r, "a", "/a2.gguf", 2), 0); /* replaced, moved last (load order) */
    assert_int_equal(r.n, 2);
    assert_string_equal(r.entries[0].name, "b");
    assert_string_equal(r.entries[1].path, "/a2.gguf");
    assert_int_equal(r.entries[1].generation, 2);
    lora_roster_take(&r, "b");
    lora_roster_take(&r, "zzz");
    assert_int_equal(r.n, 1);
    assert_string_equal(r.entries[0].name, "a");
    lora_roster_free(&r);
    assert_int_equal(r.n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generations),       cmocka_unit_test(test_drop_adapter),
        cmocka_unit_test(test_unpin),             cmocka_unit_test(test_unpin_directive_parses),
        cmocka_unit_test(test_leader_unload_drops_cache), cmocka_unit_test(test_cache_prefill_rate),
        cmocka_unit_test(test_cache_state_file),  cmocka_unit_test(test_roster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
