/* Every accepted request ends within a bound (issue 37), the pure pieces:
 *  - the progress watchdog: a request with no token and no queue movement expires after its
 *    timeout; queue movement (a finish on its instance, more prompt tokens admitted) keeps it
 *    alive, decode-only stats do not; a restarted instance's first stats are a new baseline; off
 *    at 0; scans at most every check period;
 *  - a leader's refusal of a SUBMIT it cannot take (an empty prompt) is a FINISH_ERROR for the
 *    same request id with the reason; a message too short for an id gets none;
 *  - workflow ids namespaced by tenant: two tenants' "w1" differ, and no id of one tenant can
 *    spell another tenant's key;
 *  - warm-start manifests: skipped lines summarised by reason (one line, first occurrence quoted),
 *    lines of a tenant the key file does not know refused; the key file knows shared tenants;
 *  - /metrics renders the watchdog and warm-start counters;
 *  - per-key limits (key file weight= / max_concurrent= / rate=): a key past its own concurrency or
 *    rate is refused with a Retry-After, other keys never; refusals take nothing;
 *  - fair sharing (sched_fair.h): the least-served tenant's waiting request is admitted first
 *    (first come, first served within a tenant), weights scale service, a step's prefill budget is
 *    split by weight only while several tenants have work, service decays. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/auth.h"
#include "coord/coordinator.h"
#include "coord/key_limiter.h"
#include "coord/manifest_heads.h"
#include "coord/manifest_line.h"
#include "coord/metrics.h"
#include "coord/request_watchdog.h"
#include "transport/control_msg.h"
#include "worker/instance_leader.h"
#include "worker/sched_fair.h"
#include "worker/scheduler.h"

/* ---- the watchdog ---- */

static void watchdog_expires_without_progress(void **state) {
    (void)state;
    RequestWatchdog w;
    assert_int_equal(request_watchdog_init(&w, 2, 10.0), 0);
    /* dispatched at t=100 on instance 0; nothing happens */
    assert_false(request_watchdog_expired(&w, 0, 100.0, 109.9));
    assert_true(request_watchdog_expired(&w, 0, 100.0, 110.0));
    assert_true(request_watchdog_idle_s(&w, 0, 100.0, 112.5) > 12.4);
    /* a token at t=105 is its own progress */
    assert_false(request_watchdog_expired(&w, 0, 105.0, 114.0));
    request_watchdog_free(&w);
}

static void watchdog_queue_movement_keeps_waiting_requests(void **state) {
    (void)state;
    RequestWatchdog w;
    assert_int_equal(request_watchdog_init(&w, 2, 10.0), 0);
    /* the first stats set the baseline, no movement yet */
    request_watchdog_stats(&w, 0, 500, 101.0);
    assert_true(request_watchdog_expired(&w, 0, 100.0, 110.0));
    /* more prompt tokens admitted at t=108: the queue moved */
    request_watchdog_stats(&w, 0, 900, 108.0);
    assert_false(request_watchdog_expired(&w, 0, 100.0, 117.0));
    assert_true(request_watchdog_expired(&w, 0, 100.0, 118.0));
    /* decode-only stats (the same admitted count) are not movement */
    request_watchdog_stats(&w, 0, 900, 117.0);
    assert_true(request_watchdog_expired(&w, 0, 100.0, 118.0));
    /* a finish on the instance is movement; not on the other instance */
    request_watchdog_finished(&w, 0, 120.0);
    assert_false(request_watchdog_expired(&w, 0, 100.0, 129.0));
    assert_true(request_watchdog_expired(&w, 1, 100.0, 129.0));
    /* a restarted instance's counters start over: its first stats are a baseline, not movement */
    request_watchdog_instance_reset(&w, 1);
    request_watchdog_stats(&w, 1, 3, 125.0);
    assert_true(request_watchdog_expired(&w, 1, 100.0, 129.0));
    /* out-of-range instances are ignored, not trusted */
    request_watchdog_finished(&w, 7, 200.0);
    request_watchdog_stats(&w, -1, 1, 200.0);
    assert_true(request_watchdog_expired(&w, 7, 100.0, 129.0));
    request_watchdog_free(&w);
}

