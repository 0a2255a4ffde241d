/* Rank binding (src/worker/rank_binding.h): the core partition (pure), and hwloc on this machine
 * for one rank alone (bound to every allowed core) and for more ranks than PUs (oversubscribed:
 * nothing bound); the /metrics text and the start-up line. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/rank_binding.h"

static void test_partition_examples(void **state) {
    (void)state;
    int first, count;
    /* 2 cores, 2 ranks: one each (this machine's case). */
    assert_int_equal(rank_binding_partition(2, 0, 2, &first, &count), 0);
    assert_int_equal(first, 0), assert_int_equal(count, 1);
    assert_int_equal(rank_binding_partition(2, 1, 2, &first, &count), 0);
    assert_int_equal(first, 1), assert_int_equal(count, 1);
    /* 10 cores, 4 ranks: 3 + 3 + 2 + 2, the extra units to the first ranks. */
    int want_first[] = {0, 3, 6, 8}, want_count[] = {3, 3, 2, 2};
    for (int r = 0; r < 4; r++) {
        assert_int_equal(rank_binding_partition(10, r, 4, &first, &count), 0);
        assert_int_equal(first, want_first[r]);
        assert_int_equal(count, want_count[r]);
    }
    /* One rank takes everything. */
    assert_int_equal(rank_binding_partition(64, 0, 1, &first, &count), 0);
    assert_int_equal(first, 0), assert_int_equal(count, 64);
}

static void test_partition_refusals(void **state) {
    (void)state;
    int first = 7, count = 7;
    assert_int_equal(rank_binding_partition(2, 0, 3, &first, &count), -1); /* oversubscribed */
    assert_int_equal(first, 0), assert_int_equal(count, 0);
    assert_int_equal(rank_binding_partition(0, 0, 1, &first, &count), -1);
    assert_int_equal(rank_binding_partition(4, -1, 2, &first, &count), -1);
    assert_int_equal(rank_binding_partition(4, 2, 2, &first, &count), -1);
    assert_int_equal(rank_binding_partition(4, 0, 0, &first, &count), -1);
}

/* Every (units, ranks) up to 96: slices are disjoint, consecutive, cover all units, within one of each other. */
static void test_partition_property(void **state) {
    (void)state;
    for (int n = 1; n <= 96; n++) {
        for (int ranks = 1; ranks <= n; ranks++) {
            int next = 0, smallest = n, largest = 0;
            for (int r = 0; r < ranks; r++) {
                int first, count;
                assert_int_equal(rank_binding_partition(n, r, ranks, &first, &count), 0);
                assert_int_equal(first, next); /* consecutive and disjoint */
                assert_true(count >= 1);
                next = first + count;
                if (count < smallest) smallest = count;
                if (count > largest) largest = count;
            }
            assert_int_equal(next, n); /* covers every unit */
            assert_true(largest - smallest <= 1);
        }
        int first, count;
        assert_int_equal(rank_binding_partition(n, 0, n + 1, &first, &count), -1);
    }
}

/* This process's allowed CPUs as a list string like Cpus_allowed_list ("0-1"). */
static void affinity_list(char *buf, size_t cap) {
    cpu_set_t set;
    CPU_ZERO(&set);
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    size_t at = 0;
    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        int end = c;
        while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, &set)) end++;
        at += (size_t)snprintf(buf + at, cap - at, "%s%d", at ? "," : "", c);
        if (end > c) at += (size_t)snprintf(buf + at, cap - at, "-%d", end);
        c = end;
    }
}

static void test_apply_alone_and_oversubscribed(void **state) {
    (void)state;
    char before[256], after[256], line[512];
    affinity_list(before, sizeof before);
    RankBinding b;
    BraidError err;
    /* Far more ranks than any machine's PUs: says so, binds nothing. */
    assert_int_equal(rank_binding_apply(5, 4095, 4096, -1, &b, &err), 0);
    assert_string_equal(b.state, "oversubscribed");
    assert_string_equal(b.cpuset, "");
    affinity_list(after, sizeof after);
    assert_string_equal(before, after);
    rank_binding_describe(&b, line, sizeof line);
    assert_non_null(strstr(line, "oversubscribed"));
    /* One rank alone gets every allowed core: the affinity it had (no cgroup narrower than it here). */
    assert_int_equal(rank_binding_apply(1, 0, 1, -1, &b, &err), 0);
    assert_string_equal(b.state, "bound");
    assert_true(b.cores >= 1 && b.pus >= b.cores);
    assert_true(b.numa[0] != '\0');
    affinity_list(after, sizeof after);
    assert_string_equal(b.cpuset, after);
    rank_binding_describe(&b, line, sizeof line);
    assert_non_null(strstr(line, "rank 1 (worker 1 of 1 on "));
    assert_non_null(strstr(line, "NUMA node"));
}

static void test_metrics_text(void **state) {
    (void)state;
    RankBinding b[3];
    memset(b, 0, sizeof b);
    b[1] = (RankBinding){.rank = 1, .host = "n1", .state = "bound", .cpuset = "0", .numa = "0"};
    b[2] = (RankBinding){.rank = 2, .host = "n\"1", .state = "oversubscribed"};
    char *text = rank_binding_metrics_text(b, 3);
    assert_non_null(text);
    assert_non_null(strstr(text, "# TYPE braid_rank_binding_info gauge\n"));
    assert_non_null(strstr(text, "braid_rank_binding_info{rank=\"1\",host=\"n1\",state=\"bound\",cpuset=\"0\",numa=\"0\"} 1\n"));
    assert_non_null(strstr(text, "braid_rank_binding_info{rank=\"2\",host=\"n\\\"1\",state=\"oversubscribed\",cpuset=\"\",numa=\"\"} 1\n"));
    assert_null(strstr(text, "rank=\"0\"")); /* the coordinator is not listed */
    free(text);
    RankBindMode mode;
    assert_int_equal(rank_binding_parse_mode("none", &mode), 0);
    assert_int_equal(mode, RANK_BIND_NONE);
    assert_int_equal(rank_binding_parse_mode("auto", &mode), 0);
    assert_int_equal(mode, RANK_BIND_AUTO);
    assert_int_equal(rank_binding_parse_mode("core", &mode), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partition_examples),
        cmocka_unit_test(test_partition_refusals),
        cmocka_unit_test(test_partition_property),
        cmocka_unit_test(test_apply_alone_and_oversubscribed),
        cmocka_unit_test(test_metrics_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
