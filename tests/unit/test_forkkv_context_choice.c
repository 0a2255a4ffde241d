/*
 * test_forkkv_context_choice.c — --lora-cache auto decided per context (worker/forkkv_context_choice.h).
 *
 * A context starts separate, forks only when its score clears the hysteresis band, and then keeps
 * its choice through margins inside the band (the stickiness the per-request model lacked) until the
 * evidence clearly turns; per (context, adapter) pairs decide apart. The shared prefix is what two
 * different adapters' prompts have in common, not one adapter's own history; a context one adapter
 * reads never forks; a fork's one-time cost is spread over the adapter's reads. The pricing follows
 * the header's formulas on SmolLM2's shape: a thrashing mapreduce-like context forks within a few
 * reads and stays forked once its residuals are warm; a context whose copies stay cached stays
 * separate. The table grows and finds every context again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "worker/forkkv_context_choice.h"

enum { CTX = 0x1234, A1 = 11, A2 = 22, A3 = 33, A4 = 44 };

/* A read with a hand-set margin (saving − penalty at regret 1; penalty 1 s: the band's unit). */
static ForkCtxRead read_with(uint64_t context, uint64_t adapter, double margin) {
    return (ForkCtxRead){.context = context, .adapter = adapter, .steady_penalty_s = 1.0, .full_saving_s = 1.0 + margin,
                         .fallback_regret = 1.0};
}

/* Decides a read with a hand-set margin. */
static int decide_with(ForkCtxTable *t, uint64_t context, uint64_t adapter, double margin) {
    ForkCtxRead r = read_with(context, adapter, margin);
    return forkctx_decide(t, &r);
}

/* Observes a read whose prompt is `n` blocks (≤ 300), the document's for the first `shared`. */
static int observe(ForkCtxTable *t, uint64_t adapter, int n, int shared, uint64_t tail_seed, ForkCtxSeen *seen) {
    uint64_t h[300];
    for (int i = 0; i < n; i++) h[i] = i < shared ? 1000 + (uint64_t)i : tail_seed * 100 + (uint64_t)i;
    return forkctx_observe(t, CTX, adapter, h, n, 16, seen);
}

static void test_starts_separate_and_sticks(void **state) {
    (void)state;
    ForkCtxTable t;
    assert_int_equal(forkctx_init(&t, 0.5, false), 0);
    ForkCtxSeen seen;
    assert_int_equal(observe(&t, A1, 8, 8, 1, &seen), 0);
    assert_int_equal(forkctx_current(&t, CTX, A1), 0); /* known, not yet forked */
    /* Margins inside the band (+0.4 < 0.5 penalty): stays separate however many reads. */
    for (int i = 0; i < 20; i++) {
        assert_int_equal(observe(&t, A1, 8, 8, 1, &seen), 0);
        assert_int_equal(decide_with(&t, CTX, A1, 0.4), 0);
    }
    /* Clearly positive: forks, once. */
    int forked_at = -1;
    for (int i = 0; i < 10 && forked_at < 0; i++) {
        assert_int_equal(observe(&t, A2, 8, 8, 2, &seen), 0);
        if (decide_with(&t, CTX, A2, 2.0) == 1) forked_at = i;
    }
    assert_true(forked_at >= 0);
    assert_int_equal(t.switches, 1);
    /* Slightly negative (−0.3 > −0.5): stays forked for both adapters (one choice per context). */
    for (int i = 0; i < 20; i++) {
        assert_int_equal(observe(&t, i % 2 ? A1 : A2, 8, 8, 1, &seen), 0);
        assert_int_equal(decide_with(&t, CTX, i % 2 ? A1 : A2, -0.3), 1);
    }
    assert_int_equal(forkctx_current(&t, CTX, A1), 1);
    assert_int_equal(t.switches, 1);
    /* Clearly negative: back to separate. */
    int back = 1;
    for (int i = 0; i < 10 && back; i++) {
        assert_int_equal(observe(&t, A1, 8, 8, 1, &seen), 0);
        back = decide_with(&t, CTX, A1, -3.0);
    }
    assert_int_equal(back, 0);
    assert_int_equal(t.switches, 2);
    assert_int_equal(forkctx_current(&t, 0x9999, A1), -1);
    forkctx_free(&t);
}

static void test_per_adapter_pairs_decide_apart(void **state) {
    (void)state;
    ForkCtxTable t;
    assert_int_equal(forkctx_init(&t, 0.5, true), 0);
    ForkCtxSeen seen;
    for (int i = 0; i < 10; i++) {
        assert_int_equal(observe(&t, A1, 8, 8, 1, &seen), 0);
        decide_with(&t, CTX, A1, 3.0);
        assert_int_equal(observe(&t, A2, 8, 8, 2, &seen), 0);
        decide_with(&t, CTX, A2, -3.0);
    }
    assert_int_equal(forkctx_current(&t, CTX, A1), 1);
    assert_int_equal(forkctx_current(&t, CTX, A2), 0);
    assert_int_equal(forkctx_current(&t, CTX, A3), -1); /* never read it */
    forkctx_free(&t);
}

