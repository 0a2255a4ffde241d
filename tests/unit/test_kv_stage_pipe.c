/* The staging pipeline of host-staged KV moves (worker/kv_stage_pipe.h) on the CPU, with a fake
 * vtable whose copies complete after random numbers of polls (so fetches finish out of order) and
 * whose drains copy the buffer out only when they complete (so a buffer reused too early corrupts
 * the destination): every byte lands where it should, drains run in chunk order, the ring overlaps
 * fetches with drains, and a failure or timeout in mid-move quiesces every busy buffer, starts
 * nothing more and keeps failing. And the window layout (worker/kv_stage_layout.h): the lender's
 * pieces and the borrower's agree, so each moved block lands whole in its table slot, through the
 * pipeline, and nothing else is written — also for a loan spanning the lender's device pool and
 * host tier (a different plane layout). */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "worker/kv_stage_layout.h"
#include "worker/kv_stage_pipe.h"

enum { OP_IDLE = 0, OP_FETCH, OP_DRAIN, MAX_BUFS = 8 };

typedef struct {
    int op, polls_left, index; /* index: the fetch's (or drain's) number in start order */
    uint8_t *buf;
    const StageChunkPiece *pieces;
    int n;
} FakeSlot;

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    FakeSlot slot[MAX_BUFS];
    unsigned rng;
    int max_delay;
    int fail_fetch_start_at, fail_fetch_poll_at, fail_drain_poll_at, stall_fetch_at; /* -1: never */
    int fetch_starts, drain_starts, quiesced, busy_now, busy_max;
    int reuse_violations, order_violations;
    uint64_t last_drain_src;
    bool drained_any;
} Fake;

static void fake_init(Fake *f, const uint8_t *src, uint8_t *dst, int max_delay, unsigned seed) {
    memset(f, 0, sizeof *f);
    f->src = src, f->dst = dst, f->max_delay = max_delay, f->rng = seed;
    f->fail_fetch_start_at = f->fail_fetch_poll_at = f->fail_drain_poll_at = f->stall_fetch_at = -1;
}

static int fake_delay(Fake *f) {
    f->rng = f->rng * 1103515245u + 12345u;
    return f->max_delay ? (int)((f->rng >> 16) % (unsigned)(f->max_delay + 1)) : 0;
}

static void fake_begin(Fake *f, int slot, int op, int index, uint8_t *buf, const StageChunkPiece *p, int n) {
    if (f->slot[slot].op != OP_IDLE) f->reuse_violations++;
    f->slot[slot] = (FakeSlot){.op = op, .polls_left = fake_delay(f), .index = index, .buf = buf, .pieces = p, .n = n};
    if (++f->busy_now > f->busy_max) f->busy_max = f->busy_now;
}

static void fake_end(Fake *f, int slot) {
    f->slot[slot].op = OP_IDLE;
    f->busy_now--;
}

static int fetch_start(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *p, int n, BraidError *err) {
    Fake *f = ctx;
    int index = f->fetch_starts++;
    fake_begin(f, slot, OP_FETCH, index, buf, p, n);
    /* refused after part of it was queued (a UCX read refused after others): the buffer must be quiesced */
    if (index == f->fail_fetch_start_at) return braid_error_set(err, "fake: fetch %d refused", index);
    if (index == f->stall_fetch_at) f->slot[slot].polls_left = INT_MAX;
    return 0;
}

static int fetch_poll(void *ctx, int slot, BraidError *err) {
    Fake *f = ctx;
    FakeSlot *s = &f->slot[slot];
    assert_int_equal(s->op, OP_FETCH);
    if (s->polls_left > 0) return s->polls_left--, 0;
    if (s->index == f->fail_fetch_poll_at) return braid_error_set(err, "fake: fetch %d failed", s->index);
    for (int i = 0; i < s->n; i++) memcpy(s->buf + s->pieces[i].buf_off, f->src + s->pieces[i].src, s->pieces[i].len);
    fake_end(f, slot);
    return 1;
}

