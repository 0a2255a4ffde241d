/* Instances as failure domains, the coordinator's side: rank liveness from real child processes
 * (exit, zombie, pid reuse), heartbeat timeouts, fencing what is left of a dead TP instance, the
 * router leaving a dead instance out, and /metrics counting it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord/instance_health.h"
#include "coord/metrics.h"
#include "coord/router.h"
#include "transport/rank_directory.h"

enum { N_RANKS = 5, TP = 2 }; /* rank 0 (this process) + 2 instances of 2 ranks */

typedef struct {
    RankDirectory dir;
    pid_t pid[N_RANKS];
    uint64_t ticks[N_RANKS];
    bool local[N_RANKS];
} FakeCluster;

/* Ranks 1..4 are real processes that wait for a signal; rank 0 is this test. */
static void cluster_start(FakeCluster *fc) {
    memset(fc, 0, sizeof *fc);
    rank_directory_self(&fc->pid[0], &fc->ticks[0]);
    for (int r = 1; r < N_RANKS; r++) {
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            for (;;) pause();
        }
        fc->pid[r] = child;
    }
    /* A child's start time is readable once it exists; read it as the real gather does. */
    for (int r = 1; r < N_RANKS; r++) {
        bool zombie;
        fc->ticks[r] = rank_directory_start_ticks(fc->pid[r], &zombie);
        assert_true(fc->ticks[r] > 0);
        assert_false(zombie);
    }
    for (int r = 0; r < N_RANKS; r++) fc->local[r] = true;
    fc->dir = (RankDirectory){.n_ranks = N_RANKS, .pid = fc->pid, .start_ticks = fc->ticks, .local = fc->local};
}

static void cluster_stop(FakeCluster *fc) {
    for (int r = 1; r < N_RANKS; r++) {
        kill(fc->pid[r], SIGKILL);
        waitpid(fc->pid[r], NULL, 0);
    }
}

static bool exists(pid_t pid) { return kill(pid, 0) == 0; }

static void test_dead_rank_kills_its_instance_only(void **state) {
    (void)state;
    FakeCluster fc;
    cluster_start(&fc);
    InstanceHealth h;
    assert_int_equal(instance_health_init(&h, 2, TP, &fc.dir, 0, 100.0), 0);
    assert_int_equal(instance_health_next_dead(&h, 100.0), -1);
    for (int r = 1; r < N_RANKS; r++) assert_int_equal(rank_directory_alive(&fc.dir, r), RANK_ALIVE);

    /* Instance 1's second rank (a TP peer) dies and is reaped. */
    kill(fc.pid[4], SIGKILL);
    waitpid(fc.pid[4], NULL, 0);
    assert_int_equal(rank_directory_alive(&fc.dir, 4), RANK_GONE);
    assert_int_equal(instance_health_next_dead(&h, 100.1), 1);
    assert_non_null(strstr(instance_health_reason(&h, 1), "rank 4"));
    assert_int_equal(instance_health_next_dead(&h, 100.2), -1); /* reported once */
    assert_true(instance_health_is_dead(&h, 1));
    assert_false(instance_health_is_dead(&h, 0));
    assert_int_equal(instance_health_alive_count(&h), 1);

    /* Fencing kills the dead instance's surviving rank (its leader), and nothing else. */
    assert_int_equal(instance_health_fence(&h, 1), 1);
    int status = 0;
    assert_int_equal(waitpid(fc.pid[3], &status, 0), fc.pid[3]);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    fc.pid[3] = fc.pid[4] = 0; /* reaped; cluster_stop must not touch those pids */
    assert_true(exists(fc.pid[1]) && exists(fc.pid[2]));
    /* A dead instance's later messages do not bring it back. */
    instance_health_heard(&h, 1, 101.0);
    instance_health_started(&h, 1, 101.0);
    assert_true(instance_health_is_dead(&h, 1));
    instance_health_free(&h);
    for (int r = 1; r <= 2; r++) kill(fc.pid[r], SIGKILL), waitpid(fc.pid[r], NULL, 0);
}

static void test_unreaped_rank_is_dead(void **state) {
    (void)state;
    FakeCluster fc;
    cluster_start(&fc);
    kill(fc.pid[1], SIGKILL);
    /* Not reaped yet: a zombie, which still answers kill(pid, 0), yet it runs no more. */
    siginfo_t info;
    assert_int_equal(waitid(P_PID, (id_t)fc.pid[1], &info, WEXITED | WNOWAIT), 0);
    assert_int_equal(rank_directory_alive(&fc.dir, 1), RANK_GONE);
    InstanceHealth h;
    assert_int_equal(instance_health_init(&h, 2, TP, &fc.dir, 0, 0.0), 0);
    assert_int_equal(instance_health_next_dead(&h, 0.0), 0);
    instance_health_free(&h);
    cluster_stop(&fc);
}

