/*
 * test_watchdog_prefill.c — a request waiting behind a long prefill is not failed by the
 * coordinator's request watchdog (issue 36: live mapreduce-lora at load 40+, requests answered 500
 * "no token and no queue movement" while their instance was prefilling the requests ahead of them).
 *
 * Through the real scheduler (no model: tokens are made up; one step stands for one second of a
 * loaded CPU) and the real watchdog, fed what the coordinator feeds it (coordinator.c on_stats:
 * prompt tokens admitted plus prompt tokens prefilled), in --lora-cache separate and auto:
 *   - the pool holds two of three requests; the third waits while the two prefill in small chunks,
 *     then decode, each phase longer than the watchdog's timeout; every prefill chunk advances
 *     SchedCounters.prefilled_tokens and every decode step the generated tokens, so the waiting
 *     request is never past the watchdog, and all three finish;
 *   - the same run with admissions alone as movement (the accounting before this fix), or with
 *     prefill but not decode, puts the waiting request past the watchdog: the defect, kept visible;
 *   - auto never chooses a fork an idle pool could not hold (base blocks + residual carriers);
 *   - MsgStats carries prefilled_tokens (encode / decode).
 * Deterministic: simulated time, no threads, no clock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coord/request_watchdog.h"
#include "transport/control_msg.h"
#include "worker/scheduler.h"
#include "worker/sched_forkkv.h"

#define BS 4
#define PROMPT 40   /* 10 blocks */
#define MAX_TOKENS 24 /* 16 blocks with the prompt */
#define TIMEOUT_S 6.0

static void make_req(SchedRequest *r, const char *id, const char *adapter, int base) {
    memset(r, 0, sizeof *r);
    r->id = strdup(id);
    r->adapter = adapter ? strdup(adapter) : NULL;
    r->lora_id = adapter ? 1 : 0;
    r->cap_tokens = PROMPT + MAX_TOKENS + 1;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    assert_non_null(r->id);
    assert_non_null(r->tokens);
    for (int i = 0; i < PROMPT; i++) r->tokens[i] = base + i;
    r->n_tokens = r->n_prompt = PROMPT;
    r->max_tokens = MAX_TOKENS;
}


/* 32 usable blocks (two requests of 16, not three), 4 tokens a step: the first prompt takes 10
 * steps, the second 14 beside the first one's decode, then 10 steps decode only: each phase longer
 * than TIMEOUT_S at a second a step. auto: the unified pool and the
 * cost model at SmolLM2-135M's shape (its first choices are separate caches: nothing evicted yet). */
static void init_sched(Scheduler *s, bool automatic) {
    SchedConfig sc = {.device_blocks = 33, .block_size = BS, .max_batch_tokens = 4, .max_running = 8, .cache_enabled = true,
                      .lora_shared = automatic, .lora_auto = automatic, .residual_blocks = automatic ? 33 * 12 : 0,
                      .model_layers = 30, .model_heads = 9, .model_kv_heads = 3, .model_head_dim = 64, .lora_rank = 16};
    BraidError err;
    if (sched_init(s, &sc, &err)) fail_msg("%s", err.msg);
}

/* How much of the instance's progress the watchdog sees. */
typedef enum { SEE_ADMISSIONS, SEE_PREFILL, SEE_ALL } Seen;

/* What on_stats gives the watchdog: admitted prompt tokens (before the fix, alone), prefilled
 * prompt tokens, generated tokens (the engine's count; here the test's). */
static uint64_t movement(const Scheduler *s, uint64_t generated, Seen seen) {
    const SchedCounters *c = &s->counters;
    uint64_t admitted = c->computed_prompt_tokens + c->cached_prompt_tokens_device + c->cached_prompt_tokens_host;
    return admitted + (seen >= SEE_PREFILL ? c->prefilled_tokens : 0) + (seen >= SEE_ALL ? generated : 0);
}

/* Runs three requests dispatched at t = 0 to the end, a step a second, with the watchdog fed each
 * step; returns the longest time the last request (waiting) was without progress. */
