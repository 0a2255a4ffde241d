/* cache_op_asserts.h — cmocka assertions on backend_apply_cache_ops, shared by the cache-op tests. */
#ifndef BRAID_TEST_CACHE_OP_ASSERTS_H
#define BRAID_TEST_CACHE_OP_ASSERTS_H

#include "worker/backend.h"

/* The list is applied, or the test fails with the backend's message. */
void apply_ok(Backend *b, const CacheOp *ops, int n);
/* The list is refused with a message containing `expect` (printed, so logs show the wording). */
void apply_refused(Backend *b, const CacheOp *ops, int n, const char *expect);

#endif
