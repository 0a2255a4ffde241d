/*
 * test_forkkv_cost.c — --lora-cache auto's parts: the cost model (worker/forkkv_cost.h) and the
 * block presence it peeks through (cache/block_presence.h).
 *
 * The cost model picks separate when memory is not short (no regret) or the request is
 * decode-heavy, and the fork when separate copies keep being evicted and reread (the mapreduce
 * shape); its terms follow the formula in the header (with issue 36's recompute term: a request
 * goes where its state is cached, and a fork's ResidualAttention is charged on the tokens it
 * computes); the step and regret estimates average what
 * they are fed. The presence set follows stored / removed / cleared events, finds the longest
 * cached prefix by chained hash, remembers evictions until the ring overwrites them and forgets a
 * ghost that is stored again. The start-up probe measures ratios above 1 (ResidualAttention does
 * more work than plain attention on the same shapes).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cache/block_presence.h"
#include "worker/forkkv_cost.h"

/* SmolLM2-135M's shape, rank 16, with the committed CPU figures and a 3 ms token. */
static ForkKvCost smol(double regret) {
    ForkKvCost c;
    forkkv_cost_init(&c, 30, 9, 3, 64, 16);
    c.regret = regret;
    return c;
}

static void test_no_regret_means_separate(void **state) {
    (void)state;
    ForkKvCost c = smol(0.0);
    ForkKvRequest r = {.n_prompt = 4096, .max_tokens = 64, .held = 4096, .base = 4096};
    ForkKvChoice ch = forkkv_cost_choose(&c, &r);
    assert_false(ch.shared);
    assert_true(ch.penalty_s > 0);
    assert_true(ch.saving_s == 0);
}

static void test_thrashing_copies_mean_fork(void **state) {
    (void)state;
    /* mapreduce-lora at 640 blocks: separate mode lost about half its hits to eviction. */
    ForkKvCost c = smol(0.5);
    ForkKvRequest r = {.n_prompt = 4200, .max_tokens = 64, .held = 4096, .base = 4096};
    ForkKvChoice ch = forkkv_cost_choose(&c, &r);
    assert_true(ch.shared);
    /* The terms are the header's formula. */
    double fresh = 4200 - 4096, pen = 30 * ((c.rho_decode - 1) * c.plain_decode_s * 64 * (4200 + 32) +
                                            (c.rho_prefill - 1) * c.plain_prefill_s * fresh * (4200 - fresh / 2));
    assert_true(fabs(ch.penalty_s - pen) < 1e-9 * (1 + pen));
    /* saved = a separate copy's 4200 new tokens - the fork's (104 base + 4200 x 16/192 residual) */
    assert_true(fabs(ch.saving_s - 3e-3 * 0.5 * (4200 - (104 + 4200 * 16.0 / 192))) < 1e-9);
}

static void test_decode_heavy_or_little_held_means_separate(void **state) {
    (void)state;
    /* react-lora at 320 blocks: a few points of hit rate lost to eviction. */
    ForkKvCost c = smol(0.07);
    ForkKvRequest react = {.n_prompt = 2300, .max_tokens = 64, .held = 2048, .base = 2048};
    assert_false(forkkv_cost_choose(&c, &react).shared);
    /* The same regret as mapreduce, but nothing held yet: nothing to save. */
    ForkKvCost m = smol(0.5);
    ForkKvRequest fresh = {.n_prompt = 4200, .max_tokens = 64, .held = 0};
    assert_false(forkkv_cost_choose(&m, &fresh).shared);
    /* Long outputs turn the fork's decode penalty against it. */
    ForkKvRequest long_out = {.n_prompt = 4200, .max_tokens = 2048, .held = 4096, .base = 4096};
    assert_false(forkkv_cost_choose(&m, &long_out).shared);
}

/* The corrected saving (issue 36): memory, in tokens, that forking saves. An adapter whose own
 * separate copy holds the context and no other adapter's does saves nothing by forking (it would
 * recompute into the shared base and add a residual): separate, however high the regret. Other
 * adapters' separate copies of the same context are the duplicates a shared base folds into
 * residuals: with two of them, the same request forks. */