static int drain_start(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *p, int n, BraidError *err) {
    (void)err;
    Fake *f = ctx;
    if (f->drained_any && p[0].src <= f->last_drain_src) f->order_violations++;
    f->last_drain_src = p[0].src, f->drained_any = true;
    fake_begin(f, slot, OP_DRAIN, f->drain_starts++, buf, p, n);
    return 0;
}

static int drain_poll(void *ctx, int slot, BraidError *err) {
    Fake *f = ctx;
    FakeSlot *s = &f->slot[slot];
    assert_int_equal(s->op, OP_DRAIN);
    if (s->polls_left > 0) return s->polls_left--, 0;
    if (s->index == f->fail_drain_poll_at) return braid_error_set(err, "fake: drain %d failed", s->index);
    for (int i = 0; i < s->n; i++) memcpy(f->dst + s->pieces[i].dst, s->buf + s->pieces[i].buf_off, s->pieces[i].len);
    fake_end(f, slot);
    return 1;
}

static void quiesce(void *ctx, int slot) {
    Fake *f = ctx;
    assert_int_not_equal(f->slot[slot].op, OP_IDLE); /* only busy buffers are quiesced */
    f->quiesced++;
    fake_end(f, slot);
}

static const StageCopyOps FAKE_OPS = {fetch_start, fetch_poll, drain_start, drain_poll, quiesce};

/* A move's shape: pieces at increasing source offsets (lengths 0..max_len, some longer than a
 * buffer) landing in reverse order in the destination, like layers of a run. */
enum { N_PIECES = 40, MAX_LEN = 200, SPACE = N_PIECES * MAX_LEN };

typedef struct {
    uint8_t src[SPACE], dst[SPACE], want[SPACE];
    uint8_t *bufs[MAX_BUFS];
    StagePiece pieces[N_PIECES];
    size_t total;
} Move;

static void move_init(Move *m, unsigned seed, int n_bufs, size_t buf_bytes) {
    memset(m, 0, sizeof *m);
    unsigned r = seed;
    for (int i = 0; i < SPACE; i++) m->src[i] = (uint8_t)((r = r * 1664525u + 1013904223u) >> 24);
    size_t src_off = 0, lens[N_PIECES];
    for (int i = 0; i < N_PIECES; i++) lens[i] = ((r = r * 1664525u + 1013904223u) >> 20) % (MAX_LEN + 1);
    size_t dst_off = 0;
    for (int i = N_PIECES - 1; i >= 0; i--) m->pieces[i].dst = dst_off, dst_off += lens[i];
    for (int i = 0; i < N_PIECES; i++) {
        m->pieces[i].src = src_off, m->pieces[i].len = lens[i];
        memcpy(m->want + m->pieces[i].dst, m->src + src_off, lens[i]);
        src_off += lens[i];
    }
    m->total = src_off;
    for (int b = 0; b < n_bufs; b++) m->bufs[b] = malloc(buf_bytes);
}

static void move_free(Move *m) {
    for (int b = 0; b < MAX_BUFS; b++) free(m->bufs[b]);
}

static KvStagePipe *pipe_for(Move *m, Fake *f, int n_bufs, size_t buf_bytes, double deadline) {
    KvStagePipeConfig cfg = {.bufs = m->bufs, .n_bufs = n_bufs, .buf_bytes = buf_bytes, .deadline = deadline, .ops = &FAKE_OPS, .ctx = f};
    KvStagePipe *p;
    BraidError err;
    assert_int_equal(kv_stage_pipe_create(&p, m->pieces, N_PIECES, &cfg, &err), 0);
    return p;
}

/* One case's set-up: a move of N_PIECES pieces, a ring of n_bufs buffers of buf_bytes, and the fake
 * copies over its source and destination (copies completing after 0..max_delay polls). On the heap:
 * the spaces are too large for a test's stack. */
typedef struct {
    Move move;
    Fake fake;
    int n_bufs;
    size_t buf_bytes;
} Rig;