static double run(bool automatic, Seen seen, bool *expired) {
    Scheduler s;
    StepPlan p = {0};
    RequestWatchdog w;
    init_sched(&s, automatic);
    assert_int_equal(request_watchdog_init(&w, 1, TIMEOUT_S), 0);
    const char *adapters[3] = {"mapper-0", "mapper-1", "mapper-2"};
    SchedRequest r[3];
    for (int i = 0; i < 3; i++) {
        make_req(&r[i], adapters[i], automatic ? adapters[i] : NULL, 1000 * (i + 1));
        assert_int_equal(sched_add(&s, &r[i]), 0);
    }
    double now = 0, t_progress = 0, worst = 0; /* the waiting request's own progress: dispatch, then its tokens */
    uint64_t generated = 0;
    request_watchdog_stats(&w, 0, movement(&s, generated, seen), now); /* the baseline, before any step */
    *expired = false;
    BraidError err;
    for (int guard = 0; !sched_idle(&s); guard++) {
        assert_true(guard < 1000);
        if (sched_plan(&s, &p, &err) < 0) fail_msg("%s", err.msg);
        sched_commit(&s, &p);
        now += 1.0;
        for (int i = 0; i < p.n; i++) {
            SchedRequest *q = p.entries[i].req;
            if (!p.entries[i].sample) continue;
            assert_int_equal(sched_append_token(q, 7), 0);
            generated++;
            if (q == &r[2]) t_progress = now;
            if (q->n_tokens - q->n_prompt >= q->max_tokens) {
                sched_finish(&s, q, "length");
                request_watchdog_finished(&w, 0, now);
            }
        }
        request_watchdog_stats(&w, 0, movement(&s, generated, seen), now);
        if (r[2].state != REQ_FINISHED) {
            double idle = request_watchdog_idle_s(&w, 0, t_progress, now);
            if (idle > worst) worst = idle;
            *expired |= request_watchdog_expired(&w, 0, t_progress, now);
        }
        if (sched_check(&s, &err)) fail_msg("%s", err.msg);
    }
    for (int i = 0; i < 3; i++) {
        assert_string_equal(r[i].finish_reason, "length");
        if (automatic) assert_true(r[i].kv_separate); /* auto's first choices here: separate caches */
        sched_request_free(&r[i]);
    }
    plan_free(&p);
    request_watchdog_free(&w);
    sched_free(&s);
    return worst;
}

static void check_mode(bool automatic) {
    bool expired;
    /* Admissions alone (before the fix): the third request waits two prefills and a decode. */
    double old_worst = run(automatic, SEE_ADMISSIONS, &expired);
    assert_true(expired);
    assert_true(old_worst >= TIMEOUT_S);
    /* Prefill chunks alone are not enough: the decode of the requests ahead outlasts the timeout. */
    run(automatic, SEE_PREFILL, &expired);
    assert_true(expired);
    /* Everything the requests ahead do counts: the waiting request is never past the watchdog. */
    double worst = run(automatic, SEE_ALL, &expired);
    assert_false(expired);
    assert_true(worst < TIMEOUT_S);
}

static void test_separate(void **state) {
    (void)state;
    check_mode(false);
}

static void test_auto(void **state) {
    (void)state;
    check_mode(true);
}

static void test_prefilled_counts_chunks(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, false);
    SchedRequest r;
    make_req(&r, "a", NULL, 500);
    assert_int_equal(sched_add(&s, &r), 0);
    BraidError err;
    for (int step = 1; step <= PROMPT / 4; step++) {
        if (sched_plan(&s, &p, &err) < 0) fail_msg("%s", err.msg);
        sched_commit(&s, &p);
        assert_int_equal(s.counters.prefilled_tokens, (uint64_t)(4 * step)); /* chunk by chunk, not at admission */
    }
    /* Decode steps are not prefill. */
    for (int i = 0; i < p.n; i++)
        if (p.entries[i].sample) assert_int_equal(sched_append_token(p.entries[i].req, 7), 0);
    if (sched_plan(&s, &p, &err) < 0) fail_msg("%s", err.msg);
    sched_commit(&s, &p);
    assert_int_equal(s.counters.prefilled_tokens, (uint64_t)PROMPT);
    sched_finish(&s, &r, "length");
    sched_request_free(&r);
    plan_free(&p);
    sched_free(&s);
}

