/*
 * The KV cache object (src/cache/kv_cache.h): deterministic cases (never the whole prompt, node
 * split, namespaces by interned names even when their hash seeds collide, locking, LRU order,
 * demotion to the host tier and load-back with the exact operations) and a property test that
 * drives it with thousands of random operations (match / acquire / reserve / commit / release /
 * evict per tier / workflow end) while carrying out its block operations on a fake memory: every
 * block a request reads must hold the content that was computed for it, nothing matches that was
 * never inserted, nothing is lost without pressure, and per-tier accounting
 * (free + cached + in use == total) holds after every operation.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
#include "cache/kv_cache.h"

#define BS 4

static void check_all(const KvCache *c) {
    BraidError err;
    if (kv_cache_check(c, &err)) fail_msg("%s", err.msg);
    for (int t = 0; t < CACHE_N_TIERS; t++)
        assert_int_equal(kv_cache_free_blocks(c, t) + kv_cache_cached(c, t) + kv_cache_in_use(c, t), kv_cache_total(c, t));
}

static void init_cache(KvCache *c, int device_blocks, int host_blocks) {
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = device_blocks, .host_blocks = host_blocks};
    if (kv_cache_init(c, &cfg, &err)) fail_msg("%s", err.msg);
}

static CacheIdentity ident(KvCache *c, const char *tenant, const char *adapter) {
    CacheIdentity id;
    BraidError err;
    if (kv_cache_identity(c, tenant, adapter, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
    return id;
}

/* A request that computes n_blocks blocks of tokens from scratch (or after its cached prefix),
 * commits them and releases everything. Returns the cached blocks it found. */
static int serve(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_blocks) {
    BraidError err;
    KvCacheMatch m;
    int32_t table[64];
    assert_int_equal(kv_cache_match(c, id, tokens, n_blocks * BS + 1, &m, &err), 0);
    int got = kv_cache_acquire(c, &m, table, &err);
    assert_true(got >= 0);
    assert_int_equal(kv_cache_reserve(c, n_blocks - got, table + got), 0);
    RadixNode *lock = m.node;
    assert_int_equal(kv_cache_commit(c, id, tokens, n_blocks, table, &lock, false, &err), 0);
    kv_cache_release(c, lock, table, n_blocks);
    check_all(c);
    return got;
}

static int match_len(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, KvCacheMatch *m) {
    BraidError err;
    assert_int_equal(kv_cache_match(c, id, tokens, n_tokens, m, &err), 0);
    return m->device_blocks + m->host_blocks;
}

static void test_match_commit_split(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, 32, 0);
    CacheIdentity id = ident(&c, "acme", NULL), other = ident(&c, "globex", NULL), adapted = ident(&c, "acme", "coder");
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++) a[i] = b[i] = 100 + i;
    b[9] = 7; /* b diverges inside block 2 */
    assert_int_equal(serve(&c, &id, a, 3), 0);
    assert_int_equal(kv_cache_cached(&c, CACHE_TIER_DEVICE), 3);
    KvCacheMatch m;
    assert_int_equal(match_len(&c, &id, a, 13, &m), 3);
    kv_cache_release(&c, m.node, NULL, 0);
    /* exactly the cached 12 tokens: never the whole prompt, so 2 blocks, splitting the node */
    assert_int_equal(match_len(&c, &id, a, 12, &m), 2);
    kv_cache_release(&c, m.node, NULL, 0);
    check_all(&c);
    assert_int_equal(match_len(&c, &other, a, 13, &m), 0); /* another tenant sees nothing */
    kv_cache_release(&c, m.node, NULL, 0);
    assert_int_equal(match_len(&c, &adapted, a, 13, &m), 0); /* nor another adapter */
    kv_cache_release(&c, m.node, NULL, 0);
    assert_int_equal(serve(&c, &id, b, 4), 2); /* shares blocks 0-1 with a */
    assert_int_equal(kv_cache_cached(&c, CACHE_TIER_DEVICE), 5);
    check_all(&c);
    kv_cache_free(&c);
}