static Rig *rig_new(unsigned move_seed, int n_bufs, size_t buf_bytes, int max_delay, unsigned fake_seed) {
    Rig *r = malloc(sizeof *r);
    assert_non_null(r);
    move_init(&r->move, move_seed, n_bufs, buf_bytes);
    fake_init(&r->fake, r->move.src, r->move.dst, max_delay, fake_seed);
    r->n_bufs = n_bufs, r->buf_bytes = buf_bytes;
    return r;
}

/* The rig's pipe over the fake copies; deadline 0: none. */
static KvStagePipe *rig_pipe(Rig *r, double deadline) { return pipe_for(&r->move, &r->fake, r->n_bufs, r->buf_bytes, deadline); }

static void rig_free(Rig *r) {
    move_free(&r->move);
    free(r);
}

/* Steps until the pipe settles (bounded: a pipe that never settles fails the test, not hangs it). */
static int run_to_end(KvStagePipe *p, BraidError *err) {
    for (int i = 0; i < 100000; i++) {
        int st = kv_stage_pipe_step(p, 1.0, err);
        if (st != 0) return st;
    }
    fail_msg("the pipe never settled");
    return -1;
}

static void test_every_byte_lands_in_order(void **state) {
    (void)state;
    const int bufs[] = {1, 2, 3, 4};
    const size_t sizes[] = {7, 64, 333, 100000};
    const int delays[] = {0, 3};
    for (int bi = 0; bi < 4; bi++)
        for (int si = 0; si < 4; si++)
            for (int di = 0; di < 2; di++) {
                Rig *r = rig_new(7u + (unsigned)(bi * 16 + si * 4 + di), bufs[bi], sizes[si], delays[di], 99u + (unsigned)si);
                const Move *m = &r->move;
                const Fake *f = &r->fake;
                KvStagePipe *p = rig_pipe(r, 0);
                assert_int_equal(kv_stage_pipe_chunks(p), (int)((m->total + sizes[si] - 1) / sizes[si])); /* packed, not one per piece */
                assert_int_equal(kv_stage_pipe_bytes(p), m->total);
                BraidError err;
                assert_int_equal(run_to_end(p, &err), 1);
                assert_memory_equal(m->dst, m->want, m->total); /* nothing dropped, misplaced or overwritten */
                assert_int_equal(f->reuse_violations, 0);
                assert_int_equal(f->order_violations, 0);
                assert_int_equal(kv_stage_pipe_chunks_landed(p), kv_stage_pipe_chunks(p));
                assert_int_equal(kv_stage_pipe_busy_buffers(p), 0);
                assert_int_equal(f->busy_now, 0);
                assert_int_equal(kv_stage_pipe_step(p, 1.0, &err), 1); /* landed stays landed */
                kv_stage_pipe_destroy(p);
                assert_int_equal(f->quiesced, 0);
                rig_free(r);
            }
}

/* With two buffers, one chunk is fetched while the previous one drains; with one, never. */
static void test_ring_overlaps_fetch_and_drain(void **state) {
    (void)state;
    for (int n_bufs = 1; n_bufs <= 2; n_bufs++) {
        Rig *r = rig_new(5u, n_bufs, 64, 2, 3u);
        KvStagePipe *p = rig_pipe(r, 0);
        BraidError err;
        assert_int_equal(run_to_end(p, &err), 1);
        assert_memory_equal(r->move.dst, r->move.want, r->move.total);
        assert_int_equal(r->fake.busy_max, n_bufs);
        kv_stage_pipe_destroy(p);
        rig_free(r);
    }
}