static void watchdog_off_and_period(void **state) {
    (void)state;
    RequestWatchdog w;
    assert_int_equal(request_watchdog_init(&w, 1, 0), 0);
    assert_false(request_watchdog_expired(&w, 0, 0.0, 1e9));
    assert_false(request_watchdog_due(&w, 1000.0));
    request_watchdog_free(&w);
    assert_int_equal(request_watchdog_init(&w, 1, 5.0), 0);
    assert_true(request_watchdog_due(&w, 1000.0));
    assert_false(request_watchdog_due(&w, 1000.0 + REQUEST_WATCHDOG_CHECK_PERIOD_S / 2));
    assert_true(request_watchdog_due(&w, 1000.0 + REQUEST_WATCHDOG_CHECK_PERIOD_S));
    request_watchdog_free(&w);
}

/* ---- the leader's refusal ---- */

static void leader_refuses_an_empty_prompt_with_a_finish(void **state) {
    (void)state;
    /* what the coordinator sends for a prompt a splice emptied: no tokens */
    MsgSubmit m = {.req_id = 4242, .max_tokens = 2, .tenant = "acme", .adapter = "", .workflow = "", .agent = "", .tokens = NULL,
                   .n_tokens = 0, .pull_rank = -1};
    WireBuf sub = {0};
    msg_submit_encode(&sub, &m);
    assert_false(sub.failed);
    WireReader rd = wire_reader(sub.data, sub.len);
    MsgSubmit decoded;
    assert_int_not_equal(msg_submit_decode(&rd, &decoded), 0); /* the leader cannot take it ... */

    WireBuf fin = {0};
    uint64_t id = 0;
    assert_int_equal(instance_leader_refusal(sub.data, sub.len, "malformed", &fin, &id), 0); /* ... so it answers it */
    assert_int_equal(id, 4242);
    WireReader fr = wire_reader(fin.data, fin.len);
    MsgFinish f;
    assert_int_equal(msg_finish_decode(&fr, &f), 0);
    assert_int_equal(f.req_id, 4242);
    assert_int_equal(f.reason, FINISH_ERROR);
    assert_string_equal(f.error, "malformed");
    assert_int_equal(f.completion_tokens, 0);
    msg_finish_free(&f);
    wire_buf_free(&fin);

    /* too short for an id: nothing to answer */
    WireBuf none = {0};
    assert_int_equal(instance_leader_refusal(sub.data, 7, "x", &none, &id), -1);
    assert_int_equal(none.len, 0);
    wire_buf_free(&sub);
}

/* ---- workflow ids namespaced by tenant ---- */

static void workflow_keys_are_per_tenant(void **state) {
    (void)state;
    char *a = coordinator_workflow_key("acme", "w1"), *b = coordinator_workflow_key("globex", "w1");
    char *none = coordinator_workflow_key(NULL, "w1"), *empty = coordinator_workflow_key("", "w1");
    assert_non_null(a);
    assert_non_null(b);
    assert_string_not_equal(a, b);
    assert_string_equal(none, "w1");
    assert_string_equal(empty, "w1");
    /* a tenant "ac" cannot name acme's w1 by moving bytes between tenant and id */
    char *forged = coordinator_workflow_key("ac", "me/w1"), *forged2 = coordinator_workflow_key("acme/w1", "x");
    assert_string_not_equal(forged, a);
    assert_string_not_equal(forged2, a);
    assert_null(coordinator_workflow_key("acme", NULL));
    free(a), free(b), free(none), free(empty), free(forged), free(forged2);
}

/* ---- warm-start manifests ---- */

enum { VOCAB = 1000 };
#define SEED 0x5eedULL

/* One valid position-0 manifest line of tenant with these tokens (stale: a wrong hash). */
static char *line_of(const char *tenant, const int32_t *tokens, int n, long long count, bool stale) {
    ManifestLine l = {.content_hash = manifest_chunk_hash(SEED, tenant, NULL, tokens, n) ^ (stale ? 1 : 0), .tokens = (int32_t *)tokens,
                      .n_tokens = n, .count = count, .tenant = (char *)tenant, .position = 0};
    return manifest_line_format(&l);
}

static bool only_acme(void *ctx, const char *tenant) { return (void)ctx, tenant && strcmp(tenant, "acme") == 0; }

