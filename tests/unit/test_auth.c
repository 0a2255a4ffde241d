/* API keys (src/coord/auth.h): the key file's format and every refusal naming its line (never the
 * key), bearer lookup (case-insensitive scheme, exact key, no prefix or padding matches), tenants
 * and shared namespaces, and allowed adapters. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/auth.h"

#define KEY_A "sk-acme-0123456789abcdef"
#define KEY_B "sk-globex-0123456789abcdef"

static const char good_file[] =
    "# tenants of the test cluster\n"
    "\n"
    KEY_A " tenant=acme adapters=coder,tester shares=public   # trailing comment\r\n"
    "  \t" KEY_B "\ttenant=globex adapters=*\n"
    "sk-public-reader-000000 tenant=public";

static AuthKeys *parse(const char *text, BraidError *err) { return auth_keys_parse(text, strlen(text), "keys.txt", err); }

static void test_parse_and_lookup(void **state) {
    (void)state;
    BraidError err;
    AuthKeys *keys = parse(good_file, &err);
    if (!keys) fail_msg("good file refused: %s", err.msg);
    assert_int_equal(auth_keys_count(keys), 3);

    const AuthKey *a = auth_keys_authenticate(keys, "Bearer " KEY_A);
    assert_non_null(a);
    assert_string_equal(auth_key_tenant(a), "acme");
    assert_ptr_equal(auth_keys_authenticate(keys, "bearer   " KEY_A "  "), a); /* scheme is case-insensitive */
    const AuthKey *b = auth_keys_authenticate(keys, "Bearer " KEY_B);
    assert_non_null(b);
    assert_string_equal(auth_key_tenant(b), "globex");
    assert_string_equal(auth_key_tenant(auth_keys_authenticate(keys, "Bearer sk-public-reader-000000")), "public");

    /* Wrong, missing, truncated, extended, other schemes: no key. */
    const char *refused[] = {NULL, "", "Bearer", "Bearer ", KEY_A, "Basic " KEY_A, "Bearer " KEY_A "x", "Bearer sk-acme-0123456789abcde",
                             "Bearer SK-ACME-0123456789ABCDEF", "Bearer " KEY_A KEY_A KEY_A KEY_A KEY_A KEY_A};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (auth_keys_authenticate(keys, refused[i])) fail_msg("case %zu authenticated: %s", i, refused[i] ? refused[i] : "(null)");

    /* Tenants: its own and the ones it shares; adapters: the listed ones, or any with '*'. */
    assert_true(auth_key_allows_tenant(a, "acme"));
    assert_true(auth_key_allows_tenant(a, "public"));
    assert_false(auth_key_allows_tenant(a, "globex"));
    assert_false(auth_key_allows_tenant(b, "acme"));
    assert_true(auth_key_allows_adapter(a, "coder"));
    assert_true(auth_key_allows_adapter(a, "tester"));
    assert_false(auth_key_allows_adapter(a, "planner"));
    assert_false(auth_key_allows_adapter(a, "code"));
    assert_true(auth_key_allows_adapter(b, "anything"));
    assert_false(auth_key_allows_adapter(auth_keys_authenticate(keys, "Bearer sk-public-reader-000000"), "coder"));
    auth_keys_free(keys);
}

