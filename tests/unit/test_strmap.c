/* String hash map: put/get, overwrite, growth, binary keys. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "common/strmap.h"

static void test_basic(void **state) {
    (void)state;
    StrMap *m = strmap_create(4);
    int32_t v;
    assert_int_equal(strmap_get(m, "a", 1, &v), 0);
    assert_int_equal(strmap_put(m, "a", 1, 1), 0);
    assert_int_equal(strmap_put(m, "ab", 2, 2), 0);
    assert_int_equal(strmap_put(m, "", 0, 3), 0);
    assert_int_equal(strmap_put(m, "a\0b", 3, 4), 0); /* embedded NUL: a different key from "a" */
    assert_int_equal(strmap_get(m, "a", 1, &v), 1); assert_int_equal(v, 1);
    assert_int_equal(strmap_get(m, "ab", 2, &v), 1); assert_int_equal(v, 2);
    assert_int_equal(strmap_get(m, "", 0, &v), 1); assert_int_equal(v, 3);
    assert_int_equal(strmap_get(m, "a\0b", 3, &v), 1); assert_int_equal(v, 4);
    assert_int_equal(strmap_put(m, "a", 1, 10), 0);
    assert_int_equal(strmap_get(m, "a", 1, &v), 1); assert_int_equal(v, 10);
    assert_int_equal(strmap_count(m), 4);
    assert_int_equal(strmap_get(m, "b", 1, &v), 0);
    strmap_destroy(m);
}

/* The key "<prefix><i>" is in m with value i. */
static void assert_numbered_key(const StrMap *m, const char *prefix, int i) {
    char key[32];
    int n = snprintf(key, sizeof key, "%s%d", prefix, i);
    int32_t v;
    assert_int_equal(strmap_get(m, key, (size_t)n, &v), 1);
    assert_int_equal(v, i);
}

static void test_growth(void **state) {
    (void)state;
    StrMap *m = strmap_create(1);
    char key[32];
    for (int i = 0; i < 100000; i++) {
        int n = snprintf(key, sizeof key, "key-%d", i);
        assert_int_equal(strmap_put(m, key, (size_t)n, i), 0);
    }
    assert_int_equal(strmap_count(m), 100000);
    for (int i = 0; i < 100000; i += 7) assert_numbered_key(m, "key-", i);
    int32_t v;
    assert_int_equal(strmap_get(m, "key-100000", 10, &v), 0);
    strmap_destroy(m);
}

/* Keys that come and go: every live key stays findable with its value, removed ones are gone, and
 * the arena stays bounded by the live keys (it is compacted), not by all keys ever put. */
static void test_remove_churn(void **state) {
    (void)state;
    StrMap *m = strmap_create(8);
    char key[32];
    enum { LIVE = 64, TOTAL = 200000 };
    for (int i = 0; i < TOTAL; i++) {
        int n = snprintf(key, sizeof key, "workflow-%d", i);
        assert_int_equal(strmap_put(m, key, (size_t)n, i), 0);
        if (i < LIVE) continue;
        n = snprintf(key, sizeof key, "workflow-%d", i - LIVE);
        assert_int_equal(strmap_remove(m, key, (size_t)n), 1);
        assert_int_equal(strmap_remove(m, key, (size_t)n), 0); /* already gone */
    }
    assert_int_equal(strmap_count(m), LIVE);
    for (int i = TOTAL - LIVE; i < TOTAL; i++) assert_numbered_key(m, "workflow-", i);
    int32_t v;
    assert_int_equal(strmap_get(m, "workflow-0", 10, &v), 0);
    assert_true(strmap_arena_bytes(m) < 64 * 1024); /* TOTAL keys would be ~2.6 MB */
    strmap_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_basic), cmocka_unit_test(test_growth), cmocka_unit_test(test_remove_churn)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