static void manifest_skips_are_summarised_by_reason(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int32_t t1[] = {1, 2, 3, 4}, t2[] = {5, 6, 7, 8}, t3[] = {9, 10, 11, 12};
    char *good = line_of("acme", t1, 4, 7, false), *ghost = line_of("ghost", t2, 4, 9, false);
    fprintf(f, "%s\n{\"content_hash\": \"00\n", good);          /* line 2: not JSON */
    for (int i = 0; i < 50; i++) {                                 /* lines 3..52: stale */
        char *stale = line_of("acme", t3, 4, 1, true);
        fprintf(f, "%s\n", stale);
        free(stale);
    }
    fprintf(f, "%s\n", ghost);                                      /* line 53: an unknown tenant */
    fclose(f);

    FILE *in = fmemopen(text, len, "r");
    ManifestHeads h;
    BraidError err;
    ManifestTenantFilter filter = {.allows = only_acme};
    assert_int_equal(manifest_heads_read_filtered(in, VOCAB, SEED, &filter, &h, &err), 0);
    fclose(in);
    assert_int_equal(h.lines, 53);
    assert_int_equal(h.n_heads, 1);
    assert_int_equal(h.heads[0].count, 7);
    assert_int_equal(h.skipped, 52);
    assert_int_equal(h.skips[MANIFEST_SKIP_INVALID].count, 1);
    assert_int_equal(h.skips[MANIFEST_SKIP_INVALID].first_line, 2);
    assert_int_equal(h.skips[MANIFEST_SKIP_STALE].count, 50);
    assert_int_equal(h.skips[MANIFEST_SKIP_STALE].first_line, 3);
    assert_int_equal(h.skips[MANIFEST_SKIP_TENANT].count, 1);
    assert_int_equal(h.skips[MANIFEST_SKIP_TENANT].first_line, 53);
    char summary[1024];
    manifest_heads_skip_summary(&h, summary, sizeof summary);
    assert_non_null(strstr(summary, "50 stale (first: line 3, stale"));
    assert_non_null(strstr(summary, "1 invalid (first: line 2,"));
    assert_non_null(strstr(summary, "1 of an unknown tenant (first: line 53, tenant 'ghost'"));
    manifest_heads_free(&h);

    /* without a filter the ghost line is warmed */
    in = fmemopen(text, len, "r");
    assert_int_equal(manifest_heads_read(in, VOCAB, SEED, &h, &err), 0);
    fclose(in);
    assert_int_equal(h.n_heads, 2);
    assert_int_equal(h.skips[MANIFEST_SKIP_TENANT].count, 0);
    manifest_heads_free(&h);
    free(good), free(ghost), free(text);
}

static void key_file_knows_own_and_shared_tenants(void **state) {
    (void)state;
    const char *text = "sk-acme-0123456789abcdef tenant=acme shares=public\nsk-globex-0123456789abcd tenant=globex\n";
    BraidError err;
    AuthKeys *keys = auth_keys_parse(text, strlen(text), "test", &err);
    assert_non_null(keys);
    assert_true(auth_keys_knows_tenant(keys, "acme"));
    assert_true(auth_keys_knows_tenant(keys, "globex"));
    assert_true(auth_keys_knows_tenant(keys, "public"));
    assert_false(auth_keys_knows_tenant(keys, "ghost"));
    assert_false(auth_keys_knows_tenant(keys, NULL));
    auth_keys_free(keys);
}

/* ---- /metrics ---- */

static void metrics_render_the_new_counters(void **state) {
    (void)state;
    Metrics *m = metrics_create(1, "model");
    assert_non_null(m);
    metrics_count_watchdog(m);
    metrics_count_watchdog(m);
    metrics_set_warm_start(m, &(WarmStartMetrics){.warmed = 3, .left_out = 97, .skipped_stale = 100000, .skipped_tenant = 2});
    char *text = metrics_render(m);
    assert_non_null(text);
    assert_non_null(strstr(text, "braid_requests_watchdog_total 2\n"));
    assert_non_null(strstr(text, "braid_warm_start_heads_total{outcome=\"warmed\"} 3\n"));
    assert_non_null(strstr(text, "braid_warm_start_heads_total{outcome=\"left_out\"} 97\n"));
    assert_non_null(strstr(text, "braid_warm_start_lines_skipped_total{reason=\"stale\"} 100000\n"));
    assert_non_null(strstr(text, "braid_warm_start_lines_skipped_total{reason=\"unknown_tenant\"} 2\n"));
    free(text);
    metrics_destroy(m);
}

/* ---- per-key limits ---- */

