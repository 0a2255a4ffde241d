#include "cache_op_asserts.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

void apply_ok(Backend *b, const CacheOp *ops, int n) {
    BraidError err;
    if (backend_apply_cache_ops(b, ops, n, &err)) fail_msg("%s", err.msg);
}

void apply_refused(Backend *b, const CacheOp *ops, int n, const char *expect) {
    BraidError err = {{0}};
    assert_int_equal(backend_apply_cache_ops(b, ops, n, &err), -1);
    fprintf(stderr, "refused as expected: %s\n", err.msg);
    if (!strstr(err.msg, expect)) fail_msg("message '%s' lacks '%s'", err.msg, expect);
}