typedef struct {
    uint32_t h;
    int i;
} Seed;

static int seed_cmp(const void *x, const void *y) {
    uint32_t a = ((const Seed *)x)->h, b = ((const Seed *)y)->h;
    return a < b ? -1 : a > b;
}

/* Two tenant names whose hash seeds collide still never share cache: the tree is keyed by
 * interned names. */
static void test_colliding_seeds_stay_isolated(void **state) {
    (void)state;
    enum { N = 200000 };
    Seed *s = malloc(N * sizeof *s);
    assert_non_null(s);
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "tenant-%d", i);
        s[i] = (Seed){(uint32_t)(content_hash_namespace(name, NULL) >> 32), i};
    }
    qsort(s, N, sizeof *s, seed_cmp);
    int found = -1;
    for (int i = 1; i < N && found < 0; i++)
        if (s[i].h == s[i - 1].h) found = i;
    assert_true(found > 0); /* 200 000 names in 32 bits: a collision is all but certain */
    char first[32], second[32];
    snprintf(first, sizeof first, "tenant-%d", s[found - 1].i);
    snprintf(second, sizeof second, "tenant-%d", s[found].i);
    free(s);
    assert_true(content_hash_namespace(first, NULL) == content_hash_namespace(second, NULL));

    KvCache c;
    init_cache(&c, 32, 0);
    CacheIdentity a = ident(&c, first, NULL), b = ident(&c, second, NULL);
    assert_int_not_equal(a.tenant, b.tenant);
    int32_t tokens[12];
    for (int i = 0; i < 12; i++) tokens[i] = i;
    serve(&c, &a, tokens, 2);
    KvCacheMatch m;
    assert_int_equal(match_len(&c, &b, tokens, 9, &m), 0);
    kv_cache_release(&c, m.node, NULL, 0);
    assert_int_equal(match_len(&c, &a, tokens, 9, &m), 2);
    kv_cache_release(&c, m.node, NULL, 0);
    kv_cache_free(&c);
}

static void fill(int32_t *tokens, int n, int32_t base) {
    for (int i = 0; i < n; i++) tokens[i] = base + i;
}

static void test_lru_order_and_locks(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, 7, 0); /* 6 usable blocks */
    CacheIdentity id = ident(&c, NULL, NULL);
    int32_t x[8], y[8], z[8];
    fill(x, 8, 1000);
    fill(y, 8, 2000);
    fill(z, 8, 3000);
    serve(&c, &id, x, 2);
    serve(&c, &id, y, 2);
    serve(&c, &id, z, 2);
    KvCacheMatch m;
    assert_int_equal(match_len(&c, &id, x, 9, &m), 2); /* x is now the most recent, and locked */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2); /* y: least recently used */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2); /* z */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 0); /* x is locked */
    check_all(&c);
    kv_cache_release(&c, m.node, NULL, 0);
    KvCacheMatch my;
    assert_int_equal(match_len(&c, &id, y, 9, &my), 0);
    kv_cache_release(&c, my.node, NULL, 0);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_int_equal(kv_cache_cached(&c, CACHE_TIER_DEVICE), 0);
    assert_int_equal(c.counters.dropped_blocks, 6);
    check_all(&c);
    kv_cache_free(&c);
}