static void key_file_limits_parse(void **state) {
    (void)state;
    const char *text = "sk-acme-0123456789abcdef tenant=acme weight=3 max_concurrent=2 rate=0.5\n"
                       "sk-globex-0123456789abcd tenant=globex\n";
    BraidError err;
    AuthKeys *keys = auth_keys_parse(text, strlen(text), "test", &err);
    assert_non_null(keys);
    const AuthKey *a = auth_keys_authenticate(keys, "Bearer sk-acme-0123456789abcdef");
    const AuthKey *g = auth_keys_authenticate(keys, "Bearer sk-globex-0123456789abcd");
    assert_non_null(a);
    assert_non_null(g);
    assert_int_equal(auth_key_index(a), 0);
    assert_int_equal(auth_key_index(g), 1);
    assert_int_equal(auth_key_max_concurrent(a), 2);
    assert_true(auth_key_rate(a) == 0.5);
    assert_true(auth_key_weight(a) == 3);
    assert_int_equal(auth_key_max_concurrent(g), 0);
    assert_true(auth_key_rate(g) == 0);
    assert_true(auth_key_weight(g) == 1);
    assert_true(auth_keys_tenant_weight(keys, "acme") == 3);
    assert_true(auth_keys_tenant_weight(keys, "nobody") == 1);
    auth_keys_free(keys);
    const char *bad[] = {"sk-acme-0123456789abcdef tenant=acme weight=0\n", "sk-acme-0123456789abcdef tenant=acme rate=-1\n",
                         "sk-acme-0123456789abcdef tenant=acme max_concurrent=1.5\n", "sk-acme-0123456789abcdef tenant=acme rate=x\n",
                         "sk-acme-0123456789abcdef tenant=acme rate=1 rate=2\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_null(auth_keys_parse(bad[i], strlen(bad[i]), "test", &err));
        assert_non_null(strstr(err.msg, "line 1"));
    }
}

static void key_limits_are_per_key(void **state) {
    (void)state;
    KeyLimiter *l = key_limiter_create(2);
    double retry;
    /* key 0: at most 2 in flight */
    assert_int_equal(key_limiter_acquire(l, 0, 2, 0, 10.0, &retry), KEY_LIMIT_OK);
    assert_int_equal(key_limiter_acquire(l, 0, 2, 0, 10.0, &retry), KEY_LIMIT_OK);
    assert_int_equal(key_limiter_acquire(l, 0, 2, 0, 10.0, &retry), KEY_LIMIT_CONCURRENCY);
    assert_true(retry >= 1);
    assert_int_equal(key_limiter_inflight(l, 0), 2); /* the refusal took nothing */
    /* key 1 is not affected by key 0's limit */
    for (int i = 0; i < 5; i++) assert_int_equal(key_limiter_acquire(l, 1, 0, 0, 10.0, &retry), KEY_LIMIT_OK);
    key_limiter_release(l, 0);
    assert_int_equal(key_limiter_acquire(l, 0, 2, 0, 10.0, &retry), KEY_LIMIT_OK);
    key_limiter_destroy(l);

    /* rate 0.5/s: a burst of one, then one every 2 s */
    l = key_limiter_create(1);
    assert_int_equal(key_limiter_acquire(l, 0, 0, 0.5, 100.0, &retry), KEY_LIMIT_OK);
    assert_int_equal(key_limiter_acquire(l, 0, 0, 0.5, 100.5, &retry), KEY_LIMIT_RATE);
    assert_true(retry > 1.4 && retry < 1.6);
    assert_int_equal(key_limiter_acquire(l, 0, 0, 0.5, 102.0, &retry), KEY_LIMIT_OK);
    /* rate 4/s: a burst of four */
    key_limiter_destroy(l);
    l = key_limiter_create(1);
    for (int i = 0; i < 4; i++) assert_int_equal(key_limiter_acquire(l, 0, 0, 4, 50.0, &retry), KEY_LIMIT_OK);
    assert_int_equal(key_limiter_acquire(l, 0, 0, 4, 50.0, &retry), KEY_LIMIT_RATE);
    /* an index out of range is never limited */
    assert_int_equal(key_limiter_acquire(l, 5, 1, 0.001, 50.0, &retry), KEY_LIMIT_OK);
    key_limiter_release(l, 5);
    key_limiter_destroy(l);
}

/* ---- fair sharing ---- */