static void test_other_adapters_copies_decide(void **state) {
    (void)state;
    ForkKvCost c = smol(0.5);
    ForkKvRequest own_only = {.n_prompt = 4200, .max_tokens = 64, .held = 4096, .own = 4096};
    ForkKvChoice ch = forkkv_cost_choose(&c, &own_only);
    assert_false(ch.shared);
    assert_true(ch.saving_s == 0);
    ForkKvRequest nothing = {.n_prompt = 4200, .max_tokens = 64, .held = 0};
    assert_false(forkkv_cost_choose(&c, &nothing).shared);
    ForkKvRequest dup = {.n_prompt = 4200, .max_tokens = 64, .held = 4096, .copies = 2 * 4096};
    ch = forkkv_cost_choose(&c, &dup);
    assert_true(ch.shared);
    double res = 16.0 / 192, saved = 4200 - (4200 + 4200 * res) + 2 * 4096 * (1 - res);
    assert_true(fabs(ch.saving_s - 3e-3 * 0.5 * saved) < 1e-9);
    /* The same copies with no regret measured: memory is not short, separate stays. */
    ForkKvCost calm = smol(0.0);
    assert_false(forkkv_cost_choose(&calm, &dup).shared);
}

/* Issue 36's recompute term (residual_known): what each choice computes now. A fork reuses
 * min(base, residual); a separate run its own copy. */
static void test_recompute_term_decides(void **state) {
    (void)state;
    /* An adapter whose residuals and the base hold the context forks even with no regret: a
     * separate run would recompute the whole prefix (the term is the only one for the fork). */
    ForkKvCost calm = smol(0.0);
    ForkKvRequest forked_before = {.n_prompt = 4200, .max_tokens = 64, .held = 4096, .base = 4096,
                                   .residual_known = true, .residual = 4096};
    ForkKvChoice ch = forkkv_cost_choose(&calm, &forked_before);
    assert_true(ch.shared);
    assert_true(fabs(ch.recompute_s - 3e-3 * (0 - 4096)) < 1e-9);
    /* Its own copy holds it and the base does too, but not its residuals: a fork would recompute
     * all 4096 (ForkKV's fork tokens); the duplicates' memory saving does not pay for that. */
    ForkKvCost short_mem = smol(0.5);
    ForkKvRequest own_copy = {.n_prompt = 4200, .max_tokens = 64, .held = 4096, .base = 4096, .own = 4096,
                              .copies = 3 * 4096, .residual_known = true, .residual = 0};
    ch = forkkv_cost_choose(&short_mem, &own_copy);
    assert_true(ch.saving_s > ch.penalty_s); /* the memory terms alone would fork */
    assert_true(fabs(ch.recompute_s - 3e-3 * 4096) < 1e-9);
    assert_false(ch.shared);
    /* The penalty's prefill part counts the tokens the fork computes (n - min(base, residual)), not
     * n - held: a base hit without residuals is recomputed through ResidualAttention. */
    ForkKvRequest no_residual = {.n_prompt = 4200, .max_tokens = 64, .held = 4096, .base = 4096, .residual_known = true};
    ForkKvRequest nothing = {.n_prompt = 4200, .max_tokens = 64, .held = 0};
    ForkKvRequest old_model = {.n_prompt = 4200, .max_tokens = 64, .held = 4096, .base = 4096};
    double p_new = forkkv_cost_choose(&short_mem, &no_residual).penalty_s, p_all = forkkv_cost_choose(&short_mem, &nothing).penalty_s;
    assert_true(fabs(p_new - p_all) < 1e-12);
    assert_true(forkkv_cost_choose(&short_mem, &old_model).penalty_s < p_new / 2);
    assert_true(forkkv_cost_choose(&short_mem, &old_model).recompute_s == 0); /* not known: the old model */
}

