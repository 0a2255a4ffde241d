/* prompt_cache_key routing (cache_key_affinity.h) against a real Router, and the explicit-cache
 * registry (explicit_caches.h): tenancy, bounds, tombstones, expiry, and a request's content
 * starting from a cache. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "coord/cache_key_affinity.h"
#include "coord/explicit_caches.h"
#include "coord/router.h"

static void test_cache_key_routing(void **state) {
    (void)state;
    Router r;
    assert_int_equal(router_init(&r, 2, 8), 0);
    r.mode = ROUTER_CACHE_AWARE;
    CacheKeyAffinity a = {0};
    uint64_t h[12];
    for (int i = 0; i < 12; i++) h[i] = 0x1000u + (uint64_t)i;
    router_stored(&r, 1, h, 3); /* a short head on instance 1 */
    char *key = cache_key_affinity_scoped("t", "K"), *other = cache_key_affinity_scoped("t2", "K");
    assert_non_null(key);
    assert_string_not_equal(key, other);

    RouteDecision d = router_pick(&r, h, 12, NULL);
    assert_int_equal(d.instance, 1);
    cache_key_affinity_route(&a, &r, key, h, 12, &d); /* key unknown yet: nothing moves */
    assert_int_equal(d.instance, 1);
    cache_key_affinity_assigned(&a, key, 0);

    d = router_pick(&r, h, 12, NULL);
    cache_key_affinity_route(&a, &r, key, h, 12, &d);
    assert_int_equal(d.instance, 0);
    assert_string_equal(d.reason, "cache_key");
    assert_int_equal(d.source, 1); /* the short head can still be moved in */
    assert_int_equal(d.source_blocks, 3);

    d = router_pick(&r, h, 12, NULL);
    cache_key_affinity_route(&a, &r, other, h, 12, &d); /* another tenant's K: its own (unknown) key */
    assert_int_equal(d.instance, 1);
    cache_key_affinity_route(&a, &r, NULL, h, 12, &d);
    assert_int_equal(d.instance, 1);

    r.load[0] = 20; /* badly unbalanced: load wins */
    d = router_pick(&r, h, 12, NULL);
    cache_key_affinity_route(&a, &r, key, h, 12, &d);
    assert_int_equal(d.instance, 1);
    r.load[0] = 0;

    router_stored(&r, 1, h, 3 + CACHE_KEY_SHORT_OVERLAP_BLOCKS + 1); /* a long overlap: a real hit beats the hint */
    d = router_pick(&r, h, 12, NULL);
    cache_key_affinity_route(&a, &r, key, h, 12, &d);
    assert_int_equal(d.instance, 1);
    router_cleared(&r, 1);
    router_stored(&r, 1, h, 3);

    r.mode = ROUTER_ROUND_ROBIN; /* the baseline ignores keys as it ignores caches */
    d = (RouteDecision){.instance = 1, .source = -1};
    cache_key_affinity_route(&a, &r, key, h, 12, &d);
    assert_int_equal(d.instance, 1);
    r.mode = ROUTER_CACHE_AWARE;

    router_instance_down(&r, 0); /* the key's instance died */
    d = router_pick(&r, h, 12, NULL);
    cache_key_affinity_route(&a, &r, key, h, 12, &d);
    assert_int_equal(d.instance, 1);
    assert_int_equal(a.overridden, 1);

    free(key);
    free(other);
    cache_key_affinity_free(&a);
    router_free(&r);
}

