/*
 * test_sched_shared_prefill.c — issue 33 (b): prompts sharing a head that reach an idle instance
 * together. Through the real scheduler (no model: tokens are made up):
 *   - two prompts with an 8-block head queued before the first step: the first is planned alone,
 *     the second waits one step and is admitted with the head cached (32 tokens), so the head is
 *     computed once (the old scheduler packed both into one step: cached 0, the head twice);
 *   - a head still being prefilled in chunks (budget 64, a 100-token leader): the follower waits
 *     until the leader's chunks have committed the shared blocks, then hits all of them;
 *   - prompts that share nothing, or share it in another tenant's cache, are packed as before;
 *   - never starving: a leader cancelled mid-prefill leads nothing (the follower is admitted with
 *     what was committed), and every case runs to idle with the accounting checked each step;
 *   - kv_cache_peek_prefix counts what kv_cache_match would, without splitting or locking.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/scheduler.h"

#define BS 4

/* A request whose prompt is `prompt` tokens: the first `head` are 1000 + i (shared), the rest base + i. */
static void make_req(SchedRequest *r, const char *id, int head, int base, int prompt, int max_tokens, const char *tenant) {
    memset(r, 0, sizeof *r);
    r->id = strdup(id);
    r->tenant = tenant ? strdup(tenant) : NULL;
    r->cap_tokens = prompt + max_tokens + 1;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    assert_non_null(r->tokens);
    for (int i = 0; i < prompt; i++) r->tokens[i] = i < head ? 1000 + i : base + i;
    r->n_tokens = r->n_prompt = prompt;
    r->max_tokens = max_tokens;
}

static void init_sched(Scheduler *s, int budget) {
    SchedConfig sc = {.device_blocks = 129, .block_size = BS, .max_batch_tokens = budget, .max_running = 8, .cache_enabled = true};
    BraidError err;
    if (sched_init(s, &sc, &err)) fail_msg("%s", err.msg);
}

/* One step: plan, commit, one sampled token per finishing prefill or decode; max_tokens ends a request. */
static int step(Scheduler *s, StepPlan *p) {
    BraidError err;
    int n = sched_plan(s, p, &err);
    if (n < 0) fail_msg("%s", err.msg);
    sched_commit(s, p);
    for (int i = 0; i < p->n; i++) {
        SchedRequest *r = p->entries[i].req;
        if (!p->entries[i].sample) continue;
        assert_int_equal(sched_append_token(r, 7), 0);
        if (r->n_tokens - r->n_prompt >= r->max_tokens) sched_finish(s, r, "length");
    }
    if (sched_check(s, &err)) fail_msg("%s", err.msg);
    return n;
}

static void run_to_idle(Scheduler *s, StepPlan *p) {
    for (int guard = 0; !sched_idle(s); guard++) {
        assert_true(guard < 1000);
        step(s, p);
    }
}

static bool planned(const StepPlan *p, const SchedRequest *r) {
    for (int i = 0; i < p->n; i++)
        if (p->entries[i].req == r) return true;
    return false;
}

static void test_same_step_waits(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, 512);
    SchedRequest a, b;
    make_req(&a, "a", 32, 100, 40, 2, NULL);
    make_req(&b, "b", 32, 500, 40, 2, NULL); /* the same 32-token (8-block) head, its own tail */
    assert_int_equal(sched_add(&s, &a), 0);
    assert_int_equal(sched_add(&s, &b), 0);
    step(&s, &p);
    assert_true(planned(&p, &a));
    assert_false(planned(&p, &b)); /* it waits for a's head to be committed */
    assert_int_equal(b.state, REQ_WAITING);
    assert_int_equal(s.counters.shared_prefill_waits, 1);
    step(&s, &p);
    assert_true(planned(&p, &b));
    assert_int_equal(b.cached_tokens, 32); /* the head came from the cache */
    run_to_idle(&s, &p);
    assert_int_equal(a.cached_tokens, 0);
    assert_int_equal(s.counters.computed_prompt_tokens, 40 + 8); /* the head once */
    sched_request_free(&a);
    sched_request_free(&b);
    plan_free(&p);
    sched_free(&s);
}