static void test_estimates_average_their_samples(void **state) {
    (void)state;
    ForkKvCost c = smol(0.0);
    forkkv_cost_observe_step(&c, 100, 0, 0.5);   /* 5 ms a token */
    forkkv_cost_observe_step(&c, 100, 0, 0.3);   /* 3 ms */
    forkkv_cost_observe_step(&c, 8, 8, 10.0);    /* a decode step: not a prompt token's price */
    assert_true(fabs(c.token_s - 4e-3) < 1e-12);
    forkkv_cost_observe_regret(&c, 10, 20);
    forkkv_cost_observe_regret(&c, 0, 20);
    forkkv_cost_observe_regret(&c, 5, 0); /* no blocks: no sample */
    assert_true(fabs(c.regret - 0.25) < 1e-12);
}

static void test_probe_measures_ratios(void **state) {
    (void)state;
    ForkKvCost c = smol(0.0);
    c.rho_decode = c.rho_prefill = 0;
    assert_int_equal(forkkv_cost_measure(&c), 0);
    assert_true(c.rho_decode > 1.0 && c.rho_prefill > 1.0);
    assert_true(c.plain_decode_s > 0 && c.plain_prefill_s > 0);
}

static CacheEvent event(CacheEventKind kind, const uint64_t *hashes, int n) {
    return (CacheEvent){.kind = kind, .tier = CACHE_TIER_DEVICE, .n_blocks = n, .hashes = hashes};
}

static void test_presence_follows_events(void **state) {
    (void)state;
    BlockPresence p;
    assert_int_equal(block_presence_init(&p, 3), 0);
    uint64_t chain[4] = {11, 0, 1, 44}; /* 0 and 1 are hashes too */
    CacheEvent stored = event(CACHE_EVENT_STORED, chain, 4);
    assert_int_equal(block_presence_on_event(&p, &stored), 0);
    assert_int_equal(block_presence_prefix(&p, chain, 4), 4);
    uint64_t tail[2] = {1, 44};
    CacheEvent removed = event(CACHE_EVENT_REMOVED, tail, 2);
    assert_int_equal(block_presence_on_event(&p, &removed), 0);
    assert_int_equal(block_presence_prefix(&p, chain, 4), 2);
    assert_true(block_presence_evicted(&p, 1) && block_presence_evicted(&p, 44));
    assert_false(block_presence_evicted(&p, 11));
    /* Stored again: present, no longer a loss. */
    CacheEvent back = event(CACHE_EVENT_STORED, tail + 1, 1);
    assert_int_equal(block_presence_on_event(&p, &back), 0);
    assert_false(block_presence_evicted(&p, 44));
    /* The ring keeps the last three removals. */
    uint64_t more[3] = {100, 101, 102};
    CacheEvent gone = event(CACHE_EVENT_REMOVED, more, 3);
    assert_int_equal(block_presence_on_event(&p, &gone), 0);
    assert_false(block_presence_evicted(&p, 1)); /* overwritten */
    assert_true(block_presence_evicted(&p, 100) && block_presence_evicted(&p, 102));
    /* A host-tier event is not the device's. */
    CacheEvent host = event(CACHE_EVENT_STORED, more, 1);
    host.tier = CACHE_TIER_HOST;
    assert_int_equal(block_presence_on_event(&p, &host), 0);
    assert_false(block_presence_has(&p, 100));
    /* Many blocks: the set grows and still finds them all. */
    uint64_t *many = malloc(5000 * sizeof *many);
    assert_non_null(many);
    for (int i = 0; i < 5000; i++) many[i] = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 7);
    CacheEvent lots = event(CACHE_EVENT_STORED, many, 5000);
    assert_int_equal(block_presence_on_event(&p, &lots), 0);
    assert_int_equal(block_presence_prefix(&p, many, 5000), 5000);
    CacheEvent cleared = {.kind = CACHE_EVENT_CLEARED};
    assert_int_equal(block_presence_on_event(&p, &cleared), 0);
    assert_int_equal(block_presence_prefix(&p, many, 5000), 0);
    free(many);
    block_presence_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_regret_means_separate),
        cmocka_unit_test(test_thrashing_copies_mean_fork),
        cmocka_unit_test(test_decode_heavy_or_little_held_means_separate),
        cmocka_unit_test(test_other_adapters_copies_decide),
        cmocka_unit_test(test_recompute_term_decides),
        cmocka_unit_test(test_estimates_average_their_samples),
        cmocka_unit_test(test_probe_measures_ratios),
        cmocka_unit_test(test_presence_follows_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
