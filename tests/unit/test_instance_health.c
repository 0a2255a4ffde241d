/* Instances as failure domains, the coordinator's side: rank liveness from real child processes
 * (exit, zombie, pid reuse), heartbeat timeouts, fencing what is left of a dead TP instance, the
 * router leaving a dead instance out, and /metrics counting it; restarts (--restart-instances): a
 * revived instance watched and fenced through its new process, the backoff and the limit, the
 * router and /metrics taking it back. */
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
#include "coord/instance_restart.h"
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

/* A tp = 1 instance dies, is revived, and from then on its new process (not the dead rank) is
 * what is watched and fenced. */
static void test_revived_instance_watches_its_new_process(void **state) {
    (void)state;
    FakeCluster fc;
    cluster_start(&fc);
    InstanceHealth h;
    assert_int_equal(instance_health_init(&h, 4, 1, &fc.dir, 0, 100.0), 0); /* ranks 1..4 lead instances 0..3 */
    kill(fc.pid[4], SIGKILL);
    waitpid(fc.pid[4], NULL, 0);
    assert_int_equal(instance_health_next_dead(&h, 100.1), 3);
    assert_int_equal(instance_health_revive(&h, 3, 101.0), 0);
    assert_false(instance_health_is_dead(&h, 3));
    assert_int_equal(instance_health_alive_count(&h), 4);
    /* Not yet named: the dead rank is no longer looked at, so nothing is reported. */
    assert_int_equal(instance_health_next_dead(&h, 101.2), -1);
    pid_t fresh = fork();
    assert_true(fresh >= 0);
    if (fresh == 0) for (;;) pause();
    bool zombie;
    uint64_t ticks = rank_directory_start_ticks(fresh, &zombie);
    instance_health_respawned_process(&h, 3, fresh, ticks);
    instance_health_started(&h, 3, 101.3);
    assert_int_equal(instance_health_next_dead(&h, 101.4), -1);
    kill(fresh, SIGKILL);
    waitpid(fresh, NULL, 0);
    assert_int_equal(instance_health_next_dead(&h, 101.5), 3);
    assert_non_null(strstr(instance_health_reason(&h, 3), "respawned leader of instance 3"));
    /* Revived again: fencing reaches the newest process, and only it. */
    assert_int_equal(instance_health_revive(&h, 3, 102.0), 0);
    pid_t newest = fork();
    assert_true(newest >= 0);
    if (newest == 0) for (;;) pause();
    instance_health_respawned_process(&h, 3, newest, rank_directory_start_ticks(newest, &zombie));
    assert_int_equal(instance_health_fence(&h, 3), 1);
    int status = 0;
    assert_int_equal(waitpid(newest, &status, 0), newest);
    assert_true(WIFSIGNALED(status));
    assert_true(exists(fc.pid[1]) && exists(fc.pid[2]) && exists(fc.pid[3]));
    assert_int_equal(instance_health_revive(&h, 3, 103.0), 0);
    instance_health_free(&h);
    fc.pid[4] = 0;
    for (int r = 1; r <= 3; r++) kill(fc.pid[r], SIGKILL), waitpid(fc.pid[r], NULL, 0);
}

/* Backoff doubles from 1 s up to the cap; past max_restarts nothing is scheduled. The spawn itself
 * needs a running MPI job (the integration test does it); here its bookkeeping is stood in for. */
static void test_restart_backoff_and_limit(void **state) {
    (void)state;
    InstanceRestarts r;
    const char *args[] = {"serve", "--model", "m.gguf", NULL};
    BraidError err;
    assert_int_equal(instance_restarts_init(&r, 2, 7, args, &err), 0);
    assert_string_equal(r.argv[0], "serve");
    assert_null(r.argv[3]);
    assert_int_equal(instance_restarts_due(&r, 1000.0), -1);
    const double want[7] = {1, 2, 4, 8, 16, 30, 30};
    double now = 100.0, delay;
    for (int k = 0; k < 7; k++) {
        assert_true(instance_restarts_schedule(&r, 1, now, &delay));
        assert_true(delay == want[k]);
        assert_int_equal(instance_restarts_due(&r, now + delay - 0.01), -1);
        assert_int_equal(instance_restarts_due(&r, now + delay), 1);
        r.due[1] = 0, r.restarts[1]++; /* what a spawn records */
        now += delay;
    }
    assert_false(instance_restarts_schedule(&r, 1, now, &delay)); /* its 7 are used */
    assert_true(instance_restarts_schedule(&r, 0, now, &delay));  /* the other instance has its own */
    assert_true(delay == 1);
    instance_restarts_free(&r);
}

static void test_router_and_metrics_take_a_restarted_instance_back(void **state) {
    (void)state;
    Router r;
    assert_int_equal(router_init(&r, 2, 8), 0);
    router_instance_down(&r, 1);
    router_assigned(&r, 0, NULL);
    router_instance_up(&r, 1);
    assert_int_equal(router_pick(&r, NULL, 0, NULL).instance, 1); /* back, and the least loaded */
    router_free(&r);
    Metrics *m = metrics_create(2, "model");
    assert_non_null(m);
    metrics_instance_down(m, 1);
    metrics_instance_restarted(m, 1);
    char *text = metrics_render(m);
    assert_non_null(strstr(text, "braid_instance_up{instance=\"1\"} 1\n"));
    assert_non_null(strstr(text, "braid_instances_alive 2\n"));
    assert_non_null(strstr(text, "braid_instance_restarts_total 1\n"));
    free(text);
    metrics_instance_down(m, 1); /* it dies again: a second failure */
    text = metrics_render(m);
    assert_non_null(strstr(text, "braid_instance_failures_total 2\n"));
    assert_non_null(strstr(text, "braid_instance_up{instance=\"1\"} 0\n"));
    free(text);
    metrics_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_revived_instance_watches_its_new_process),
        cmocka_unit_test(test_restart_backoff_and_limit),
        cmocka_unit_test(test_router_and_metrics_take_a_restarted_instance_back),
        cmocka_unit_test(test_dead_rank_kills_its_instance_only),
        cmocka_unit_test(test_unreaped_rank_is_dead),
        cmocka_unit_test(test_reused_pid_is_dead_and_never_killed),
        cmocka_unit_test(test_silent_leader_times_out),
        cmocka_unit_test(test_router_leaves_dead_instance_out),
        cmocka_unit_test(test_metrics_count_dead_instances),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