/* Each bad file is refused with a message naming the line and the problem, and never the key. */
static void test_refusals(void **state) {
    (void)state;
    struct {
        const char *text, *mention;
    } bad[] = {
        {"", "no keys"},
        {"# only a comment\n\n", "no keys"},
        {"short tenant=a\n", "line 1: the key is 5 characters"},
        {"# c\n" KEY_A "\n", "line 2: tenant= is missing"},
        {KEY_A " tenant=a tenant=b\n", "line 1: tenant= given twice"},
        {KEY_A " tenant=a tenat=b\n", "line 1: unknown field 'tenat'"},
        {KEY_A " tenant=a oops\n", "line 1: field 2 is not NAME=VALUE"},
        {KEY_A " tenant=\n", "line 1: a name in tenant= must be 1 to 256 bytes"},
        {KEY_A " tenant=a adapters=x,,y\n", "line 1: a name in adapters= must be 1 to 256 bytes"},
        {KEY_A " tenant=a adapters=x adapters=y\n", "adapters= given twice"},
        {KEY_A " tenant=a shares=\n", "a name in shares="},
        {"sk-acme-0123456789abcd\"f tenant=a\n", "line 1: the key's character 23 is not allowed"},
        {"sk-acme-0123456789=abcdef tenant=a\n", "the key's character 19 is not allowed"},
        {KEY_A " tenant=a\n" KEY_A " tenant=b\n", "line 2: the same key as line 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        BraidError err;
        memset(&err, 0, sizeof err);
        AuthKeys *keys = parse(bad[i].text, &err);
        if (keys) fail_msg("bad file %zu accepted", i);
        if (!strstr(err.msg, bad[i].mention)) fail_msg("bad file %zu: message '%s', expected '%s'", i, err.msg, bad[i].mention);
        if (strstr(err.msg, "0123456789")) fail_msg("bad file %zu: the message quotes the key: %s", i, err.msg);
    }
    /* A field that might be a piece of a key is not quoted. */
    BraidError quoted;
    assert_null(parse(KEY_A " tenant=a 0123456789ab+/==\n", &quoted));
    assert_non_null(strstr(quoted.msg, "line 1: field 2 has an unknown name"));
    assert_null(strstr(quoted.msg, "0123456789ab"));
    /* A padded key ending in '=' is fine; a NUL byte is not. */
    BraidError err;
    AuthKeys *keys = parse("c2stYWNtZS0wMTIzNDU2Nzg5== tenant=a\n", &err);
    assert_non_null(keys);
    assert_non_null(auth_keys_authenticate(keys, "Bearer c2stYWNtZS0wMTIzNDU2Nzg5=="));
    auth_keys_free(keys);
    static const char with_nul[] = KEY_A " tenant=a\0\n";
    assert_null(auth_keys_parse(with_nul, sizeof with_nul - 1, "keys.txt", &err));
    assert_non_null(strstr(err.msg, "line 1: holds a NUL byte"));
}

/* The text is read by length: bytes past it (a list going on, more '=') are not part of the file. */
static void test_reads_by_length(void **state) {
    (void)state;
    static const char text[] = KEY_A " tenant=acme adapters=coder,evil";
    BraidError err;
    AuthKeys *keys = auth_keys_parse(text, strlen(KEY_A " tenant=acme adapters=coder"), "keys.txt", &err);
    assert_non_null(keys);
    const AuthKey *k = auth_keys_authenticate(keys, "Bearer " KEY_A);
    assert_non_null(k);
    assert_true(auth_key_allows_adapter(k, "coder"));
    assert_false(auth_key_allows_adapter(k, "evil"));
    auth_keys_free(keys);
    static const char padded[] = "c2stYWNtZS0wMTIzNDU2Nzg5== tenant=a";
    keys = auth_keys_parse(padded, strlen("c2stYWNtZS0wMTIzNDU2Nzg5="), "keys.txt", &err); /* ends inside the key */
    assert_null(keys);
    assert_non_null(strstr(err.msg, "tenant= is missing"));
}

/* segment_reuse= is the tenant's opt-in; absent is -1, a bad value or a repeat is refused. */
static void test_segment_reuse_field(void **state) {
    (void)state;
    BraidError err;
    AuthKeys *keys = parse(KEY_A " tenant=acme segment_reuse=approx\n" KEY_B " tenant=beta\n", &err);
    if (!keys) fail_msg("refused: %s", err.msg);
    assert_int_equal(auth_key_segment_reuse(auth_keys_authenticate(keys, "Bearer " KEY_A)), 2);
    assert_int_equal(auth_key_segment_reuse(auth_keys_authenticate(keys, "Bearer " KEY_B)), -1);
    auth_keys_free(keys);
    assert_null(parse(KEY_A " tenant=acme segment_reuse=sometimes\n", &err));
    assert_non_null(strstr(err.msg, "segment_reuse= must be off, exact or approx"));
    assert_null(parse(KEY_A " tenant=acme segment_reuse=off segment_reuse=exact\n", &err));
    assert_non_null(strstr(err.msg, "given twice"));
}

/* auto_splice= is the tenant's default for requests without "auto_splice" (issue 36). */
static void test_auto_splice_field(void **state) {
    (void)state;
    BraidError err;
    AuthKeys *keys = parse(KEY_A " tenant=acme auto_splice=amortize\n" KEY_B " tenant=beta\n", &err);
    if (!keys) fail_msg("refused: %s", err.msg);
    assert_int_equal(auth_key_auto_splice(auth_keys_authenticate(keys, "Bearer " KEY_A)), 1);
    assert_int_equal(auth_key_auto_splice(auth_keys_authenticate(keys, "Bearer " KEY_B)), -1);
    auth_keys_free(keys);
    assert_null(parse(KEY_A " tenant=acme auto_splice=always\n", &err));
    assert_non_null(strstr(err.msg, "auto_splice= must be amortize, forget or off"));
    assert_null(parse(KEY_A " tenant=acme auto_splice=off auto_splice=forget\n", &err));
    assert_non_null(strstr(err.msg, "given twice"));
}

static void test_load_file(void **state) {
    (void)state;
    char path[] = "/tmp/braid_test_auth_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(good_file, f);
    fclose(f);
    BraidError err;
    AuthKeys *keys = auth_keys_load(path, &err);
    assert_non_null(keys);
    assert_int_equal(auth_keys_count(keys), 3);
    auth_keys_free(keys);
    remove(path);
    assert_null(auth_keys_load(path, &err));
    assert_non_null(strstr(err.msg, "cannot open"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_and_lookup),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_reads_by_length),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_segment_reuse_field),
        cmocka_unit_test(test_auto_splice_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