static void test_demote_and_load_back(void **state) {
    (void)state;
    KvCache c;
    BraidError err;
    init_cache(&c, 5, 9); /* 4 device blocks, 8 host blocks */
    CacheIdentity id = ident(&c, NULL, NULL);
    int32_t a[16], b[16];
    fill(a, 16, 1);
    fill(b, 16, 500);
    serve(&c, &id, a, 3);
    CacheOpList ops = {0};
    assert_int_equal(kv_cache_take_ops(&c, &ops), 0);
    assert_int_equal(ops.n, 0);
    /* b needs 3 blocks: a (the only victim) is demoted, not dropped */
    assert_int_equal(serve(&c, &id, b, 3), 0);
    assert_int_equal(kv_cache_take_ops(&c, &ops), 0);
    assert_int_equal(ops.n, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(ops.ops[i].kind, CACHE_OP_STORE);
    assert_int_equal(c.counters.demoted_blocks, 3);
    assert_int_equal(kv_cache_cached(&c, CACHE_TIER_HOST), 3);
    int32_t host_ids[3] = {ops.ops[0].dst, ops.ops[1].dst, ops.ops[2].dst};
    cache_ops_clear(&ops);

    KvCacheMatch m;
    assert_int_equal(kv_cache_match(&c, &id, a, 13, &m, &err), 0);
    assert_int_equal(m.device_blocks, 0);
    assert_int_equal(m.host_blocks, 3);
    int32_t table[8];
    assert_int_equal(kv_cache_acquire(&c, &m, table, &err), 3);
    assert_int_equal(m.host_blocks, 3);
    assert_int_equal(kv_cache_take_ops(&c, &ops), 0);
    /* b is demoted to make room (3 STOREs), then a's three blocks are loaded into its table */
    int loads = 0;
    for (int i = 0; i < ops.n; i++)
        if (ops.ops[i].kind == CACHE_OP_LOAD) {
            assert_int_equal(ops.ops[i].src, host_ids[loads]);
            assert_int_equal(ops.ops[i].dst, table[loads]);
            loads++;
        } else {
            assert_int_equal(ops.ops[i].kind, CACHE_OP_STORE);
            assert_int_equal(loads, 0); /* every STORE precedes the LOADs that may reuse its block */
        }
    assert_int_equal(loads, 3);
    assert_int_equal(c.counters.loaded_blocks, 3);
    assert_int_equal(c.counters.host_hit_blocks, 3);
    check_all(&c);
    kv_cache_release(&c, m.node, table, 3);
    /* a is on both tiers now: demoting it again needs no copy */
    cache_ops_clear(&ops);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 4), 3);
    assert_int_equal(kv_cache_take_ops(&c, &ops), 0);
    assert_int_equal(ops.n, 0);
    check_all(&c);
    cache_ops_free(&ops);
    kv_cache_free(&c);
}

/* ---- property test ---- */

enum { P_DEV = 24, P_HOST = 40, P_FAMILIES = 6, P_MAX_BLOCKS = 8, P_ACTIVE = 3, P_STEPS = 20000 };

typedef struct {
    uint32_t rng;
    uint64_t dev[4096], host[P_HOST]; /* fake memory: the content tag each block holds */
    uint64_t *inserted;                 /* chained hashes ever committed (the naive reference) */
    int n_inserted, cap_inserted;
} World;

typedef struct {
    bool live;
    CacheIdentity id;
    int32_t tokens[P_MAX_BLOCKS * BS + 1];
    uint64_t tags[P_MAX_BLOCKS];         /* chained hash of each block: its content */
    int32_t table[P_MAX_BLOCKS + 1];
    int n_blocks, n_held;
    RadixNode *lock;
} Active;

static uint32_t rnd(World *w) {
    w->rng = w->rng * 1103515245u + 12345u;
    return w->rng >> 8;
}

static void apply_ops(KvCache *c, World *w) {
    CacheOpList ops = {0};
    assert_int_equal(kv_cache_take_ops(c, &ops), 0);
    for (int i = 0; i < ops.n; i++) {
        const CacheOp *op = &ops.ops[i];
        if (op->kind == CACHE_OP_STORE) w->host[op->dst] = w->dev[op->src];
        else if (op->kind == CACHE_OP_LOAD) w->dev[op->dst] = w->host[op->src];
        else if (op->kind == CACHE_OP_COPY) w->dev[op->dst] = w->dev[op->src];
        else fail_msg("unexpected operation %d", op->kind);
    }
    cache_ops_free(&ops);
}

