/*
 * test_sched_admit.c — output-aware admission (worker/sched_admit.h, braid serve / batch / sim
 * --admit-output). Through the real scheduler (no model: tokens are made up) and the simulator's
 * batching replay (which runs the same scheduler):
 *   - the option parses off / auto / a token count and refuses anything else;
 *   - an instance whose pool has room for a second request's prompt but not for both requests'
 *     outputs admits the second one with admission off, and then preempts; with it on the second
 *     request waits in the queue (deferred), and both finish with no preemption;
 *   - auto learns the mean output of finished requests: once short answers have finished, two
 *     requests that fit with that expectation are admitted together;
 *   - nothing running: the head is admitted whatever the rule says (the queue never stalls);
 *   - the batching replay preempts with admission off and not with it on, on the same trace.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "sim/sim_cluster.h"
#include "sim/trace.h"
#include "worker/sched_admit.h"
#include "worker/scheduler.h"

#define BS 4

/* A request whose prompt is `prompt` distinct tokens (base + i), generating up to max_tokens. */
static void make_req(SchedRequest *r, const char *id, int base, int prompt, int max_tokens) {
    memset(r, 0, sizeof *r);
    r->id = strdup(id);
    r->cap_tokens = prompt + max_tokens + 1;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    assert_non_null(r->tokens);
    for (int i = 0; i < prompt; i++) r->tokens[i] = base + i;
    r->n_tokens = r->n_prompt = prompt;
    r->max_tokens = max_tokens;
}

/* 12 usable blocks of 4 tokens (plus the null block), prefix cache on. */
static void init_sched(Scheduler *s, int admit_output) {
    SchedConfig sc = {.device_blocks = 13, .block_size = BS, .max_batch_tokens = 64, .max_running = 8, .cache_enabled = true,
                      .admit_output = admit_output};
    BraidError err;
    if (sched_init(s, &sc, &err)) fail_msg("%s", err.msg);
}

/* One step; a request stops at `stop_at` generated tokens (reason stop) or max_tokens (length). */
static void step(Scheduler *s, StepPlan *p, int stop_at) {
    BraidError err;
    if (sched_plan(s, p, &err) < 0) fail_msg("%s", err.msg);
    sched_commit(s, p);
    for (int i = 0; i < p->n; i++) {
        SchedRequest *r = p->entries[i].req;
        if (!p->entries[i].sample) continue;
        assert_int_equal(sched_append_token(r, 7), 0);
        int generated = r->n_tokens - r->n_prompt;
        if (generated >= r->max_tokens) sched_finish(s, r, "length");
        else if (stop_at > 0 && generated >= stop_at) sched_finish(s, r, "stop");
    }
    if (sched_check(s, &err)) fail_msg("%s", err.msg);
}

static void run_to_idle(Scheduler *s, StepPlan *p, int stop_at) {
    for (int guard = 0; !sched_idle(s); guard++) {
        assert_true(guard < 10000);
        step(s, p, stop_at);
    }
}

static void test_parse(void **state) {
    (void)state;
    int m = 123;
    assert_int_equal(sched_admit_output_parse("off", &m), 0);
    assert_int_equal(m, SCHED_ADMIT_OUTPUT_OFF);
    assert_int_equal(sched_admit_output_parse("auto", &m), 0);
    assert_int_equal(m, SCHED_ADMIT_OUTPUT_AUTO);
    assert_int_equal(sched_admit_output_parse("256", &m), 0);
    assert_int_equal(m, 256);
    const char *bad[] = {"", "0", "-1", "64k", "on", "1048577", "12 ", NULL};
    for (int i = 0; bad[i]; i++) assert_int_equal(sched_admit_output_parse(bad[i], &m), -1);
    assert_int_equal(sched_admit_output_parse(NULL, &m), -1);
    char buf[16];
    assert_string_equal(sched_admit_output_name(SCHED_ADMIT_OUTPUT_AUTO, buf, sizeof buf), "auto");
    assert_string_equal(sched_admit_output_name(64, buf, sizeof buf), "64");
}