static void test_explicit_cache_registry(void **state) {
    (void)state;
    ExplicitCaches *c = explicit_caches_create();
    assert_non_null(c);
    ApiError e;
    char id[EXPLICIT_CACHE_ID_BYTES], ids[EXPLICIT_CACHES_PER_TENANT][EXPLICIT_CACHE_ID_BYTES];
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "system", "content", "policy text");
    assert_int_equal(explicit_caches_reserve(c, "a", msgs, NULL, 60, 1000, id, &e), 0);
    json_t *m;
    char *p;
    assert_int_equal(explicit_caches_resolve(c, "a", id, 1000, &m, &p, &e), -1);
    assert_int_equal(e.status, 409); /* not prefilled yet */
    explicit_caches_commit(c, id, 42, "{\"op\":\"pin\",\"outcome\":\"accepted\"}", 1001);
    assert_int_equal(explicit_caches_resolve(c, "a", id, 1002, &m, &p, &e), 0);
    assert_true(json_equal(m, msgs));
    assert_null(p);
    json_decref(m);
    /* another tenant: exactly like a missing id */
    assert_int_equal(explicit_caches_resolve(c, "b", id, 1002, &m, &p, &e), -1);
    assert_int_equal(e.status, 404);
    assert_non_null(strstr(e.message, "no cache"));
    /* expiry: committed at 1001 with 60 s */
    assert_int_equal(explicit_caches_resolve(c, "a", id, 1061.5, &m, &p, &e), -1);
    assert_int_equal(e.status, 404);
    assert_non_null(strstr(e.message, "expired"));
    /* bound per tenant, delete, tombstone */
    for (int i = 0; i < EXPLICIT_CACHES_PER_TENANT; i++) {
        assert_int_equal(explicit_caches_reserve(c, "a", NULL, "p", 60, 2000, ids[i], &e), 0);
        explicit_caches_commit(c, ids[i], 1, NULL, 2000);
    }
    assert_int_equal(explicit_caches_reserve(c, "a", NULL, "p", 60, 2000, id, &e), -1);
    assert_int_equal(e.status, 429);
    assert_int_equal(explicit_caches_reserve(c, "b", NULL, "p", 60, 2000, id, &e), 0); /* other tenants unaffected */
    json_t *list = explicit_caches_list(c, "a", 2001);
    assert_int_equal(json_array_size(list), EXPLICIT_CACHES_PER_TENANT);
    json_decref(list);
    assert_int_equal(explicit_caches_delete(c, "a", ids[3], 2002, &e), 0);
    assert_int_equal(explicit_caches_delete(c, "a", ids[3], 2003, &e), -1);
    assert_int_equal(e.status, 404);
    assert_non_null(strstr(e.message, "was deleted"));
    assert_int_equal(explicit_caches_reserve(c, "a", NULL, "p", 60, 2004, id, &e), 0); /* room again */
    /* ttl change */
    assert_int_equal(explicit_caches_set_ttl(c, "a", ids[0], 600, 2005, &e), 0);
    ExplicitCacheInfo info;
    assert_int_equal(explicit_caches_get(c, "a", ids[0], 2006, "id", &info, &e), 0);
    assert_true(info.expires_at == 2605 && info.ttl_s == 600 && info.tokens == 1 && strcmp(info.prompt, "p") == 0);
    explicit_cache_info_free(&info);
    json_decref(msgs);
    explicit_caches_destroy(c);
}

/* A request naming cache_id: its messages become the cache's followed by its own. */
static void test_apply_prepends(void **state) {
    (void)state;
    ExplicitCaches *c = explicit_caches_create();
    ApiError e;
    char id[EXPLICIT_CACHE_ID_BYTES];
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "system", "content", "cached system text");
    assert_int_equal(explicit_caches_reserve(c, NULL, msgs, NULL, 60, 10, id, &e), 0);
    explicit_caches_commit(c, id, 5, NULL, 10);
    char body[256];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"cache_id\":\"%s\",\"max_tokens\":3}", id);
    ApiRequest a;
    assert_int_equal(api_request_parse(body, strlen(body), API_CHAT, NULL, &a, &e), 0);
    assert_string_equal(a.cache_id, id);
    assert_int_equal(explicit_caches_apply(c, &a, body, strlen(body), 11, &e), 0);
    assert_int_equal(a.n_messages, 2);
    assert_string_equal(a.messages[0].content, "cached system text");
    assert_string_equal(a.messages[1].content, "hi");
    assert_int_equal(a.max_tokens, 3);
    api_request_free(&a);
    assert_int_equal(api_request_parse(body, strlen(body), API_CHAT, NULL, &a, &e), 0);
    assert_int_equal(explicit_caches_apply(c, &a, body, strlen(body), 100, &e), -1); /* expired by now */
    assert_int_equal(e.status, 404);
    api_request_free(&a);
    json_decref(msgs);
    explicit_caches_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_key_routing),
        cmocka_unit_test(test_explicit_cache_registry),
        cmocka_unit_test(test_apply_prepends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