static void test_shared_prefix_is_between_adapters(void **state) {
    (void)state;
    ForkCtxTable t;
    assert_int_equal(forkctx_init(&t, 0.5, false), 0);
    ForkCtxSeen seen;
    /* One adapter's reads share 30 blocks with each other (its own history): nothing shared yet. */
    assert_int_equal(observe(&t, A1, 40, 30, 7, &seen), 0);
    assert_int_equal(observe(&t, A1, 40, 30, 7, &seen), 0);
    assert_int_equal(seen.shared_tokens, 0);
    assert_int_equal(seen.readers, 1);
    assert_int_equal(seen.adapter_reads, 2);
    /* Another adapter whose prompt shares the first 10 blocks: 160 tokens. */
    assert_int_equal(observe(&t, A2, 40, 10, 8, &seen), 0);
    assert_int_equal(seen.shared_tokens, 10 * 16);
    assert_int_equal(seen.readers, 2);
    assert_int_equal(seen.adapter_reads, 1);
    /* A shorter common prefix later does not shrink it. */
    assert_int_equal(observe(&t, A3, 40, 4, 9, &seen), 0);
    assert_int_equal(seen.shared_tokens, 10 * 16);
    assert_int_equal(seen.readers, 3);
    forkctx_free(&t);
}

/* SmolLM2-135M's shape, rank 16, the committed CPU attention figures, 2.5 ms a token. */
static ForkKvCost smol(double regret) {
    ForkKvCost c;
    forkkv_cost_init(&c, 30, 1, 1, 192, 16);
    c.rho_decode = 3.14;
    c.rho_prefill = 1.58;
    c.plain_decode_s = 72.2e-9;
    c.plain_prefill_s = 50.6e-9;
    c.token_s = 2.5e-3;
    c.regret = regret;
    return c;
}

static void test_pricing(void **state) {
    (void)state;
    ForkKvCost c = smol(0.8);
    ForkCtxSeen one = {.shared_tokens = 0, .readers = 1, .adapter_reads = 1};
    ForkKvRequest cold = {.n_prompt = 4500, .max_tokens = 64, .residual_known = true};
    ForkCtxRead r;
    forkctx_price(&c, &cold, &one, 0, 12288, CTX, A1, 16, &r);
    assert_true(r.full_saving_s == 0); /* one reader: nothing to share */
    assert_true(r.steady_penalty_s > 0);
    ForkCtxSeen four = {.shared_tokens = 4176, .readers = 4, .adapter_reads = 1};
    forkctx_price(&c, &cold, &four, 0, 12288, CTX, A1, 16, &r);
    assert_true(r.full_saving_s > 2.5e-3 * 4176 * 0.999 && r.full_saving_s < 2.5e-3 * 4176 * 1.001);
    assert_true(r.fallback_regret == 0.8);
    assert_true(r.one_time_s > 0); /* its residuals are missing: the prompt goes through ResidualAttention once */
    /* The forked context (4 176 x (1 + 4/12) = 5 568 tokens) does not fit 3/4 of a 6 144-token pool. */
    ForkCtxRead tight;
    forkctx_price(&c, &cold, &four, 0, 6144, CTX, A1, 16, &tight);
    assert_true(tight.full_saving_s == 0);
    ForkKvRequest warm = cold;
    warm.base = warm.residual = 4336;
    ForkCtxRead w;
    forkctx_price(&c, &warm, &four, 0, 12288, CTX, A1, 16, &w);
    assert_true(w.one_time_s == 0);
    assert_true(w.steady_penalty_s <= r.steady_penalty_s);
    /* An own separate copy the fork would drop adds its recompute to the one-time cost; and the copy
     * is regret evidence: 4 336 tokens held before, 1 600 of them gone. */
    ForkKvRequest own = cold;
    own.base = 4176;
    own.own = 2736;
    ForkCtxRead o;
    forkctx_price(&c, &own, &four, 4336, 12288, CTX, A1, 16, &o);
    assert_true(o.one_time_s > r.one_time_s);
    assert_int_equal(o.reread_blocks, 4336 / 16);
    assert_int_equal(o.evicted_blocks, 1600 / 16);
}

/* Runs `rounds` of k adapters reading one shared document (4 500-token prompts, a 4 176-token
 * document, 12 288-token pool), each read priced by the model: separate reads find their copy
 * evicted with probability `regret` (as the regret evidence says), forked reads find the residuals
 * warm once their adapter forked before. Returns the choice of the last read; *first_fork the read
 * of the first fork (-1 none). Fails if the context flips back. */