/* --lora-cache auto never chooses a fork the pool could not hold even idle: a fork needs its base
 * blocks and, in the unified pool, carriers for its residuals from the same blocks; a separate
 * cache only the first (what sched_add checked). Here 32 base blocks fit the 32, 32 + 3 carriers
 * do not: before the fix the forked request stayed at the head of the queue with nothing running
 * ("cannot be admitted with an idle pool"), the instance's step failed and nothing behind it ran. */
static void test_auto_fork_must_fit(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, true);
    SchedRequest a, b;
    make_req(&a, "a", "lora-a", 0);
    make_req(&b, "b", "lora-b", 0);
    for (SchedRequest *r = &a; r; r = r == &a ? &b : NULL) { /* 104 prompt tokens, the same for both */
        r->cap_tokens = 104 + MAX_TOKENS + 1;
        r->tokens = realloc(r->tokens, (size_t)r->cap_tokens * sizeof *r->tokens);
        assert_non_null(r->tokens);
        for (int i = 0; i < 104; i++) r->tokens[i] = 300 + i;
        r->n_tokens = r->n_prompt = 104;
    }
    s.max_batch_tokens = 128;
    BraidError err;
    assert_int_equal(sched_add(&s, &a), 0); /* nothing evicted yet: a separate cache */
    for (int guard = 0; !sched_idle(&s); guard++) {
        assert_true(guard < 100);
        if (sched_plan(&s, &p, &err) < 0) fail_msg("%s", err.msg);
        sched_commit(&s, &p);
        for (int i = 0; i < p.n; i++)
            if (p.entries[i].sample && sched_append_token(p.entries[i].req, 7) == 0 && a.n_tokens - a.n_prompt >= MAX_TOKENS)
                sched_finish(&s, &a, "length");
    }
    assert_true(a.kv_separate);
    /* A cost model that forks whatever it can: no attention penalty, every copy regretted. */
    ForkKvCost *c = sched_forkkv_cost(&s);
    assert_non_null(c);
    c->plain_decode_s = c->plain_prefill_s = 0;
    c->regret = 1.0;
    c->token_s = 1.0;
    assert_int_equal(sched_add(&s, &b), 0);
    for (int guard = 0; !sched_idle(&s); guard++) {
        assert_true(guard < 100);
        if (sched_plan(&s, &p, &err) < 0) fail_msg("req b stalled: %s", err.msg);
        sched_commit(&s, &p);
        for (int i = 0; i < p.n; i++)
            if (p.entries[i].sample && sched_append_token(p.entries[i].req, 7) == 0 && b.n_tokens - b.n_prompt >= MAX_TOKENS)
                sched_finish(&s, &b, "length");
        if (sched_check(&s, &err)) fail_msg("%s", err.msg);
    }
    assert_string_equal(b.finish_reason, "length");
    assert_true(b.kv_separate); /* the fork would not fit: a separate cache */
    sched_request_free(&a);
    sched_request_free(&b);
    plan_free(&p);
    sched_free(&s);
}

static void test_stats_message(void **state) {
    (void)state;
    MsgStats m = {.computed_prompt_tokens = 11, .prefilled_tokens = 123456789012ull, .segment_probes_rejected = 5, .move_declines = 7,
                  .move_followers = 9};
    WireBuf b = {0};
    msg_stats_encode(&b, &m);
    WireReader rd = wire_reader(b.data, b.len);
    MsgStats d;
    assert_int_equal(msg_stats_decode(&rd, &d), 0);
    assert_int_equal(d.prefilled_tokens, 123456789012ull);
    assert_int_equal(d.computed_prompt_tokens, 11);
    assert_int_equal(d.segment_probes_rejected, 5);
    assert_int_equal(d.move_declines, 7);
    assert_int_equal(d.move_followers, 9);
    wire_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefilled_counts_chunks),
        cmocka_unit_test(test_separate),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_auto_fork_must_fit),
        cmocka_unit_test(test_stats_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