/* A failure after some chunks: every busy buffer quiesced, nothing new starts, the pipe keeps failing. */
static void check_failure(Fake *f, KvStagePipe *p, const char *needle) {
    BraidError err;
    int busy_before_quiesce_total = f->quiesced;
    assert_int_equal(run_to_end(p, &err), -1);
    assert_non_null(strstr(err.msg, needle));
    assert_int_equal(f->busy_now, 0); /* no buffer left with an operation in flight */
    assert_int_equal(kv_stage_pipe_busy_buffers(p), 0);
    assert_true(kv_stage_pipe_chunks_landed(p) < kv_stage_pipe_chunks(p));
    int starts = f->fetch_starts + f->drain_starts, quiesced = f->quiesced;
    assert_true(quiesced >= busy_before_quiesce_total);
    assert_int_equal(kv_stage_pipe_step(p, 1.0, &err), -1);
    assert_non_null(strstr(err.msg, needle));
    assert_int_equal(f->fetch_starts + f->drain_starts, starts);
    kv_stage_pipe_destroy(p);
    assert_int_equal(f->quiesced, quiesced); /* nothing busy left to quiesce */
    assert_int_equal(f->reuse_violations, 0);
}

static void test_fetch_fails_mid_move(void **state) {
    (void)state;
    Rig *r = rig_new(11u, 3, 64, 2, 17u);
    r->fake.fail_fetch_poll_at = 5;
    check_failure(&r->fake, rig_pipe(r, 0), "fake: fetch 5 failed");
    assert_true(r->fake.quiesced >= 1); /* the other buffers were busy when chunk 5 failed */
    rig_free(r);
}

static void test_fetch_refused_mid_move(void **state) {
    (void)state;
    Rig *r = rig_new(12u, 4, 64, 3, 19u);
    r->fake.fail_fetch_start_at = 6;
    check_failure(&r->fake, rig_pipe(r, 0), "fake: fetch 6 refused");
    rig_free(r);
}

static void test_drain_fails_mid_move(void **state) {
    (void)state;
    Rig *r = rig_new(13u, 2, 64, 1, 23u);
    r->fake.fail_drain_poll_at = 4;
    check_failure(&r->fake, rig_pipe(r, 0), "fake: drain 4 failed");
    rig_free(r);
}

/* A chunk whose read never lands: the pipe waits, then fails at the deadline and quiesces. */
static void test_timeout_mid_move(void **state) {
    (void)state;
    Rig *r = rig_new(14u, 3, 64, 0, 29u);
    r->fake.stall_fetch_at = 4;
    KvStagePipe *p = rig_pipe(r, 5.0);
    BraidError err;
    for (int i = 0; i < 50; i++) assert_int_equal(kv_stage_pipe_step(p, 1.0 + i * 0.01, &err), 0);
    assert_int_equal(kv_stage_pipe_chunks_landed(p), 4); /* chunks 0..3 landed, 4 stalls the ring */
    assert_true(kv_stage_pipe_busy_buffers(p) > 0);
    assert_int_equal(kv_stage_pipe_step(p, 6.0, &err), -1);
    assert_non_null(strstr(err.msg, "timed out with 4 of"));
    assert_int_equal(r->fake.busy_now, 0);
    assert_int_equal(kv_stage_pipe_busy_buffers(p), 0);
    assert_int_equal(kv_stage_pipe_step(p, 7.0, &err), -1);
    kv_stage_pipe_destroy(p);
    rig_free(r);
}

/* Ending a move in flight (the importer's own timeout, a cancelled request) quiesces its buffers. */
static void test_destroy_in_flight_quiesces(void **state) {
    (void)state;
    Rig *r = rig_new(15u, 4, 32, 5, 31u);
    KvStagePipe *p = rig_pipe(r, 0);
    BraidError err;
    for (int i = 0; i < 3; i++) assert_int_equal(kv_stage_pipe_step(p, 1.0, &err), 0);
    int busy = kv_stage_pipe_busy_buffers(p);
    assert_true(busy > 0);
    kv_stage_pipe_destroy(p);
    assert_int_equal(r->fake.quiesced, busy);
    assert_int_equal(r->fake.busy_now, 0);
    rig_free(r);
}

