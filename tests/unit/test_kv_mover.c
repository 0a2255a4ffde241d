/*
 * test_kv_mover — the UCX data plane of KV block moves (src/transport/kv_mover.h), with 2 MPI ranks:
 *   mpirun -np 2 test_kv_mover        (registered with ctest for UCX_TLS=tcp and UCX's default)
 * Rank 1 owns two regions filled with known patterns and sends its description to rank 0 over MPI;
 * it then progresses its mover (TCP emulates RMA, so the owner must) and serves commands until
 * rank 0 is done. Rank 0 runs the cmocka tests: scattered ranges, many small ranges (a KV-pool-like
 * layout, 2400 gets in one batch), refused ranges and descriptions, reconnects, disconnects,
 * batches ended while reads are in flight, and a peer whose owner is killed (kill -9 of a child
 * process of rank 1 that owns a region): that batch fails, never hangs or crashes. Every wait is
 * bounded by a deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/timeutil.h"
#include "transport/kv_mover.h"

enum { TAG_DESC = 1, TAG_CMD = 2, TAG_ACK = 3 };
enum { CMD_DONE = 0, CMD_FORK_OWNER = 1, CMD_KILL_OWNER = 2 };

#define REGION_A_BYTES ((size_t)4 << 20)
/* Region B is laid out like a CPU KV pool: (K/V, layer, block) of 6 KiB each. */
#define POOL_LAYERS 30
#define POOL_BLOCKS 48
#define BLOCK_BYTES ((size_t)6144)
#define REGION_B_BYTES ((size_t)2 * POOL_LAYERS * POOL_BLOCKS * BLOCK_BYTES)
#define CHILD_REGION_BYTES ((size_t)8 << 20)
#define DEADLINE_S 60.0

static uint8_t pattern_byte(int region, size_t off) {
    uint64_t x = (uint64_t)off * 0x9E3779B97F4A7C15ull + (uint64_t)region * 0xD1B54A32D192ED03ull;
    return (uint8_t)(x >> 56) ^ (uint8_t)off;
}

static void fill_pattern(uint8_t *p, size_t n, int region) {
    for (size_t i = 0; i < n; i++) p[i] = pattern_byte(region, i);
}

/* Index of the first byte of dst that differs from region's pattern at off, or -1. */
static long first_mismatch(const uint8_t *dst, int region, size_t off, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (dst[i] != pattern_byte(region, off + i)) return (long)i;
    return -1;
}

static void send_bytes(const void *p, size_t n, int dest, int tag) {
    MPI_Send(p, (int)n, MPI_BYTE, dest, tag, MPI_COMM_WORLD);
}

static uint8_t *recv_bytes(int src, int tag, size_t *n) {
    MPI_Status st;
    MPI_Probe(src, tag, MPI_COMM_WORLD, &st);
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    uint8_t *p = malloc(count ? (size_t)count : 1);
    if (!p) abort();
    MPI_Recv(p, count, MPI_BYTE, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    *n = (size_t)count;
    return p;
}

/* ---- the owners ---------------------------------------------------------------------------- */

/* A child of rank 1 (fork + exec of this binary with --child-owner FD) that owns one region
 * (pattern 2) and progresses until it is killed. It writes its description to fd (u64 length,
 * bytes). It never touches MPI and never returns. */
static _Noreturn void child_owner(int fd) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(300); /* never outlive a test run that went wrong */
    BraidError err;
    KvMover *m;
    uint8_t *mem = malloc(CHILD_REGION_BYTES);
    int region;
    WireBuf d = {0};
    if (!mem || kv_mover_create(&m, &err) || kv_mover_register(m, mem, CHILD_REGION_BYTES, &region, &err) ||
        kv_mover_describe(m, &d, &err)) {
        fprintf(stderr, "child owner: %s\n", mem ? err.msg : "out of memory");
        _exit(1);
    }
    fill_pattern(mem, CHILD_REGION_BYTES, 2);
    uint64_t n = d.len;
    if (write(fd, &n, sizeof n) != (ssize_t)sizeof n || write(fd, d.data, d.len) != (ssize_t)d.len) _exit(1);
    close(fd);
    for (;;) {
        kv_mover_progress(m);
        sched_yield();
    }
}