static bool was_inserted(const World *w, uint64_t tag) {
    for (int i = 0; i < w->n_inserted; i++)
        if (w->inserted[i] == tag) return true;
    return false;
}

static void record_inserted(World *w, const Active *a) {
    for (int b = 0; b < a->n_blocks; b++) {
        if (was_inserted(w, a->tags[b])) continue;
        if (w->n_inserted == w->cap_inserted) {
            w->cap_inserted = w->cap_inserted ? 2 * w->cap_inserted : 256;
            w->inserted = realloc(w->inserted, (size_t)w->cap_inserted * sizeof *w->inserted);
            assert_non_null(w->inserted);
        }
        w->inserted[w->n_inserted++] = a->tags[b];
    }
}

/* A random prompt from a few families sharing prefixes, in one of two tenants. */
static void make_request(KvCache *c, World *w, Active *a) {
    static const char *const tenants[] = {"t0", "t1"};
    const char *tenant = tenants[rnd(w) % 2];
    int family = (int)(rnd(w) % P_FAMILIES), shared = (int)(rnd(w) % P_MAX_BLOCKS);
    a->n_blocks = 1 + (int)(rnd(w) % P_MAX_BLOCKS);
    for (int i = 0; i < a->n_blocks * BS + 1; i++) a->tokens[i] = i < shared * BS ? family * 1000 + i : (int32_t)(rnd(w) % 4) + 50000 + i;
    BraidError err;
    char wf[16];
    snprintf(wf, sizeof wf, "wf%d", family);
    if (kv_cache_identity(c, tenant, NULL, wf, "agent", &a->id, &err)) fail_msg("%s", err.msg);
    content_hash_blocks(a->id.hash_seed, a->tokens, a->n_blocks, BS, a->tags, NULL);
}

/* Admission, as the scheduler does it; then the request "computes" its remaining blocks. */
static bool admit(KvCache *c, World *w, Active *a) {
    BraidError err;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, &a->id, a->tokens, a->n_blocks * BS + 1, &m, &err), 0);
    int got = kv_cache_acquire(c, &m, a->table, &err);
    assert_true(got >= 0 && got <= a->n_blocks);
    a->lock = m.node;
    apply_ops(c, w);
    for (int b = 0; b < got; b++) {
        assert_true(was_inserted(w, a->tags[b])); /* nothing is matched that was never inserted */
        if (w->dev[a->table[b]] != a->tags[b]) fail_msg("block %d of a match holds the wrong content", b);
    }
    if (kv_cache_reserve(c, a->n_blocks - got, a->table + got) != 0) {
        kv_cache_release(c, a->lock, a->table, got);
        kv_cache_identity_release(c, &a->id);
        apply_ops(c, w);
        return false;
    }
    apply_ops(c, w);
    for (int b = got; b < a->n_blocks; b++) w->dev[a->table[b]] = a->tags[b];
    a->n_held = a->n_blocks;
    assert_int_equal(kv_cache_commit(c, &a->id, a->tokens, a->n_blocks, a->table, &a->lock, true, &err), 0);
    record_inserted(w, a);
    a->live = true;
    return true;
}

static void finish(KvCache *c, World *w, Active *a) {
    kv_cache_release(c, a->lock, a->table, a->n_held);
    kv_cache_identity_release(c, &a->id); /* its workflow's id may be reclaimed (kv_cache_check checks) */
    apply_ops(c, w);
    a->live = false;
}

