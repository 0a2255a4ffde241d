/*
 * test_import_followers.c — issue 33 (a): which parked KV import a request routed onto its blocks
 * waits behind (worker/import_followers.h), and the list that keeps followers in order:
 *   - shared blocks count whole blocks only, from the head, up to the first difference;
 *   - the gain is capped by the blocks the import asked for and by the follower's own match limit
 *     ((n_prompt - 1) / block_size), and is 0 across tenants or adapters (NULL and "" alike);
 *   - a request follows only when an import brings more than its local cache holds (the largest
 *     gain wins, the earliest on a tie), never when the local cache already has the shared head;
 *   - followers are taken per import, in the order they came, in batches; a cancelled one is
 *     removed; the total counts every follower ever added.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cache/radix_tree.h"
#include "worker/import_followers.h"

#define BS 4

/* A prompt of n tokens: the first `same` are 1000 + i (the shared head), the rest base + i. */
static SchedRequest prompt(int32_t *buf, int n, int same, int base, const char *tenant) {
    for (int i = 0; i < n; i++) buf[i] = i < same ? 1000 + i : base + i;
    return (SchedRequest){.id = "r", .tokens = buf, .n_tokens = n, .n_prompt = n, .tenant = (char *)tenant};
}

static void test_shared_blocks(void **state) {
    (void)state;
    int32_t a[40], b[40];
    SchedRequest ra = prompt(a, 40, 40, 0, NULL), rb = prompt(b, 40, 22, 5000, NULL);
    assert_int_equal(radix_shared_blocks(ra.tokens, 40, rb.tokens, 40, BS), 5); /* 22 tokens: 5 whole blocks */
    assert_int_equal(radix_shared_blocks(ra.tokens, 40, ra.tokens, 40, BS), 10);
    assert_int_equal(radix_shared_blocks(ra.tokens, 40, ra.tokens, 11, BS), 2); /* the shorter one bounds it */
    b[0] = 7;                                                                               /* differs in the first block */
    assert_int_equal(radix_shared_blocks(ra.tokens, 40, rb.tokens, 40, BS), 0);
    assert_int_equal(radix_shared_blocks(ra.tokens, 40, ra.tokens, 40, 0), 0);
}

static void test_gain_caps(void **state) {
    (void)state;
    int32_t imp[100], fol[40];
    SchedRequest q = prompt(imp, 100, 100, 0, NULL);
    SchedRequest r = prompt(fol, 40, 32, 5000, NULL); /* 8 blocks of head shared */
    ImportCandidate c = {.req = &q, .asked_blocks = 24};
    assert_int_equal(import_followers_gain(&r, &c, BS), 8);
    c.asked_blocks = 5; /* the move brings 5 blocks only */
    assert_int_equal(import_followers_gain(&r, &c, BS), 5);
    c.asked_blocks = 24;
    SchedRequest whole = prompt(fol, 40, 40, 5000, NULL); /* all 40 tokens shared: a match stops at 39 */
    assert_int_equal(import_followers_gain(&whole, &c, BS), 9);
    SchedRequest other = prompt(fol, 40, 32, 5000, "acme"); /* another tenant's cache */
    assert_int_equal(import_followers_gain(&other, &c, BS), 0);
    q.tenant = "";
    SchedRequest none = prompt(fol, 40, 32, 5000, NULL); /* NULL and "" both name no tenant */
    assert_int_equal(import_followers_gain(&none, &c, BS), 8);
    q.adapter = "sql";
    assert_int_equal(import_followers_gain(&none, &c, BS), 0);
}

static void test_choose(void **state) {
    (void)state;
    int32_t a[100], b[100], c[100], fol[60];
    /* Three parked imports: a shares 4 blocks with the follower, b 10, c 10 (b came first). */
    SchedRequest qa = prompt(a, 100, 16, 7000, NULL), qb = prompt(b, 100, 40, 8000, NULL), qc = prompt(c, 100, 40, 9000, NULL);
    ImportCandidate cands[] = {{.req = &qa, .asked_blocks = 30, .owner = &qa},
                               {.req = &qb, .asked_blocks = 30, .owner = &qb},
                               {.req = &qc, .asked_blocks = 30, .owner = &qc}};
    SchedRequest r = prompt(fol, 60, 44, 5000, NULL);
    int gain = -1;
    assert_int_equal(import_followers_choose(&r, cands, 3, 0, BS, &gain), 1); /* the largest gain, the earliest on a tie */
    assert_int_equal(gain, 10);
    assert_int_equal(import_followers_choose(&r, cands, 3, 9, BS, &gain), 1); /* 10 on the way > 9 cached here */
    /* The local cache holds the shared head already: nothing to wait for. */
    assert_int_equal(import_followers_choose(&r, cands, 3, 10, BS, &gain), -1);
    assert_int_equal(gain, 0);
    assert_int_equal(import_followers_choose(&r, cands, 0, 0, BS, &gain), -1);
    /* A follower that shares nothing with any import never waits. */
    SchedRequest stranger = prompt(fol, 60, 0, 5000, NULL);
    assert_int_equal(import_followers_choose(&stranger, cands, 3, 0, BS, &gain), -1);
}

/* A busy instance lands moves between steps, so a follower may wait about a step: it waits only to save at least
 * half a step's tokens (512-token steps, 16-token blocks: 16 blocks beyond what is cached). An idle one: any gain. */
static void test_worth_waiting(void **state) {
    (void)state;
    assert_false(import_followers_worth_waiting(7, 0, 16, 512, false));  /* a 7-block head on a busy instance */
    assert_true(import_followers_worth_waiting(7, 0, 16, 512, true));    /* the same on an idle one */
    assert_true(import_followers_worth_waiting(24, 0, 16, 512, false));  /* a 24-block head pays for a step */
    assert_true(import_followers_worth_waiting(16, 0, 16, 512, false));  /* exactly half a step */
    assert_false(import_followers_worth_waiting(24, 9, 16, 512, false)); /* 15 beyond the 9 cached */
    assert_false(import_followers_worth_waiting(3, 3, 16, 512, true));   /* nothing to gain */
}

static void test_list_order(void **state) {
    (void)state;
    ImportFollowers f = {0};
    int imp1, imp2, fol[40];
    for (int i = 0; i < 40; i++) assert_int_equal(import_followers_add(&f, &fol[i], i % 2 ? &imp2 : &imp1), 0);
    assert_int_equal(f.total, 40);
    assert_true(import_followers_remove(&f, &fol[2])); /* cancelled while waiting */
    assert_false(import_followers_remove(&f, &fol[2]));
    void *out[8];
    int seen = 0, expect = 0, got;
    do { /* imp1's followers in batches of 8, in the order they came, without fol[2] */
        got = import_followers_take(&f, &imp1, out, 8);
        for (int i = 0; i < got; i++, seen++) {
            if (expect == 2) expect += 2;
            assert_ptr_equal(out[i], &fol[expect]);
            expect += 2;
        }
    } while (got == 8);
    assert_int_equal(seen, 19);
    assert_int_equal(f.n, 20); /* imp2's stay, in order */
    for (int i = 0; i < f.n; i++) assert_ptr_equal(f.items[i].follower, &fol[2 * i + 1]);
    assert_int_equal(import_followers_take(&f, &imp1, out, 8), 0);
    assert_int_equal(f.total, 40); /* the counter counts followers added, not those still waiting */
    import_followers_free(&f);
    assert_int_equal(f.n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_blocks),
        cmocka_unit_test(test_gain_caps),
        cmocka_unit_test(test_choose),
        cmocka_unit_test(test_worth_waiting),
        cmocka_unit_test(test_list_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