static void test_empty_and_bad_config(void **state) {
    (void)state;
    Fake f;
    uint8_t buf[8], *bufs[1] = {buf};
    fake_init(&f, NULL, NULL, 0, 1u);
    KvStagePipeConfig cfg = {.bufs = bufs, .n_bufs = 1, .buf_bytes = 8, .ops = &FAKE_OPS, .ctx = &f};
    KvStagePipe *p;
    BraidError err;
    StagePiece none = {.len = 0};
    assert_int_equal(kv_stage_pipe_create(&p, &none, 1, &cfg, &err), 0);
    assert_int_equal(kv_stage_pipe_chunks(p), 0);
    assert_int_equal(kv_stage_pipe_step(p, 1.0, &err), 1);
    assert_int_equal(f.fetch_starts, 0);
    kv_stage_pipe_destroy(p);
    cfg.buf_bytes = 0;
    assert_int_equal(kv_stage_pipe_create(&p, &none, 1, &cfg, &err), -1);
    cfg.buf_bytes = 8, cfg.n_bufs = 0;
    assert_int_equal(kv_stage_pipe_create(&p, &none, 1, &cfg, &err), -1);
    StageCopyOps half = FAKE_OPS;
    half.drain_poll = NULL; /* a drain that cannot be polled */
    cfg.n_bufs = 1, cfg.ops = &half;
    assert_int_equal(kv_stage_pipe_create(&p, &none, 1, &cfg, &err), -1);
}

/* No drain (a reader landing straight in its destination): a fetched chunk is landed. */
static void test_fetch_only(void **state) {
    (void)state;
    Rig *r = rig_new(16u, 2, 50, 2, 37u);
    StageCopyOps fetch_only = {fetch_start, fetch_poll, NULL, NULL, quiesce};
    KvStagePipeConfig cfg = {.bufs = r->move.bufs, .n_bufs = 2, .buf_bytes = 50, .ops = &fetch_only, .ctx = &r->fake};
    KvStagePipe *p;
    BraidError err;
    assert_int_equal(kv_stage_pipe_create(&p, r->move.pieces, N_PIECES, &cfg, &err), 0);
    assert_int_equal(run_to_end(p, &err), 1);
    assert_int_equal(r->fake.drain_starts, 0);
    assert_int_equal(r->fake.busy_now, 0);
    kv_stage_pipe_destroy(p);
    rig_free(r);
}

/* Host pools standing in for two CUDA pools: the lender stages blocks {5,6,7,2,3,9} into a window;
 * the borrower, holding the first 2 locally, reads slots 2..5 into its blocks {11,12,4,15} through a
 * pipe of 2 small buffers. Every plane and the positions of each moved block equal the lender's. */
enum { LAY_LAYERS = 3, LAY_BS = 4, LAY_BLB = 40, LEND_BLOCKS = 12, BORROW_BLOCKS = 20 };

static void fill_pool(uint8_t *kv, int32_t *pos, int n_blocks, uint8_t salt) {
    for (size_t i = 0; i < (size_t)2 * LAY_LAYERS * n_blocks * LAY_BLB; i++) kv[i] = (uint8_t)(i * 7u + salt);
    for (int i = 0; i < n_blocks * LAY_BS; i++) pos[i] = salt * 1000 + i;
}

static int copy_fetch_start(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *p, int n, BraidError *err) {
    (void)slot, (void)err;
    const uint8_t *window = ctx;
    for (int i = 0; i < n; i++) memcpy(buf + p[i].buf_off, window + p[i].src, p[i].len);
    return 0;
}
static int copy_poll(void *ctx, int slot, BraidError *err) {
    (void)ctx, (void)slot, (void)err;
    return 1;
}
static int copy_drain_start(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *p, int n, BraidError *err) {
    (void)ctx, (void)slot, (void)err;
    for (int i = 0; i < n; i++) memcpy((void *)(uintptr_t)p[i].dst, buf + p[i].buf_off, p[i].len);
    return 0;
}
static void copy_quiesce(void *ctx, int slot) { (void)ctx, (void)slot; }