static void fair_admission_prefers_the_least_served_tenant(void **state) {
    (void)state;
    SchedFair f = {0};
    SchedRequest a1 = {.tenant = "A"}, a2 = {.tenant = "A"}, b1 = {.tenant = "B"}, b2 = {.tenant = "B"};
    SchedRequest *waiting[] = {&a1, &a2, &b1, &b2};
    /* nobody served yet: first come, first served */
    assert_int_equal(sched_fair_pick(&f, waiting, 4, 0.0), 0);
    /* A was served 1000 tokens: B's first request goes next */
    sched_fair_charge(&f, &a1, 1000, true, 0.0);
    assert_int_equal(sched_fair_pick(&f, waiting, 4, 0.0), 2);
    /* B served more than A: A's first again */
    sched_fair_charge(&f, &b1, 1500, true, 0.0);
    assert_int_equal(sched_fair_pick(&f, waiting, 4, 0.0), 0);
    /* weights: B at weight 4 has a share of 1500/4 < 1000 */
    b1.tenant_weight = b2.tenant_weight = 4;
    assert_int_equal(sched_fair_pick(&f, waiting, 4, 0.0), 2);
    /* service decays: half after a half-life */
    double share = sched_fair_share_of(&f, "A", SCHED_FAIR_HALF_LIFE_S);
    assert_true(share > 499 && share < 501);
    sched_fair_free(&f);
}

static void fair_budget_split_only_between_active_tenants(void **state) {
    (void)state;
    SchedFair f = {0};
    /* waiting requests with 1000-token prompts each: every tenant wants more than the step has */
    SchedRequest a1 = {.tenant = "A", .n_tokens = 1000}, a2 = {.tenant = "A", .n_tokens = 1000},
                 b1 = {.tenant = "B", .tenant_weight = 3, .n_tokens = 1000};
    SchedRequest *one[] = {&a1, &a2};
    /* one tenant: no cap, the whole budget (not the shared step size) */
    sched_fair_begin_step(&f, one, 2, NULL, 0, 512, 64, 0.0);
    assert_int_equal(sched_fair_allowance(&f, &a1, 512), 512);
    /* A (weight 1) and B (weight 3) both have work: A gets a quarter of the step, B three */
    SchedRequest *running[] = {&a1, &a2}, *waiting[] = {&b1};
    sched_fair_begin_step(&f, running, 2, waiting, 1, 512, 512, 0.0);
    assert_int_equal(sched_fair_allowance(&f, &a1, 512), 128);
    assert_int_equal(sched_fair_allowance(&f, &b1, 512), 384);
    sched_fair_charge(&f, &a1, 100, true, 0.0);
    assert_int_equal(sched_fair_allowance(&f, &a2, 512), 28); /* A's part is shared by its requests */
    sched_fair_charge(&f, &a2, 28, true, 0.0);
    assert_int_equal(sched_fair_allowance(&f, &a2, 512), 0);
    /* the second pass: B's unused part goes to anyone, within what the step has left */
    assert_true(sched_fair_release_caps(&f));
    assert_int_equal(sched_fair_allowance(&f, &a2, 512), 384);
    /* the shared step size bounds the step while tenants share (default when 0) */
    sched_fair_begin_step(&f, running, 2, waiting, 1, 512, 0, 0.0);
    assert_int_equal(sched_fair_allowance(&f, &a1, 512), SCHED_FAIR_DEFAULT_STEP_TOKENS / 4);
    assert_int_equal(sched_fair_allowance(&f, &b1, 512), SCHED_FAIR_DEFAULT_STEP_TOKENS * 3 / 4);
    /* at least a token each, however small the weight */
    SchedRequest tiny = {.tenant = "T", .tenant_weight = 0.01f, .n_tokens = 1000};
    SchedRequest *three[] = {&a1, &b1, &tiny};
    sched_fair_begin_step(&f, three, 3, NULL, 0, 512, 512, 0.0);
    assert_int_equal(sched_fair_allowance(&f, &tiny, 512), 1);
    /* order: least share first (A has 128 tokens, B 0 at weight 3, T 0) */
    const int *order = sched_fair_order(&f, three, 3, 0.0);
    assert_non_null(order);
    assert_int_equal(order[2], 0);
    sched_fair_free(&f);
}

/* Work conservation inside the step: a tenant that needs less than its part (B decodes only, or
 * prefills a short prompt) leaves the rest to the others already in the capped pass. */