static void test_expected_output(void **state) {
    (void)state;
    SchedAdmit a = {.output_tokens = 32};
    assert_int_equal(sched_admit_expected_output(&a, 100), 32);
    assert_int_equal(sched_admit_expected_output(&a, 10), 10); /* never past max_tokens */
    /* 9 prompt + 32 output = 41 tokens = 11 blocks of 4; 3 held: 8 due. */
    assert_int_equal(sched_admit_blocks_due(&a, 9, 100, 3, 4), 8);
    assert_int_equal(sched_admit_blocks_due(&a, 9, 100, 20, 4), 0);
    SchedAdmit off = {.output_tokens = SCHED_ADMIT_OUTPUT_OFF};
    assert_int_equal(sched_admit_blocks_due(&off, 9, 100, 3, 4), 0);
    SchedAdmit au = {.output_tokens = SCHED_ADMIT_OUTPUT_AUTO};
    assert_int_equal(sched_admit_expected_output(&au, 50), 50); /* nothing finished yet: max_tokens */
    sched_admit_learn(&au, 4);
    sched_admit_learn(&au, 7);
    assert_int_equal(sched_admit_expected_output(&au, 50), 6); /* mean 5.5, rounded up */
    assert_false(sched_admit_defer(&au, 0, 10, 0));            /* nothing runs: admit */
    assert_true(sched_admit_defer(&au, 9, 10, 1));
    assert_false(sched_admit_defer(&au, 10, 10, 1));
    assert_int_equal(au.deferrals, 1);
}

/* Two requests of 9 prompt tokens (3 blocks) and 20 output tokens (28 tokens written: 7 blocks
 * each, 14 in all) on 12 blocks: both prompts fit, both outputs do not. */
static void two_requests(int admit_output, uint64_t *preemptions, int *running_after_first_step, uint64_t *deferrals) {
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, admit_output);
    SchedRequest a, b;
    make_req(&a, "a", 100, 9, 20);
    make_req(&b, "b", 200, 9, 20);
    assert_int_equal(sched_add(&s, &a), 0);
    assert_int_equal(sched_add(&s, &b), 0);
    step(&s, &p, 0);
    *running_after_first_step = s.n_running;
    if (s.n_running == 1) assert_int_equal(b.state, REQ_WAITING);
    run_to_idle(&s, &p, 0);
    assert_string_equal(a.finish_reason, "length");
    assert_string_equal(b.finish_reason, "length");
    assert_int_equal(a.n_tokens - a.n_prompt, 20);
    assert_int_equal(b.n_tokens - b.n_prompt, 20);
    *preemptions = s.counters.preemptions;
    *deferrals = s.admit.deferrals;
    sched_request_free(&a);
    sched_request_free(&b);
    plan_free(&p);
    sched_free(&s);
}

static void test_defers_when_output_does_not_fit(void **state) {
    (void)state;
    uint64_t pre_off, pre_on, pre_auto, def_off, def_on, def_auto;
    int run_off, run_on, run_auto;
    two_requests(SCHED_ADMIT_OUTPUT_OFF, &pre_off, &run_off, &def_off);
    assert_int_equal(run_off, 2); /* admitted on the prompt's blocks alone */
    assert_true(pre_off >= 1);    /* then decode growth preempts */
    assert_int_equal(def_off, 0);
    two_requests(20, &pre_on, &run_on, &def_on);
    assert_int_equal(run_on, 1); /* room for b's prompt, not for both outputs: b waits */
    assert_int_equal(pre_on, 0);
    assert_true(def_on >= 1);
    two_requests(SCHED_ADMIT_OUTPUT_AUTO, &pre_auto, &run_auto, &def_auto); /* nothing finished: max_tokens */
    assert_int_equal(run_auto, 1);
    assert_int_equal(pre_auto, 0);
    /* An expectation small enough for both: admitted together again. */
    uint64_t pre4, def4;
    int run4;
    two_requests(4, &pre4, &run4, &def4);
    assert_int_equal(run4, 2);
    assert_int_equal(def4, 0);
}