static void test_chunked_head_waits(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, 64);
    SchedRequest a, b;
    make_req(&a, "a", 100, 100, 100, 2, NULL); /* 25 blocks, prefilled in chunks of 64 tokens */
    make_req(&b, "b", 80, 500, 92, 2, NULL);   /* shares a's first 20 blocks */
    assert_int_equal(sched_add(&s, &a), 0);
    assert_int_equal(sched_add(&s, &b), 0);
    step(&s, &p); /* a: 64 tokens (16 blocks), the whole budget */
    assert_false(planned(&p, &b));
    assert_int_equal(s.counters.shared_prefill_waits, 0);
    step(&s, &p); /* a: the other 36; b still waits (16 committed < 20 shared; the old scheduler admitted it with 16) */
    assert_false(planned(&p, &b));
    assert_int_equal(b.state, REQ_WAITING);
    step(&s, &p);
    assert_true(planned(&p, &b));
    assert_int_equal(b.cached_tokens, 80);
    run_to_idle(&s, &p);
    assert_int_equal(s.counters.computed_prompt_tokens, 100 + 12);
    assert_int_equal(s.counters.shared_prefill_waits, 1); /* step 2, with 28 tokens of budget left */
    sched_request_free(&a);
    sched_request_free(&b);
    plan_free(&p);
    sched_free(&s);
}

static void test_unrelated_packed(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, 512);
    SchedRequest a, b, c;
    make_req(&a, "a", 32, 100, 40, 2, NULL);
    make_req(&b, "b", 0, 500, 40, 2, NULL);    /* shares nothing */
    make_req(&c, "c", 32, 900, 40, 2, "acme"); /* a's head, in another tenant's cache */
    assert_int_equal(sched_add(&s, &a), 0);
    assert_int_equal(sched_add(&s, &b), 0);
    assert_int_equal(sched_add(&s, &c), 0);
    step(&s, &p);
    assert_true(planned(&p, &a) && planned(&p, &b) && planned(&p, &c));
    assert_int_equal(s.counters.shared_prefill_waits, 0);
    run_to_idle(&s, &p);
    sched_request_free(&a);
    sched_request_free(&b);
    sched_request_free(&c);
    plan_free(&p);
    sched_free(&s);
}

static void test_cancelled_leader_leads_nothing(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, 64);
    SchedRequest a, b;
    make_req(&a, "a", 100, 100, 100, 2, NULL);
    make_req(&b, "b", 80, 500, 92, 2, NULL);
    assert_int_equal(sched_add(&s, &a), 0);
    assert_int_equal(sched_add(&s, &b), 0);
    step(&s, &p); /* a: 16 blocks committed; b waits */
    assert_false(planned(&p, &b));
    sched_cancel(&s, &a); /* the client went away mid-prefill */
    step(&s, &p);
    assert_true(planned(&p, &b)); /* nothing leads it now: admitted with what a committed */
    assert_int_equal(b.cached_tokens, 64);
    run_to_idle(&s, &p);
    sched_request_free(&a);
    sched_request_free(&b);
    plan_free(&p);
    sched_free(&s);
}

/* kv_cache_peek_prefix, which the rule asks instead of kv_cache_match: the same count, and the tree
 * untouched (a match splits the node where the prompts part and locks the path). */
static void test_peek_is_read_only(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    init_sched(&s, 512);
    SchedRequest a, b;
    make_req(&a, "a", 32, 100, 40, 2, NULL);
    make_req(&b, "b", 32, 500, 40, 2, NULL);
    assert_int_equal(sched_add(&s, &a), 0);
    run_to_idle(&s, &p); /* a's 10 prompt blocks in the tree, one node */
    assert_int_equal(sched_add(&s, &b), 0);
    int nodes = s.cache.n_nodes;
    assert_int_equal(kv_cache_peek_prefix(&s.cache, &b.identity, b.tokens, b.n_tokens), 8);
    assert_int_equal(kv_cache_peek_prefix(&s.cache, &a.identity, a.tokens, a.n_prompt), 9); /* never the whole prompt */
    assert_int_equal(s.cache.n_nodes, nodes);
    KvCacheMatch m;
    BraidError err;
    if (kv_cache_match(&s.cache, &b.identity, b.tokens, b.n_tokens, &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m.device_blocks + m.host_blocks, 8);
    assert_int_equal(s.cache.n_nodes, nodes + 1); /* the match split the node */
    kv_cache_release(&s.cache, m.node, NULL, 0);
    run_to_idle(&s, &p);
    sched_request_free(&a);
    sched_request_free(&b);
    plan_free(&p);
    sched_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_step_waits),
        cmocka_unit_test(test_chunked_head_waits),
        cmocka_unit_test(test_unrelated_packed),
        cmocka_unit_test(test_cancelled_leader_leads_nothing),
        cmocka_unit_test(test_peek_is_read_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