static int read_full(int fd, void *p, size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (uint8_t *)p + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Rank 1: registers regions 0 (pattern 0) and 1 (pattern 1), sends the description, then
 * progresses and serves rank 0's commands until CMD_DONE. */
static int owner_main(void) {
    BraidError err;
    KvMover *m;
    uint8_t *a = malloc(REGION_A_BYTES), *b = malloc(REGION_B_BYTES);
    if (!a || !b) return 1;
    fill_pattern(a, REGION_A_BYTES, 0);
    fill_pattern(b, REGION_B_BYTES, 1);
    int ra, rb;
    WireBuf d = {0};
    if (kv_mover_create(&m, &err) || kv_mover_register(m, a, REGION_A_BYTES, &ra, &err) ||
        kv_mover_register(m, b, REGION_B_BYTES, &rb, &err) || kv_mover_describe(m, &d, &err)) {
        fprintf(stderr, "owner: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (ra != 0 || rb != 1) {
        fprintf(stderr, "owner: regions numbered %d, %d\n", ra, rb);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    send_bytes(d.data, d.len, 0, TAG_DESC);
    wire_buf_free(&d);
    pid_t child = -1;
    for (;;) {
        kv_mover_progress(m);
        int flag = 0;
        MPI_Iprobe(0, TAG_CMD, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        if (!flag) {
            sched_yield();
            continue;
        }
        int cmd;
        MPI_Recv(&cmd, 1, MPI_INT, 0, TAG_CMD, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (cmd == CMD_DONE) break;
        if (cmd == CMD_FORK_OWNER) {
            int fds[2];
            if (pipe(fds)) MPI_Abort(MPI_COMM_WORLD, 1);
            child = fork();
            if (child < 0) MPI_Abort(MPI_COMM_WORLD, 1);
            if (child == 0) { /* a fresh image: UCX state inherited through fork() is unusable */
                close(fds[0]);
                char fd[16];
                snprintf(fd, sizeof fd, "%d", fds[1]);
                execl("/proc/self/exe", "test_kv_mover", "--child-owner", fd, (char *)NULL);
                _exit(127);
            }
            close(fds[1]);
            uint64_t n = 0;
            uint8_t *desc = NULL;
            if (read_full(fds[0], &n, sizeof n) == 0 && n < (1u << 20) && (desc = malloc(n)) &&
                read_full(fds[0], desc, n) == 0) {
                send_bytes(desc, n, 0, TAG_DESC);
            } else {
                send_bytes("", 0, 0, TAG_DESC); /* rank 0 fails the test on an empty description */
            }
            free(desc);
            close(fds[0]);
        } else if (cmd == CMD_KILL_OWNER) {
            int status = 0;
            if (child > 0) {
                kill(child, SIGKILL);
                waitpid(child, &status, 0);
                child = -1;
            }
            MPI_Send(&status, 1, MPI_INT, 0, TAG_ACK, MPI_COMM_WORLD);
        }
    }
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    kv_mover_destroy(m);
    free(a);
    free(b);
    return 0;
}

/* ---- rank 0: the reader ---------------------------------------------------------------------- */

typedef struct {
    KvMover *m;
    uint8_t *desc;
    size_t desc_len;
    int peer;
} Reader;

static void command(int cmd) { MPI_Send(&cmd, 1, MPI_INT, 1, TAG_CMD, MPI_COMM_WORLD); }

static int reader_setup(void **state) {
    Reader *r = calloc(1, sizeof *r);
    BraidError err;
    if (!r || kv_mover_create(&r->m, &err)) {
        fprintf(stderr, "reader: %s\n", r ? err.msg : "out of memory");
        return -1;
    }
    r->desc = recv_bytes(1, TAG_DESC, &r->desc_len);
    if (kv_mover_connect(r->m, 1, r->desc, r->desc_len, &r->peer, &err)) {
        fprintf(stderr, "reader: %s\n", err.msg);
        return -1;
    }
    fprintf(stderr, "[test_kv_mover] peer transports: \"%s\"\n", kv_mover_peer_transports(r->m, r->peer));
    *state = r;
    return 0;
}

static int reader_teardown(void **state) {
    Reader *r = *state;
    command(CMD_DONE);
    if (r) {
        kv_mover_destroy(r->m);
        free(r->desc);
        free(r);
    }
    return 0;
}

/* Polls b until it settles or the deadline passes: 1, -1 (err), or 0 on timeout. */
static int wait_batch(KvMoveBatch *b, double deadline_s, BraidError *err) {
    double deadline = braid_now_seconds() + deadline_s;
    for (;;) {
        int rc = kv_mover_poll(b, err);
        if (rc != 0) return rc;
        if (braid_now_seconds() > deadline) return 0;
    }
}

typedef struct {
    int region;
    size_t off, len;
    uint8_t *dst;
} Range;

static void check_ranges(const Range *rs, int n) {
    for (int i = 0; i < n; i++) {
        long bad = first_mismatch(rs[i].dst, rs[i].region, rs[i].off, rs[i].len);
        if (bad >= 0) fail_msg("range %d (region %d, offset %zu, %zu bytes): byte %ld differs", i, rs[i].region, rs[i].off,
                               rs[i].len, bad);
    }
}

static uint64_t next_rand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_scattered_ranges(void **state) {
    Reader *r = *state;
    BraidError err;
    enum { N = 300 };
    Range rs[N];
    uint64_t seed = 0x1234567;
    size_t expect = 0;
    KvMoveBatch *b;
    assert_int_equal(kv_mover_batch_begin(r->m, r->peer, &b, &err), 0);
    for (int i = 0; i < N; i++) {
        int region = (int)(next_rand(&seed) % 2);
        size_t cap = region ? REGION_B_BYTES : REGION_A_BYTES;
        size_t len = i < 4 ? cap >> (i & 1) : 1 + next_rand(&seed) % (i % 10 == 0 ? 256 << 10 : 4096);
        size_t off = i < 4 ? (i & 1 ? cap / 2 : 0) : next_rand(&seed) % (cap - len + 1);
        if (i == 4) off = cap - len; /* the last byte of a region */
        rs[i] = (Range){region, off, len, malloc(len)};
        assert_non_null(rs[i].dst);
        if (kv_mover_get(b, region, off, rs[i].dst, len, &err)) fail_msg("%s", err.msg);
        expect += len;
    }
    assert_int_equal(kv_mover_batch_bytes(b), expect);
    int rc = wait_batch(b, DEADLINE_S, &err);
    if (rc != 1) fail_msg("batch: %s", rc ? err.msg : "timed out");
    check_ranges(rs, N);
    /* A settled batch takes more reads, and polls 1 again once they land. */
    uint8_t extra[100];
    assert_int_equal(kv_mover_get(b, 0, 12345, extra, sizeof extra, &err), 0);
    assert_int_equal(wait_batch(b, DEADLINE_S, &err), 1);
    assert_int_equal(first_mismatch(extra, 0, 12345, sizeof extra), -1);
    kv_mover_batch_end(b);
    for (int i = 0; i < N; i++) free(rs[i].dst);
}

/* Offset of (kv, layer, block) in the pool region. */
static size_t pool_offset(int kv, int layer, int block) {
    return (((size_t)kv * POOL_LAYERS + (size_t)layer) * POOL_BLOCKS + (size_t)block) * BLOCK_BYTES;
}

static void test_many_small_gets(void **state) {
    Reader *r = *state;
    BraidError err;
    enum { NB = 40 }; /* 2 * 30 * 40 = 2400 gets of 6 KiB: more than the mover keeps in flight (2048) */
    int blocks[NB];
    uint64_t seed = 99;
    for (int i = 0; i < NB; i++) blocks[i] = (int)(next_rand(&seed) % POOL_BLOCKS);
    size_t per_block = 2 * POOL_LAYERS * BLOCK_BYTES;
    uint8_t *dst = malloc(NB * per_block);
    assert_non_null(dst);
    for (int rep = 0; rep < 2; rep++) {
        memset(dst, 0, NB * per_block);
        KvMoveBatch *b;
        assert_int_equal(kv_mover_batch_begin(r->m, r->peer, &b, &err), 0);
        double t0 = braid_now_seconds();
        int gets = 0;
        for (int i = 0; i < NB; i++)
            for (int kv = 0; kv < 2; kv++)
                for (int l = 0; l < POOL_LAYERS; l++, gets++) {
                    uint8_t *to = dst + (size_t)i * per_block + ((size_t)kv * POOL_LAYERS + (size_t)l) * BLOCK_BYTES;
                    if (kv_mover_get(b, 1, pool_offset(kv, l, blocks[i]), to, BLOCK_BYTES, &err)) fail_msg("%s", err.msg);
                }
        assert_int_equal(kv_mover_batch_bytes(b), (size_t)gets * BLOCK_BYTES);
        int rc = wait_batch(b, DEADLINE_S, &err);
        double dt = braid_now_seconds() - t0;
        if (rc != 1) fail_msg("batch of %d gets: %s", gets, rc ? err.msg : "timed out");
        assert_true(gets > 1000);
        fprintf(stderr, "[test_kv_mover] %d gets of %zu B in %.2f ms\n", gets, BLOCK_BYTES, dt * 1e3);
        kv_mover_batch_end(b);
        for (int i = 0; i < NB; i++)
            for (int kv = 0; kv < 2; kv++)
                for (int l = 0; l < POOL_LAYERS; l++) {
                    const uint8_t *got = dst + (size_t)i * per_block + ((size_t)kv * POOL_LAYERS + (size_t)l) * BLOCK_BYTES;
                    long bad = first_mismatch(got, 1, pool_offset(kv, l, blocks[i]), BLOCK_BYTES);
                    if (bad >= 0) fail_msg("block %d kv %d layer %d: byte %ld differs", blocks[i], kv, l, bad);
                }
    }
    free(dst);
}

static void test_refused_ranges(void **state) {
    Reader *r = *state;
    BraidError err;
    uint8_t buf[64];
    KvMoveBatch *b;
    assert_int_equal(kv_mover_batch_begin(r->m, r->peer, &b, &err), 0);
    err.msg[0] = 0;
    assert_int_equal(kv_mover_get(b, 0, REGION_A_BYTES - 10, buf, 11, &err), -1);
    assert_non_null(strstr(err.msg, "past region 0"));
    assert_int_equal(kv_mover_get(b, 0, REGION_A_BYTES + 1, buf, 0, &err), -1);
    assert_int_equal(kv_mover_get(b, 1, SIZE_MAX - 4, buf, 8, &err), -1); /* offset + len wraps */
    assert_int_equal(kv_mover_get(b, 1, 8, buf, SIZE_MAX - 4, &err), -1);
    assert_int_equal(kv_mover_get(b, 2, 0, buf, 1, &err), -1);
    assert_non_null(strstr(err.msg, "no region 2"));
    assert_int_equal(kv_mover_get(b, -1, 0, buf, 1, &err), -1);
    assert_int_equal(kv_mover_get(b, 0, 0, NULL, 1, &err), -1);
    /* Refusals leave the batch as it was: exact-fit reads still work. */
    assert_int_equal(kv_mover_get(b, 0, REGION_A_BYTES - 10, buf, 10, &err), 0);
    assert_int_equal(kv_mover_get(b, 1, 0, buf + 10, 0, &err), 0);
    assert_int_equal(kv_mover_batch_bytes(b), 10);
    assert_int_equal(wait_batch(b, DEADLINE_S, &err), 1);
    assert_int_equal(first_mismatch(buf, 0, REGION_A_BYTES - 10, 10), -1);
    kv_mover_batch_end(b);
    assert_int_equal(kv_mover_batch_begin(r->m, 12345, &b, &err), -1);
    assert_null(b);
}

static void test_bad_descriptions(void **state) {
    Reader *r = *state;
    BraidError err;
    int peer = -1;
    assert_int_equal(kv_mover_connect(r->m, 50, r->desc, 7, &peer, &err), -1);
    for (size_t cut = 8; cut < r->desc_len; cut += 1 + cut / 3) {
        err.msg[0] = 0;
        if (kv_mover_connect(r->m, 50, r->desc, cut, &peer, &err) != -1) fail_msg("a description cut at %zu was accepted", cut);
        assert_true(err.msg[0] != 0);
    }
    uint8_t *bad = malloc(r->desc_len + 1);
    assert_non_null(bad);
    memcpy(bad, r->desc, r->desc_len);
    bad[0] ^= 1;
    assert_int_equal(kv_mover_connect(r->m, 50, bad, r->desc_len, &peer, &err), -1);
    assert_non_null(strstr(err.msg, "magic"));
    bad[0] ^= 1;
    bad[r->desc_len] = 0;
    assert_int_equal(kv_mover_connect(r->m, 50, bad, r->desc_len + 1, &peer, &err), -1);
    free(bad);
    /* The same key and description again: the same peer. */
    int again = -1;
    assert_int_equal(kv_mover_connect(r->m, 1, r->desc, r->desc_len, &again, &err), 0);
    assert_int_equal(again, r->peer);
}

/* A batch ended with reads in flight, and one whose peer is disconnected under it. */
static void test_end_and_disconnect_in_flight(void **state) {
    Reader *r = *state;
    BraidError err;
    uint8_t *dst = malloc(REGION_B_BYTES);
    assert_non_null(dst);
    KvMoveBatch *b;
    assert_int_equal(kv_mover_batch_begin(r->m, r->peer, &b, &err), 0);
    for (size_t off = 0; off < REGION_B_BYTES; off += BLOCK_BYTES)
        assert_int_equal(kv_mover_get(b, 1, off, dst + off, BLOCK_BYTES, &err), 0);
    double t_end = braid_now_seconds();
    kv_mover_batch_end(b); /* no poll at all */
    double took = braid_now_seconds() - t_end;
    fprintf(stderr, "[test_kv_mover] batch_end with reads in flight took %.3f s\n", took);
    assert_true(took < 5.0);
    /* The peer still works, unless the reads did not land within the grace period (a loaded
     * machine, a sanitizer build): then it is broken, and connecting again gives a fresh one. */
    if (kv_mover_batch_begin(r->m, r->peer, &b, &err) != 0) {
        assert_non_null(strstr(err.msg, "broken"));
        int fresh = -1;
        assert_int_equal(kv_mover_connect(r->m, 1, r->desc, r->desc_len, &fresh, &err), 0);
        assert_true(fresh != r->peer);
        r->peer = fresh;
        assert_int_equal(kv_mover_batch_begin(r->m, r->peer, &b, &err), 0);
    }
    assert_int_equal(kv_mover_get(b, 1, 0, dst, REGION_B_BYTES, &err), 0);
    assert_int_equal(wait_batch(b, DEADLINE_S, &err), 1);
    kv_mover_batch_end(b);
    assert_int_equal(first_mismatch(dst, 1, 0, REGION_B_BYTES), -1);

    /* A second peer to the same owner under another key; disconnected with a batch open. */
    int p2 = -1;
    assert_int_equal(kv_mover_connect(r->m, 2, r->desc, r->desc_len, &p2, &err), 0);
    assert_true(p2 != r->peer);
    assert_int_equal(kv_mover_batch_begin(r->m, p2, &b, &err), 0);
    for (size_t off = 0; off < REGION_B_BYTES; off += BLOCK_BYTES)
        assert_int_equal(kv_mover_get(b, 1, off, dst + off, BLOCK_BYTES, &err), 0);
    kv_mover_disconnect(r->m, p2);
    err.msg[0] = 0;
    assert_int_equal(kv_mover_poll(b, &err), -1);
    assert_non_null(strstr(err.msg, "disconnected"));
    assert_int_equal(kv_mover_get(b, 1, 0, dst, 8, &err), -1);
    kv_mover_batch_end(b);
    kv_mover_disconnect(r->m, p2); /* twice: a no-op */
    assert_int_equal(kv_mover_batch_begin(r->m, p2, &b, &err), -1);
    /* The first peer is untouched. */
    assert_int_equal(kv_mover_batch_begin(r->m, r->peer, &b, &err), 0);
    assert_int_equal(kv_mover_get(b, 0, 0, dst, 4096, &err), 0);
    assert_int_equal(wait_batch(b, DEADLINE_S, &err), 1);
    kv_mover_batch_end(b);
    assert_int_equal(first_mismatch(dst, 0, 0, 4096), -1);
    free(dst);
}

/* The owner of a peer is killed (kill -9): a batch in flight and every later batch fail, in bounded
 * time; the reader and its other peers live on. */
static void test_dead_owner(void **state) {
    Reader *r = *state;
    BraidError err;
    command(CMD_FORK_OWNER);
    size_t n;
    uint8_t *desc = recv_bytes(1, TAG_DESC, &n);
    assert_true(n > 0);
    int dead = -1;
    if (kv_mover_connect(r->m, 9, desc, n, &dead, &err)) fail_msg("%s", err.msg);
    uint8_t *dst = malloc(CHILD_REGION_BYTES);
    assert_non_null(dst);
    KvMoveBatch *b;
    assert_int_equal(kv_mover_batch_begin(r->m, dead, &b, &err), 0);
    assert_int_equal(kv_mover_get(b, 0, 0, dst, CHILD_REGION_BYTES, &err), 0);
    int rc = wait_batch(b, DEADLINE_S, &err);
    if (rc != 1) fail_msg("reading the child owner: %s", rc ? err.msg : "timed out");
    kv_mover_batch_end(b);
    assert_int_equal(first_mismatch(dst, 2, 0, CHILD_REGION_BYTES), -1);

    /* Reads in flight when the owner dies. */
    assert_int_equal(kv_mover_batch_begin(r->m, dead, &b, &err), 0);
    for (size_t off = 0; off < CHILD_REGION_BYTES; off += BLOCK_BYTES) {
        size_t len = CHILD_REGION_BYTES - off < BLOCK_BYTES ? CHILD_REGION_BYTES - off : BLOCK_BYTES;
        assert_int_equal(kv_mover_get(b, 0, off, dst + off, len, &err), 0);
    }
    command(CMD_KILL_OWNER);
    int status = 0;
    MPI_Recv(&status, 1, MPI_INT, 1, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    double t0 = braid_now_seconds();
    rc = wait_batch(b, DEADLINE_S, &err);
    fprintf(stderr, "[test_kv_mover] in-flight batch after kill -9: %d (%s) after %.3f s\n", rc, rc < 0 ? err.msg : "",
            braid_now_seconds() - t0);
    assert_true(rc != 0); /* it landed before the kill, or it failed; it did not hang */
    kv_mover_batch_end(b);

    /* Later batches fail: at begin (the peer is known broken), at get, or at poll. */
    t0 = braid_now_seconds();
    rc = kv_mover_batch_begin(r->m, dead, &b, &err);
    if (rc == 0) {
        rc = kv_mover_get(b, 0, 0, dst, 1 << 20, &err);
        if (rc == 0) rc = wait_batch(b, DEADLINE_S, &err);
        kv_mover_batch_end(b);
    }
    fprintf(stderr, "[test_kv_mover] batch after kill -9: %d (%s) after %.3f s\n", rc, err.msg, braid_now_seconds() - t0);
    assert_int_equal(rc, -1);
    /* And go on failing at once. */
    assert_int_equal(kv_mover_batch_begin(r->m, dead, &b, &err), -1);
    assert_non_null(strstr(err.msg, "broken"));
    kv_mover_disconnect(r->m, dead);

    /* The other peer is fine. */
    assert_int_equal(kv_mover_batch_begin(r->m, r->peer, &b, &err), 0);
    assert_int_equal(kv_mover_get(b, 0, 100, dst, 5000, &err), 0);
    assert_int_equal(wait_batch(b, DEADLINE_S, &err), 1);
    kv_mover_batch_end(b);
    assert_int_equal(first_mismatch(dst, 0, 100, 5000), -1);
    free(dst);
    free(desc);
}

static void test_destroy_with_batches_open(void **state) {
    (void)state;
    BraidError err;
    KvMover *m;
    assert_int_equal(kv_mover_create(&m, &err), 0);
    uint8_t local[4096];
    int region = -1;
    assert_int_equal(kv_mover_register(m, local, sizeof local, &region, &err), 0);
    assert_int_equal(region, 0);
    assert_int_equal(kv_mover_register(m, NULL, 10, &region, &err), -1);
    assert_int_equal(kv_mover_register(m, local, 0, &region, &err), -1);
    WireBuf d = {0};
    assert_int_equal(kv_mover_describe(m, &d, &err), 0);
    /* Reading one's own memory through the description (a loopback peer). */
    fill_pattern(local, sizeof local, 3);
    int self = -1;
    assert_int_equal(kv_mover_connect(m, 0, d.data, d.len, &self, &err), 0);
    uint8_t out[4096];
    KvMoveBatch *b, *open;
    assert_int_equal(kv_mover_batch_begin(m, self, &b, &err), 0);
    assert_int_equal(kv_mover_get(b, 0, 0, out, sizeof out, &err), 0);
    assert_int_equal(wait_batch(b, DEADLINE_S, &err), 1);
    kv_mover_batch_end(b);
    assert_int_equal(first_mismatch(out, 3, 0, sizeof out), -1);
    assert_int_equal(kv_mover_batch_begin(m, self, &open, &err), 0);
    assert_int_equal(kv_mover_get(open, 0, 0, out, sizeof out, &err), 0);
    wire_buf_free(&d);
    kv_mover_destroy(m); /* frees the open batch too */
    kv_mover_destroy(NULL);
    kv_mover_batch_end(NULL);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--child-owner") == 0) child_owner(atoi(argv[2])); /* never returns */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "test_kv_mover: run with 2 MPI ranks (mpirun -np 2)\n");
        MPI_Finalize();
        return 1;
    }
    int rc;
    if (rank == 1) {
        rc = owner_main();
    } else {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_scattered_ranges),
            cmocka_unit_test(test_many_small_gets),
            cmocka_unit_test(test_refused_ranges),
            cmocka_unit_test(test_bad_descriptions),
            cmocka_unit_test(test_end_and_disconnect_in_flight),
            cmocka_unit_test(test_dead_owner),
            cmocka_unit_test(test_destroy_with_batches_open),
        };
        rc = cmocka_run_group_tests(tests, reader_setup, reader_teardown);
    }
    MPI_Finalize();
    return rc;
}