static void fair_split_gives_unused_parts_to_the_others(void **state) {
    (void)state;
    SchedFair f = {0};
    SchedRequest a1 = {.tenant = "A", .state = REQ_RUNNING, .n_tokens = 1000, .n_computed = 100};
    SchedRequest b_decoding = {.tenant = "B", .state = REQ_RUNNING, .n_tokens = 21, .n_computed = 20};
    SchedRequest b_short = {.tenant = "B", .n_tokens = 10};
    SchedRequest *running[] = {&a1, &b_decoding}, *waiting[] = {&b_short};
    /* B only decodes: A may take the whole shared step */
    sched_fair_begin_step(&f, running, 2, NULL, 0, 500, 64, 0.0);
    assert_int_equal(sched_fair_allowance(&f, &a1, 500), 64);
    assert_int_equal(sched_fair_allowance(&f, &b_decoding, 500), 0);
    /* B's 10-token prompt waits: B gets its 10, A the other 54 */
    sched_fair_begin_step(&f, running, 2, waiting, 1, 500, 64, 0.0);
    assert_int_equal(sched_fair_allowance(&f, &b_short, 500), 10);
    assert_int_equal(sched_fair_allowance(&f, &a1, 500), 54);
    /* with B's part used, the pick skips B's waiting request (-1: no tenant may prefill) */
    sched_fair_charge(&f, &b_short, 10, true, 0.0);
    sched_fair_charge(&f, &a1, 54, true, 0.0);
    assert_int_equal(sched_fair_pick(&f, waiting, 1, 0.0), -1);
    assert_false(sched_fair_release_caps(&f)); /* and nothing is left for a second pass */
    sched_fair_free(&f);
}

/* Through the scheduler: tenant A's long prompt is prefilling when tenant B's short one arrives.
 * First come, first served: A's chunks fill every step's budget until its prefill is done, and B
 * waits. Fair: B is admitted in the next step with its part of the budget and samples its first
 * token there. */
static SchedRequest *tenant_request(const char *id, const char *tenant, int32_t base, int n_prompt) {
    SchedRequest *r = calloc(1, sizeof *r);
    r->id = strdup(id);
    r->tenant = strdup(tenant);
    r->cap_tokens = n_prompt + 8;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    for (int i = 0; i < n_prompt; i++) r->tokens[i] = base + i;
    r->n_tokens = r->n_prompt = n_prompt;
    r->max_tokens = 4;
    return r;
}

/* Steps until B has its first token (or 20 steps); returns the step count. */
static int steps_to_first_token_of_b(bool fair) {
    Scheduler s;
    StepPlan p = {0};
    BraidError err;
    SchedConfig cfg = {.device_blocks = 64, .block_size = 16, .max_batch_tokens = 64, .max_running = 4, .cache_enabled = true,
                       .policy = &evict_policy_lru, .fair_share = fair};
    if (sched_init(&s, &cfg, &err)) fail_msg("%s", err.msg);
    SchedRequest *a = tenant_request("a", "A", 100, 320), *b = tenant_request("b", "B", 900, 20);
    assert_int_equal(sched_add(&s, a), 0);
    int steps = 0, first_b = -1;
    for (; steps < 20 && first_b < 0; steps++) {
        if (steps == 1) assert_int_equal(sched_add(&s, b), 0); /* B arrives while A prefills */
        if (sched_plan(&s, &p, &err) < 0) fail_msg("%s", err.msg);
        sched_commit(&s, &p);
        for (int i = 0; i < p.n; i++) {
            SchedRequest *r = p.entries[i].req;
            if (!p.entries[i].sample) continue;
            assert_int_equal(sched_append_token(r, 7), 0);
            if (r == b) first_b = steps;
        }
        if (sched_check(&s, &err)) fail_msg("%s", err.msg);
    }
    if (a->state != REQ_FINISHED) sched_finish(&s, a, "length");
    if (b->state != REQ_FINISHED) sched_finish(&s, b, "length");
    sched_request_free(a), sched_request_free(b);
    free(a), free(b);
    plan_free(&p);
    sched_free(&s);
    return first_b;
}

static void fair_scheduler_lets_a_short_request_in(void **state) {
    (void)state;
    int fcfs = steps_to_first_token_of_b(false), fair = steps_to_first_token_of_b(true);
    assert_int_equal(fair, 1);  /* the step after it arrived */
    assert_true(fcfs >= 4);     /* after A's 320-token prefill at 64 tokens a step */
}

/* Prefill tokens each step plans for tenant A's 20000-token prompt: alone (steps 0-1), then while
 * B's 20-token request is in flight (it arrives before step 2 and decodes to its 4th token), then
 * while B lingers and after. */
