/*
 * The coordinator's content-hash registry at scale (src/coord/block_index.h): 10^6 blocks held
 * within the memory bound with every lookup right; a bounded index evicting least recently stored
 * first and staying consistent; removals and re-stores under churn checked against a plain array.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "common/mix64.h"
#include "coord/block_index.h"

enum { MILLION = 1000000 };
/* The bound the header promises, with room: entries (16 bytes) + table (4 bytes per slot, at most
 * 4 slots per block after a rehash to twice the live count, rounded up to a power of two). */
#define BYTES_PER_BLOCK_BOUND 40

static void test_million_blocks(void **state) {
    (void)state;
    BlockIndex ix;
    block_index_init(&ix, 0);
    for (uint64_t i = 0; i < MILLION; i++) assert_int_equal(block_index_add(&ix, mix64(i)), 0);
    assert_int_equal(ix.count, MILLION);
    assert_int_equal(ix.evicted, 0);
    size_t bytes = block_index_bytes(&ix);
    print_message("10^6 blocks: %zu bytes, %.1f per block\n", bytes, (double)bytes / MILLION);
    assert_true(bytes <= (size_t)MILLION * BYTES_PER_BLOCK_BOUND);
    for (uint64_t i = 0; i < MILLION; i++) assert_true(block_index_has(&ix, mix64(i)));
    for (uint64_t i = MILLION; i < 2 * MILLION; i++) assert_false(block_index_has(&ix, mix64(i)));

    /* Prefix lookups: chains of 64 stored blocks, cut by one absent block at position k. */
    uint64_t chain[64];
    for (int k = 0; k <= 64; k += 8) {
        uint64_t base = (uint64_t)k * 1000;
        for (int j = 0; j < 64; j++) chain[j] = mix64(base + (uint64_t)j);
        if (k < 64) chain[k] = mix64(2 * MILLION + (uint64_t)k);
        assert_int_equal(block_index_prefix(&ix, chain, 64), k);
    }
    /* Removing half leaves exactly the other half; the memory does not grow. */
    for (uint64_t i = 0; i < MILLION; i += 2) block_index_remove(&ix, mix64(i));
    assert_int_equal(ix.count, MILLION / 2);
    for (uint64_t i = 0; i < MILLION; i++) assert_int_equal(block_index_has(&ix, mix64(i)), i % 2 == 1);
    for (uint64_t i = 0; i < MILLION; i += 2) assert_int_equal(block_index_add(&ix, mix64(i)), 0);
    assert_int_equal(ix.count, MILLION);
    assert_true(block_index_bytes(&ix) <= (size_t)MILLION * BYTES_PER_BLOCK_BOUND);
    block_index_free(&ix);
}

/* 10^6 blocks through an index bounded at 2^18: the last 2^18 stored are there, the rest evicted
 * and counted, and the memory stays within the bound for 2^18. */
static void test_bound_evicts_least_recently_stored(void **state) {
    (void)state;
    const size_t bound = (size_t)1 << 18;
    BlockIndex ix;
    block_index_init(&ix, bound);
    for (uint64_t i = 0; i < MILLION; i++) assert_int_equal(block_index_add(&ix, mix64(i)), 0);
    assert_int_equal(ix.count, bound);
    assert_int_equal(ix.evicted, MILLION - bound);
    assert_true(block_index_bytes(&ix) <= bound * BYTES_PER_BLOCK_BOUND);
    for (uint64_t i = 0; i < MILLION; i++) assert_int_equal(block_index_has(&ix, mix64(i)), i >= MILLION - bound);
    block_index_free(&ix);

    /* A re-stored block is the newest: the next eviction takes the one stored before it. Hash
     * values 0, 1 and all-ones are ordinary keys. */
    block_index_init(&ix, 4);
    const uint64_t keys[] = {0, 1, UINT64_MAX, 7};
    for (int i = 0; i < 4; i++) assert_int_equal(block_index_add(&ix, keys[i]), 0);
    assert_int_equal(block_index_add(&ix, 0), 0); /* refresh */
    assert_int_equal(block_index_add(&ix, 42), 0); /* evicts 1 */
    assert_true(block_index_has(&ix, 0) && block_index_has(&ix, UINT64_MAX) && block_index_has(&ix, 7) && block_index_has(&ix, 42));
    assert_false(block_index_has(&ix, 1));
    assert_int_equal(ix.evicted, 1);
    /* A removed block frees its place: the next add evicts nothing. */
    block_index_remove(&ix, 7);
    assert_int_equal(block_index_add(&ix, 43), 0);
    assert_int_equal(ix.evicted, 1);
    assert_int_equal(ix.count, 4);
    /* Clearing keeps the bound and the eviction count. */
    block_index_clear(&ix);
    assert_int_equal(ix.count, 0);
    assert_int_equal(ix.evicted, 1);
    assert_int_equal(ix.max_blocks, 4);
    assert_false(block_index_has(&ix, 0));
    block_index_free(&ix);
}

/* Random adds and removes over 2^17 keys (10^6 operations, tombstones and rehashes on the way),
 * checked against a plain presence array. */
static void test_churn_matches_reference(void **state) {
    (void)state;
    enum { KEYS = 1 << 17 };
    bool *present = calloc(KEYS, sizeof *present);
    assert_non_null(present);
    BlockIndex ix;
    block_index_init(&ix, 0);
    size_t live = 0;
    uint64_t rng = 12345;
    for (int op = 0; op < MILLION; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t k = (rng >> 33) % KEYS;
        if ((rng >> 20) & 1) {
            assert_int_equal(block_index_add(&ix, mix64(k)), 0);
            live += !present[k];
            present[k] = true;
        } else {
            block_index_remove(&ix, mix64(k));
            live -= present[k];
            present[k] = false;
        }
    }
    assert_int_equal(ix.count, live);
    for (uint64_t k = 0; k < KEYS; k++) assert_int_equal(block_index_has(&ix, mix64(k)), present[k]);
    assert_true(block_index_bytes(&ix) <= (live + 64) * BYTES_PER_BLOCK_BOUND * 2);
    block_index_free(&ix);
    free(present);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_million_blocks),
        cmocka_unit_test(test_bound_evicts_least_recently_stored),
        cmocka_unit_test(test_churn_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
