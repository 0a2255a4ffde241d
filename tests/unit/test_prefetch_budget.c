/*
 * PBKV's S_bw from measurements (worker/prefetch_budget.h): the budget is the fixed default until
 * both a copy rate and a decode step time were observed, then bandwidth x step time / block bytes,
 * following the averages as they move (up with a faster copy or a longer step, down with a slower
 * copy), clamped to [1, PREFETCH_BUDGET_MAX_BLOCKS]; a fixed --prefetch-blocks overrides it and
 * non-positive samples are ignored.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "worker/prefetch_budget.h"

#define MB (1024.0 * 1024.0)

static void test_default_until_measured(void **state) {
    (void)state;
    PrefetchBudget b;
    prefetch_budget_init(&b, (size_t)MB, 0, 8);
    assert_int_equal(prefetch_budget_blocks(&b), 8);
    prefetch_budget_observe_copy(&b, 100 * MB, 0.01); /* 10 000 MB/s */
    assert_false(prefetch_budget_measured(&b));
    assert_int_equal(prefetch_budget_blocks(&b), 8); /* no step time yet */
    prefetch_budget_observe_step(&b, 0.002);          /* 2 ms: 20 MB, 20 blocks */
    assert_true(prefetch_budget_measured(&b));
    assert_int_equal(prefetch_budget_blocks(&b), 20);
    prefetch_budget_observe_copy(&b, 0, 1.0); /* ignored */
    prefetch_budget_observe_copy(&b, MB, 0.0);
    prefetch_budget_observe_step(&b, -1.0);
    assert_int_equal(prefetch_budget_blocks(&b), 20);
}

static void test_follows_measurements(void **state) {
    (void)state;
    PrefetchBudget b;
    prefetch_budget_init(&b, (size_t)MB, 0, 8);
    prefetch_budget_observe_copy(&b, 1000 * MB, 1.0); /* 1000 MB/s */
    prefetch_budget_observe_step(&b, 0.010);          /* 10 ms: 10 blocks */
    int before = prefetch_budget_blocks(&b);
    assert_int_equal(before, 10);
    /* Longer steps: the average climbs towards 40 ms, the budget with it. */
    int prev = before;
    for (int i = 0; i < 50; i++) {
        prefetch_budget_observe_step(&b, 0.040);
        int now = prefetch_budget_blocks(&b);
        assert_true(now >= prev);
        prev = now;
    }
    assert_in_range(prev, 38, 40);
    /* A slower copy (a tenth): the budget falls to about a tenth. */
    for (int i = 0; i < 80; i++) prefetch_budget_observe_copy(&b, 100 * MB, 1.0);
    assert_in_range(prefetch_budget_blocks(&b), 3, 4);
    /* One outlier moves the average by a tenth of its distance only. */
    prefetch_budget_observe_step(&b, 0.400);
    assert_in_range(prefetch_budget_blocks(&b), 7, 8);
}

static void test_clamps_and_fixed_override(void **state) {
    (void)state;
    PrefetchBudget b;
    prefetch_budget_init(&b, (size_t)MB, 0, 8);
    prefetch_budget_observe_copy(&b, MB, 1.0); /* 1 MB/s */
    prefetch_budget_observe_step(&b, 0.001);
    assert_int_equal(prefetch_budget_blocks(&b), 1); /* never below one block */
    prefetch_budget_init(&b, (size_t)MB, 0, 8);
    prefetch_budget_observe_copy(&b, 1e6 * MB, 1.0);
    prefetch_budget_observe_step(&b, 1.0);
    assert_int_equal(prefetch_budget_blocks(&b), PREFETCH_BUDGET_MAX_BLOCKS);
    /* --prefetch-blocks 5: the measurements are kept, the budget stays 5. */
    prefetch_budget_init(&b, (size_t)MB, 5, 8);
    prefetch_budget_observe_copy(&b, 1000 * MB, 1.0);
    prefetch_budget_observe_step(&b, 0.1);
    assert_false(prefetch_budget_measured(&b));
    assert_int_equal(prefetch_budget_blocks(&b), 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_until_measured),
        cmocka_unit_test(test_follows_measurements),
        cmocka_unit_test(test_clamps_and_fixed_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