static void test_auto_learns_short_outputs(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, SCHED_ADMIT_OUTPUT_AUTO);
    /* Warm-up: one request at a time answers 3 tokens of its 16 (stop). */
    for (int i = 0; i < 2; i++) {
        SchedRequest w;
        char id[8];
        snprintf(id, sizeof id, "w%d", i);
        make_req(&w, id, 1000 + 100 * i, 9, 16);
        assert_int_equal(sched_add(&s, &w), 0);
        run_to_idle(&s, &p, 3);
        assert_string_equal(w.finish_reason, "stop");
        sched_request_free(&w);
    }
    assert_int_equal(sched_admit_expected_output(&s.admit, 16), 3);
    /* 9 + 3 tokens = 3 blocks each: both fit with that expectation, so both are admitted. */
    SchedRequest a, b;
    make_req(&a, "a", 100, 9, 16);
    make_req(&b, "b", 200, 9, 16);
    assert_int_equal(sched_add(&s, &a), 0);
    assert_int_equal(sched_add(&s, &b), 0);
    step(&s, &p, 3);
    assert_int_equal(s.n_running, 2);
    run_to_idle(&s, &p, 3);
    sched_request_free(&a);
    sched_request_free(&b);
    plan_free(&p);
    sched_free(&s);
}

/* A request that alone needs more than the pool has left for outputs is still admitted when
 * nothing runs (it fits alone: sched_add checked), so the rule never stalls the queue. */
static void test_head_admitted_when_idle(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, 1 << 20);
    SchedRequest a;
    make_req(&a, "a", 100, 9, 39); /* 48 tokens = the whole pool */
    assert_int_equal(sched_add(&s, &a), 0);
    step(&s, &p, 0);
    assert_int_equal(s.n_running, 1);
    run_to_idle(&s, &p, 0);
    assert_string_equal(a.finish_reason, "length");
    sched_request_free(&a);
    plan_free(&p);
    sched_free(&s);
}

/* The batching replay: 4 requests at once on one instance of 16 blocks of 16 tokens, each 3 prompt
 * blocks + 4 output blocks: all four prompts fit (12 blocks), two whole requests do (14). */
static void sim_run(int admit_output, SimClusterResult *r) {
    char path[] = "/tmp/braid_sched_admit_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    for (int i = 0; i < 4; i++) {
        fprintf(f, "{\"type\":\"request\",\"seq\":%d,\"t\":0,\"id\":\"r%d\",\"prompt_tokens\":48,\"output_tokens\":64,\"block_size\":16,\"blocks\":[", i, i);
        for (int b = 0; b < 3; b++) fprintf(f, "%s\"%016llx\"", b ? "," : "", (unsigned long long)((i + 1) * 1000 + b + 1));
        fprintf(f, "]}\n");
    }
    fclose(f);
    Trace t;
    BraidError err;
    if (trace_load(path, &t, &err)) fail_msg("%s", err.msg);
    unlink(path);
    SimClusterConfig cfg = sim_cluster_config_default();
    cfg.n_instances = 1;
    cfg.kv_tokens = 256;
    cfg.admit_output = admit_output;
    if (sim_cluster_run(&t, &cfg, r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r->requests, 4);
    assert_int_equal(r->too_large, 0);
    trace_free(&t);
}

static void test_sim_replay_admits_on_output(void **state) {
    (void)state;
    SimClusterResult off, on;
    sim_run(SCHED_ADMIT_OUTPUT_OFF, &off);
    sim_run(SCHED_ADMIT_OUTPUT_AUTO, &on);
    assert_true(off.preemptions >= 1);
    assert_int_equal(on.preemptions, 0);
    assert_true(on.computed_tokens <= off.computed_tokens);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_expected_output),
        cmocka_unit_test(test_defers_when_output_does_not_fit),
        cmocka_unit_test(test_auto_learns_short_outputs),
        cmocka_unit_test(test_head_admitted_when_idle),
        cmocka_unit_test(test_sim_replay_admits_on_output),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