static void prefill_per_step_with_b(bool fair, int *tokens_of_a, int n_steps) {
    Scheduler s;
    StepPlan p = {0};
    BraidError err;
    SchedConfig cfg = {.device_blocks = 1400, .block_size = 16, .max_batch_tokens = 512, .max_running = 8, .cache_enabled = true,
                       .policy = &evict_policy_lru, .fair_share = fair, .fair_step_tokens = 64};
    if (sched_init(&s, &cfg, &err)) fail_msg("%s", err.msg);
    SchedRequest *a = tenant_request("a", "A", 100, 20000), *b = tenant_request("b", "B", 90000, 20);
    assert_int_equal(sched_add(&s, a), 0);
    for (int step = 0; step < n_steps; step++) {
        if (step == 2) assert_int_equal(sched_add(&s, b), 0);
        if (sched_plan(&s, &p, &err) < 0) fail_msg("%s", err.msg);
        sched_commit(&s, &p);
        tokens_of_a[step] = 0;
        for (int i = 0; i < p.n; i++) {
            SchedRequest *r = p.entries[i].req;
            if (r == a && p.entries[i].start < r->n_prompt) tokens_of_a[step] += p.entries[i].count;
            if (p.entries[i].sample) assert_int_equal(sched_append_token(r, 7), 0);
            if (r == b && b->n_tokens - b->n_prompt >= b->max_tokens) sched_finish(&s, b, "length");
        }
        if (sched_check(&s, &err)) fail_msg("%s", err.msg);
    }
    if (a->state != REQ_FINISHED) sched_finish(&s, a, "length");
    if (b->state != REQ_FINISHED) sched_finish(&s, b, "length");
    sched_request_free(a), sched_request_free(b);
    free(a), free(b);
    plan_free(&p);
    sched_free(&s);
}

/* Fair sharing keeps every step's prefill full: alone, A gets the whole budget; while B is in
 * flight the step is the shared step size, with B's unused part going to A (never an idle step);
 * B lingers for SCHED_FAIR_LINGER_STEPS steps, then A has the whole budget again. First come,
 * first served fills every step with A's chunk, B's prompt waiting behind it. */
enum { WORK_STEPS = 6 + SCHED_FAIR_LINGER_STEPS + 2 };
static void fair_scheduler_is_work_conserving(void **state) {
    (void)state;
    int fair[WORK_STEPS], fcfs[WORK_STEPS];
    prefill_per_step_with_b(true, fair, WORK_STEPS);
    prefill_per_step_with_b(false, fcfs, 3);
    assert_int_equal(fair[0], 512);
    assert_int_equal(fair[1], 512);
    assert_int_equal(fair[2], 64 - 20); /* B's prompt takes its 20, A the rest of the shared step */
    for (int i = 3; i < 6; i++) assert_int_equal(fair[i], 64); /* B only decodes: the shared step is A's */
    /* B finished in step 5; it lingers (its next request would find a short step), then A is alone */
    for (int i = 6; i <= 5 + SCHED_FAIR_LINGER_STEPS; i++) assert_int_equal(fair[i], 64);
    assert_int_equal(fair[WORK_STEPS - 1], 512);
    assert_int_equal(fcfs[0], 512);
    assert_int_equal(fcfs[2], 512); /* first come, first served: B waits behind A's whole chunk */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(watchdog_expires_without_progress),
        cmocka_unit_test(watchdog_queue_movement_keeps_waiting_requests),
        cmocka_unit_test(watchdog_off_and_period),
        cmocka_unit_test(leader_refuses_an_empty_prompt_with_a_finish),
        cmocka_unit_test(workflow_keys_are_per_tenant),
        cmocka_unit_test(manifest_skips_are_summarised_by_reason),
        cmocka_unit_test(key_file_knows_own_and_shared_tenants),
        cmocka_unit_test(metrics_render_the_new_counters),
        cmocka_unit_test(key_file_limits_parse),
        cmocka_unit_test(key_limits_are_per_key),
        cmocka_unit_test(fair_admission_prefers_the_least_served_tenant),
        cmocka_unit_test(fair_budget_split_only_between_active_tenants),
        cmocka_unit_test(fair_split_gives_unused_parts_to_the_others),
        cmocka_unit_test(fair_scheduler_lets_a_short_request_in),
        cmocka_unit_test(fair_scheduler_is_work_conserving),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
