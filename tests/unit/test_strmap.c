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

static void test_growth(void **state) {
    (void)state;
    StrMap *m = strmap_create(1);
    char key[32];
    for (int i = 0; i < 100000; i++) {
        int n = snprintf(key, sizeof key, "key-%d", i);
        assert_int_equal(strmap_put(m, key, (size_t)n, i), 0);
    }
    assert_int_equal(strmap_count(m), 100000);
    for (int i = 0; i < 100000; i += 7) {
        int n = snprintf(key, sizeof key, "key-%d", i);
        int32_t v;
        assert_int_equal(strmap_get(m, key, (size_t)n, &v), 1);
        assert_int_equal(v, i);
    }
    int32_t v;
    assert_int_equal(strmap_get(m, "key-100000", 10, &v), 0);
    strmap_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_basic), cmocka_unit_test(test_growth)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