static void test_reused_pid_is_dead_and_never_killed(void **state) {
    (void)state;
    FakeCluster fc;
    cluster_start(&fc);
    /* Rank 2's pid now names a process that started at another time: not the rank any more. */
    fc.ticks[2] += 1;
    assert_int_equal(rank_directory_alive(&fc.dir, 2), RANK_GONE);
    assert_int_equal(rank_directory_kill(&fc.dir, 2), 0);
    assert_true(exists(fc.pid[2]));
    /* A rank on another host cannot be looked at. */
    fc.local[1] = false;
    assert_int_equal(rank_directory_alive(&fc.dir, 1), RANK_UNKNOWN);
    cluster_stop(&fc);
}

static void test_silent_leader_times_out(void **state) {
    (void)state;
    InstanceHealth h;
    assert_int_equal(instance_health_init(&h, 2, 1, NULL, 5.0, 100.0), 0);
    instance_health_started(&h, 0, 100.0);
    /* Instance 1 is still loading: silence while loading is not death. */
    assert_int_equal(instance_health_next_dead(&h, 104.0), -1);
    instance_health_heard(&h, 0, 104.0);
    assert_int_equal(instance_health_next_dead(&h, 108.0), -1);
    assert_int_equal(instance_health_next_dead(&h, 109.5), 0);
    assert_non_null(strstr(instance_health_reason(&h, 0), "no message"));
    assert_int_equal(instance_health_next_dead(&h, 200.0), -1);
    assert_string_equal(instance_state_name(h.state[1]), "starting");
    instance_health_free(&h);

    /* timeout 0: never by silence. */
    assert_int_equal(instance_health_init(&h, 1, 1, NULL, 0, 0.0), 0);
    instance_health_started(&h, 0, 0.0);
    assert_int_equal(instance_health_next_dead(&h, 1e6), -1);
    assert_true(instance_health_declare_dead(&h, 0, "mpi error"));
    assert_false(instance_health_declare_dead(&h, 0, "again"));
    assert_string_equal(instance_health_reason(&h, 0), "mpi error");
    instance_health_free(&h);
}

static void test_router_leaves_dead_instance_out(void **state) {
    (void)state;
    Router r;
    assert_int_equal(router_init(&r, 2, 8), 0);
    uint64_t hashes[3] = {11, 22, 33};
    router_stored(&r, 1, hashes, 3);
    router_assigned(&r, 1, NULL);
    assert_int_equal(router_pick(&r, hashes, 3, NULL).instance, 1); /* the cache wins */
    router_instance_down(&r, 1);
    assert_int_equal(r.load[1], 0);
    assert_int_equal(block_index_prefix(&r.index[1], hashes, 3), 0); /* its index is gone */
    RouteDecision d = router_pick(&r, hashes, 3, NULL);
    assert_int_equal(d.instance, 0);
    router_stored(&r, 1, hashes, 3); /* a late report from the dead instance changes nothing */
    assert_int_equal(router_pick(&r, hashes, 3, NULL).instance, 0);
    router_instance_down(&r, 0);
    assert_int_equal(router_pick(&r, hashes, 3, NULL).instance, -1);
    router_free(&r);
}

static void test_metrics_count_dead_instances(void **state) {
    (void)state;
    Metrics *m = metrics_create(2, "model");
    assert_non_null(m);
    metrics_set_instance(m, 1, &(InstanceStats){.running = 3, .pool_used_blocks = 7, .pool_total_blocks = 10});
    char *text = metrics_render(m);
    assert_non_null(strstr(text, "braid_instances_alive 2\n"));
    assert_non_null(strstr(text, "braid_instance_up{instance=\"1\"} 1\n"));
    assert_non_null(strstr(text, "braid_instance_failures_total 0\n"));
    free(text);
    metrics_instance_down(m, 1);
    metrics_instance_down(m, 1); /* once per instance */
    metrics_set_instance(m, 1, &(InstanceStats){.running = 5}); /* ignored: it is dead */
    text = metrics_render(m);
    assert_non_null(strstr(text, "braid_instances_alive 1\n"));
    assert_non_null(strstr(text, "braid_instance_up{instance=\"0\"} 1\n"));
    assert_non_null(strstr(text, "braid_instance_up{instance=\"1\"} 0\n"));
    assert_non_null(strstr(text, "braid_instance_failures_total 1\n"));
    assert_non_null(strstr(text, "braid_instance_running_sequences{instance=\"1\"} 0\n"));
    assert_non_null(strstr(text, "braid_instance_kv_blocks_used{instance=\"1\"} 0\n"));
    assert_non_null(strstr(text, "braid_instance_kv_blocks_total{instance=\"1\"} 10\n"));
    free(text);
    metrics_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dead_rank_kills_its_instance_only),
        cmocka_unit_test(test_unreaped_rank_is_dead),
        cmocka_unit_test(test_reused_pid_is_dead_and_never_killed),
        cmocka_unit_test(test_silent_leader_times_out),
        cmocka_unit_test(test_router_leaves_dead_instance_out),
        cmocka_unit_test(test_metrics_count_dead_instances),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