static void test_property_with_fake_memory(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, P_DEV, P_HOST);
    static World w;
    w = (World){.rng = 12345};
    Active active[P_ACTIVE] = {0};
    int admitted = 0, host_hits_seen = 0;
    for (int step = 0; step < P_STEPS; step++) {
        Active *a = &active[rnd(&w) % P_ACTIVE];
        int op = (int)(rnd(&w) % 10);
        if (op < 6) {
            if (a->live) finish(&c, &w, a);
            make_request(&c, &w, a);
            uint64_t host_before = c.counters.host_hit_blocks;
            admitted += admit(&c, &w, a);
            host_hits_seen += c.counters.host_hit_blocks > host_before;
        } else if (op < 8) {
            if (a->live) finish(&c, &w, a);
        } else if (op == 8) {
            kv_cache_evict(&c, rnd(&w) % 2 ? CACHE_TIER_HOST : CACHE_TIER_DEVICE, 1 + (int)(rnd(&w) % 4));
            apply_ops(&c, &w);
        } else {
            char wf[16];
            snprintf(wf, sizeof wf, "wf%d", (int)(rnd(&w) % P_FAMILIES));
            kv_cache_workflow_end(&c, wf);
        }
        check_all(&c);
    }
    for (int i = 0; i < P_ACTIVE; i++)
        if (active[i].live) finish(&c, &w, &active[i]);
    check_all(&c);
    assert_int_equal(kv_cache_in_use(&c, CACHE_TIER_DEVICE), 0);
    /* the run exercised what it claims to */
    assert_true(admitted > P_STEPS / 4);
    assert_true(host_hits_seen > 50);
    assert_true(c.counters.demoted_blocks > 100 && c.counters.host_evicted_blocks > 0 && c.counters.dropped_blocks > 0);
    free(w.inserted);
    kv_cache_free(&c);
}

/* Without pressure nothing is lost: every prefix ever committed matches in full later. */
static void test_no_pressure_matches_reference(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, 4096, 0);
    static World w;
    w = (World){.rng = 99};
    Active a = {0};
    for (int step = 0; step < 1500; step++) {
        make_request(&c, &w, &a);
        int expect = 0;
        while (expect < a.n_blocks && was_inserted(&w, a.tags[expect])) expect++;
        KvCacheMatch m;
        BraidError err;
        assert_int_equal(kv_cache_match(&c, &a.id, a.tokens, a.n_blocks * BS + 1, &m, &err), 0);
        assert_int_equal(m.device_blocks, expect);
        kv_cache_release(&c, m.node, NULL, 0);
        assert_true(admit(&c, &w, &a));
        finish(&c, &w, &a);
        if (step % 100 == 0) check_all(&c);
    }
    free(w.inserted);
    kv_cache_free(&c);
}

static int events_seen[4];
static void count_event(void *ctx, const CacheEvent *ev) {
    (void)ctx;
    events_seen[ev->kind]++;
    if (ev->kind != CACHE_EVENT_CLEARED) {
        assert_true(ev->n_blocks > 0 && ev->hashes != NULL);
        assert_true(ev->tiers_after <= (CACHE_ON_DEVICE | CACHE_ON_HOST));
    }
}

static void test_events(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, 5, 9);
    kv_cache_set_observer(&c, count_event, NULL);
    CacheIdentity id = ident(&c, "acme", NULL);
    int32_t a[16], b[16];
    fill(a, 16, 1);
    fill(b, 16, 900);
    serve(&c, &id, a, 3);
    assert_int_equal(events_seen[CACHE_EVENT_STORED], 1);
    serve(&c, &id, b, 3); /* a demoted: stored on host, removed from device */
    assert_int_equal(events_seen[CACHE_EVENT_STORED], 3);
    assert_int_equal(events_seen[CACHE_EVENT_REMOVED], 1);
    kv_cache_free(&c);
    assert_int_equal(events_seen[CACHE_EVENT_CLEARED], 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_commit_split),
        cmocka_unit_test(test_colliding_seeds_stay_isolated),
        cmocka_unit_test(test_lru_order_and_locks),
        cmocka_unit_test(test_demote_and_load_back),
        cmocka_unit_test(test_property_with_fake_memory),
        cmocka_unit_test(test_no_pressure_matches_reference),
        cmocka_unit_test(test_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