static void test_window_layout_lender_and_borrower_agree(void **state) {
    (void)state;
    static uint8_t lkv[2 * LAY_LAYERS * LEND_BLOCKS * LAY_BLB], bkv[2 * LAY_LAYERS * BORROW_BLOCKS * LAY_BLB];
    static int32_t lpos[LEND_BLOCKS * LAY_BS], bpos[BORROW_BLOCKS * LAY_BS];
    fill_pool(lkv, lpos, LEND_BLOCKS, 1);
    fill_pool(bkv, bpos, BORROW_BLOCKS, 2);
    static uint8_t bkv0[sizeof bkv];
    static int32_t bpos0[BORROW_BLOCKS * LAY_BS];
    memcpy(bkv0, bkv, sizeof bkv), memcpy(bpos0, bpos, sizeof bpos);
    KvStagePool lender = {.kv = (uint64_t)(uintptr_t)lkv, .slot_pos = (uint64_t)(uintptr_t)lpos, .n_layers = LAY_LAYERS, .n_blocks = LEND_BLOCKS,
                          .block_size = LAY_BS, .block_layer_bytes = LAY_BLB};
    KvStagePool borrower = lender;
    borrower.kv = (uint64_t)(uintptr_t)bkv, borrower.slot_pos = (uint64_t)(uintptr_t)bpos, borrower.n_blocks = BORROW_BLOCKS;
    const int32_t lent[] = {5, 6, 7, 2, 3, 9}, table[] = {0, 0, 11, 12, 4, 15};
    int n = 6;
    BraidError err;
    StagePiece *lp, *bp;
    int nl = kv_stage_lender_pieces(&lender, lent, n, &lp, &err);
    assert_int_equal(nl, (2 * LAY_LAYERS + 1) * 3); /* runs {5,6,7} {2,3} {9} per plane */
    uint8_t *window = calloc(1, (size_t)n * kv_stage_block_bytes(&lender));
    size_t end = 0;
    for (int i = 0; i < nl; i++) { /* window order: each piece starts where the last ended */
        assert_int_equal(lp[i].dst, end);
        memcpy(window + lp[i].dst, (const void *)(uintptr_t)lp[i].src, lp[i].len);
        end += lp[i].len;
    }
    assert_int_equal(end, (size_t)n * kv_stage_block_bytes(&lender));
    MoveRun runs[] = {{.tier = 0, .src = 2, .dst = 11, .count = 2}, {.tier = 0, .src = 4, .dst = 4, .count = 1}, {.tier = 0, .src = 5, .dst = 15, .count = 1}};
    int nb = kv_stage_borrower_pieces(&borrower, n, runs, 3, &bp, &err);
    assert_int_equal(nb, (2 * LAY_LAYERS + 1) * 3);
    for (int i = 1; i < nb; i++) assert_true(bp[i].src > bp[i - 1].src); /* window order: the watermark covers chunks in turn */
    uint8_t b0[48], b1[48], *bufs[2] = {b0, b1};
    StageCopyOps ops = {copy_fetch_start, copy_poll, copy_drain_start, copy_poll, copy_quiesce};
    KvStagePipeConfig cfg = {.bufs = bufs, .n_bufs = 2, .buf_bytes = sizeof b0, .ops = &ops, .ctx = window};
    KvStagePipe *pipe;
    assert_int_equal(kv_stage_pipe_create(&pipe, bp, nb, &cfg, &err), 0);
    assert_int_equal(run_to_end(pipe, &err), 1);
    kv_stage_pipe_destroy(pipe);
    for (int b = 0; b < BORROW_BLOCKS; b++) {
        int slot = -1;
        for (int i = 2; i < n; i++)
            if (table[i] == b) slot = i;
        for (int plane = 0; plane < 2 * LAY_LAYERS; plane++) {
            const uint8_t *got = bkv + ((size_t)plane * BORROW_BLOCKS + b) * LAY_BLB;
            const uint8_t *want = slot >= 0 ? lkv + ((size_t)plane * LEND_BLOCKS + lent[slot]) * LAY_BLB : bkv0 + ((size_t)plane * BORROW_BLOCKS + b) * LAY_BLB;
            assert_memory_equal(got, want, LAY_BLB);
        }
        assert_memory_equal(bpos + b * LAY_BS, slot >= 0 ? lpos + lent[slot] * LAY_BS : bpos0 + b * LAY_BS, LAY_BS * sizeof(int32_t));
    }
    free(lp), free(bp), free(window);
    MoveRun bad[] = {{.tier = 0, .src = 5, .dst = 3, .count = 2}}; /* past the loan's 6 slots */
    assert_int_equal(kv_stage_borrower_pieces(&borrower, n, bad, 1, &bp, &err), -1);
    MoveRun null_block[] = {{.tier = 0, .src = 0, .dst = 0, .count = 1}};
    assert_int_equal(kv_stage_borrower_pieces(&borrower, n, null_block, 1, &bp, &err), -1);
    const int32_t outside[] = {LEND_BLOCKS};
    assert_int_equal(kv_stage_lender_pieces(&lender, outside, 1, &lp, &err), -1);
}

