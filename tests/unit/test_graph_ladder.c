/*
 * CUDA-graph ladder and decode split choice (pure logic, no GPU): every batch size up to the
 * limit maps to the smallest ladder size that holds it, padding stays small, and decode splits
 * cover the GPU without exceeding one part per 64 context slots or the kernel's maximum.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "worker/graph_ladder.h"

static void test_ladder_covers_every_batch(void **state) {
    (void)state;
    int limits[] = {1, 7, 64, 100, 256, 1000};
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        GraphLadder g;
        graph_ladder_build(&g, limits[k]);
        assert_true(g.n >= 1 && g.n <= GRAPH_LADDER_MAX);
        assert_int_equal(g.sizes[g.n - 1], limits[k]);
        for (int i = 1; i < g.n; i++) assert_true(g.sizes[i] > g.sizes[i - 1]);
        for (int b = 1; b <= limits[k]; b++) {
            int idx = graph_ladder_pick(&g, b);
            assert_true(idx >= 0);
            assert_true(g.sizes[idx] >= b);
            assert_true(idx == 0 || g.sizes[idx - 1] < b);           /* the smallest that fits */
            if (b >= 8 && limits[k] <= 256) assert_true(g.sizes[idx] <= b + 31); /* bounded padding */
        }
        assert_int_equal(graph_ladder_pick(&g, limits[k] + 1), -1);
    }
    GraphLadder g;
    graph_ladder_build(&g, 256);
    assert_int_equal(g.sizes[0], 1);
    assert_int_equal(g.sizes[1], 2);
    assert_int_equal(g.sizes[3], 8);
}

static void test_decode_splits(void **state) {
    (void)state;
    assert_int_equal(decode_split_count(1, 8, 132, 8192, 32), 32);  /* one sequence: as many as allowed */
    assert_int_equal(decode_split_count(1, 8, 132, 100, 32), 2);    /* short context: one per 64 slots */
    assert_int_equal(decode_split_count(64, 8, 132, 8192, 32), 1);  /* 512 blocks already cover 2x132 SMs */
    assert_int_equal(decode_split_count(16, 3, 132, 8192, 32), 6);  /* ceil(264 / 48) */
    assert_int_equal(decode_split_count(0, 3, 132, 0, 32), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ladder_covers_every_batch),
        cmocka_unit_test(test_decode_splits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