static int run_context(double regret, int k, int rounds, int *first_fork) {
    ForkKvCost c = smol(0.0); /* the global regret starts at 0, as live: the context measures its own */
    ForkCtxTable t;
    assert_int_equal(forkctx_init(&t, 0.5, false), 0);
    const uint64_t adapters[] = {A1, A2, A3, A4};
    bool warm[4] = {false};
    int choice = 0;
    *first_fork = -1;
    for (int i = 0; i < rounds * k; i++) {
        int a = i % k;
        ForkCtxSeen seen;
        assert_int_equal(observe(&t, adapters[a], 281, 261, 100 + (uint64_t)i, &seen), 0);
        ForkKvRequest q = {.n_prompt = 4500, .max_tokens = 64, .residual_known = true};
        int before = 0;
        if (choice == 1 && warm[a]) {
            q.base = q.residual = 4336;
        } else if (choice == 0 && seen.adapter_reads > 1) { /* a copy before: kept or evicted */
            before = 4336;
            q.own = (i * 7 % 100) < regret * 100 ? 0 : 4336;
        }
        ForkCtxRead r;
        forkctx_price(&c, &q, &seen, before, 12288, CTX, adapters[a], 16, &r);
        int d = forkctx_decide(&t, &r);
        if (d == 1 && *first_fork < 0) *first_fork = i;
        if (d == 0 && choice == 1) fail_msg("read %d: a forked context flipped back on steady evidence", i);
        if (d == 1) warm[a] = true;
        choice = d;
    }
    assert_int_equal(t.switches, *first_fork >= 0 ? 1 : 0);
    forkctx_free(&t);
    return choice;
}

static void test_thrashing_context_forks_and_stays(void **state) {
    (void)state;
    int first;
    assert_int_equal(run_context(1.0, 4, 10, &first), 1);
    /* not while only cold reads are known (round one), and within the third round */
    assert_true(first >= 4 && first < 12);
}

static void test_cached_copies_stay_separate(void **state) {
    (void)state;
    int first;
    assert_int_equal(run_context(0.05, 3, 10, &first), 0);
    assert_int_equal(first, -1);
}

static void test_table_grows(void **state) {
    (void)state;
    ForkCtxTable t;
    assert_int_equal(forkctx_init(&t, 0.5, false), 0);
    ForkCtxSeen seen;
    uint64_t h[2];
    for (uint64_t i = 1; i <= 1000; i++) {
        h[0] = i * 7919, h[1] = i;
        assert_int_equal(forkctx_observe(&t, forkctx_context_key(h, 1), A1, h, 2, 16, &seen), 0);
        if (i % 2) /* the odd ones fork */
            for (int j = 0; j < 3; j++) decide_with(&t, forkctx_context_key(h, 1), A1, 5.0);
    }
    assert_int_equal(t.n, 1000);
    for (uint64_t i = 1; i <= 1000; i++) {
        h[0] = i * 7919;
        assert_int_equal(forkctx_current(&t, forkctx_context_key(h, 1), A1), (int)(i % 2));
    }
    assert_int_equal(forkctx_context_key(h, 0), 0);
    uint64_t zero = 0;
    assert_true(forkctx_context_key(&zero, 1) != 0); /* 0 is the empty slot's mark */
    forkctx_free(&t);
}

/* The one-call form a scheduler uses: no full block is no context (-1: keep the per-request choice);
 * otherwise it observes, prices and decides (the context becomes known, separate at first). */
static void test_choose_one_call(void **state) {
    (void)state;
    ForkKvCost c = smol(0.8);
    ForkCtxTable t;
    assert_int_equal(forkctx_init(&t, 0.5, false), 0);
    ForkKvRequest q = {.n_prompt = 4500, .max_tokens = 64, .residual_known = true};
    uint64_t h[281];
    for (int i = 0; i < 281; i++) h[i] = 1000 + (uint64_t)i;
    assert_int_equal(forkctx_choose(&t, &c, &q, h, 0, 16, A1, 0, 12288), -1);
    assert_int_equal(t.n, 0);
    assert_int_equal(forkctx_choose(&t, &c, &q, h, 281, 16, A1, 0, 12288), 0);
    assert_int_equal(forkctx_current(&t, forkctx_context_key(h, 281), A1), 0);
    assert_int_equal(t.n, 1);
    forkctx_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_starts_separate_and_sticks),
        cmocka_unit_test(test_per_adapter_pairs_decide_apart),
        cmocka_unit_test(test_shared_prefix_is_between_adapters),
        cmocka_unit_test(test_pricing),
        cmocka_unit_test(test_thrashing_context_forks_and_stays),
        cmocka_unit_test(test_cached_copies_stay_separate),
        cmocka_unit_test(test_table_grows),
        cmocka_unit_test(test_choose_one_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