/* A loan spanning the lender's two tiers: device blocks {1,2}, host-tier blocks {3,4} (consecutive ids
 * across the tiers: one run each, never one merged run), device block {7}, host block {0}; the host tier laid out as the CUDA backend's (a layer's K and V planes side by
 * side). The window layout is the same as for a device-only loan, so the borrower's pieces land every
 * block whole from whichever tier it came, and nothing else is written. */
enum { HOST_BLOCKS = 6 };

static void test_window_layout_mixed_tiers(void **state) {
    (void)state;
    static uint8_t dkv[2 * LAY_LAYERS * LEND_BLOCKS * LAY_BLB], hkv[2 * LAY_LAYERS * HOST_BLOCKS * LAY_BLB], bkv[2 * LAY_LAYERS * BORROW_BLOCKS * LAY_BLB],
        bkv0[sizeof bkv];
    static int32_t dpos[LEND_BLOCKS * LAY_BS], hpos[HOST_BLOCKS * LAY_BS], bpos[BORROW_BLOCKS * LAY_BS], bpos0[BORROW_BLOCKS * LAY_BS];
    fill_pool(dkv, dpos, LEND_BLOCKS, 1);
    fill_pool(hkv, hpos, HOST_BLOCKS, 3);
    fill_pool(bkv, bpos, BORROW_BLOCKS, 2);
    memcpy(bkv0, bkv, sizeof bkv), memcpy(bpos0, bpos, sizeof bpos);
    KvStagePool pools[2] = {{.kv = (uint64_t)(uintptr_t)dkv, .slot_pos = (uint64_t)(uintptr_t)dpos, .n_layers = LAY_LAYERS, .n_blocks = LEND_BLOCKS,
                             .block_size = LAY_BS, .block_layer_bytes = LAY_BLB},
                            {.kv = (uint64_t)(uintptr_t)hkv, .slot_pos = (uint64_t)(uintptr_t)hpos, .n_layers = LAY_LAYERS, .n_blocks = HOST_BLOCKS,
                             .block_size = LAY_BS, .block_layer_bytes = LAY_BLB, .kv_interleaved = true}};
    KvStagePool borrower = pools[0];
    borrower.kv = (uint64_t)(uintptr_t)bkv, borrower.slot_pos = (uint64_t)(uintptr_t)bpos, borrower.n_blocks = BORROW_BLOCKS;
    const uint8_t tiers[] = {0, 0, 1, 1, 0, 1};
    const int32_t lent[] = {1, 2, 3, 4, 7, 0}, table[] = {11, 12, 4, 15, 16, 17};
    enum { N = 6 };
    BraidError err;
    StagePiece *lp, *bp;
    int nl = kv_stage_lender_pieces_tiered(pools, tiers, lent, N, &lp, &err);
    assert_int_equal(nl, (2 * LAY_LAYERS + 1) * 4); /* runs {1,2} {3,4}h {7} {0}h per plane: never merged across tiers */
    size_t block_bytes = kv_stage_block_bytes(&pools[0]);
    uint8_t *window = calloc(1, N * block_bytes);
    size_t end = 0;
    for (int i = 0; i < nl; i++) {
        assert_int_equal(lp[i].dst, end);
        memcpy(window + lp[i].dst, (const void *)(uintptr_t)lp[i].src, lp[i].len);
        end += lp[i].len;
    }
    assert_int_equal(end, N * block_bytes);
    MoveRun runs[] = {{.tier = 0, .src = 0, .dst = 11, .count = 2}, {.tier = 0, .src = 2, .dst = 4, .count = 1}, {.tier = 0, .src = 3, .dst = 15, .count = 3}};
    int nb = kv_stage_borrower_pieces(&borrower, N, runs, 3, &bp, &err);
    assert_true(nb > 0);
    uint8_t b0[48], b1[48], *bufs[2] = {b0, b1};
    StageCopyOps ops = {copy_fetch_start, copy_poll, copy_drain_start, copy_poll, copy_quiesce};
    KvStagePipeConfig cfg = {.bufs = bufs, .n_bufs = 2, .buf_bytes = sizeof b0, .ops = &ops, .ctx = window};
    KvStagePipe *pipe;
    assert_int_equal(kv_stage_pipe_create(&pipe, bp, nb, &cfg, &err), 0);
    assert_int_equal(run_to_end(pipe, &err), 1);
    kv_stage_pipe_destroy(pipe);
    for (int b = 0; b < BORROW_BLOCKS; b++) {
        int slot = -1;
        for (int i = 0; i < N; i++)
            if (table[i] == b) slot = i;
        for (int plane = 0; plane < 2 * LAY_LAYERS; plane++) {
            int layer = plane % LAY_LAYERS, is_v = plane / LAY_LAYERS;
            const uint8_t *want = bkv0 + ((size_t)plane * BORROW_BLOCKS + b) * LAY_BLB;
            if (slot >= 0 && tiers[slot] == 0) want = dkv + ((size_t)plane * LEND_BLOCKS + lent[slot]) * LAY_BLB;
            if (slot >= 0 && tiers[slot] == 1) want = hkv + ((size_t)(2 * layer + is_v) * HOST_BLOCKS + lent[slot]) * LAY_BLB; /* K_l, V_l adjacent */
            assert_memory_equal(bkv + ((size_t)plane * BORROW_BLOCKS + b) * LAY_BLB, want, LAY_BLB);
        }
        const int32_t *want_pos = slot < 0 ? bpos0 + b * LAY_BS : (tiers[slot] ? hpos : dpos) + lent[slot] * LAY_BS;
        assert_memory_equal(bpos + b * LAY_BS, want_pos, LAY_BS * sizeof(int32_t));
    }
    free(lp), free(bp), free(window);
    const int32_t host_outside[] = {HOST_BLOCKS};
    const uint8_t host_tier[] = {1};
    assert_int_equal(kv_stage_lender_pieces_tiered(pools, host_tier, host_outside, 1, &lp, &err), -1);
    KvStagePool no_host[2] = {pools[0], {0}}; /* no host tier: a host block cannot be staged */
    assert_int_equal(kv_stage_lender_pieces_tiered(no_host, tiers, lent, N, &lp, &err), -1);
    assert_non_null(strstr(err.msg, "tier 1"));
    KvStagePool other[2] = {pools[0], pools[1]};
    other[1].block_layer_bytes = LAY_BLB / 2; /* geometry differs from the device pool's */
    assert_int_equal(kv_stage_lender_pieces_tiered(other, tiers, lent, N, &lp, &err), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_byte_lands_in_order),
        cmocka_unit_test(test_ring_overlaps_fetch_and_drain),
        cmocka_unit_test(test_fetch_fails_mid_move),
        cmocka_unit_test(test_fetch_refused_mid_move),
        cmocka_unit_test(test_drain_fails_mid_move),
        cmocka_unit_test(test_timeout_mid_move),
        cmocka_unit_test(test_destroy_in_flight_quiesces),
        cmocka_unit_test(test_empty_and_bad_config),
        cmocka_unit_test(test_fetch_only),
        cmocka_unit_test(test_window_layout_lender_and_borrower_agree),
        cmocka_unit_test(test_window_layout_mixed_tiers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
