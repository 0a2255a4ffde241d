/*
 * test_kv_stage_wire — the wire half of host-staged KV moves (worker/kv_stage_wire.h) over real UCX
 * with 2 MPI ranks, driven by the real pipeline (worker/kv_stage_pipe.h):
 *   mpirun -np 2 test_kv_stage_wire        (registered with ctest, UCX_TLS=tcp)
 * Rank 1 stands in for a CUDA lender: it owns a staging window (host memory registered with its
 * mover), and on each STAGE command zeroes the data, sets the window's generation, and writes the
 * data front to back in chunks, raising the staged watermark after each with a nap between (as the
 * lender's device-to-host copies and host functions do). Rank 0 reads it through a ring of 3
 * buffers with chunks of another size, pieces scattered like per-layer runs, the drain a memcpy:
 *  - every byte lands where it should although the reads race the staging (a read before the
 *    watermark would find zeros), and the reader had to probe the header (it waited on staging);
 *  - a window holding another generation (the lease ended, the window was reused) fails the move
 *    with the reason and leaves no buffer busy;
 *  - ending a move in mid-flight returns promptly.
 * Every wait is bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/timeutil.h"
#include "transport/kv_mover.h"
#include "worker/kv_stage_pipe.h"
#include "worker/kv_stage_wire.h"

enum { TAG_DESC = 11, TAG_CMD = 12, TAG_ACK = 13 };
enum { CMD_DONE = 0, CMD_STAGE = 1 };
#define DATA_BYTES ((size_t)3 << 20)
#define STAGE_CHUNK ((size_t)64 << 10)
#define RING_BUFS 3
#define RING_CHUNK ((size_t)40 << 10)
#define N_PIECES 90

static uint8_t pattern(uint64_t gen, size_t i) { return (uint8_t)((i * 0x9E3779B1u + gen * 131u) >> 7) ^ (uint8_t)i ^ 0x5a; }

static void nap_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* ---- rank 1: the lender stand-in ---- */

static void lender(void) {
    KvMover *m;
    BraidError err;
    uint8_t *window = calloc(1, KV_STAGE_WINDOW_HEAD + DATA_BYTES);
    int region;
    WireBuf desc = {0};
    if (!window || kv_mover_create(&m, &err) || kv_mover_register(m, window, KV_STAGE_WINDOW_HEAD + DATA_BYTES, &region, &err) ||
        kv_mover_describe(m, &desc, &err)) {
        fprintf(stderr, "lender: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Send(desc.data, (int)desc.len, MPI_BYTE, 0, TAG_DESC, MPI_COMM_WORLD);
    KvStageWindowHead *head = (KvStageWindowHead *)window;
    uint8_t *data = window + KV_STAGE_WINDOW_HEAD;
    for (;;) {
        uint64_t cmd[3]; /* command, generation, nap between chunks (us) */
        MPI_Recv(cmd, 3, MPI_UINT64_T, 0, TAG_CMD, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (cmd[0] == CMD_DONE) break;
        __atomic_store_n(&head->staged, 0, __ATOMIC_RELEASE);
        memset(data, 0, DATA_BYTES);
        head->gen = cmd[1];
        int ack = 1;
        MPI_Send(&ack, 1, MPI_INT, 0, TAG_ACK, MPI_COMM_WORLD); /* the loan is answered before it is staged */
        for (size_t off = 0; off < DATA_BYTES; off += STAGE_CHUNK) {
            nap_us((long)cmd[2]);
            for (size_t i = off; i < off + STAGE_CHUNK && i < DATA_BYTES; i++) data[i] = pattern(cmd[1], i);
            __atomic_store_n(&head->staged, off + STAGE_CHUNK < DATA_BYTES ? off + STAGE_CHUNK : DATA_BYTES, __ATOMIC_RELEASE);
        }
    }
    kv_mover_destroy(m);
    wire_buf_free(&desc);
    free(window);
}

/* ---- rank 0: the borrower ---- */

typedef struct {
    KvMover *mover;
    int peer;
    uint8_t *bufs[RING_BUFS];
    uint8_t *dst;
    StagePiece pieces[N_PIECES];
    uint8_t *want;
    size_t total;
} Borrower;

static Borrower B;

static int drain_start(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *p, int n, BraidError *err) {
    (void)ctx, (void)slot, (void)err;
    for (int i = 0; i < n; i++) memcpy(B.dst + p[i].dst, buf + p[i].buf_off, p[i].len);
    return 0;
}
static int drain_poll(void *ctx, int slot, BraidError *err) {
    (void)ctx, (void)slot, (void)err;
    return 1;
}
static int wire_fetch_start(void *ctx, int slot, uint8_t *buf, const StageChunkPiece *p, int n, BraidError *err) {
    return kv_stage_wire_fetch_start(ctx, slot, buf, p, n, err);
}
static int wire_fetch_poll(void *ctx, int slot, BraidError *err) { return kv_stage_wire_fetch_poll(ctx, slot, err); }
static void wire_quiesce(void *ctx, int slot) { kv_stage_wire_quiesce(ctx, slot); }
static const StageCopyOps OPS = {wire_fetch_start, wire_fetch_poll, drain_start, drain_poll, wire_quiesce};

/* Pieces over the whole data, in window order, landing in reverse order (per-layer runs' shape). */
static void plan(uint64_t gen) {
    size_t step = DATA_BYTES / N_PIECES, dst = 0;
    B.total = 0;
    for (int i = N_PIECES - 1; i >= 0; i--) {
        size_t len = i == N_PIECES - 1 ? DATA_BYTES - step * (N_PIECES - 1) : step;
        B.pieces[i] = (StagePiece){.src = (uint64_t)i * step, .dst = dst, .len = len};
        dst += len;
    }
    for (int i = 0; i < N_PIECES; i++) {
        for (size_t k = 0; k < B.pieces[i].len; k++) B.want[B.pieces[i].dst + k] = pattern(gen, B.pieces[i].src + k);
        B.total += B.pieces[i].len;
    }
    memset(B.dst, 0xee, DATA_BYTES);
}

static void stage(uint64_t gen, uint64_t nap_us_per_chunk) {
    uint64_t cmd[3] = {CMD_STAGE, gen, nap_us_per_chunk};
    int ack;
    MPI_Send(cmd, 3, MPI_UINT64_T, 1, TAG_CMD, MPI_COMM_WORLD);
    MPI_Recv(&ack, 1, MPI_INT, 1, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

static void start_move(uint64_t gen, KvStageWire **wire, KvStagePipe **pipe) {
    BraidError err;
    KvStageWireConfig wc = {.mover = B.mover, .peer = B.peer, .region = 0, .window_offset = 0, .gen = gen};
    assert_int_equal(kv_stage_wire_create(wire, &wc, RING_BUFS, &err), 0);
    KvStagePipeConfig pc = {.bufs = B.bufs, .n_bufs = RING_BUFS, .buf_bytes = RING_CHUNK, .deadline = braid_now_seconds() + 30, .ops = &OPS, .ctx = *wire};
    assert_int_equal(kv_stage_pipe_create(pipe, B.pieces, N_PIECES, &pc, &err), 0);
}

static int run(KvStagePipe *pipe, BraidError *err) {
    int st;
    while ((st = kv_stage_pipe_step(pipe, braid_now_seconds(), err)) == 0) nap_us(50);
    return st;
}

static void test_reads_follow_the_watermark(void **state) {
    (void)state;
    plan(7);
    stage(7, 1500); /* 48 chunks, ~1.5 ms apart: staging takes ~70 ms, the reads race it */
    KvStageWire *wire;
    KvStagePipe *pipe;
    start_move(7, &wire, &pipe);
    BraidError err;
    double t0 = braid_now_seconds();
    assert_int_equal(run(pipe, &err), 1);
    double s = braid_now_seconds() - t0;
    assert_memory_equal(B.dst, B.want, DATA_BYTES); /* nothing read before it was staged, nothing dropped or misplaced */
    assert_true(kv_stage_wire_probes(wire) > 0);    /* it waited on the watermark */
    assert_int_equal(kv_stage_pipe_busy_buffers(pipe), 0);
    printf("{\"bench\":\"kv_stage_wire\",\"bytes\":%zu,\"seconds\":%.4f,\"probes\":%d,\"chunks\":%d}\n", B.total, s, kv_stage_wire_probes(wire),
           kv_stage_pipe_chunks(pipe));
    kv_stage_pipe_destroy(pipe);
    kv_stage_wire_destroy(wire);
}

static void test_other_generation_fails(void **state) {
    (void)state;
    plan(9);
    stage(8, 0); /* the window now holds loan 8; the borrower was lent loan 9 */
    KvStageWire *wire;
    KvStagePipe *pipe;
    start_move(9, &wire, &pipe);
    BraidError err;
    assert_int_equal(run(pipe, &err), -1);
    assert_non_null(strstr(err.msg, "holds loan 8, not 9"));
    assert_int_equal(kv_stage_pipe_busy_buffers(pipe), 0);
    kv_stage_pipe_destroy(pipe);
    kv_stage_wire_destroy(wire);
}

static void test_end_mid_move(void **state) {
    (void)state;
    plan(11);
    stage(11, 20000); /* slow staging: ~1 s in all */
    KvStageWire *wire;
    KvStagePipe *pipe;
    start_move(11, &wire, &pipe);
    BraidError err;
    for (int i = 0; i < 20; i++) {
        assert_int_equal(kv_stage_pipe_step(pipe, braid_now_seconds(), &err), 0);
        nap_us(2000);
    }
    double t0 = braid_now_seconds();
    kv_stage_pipe_destroy(pipe);
    kv_stage_wire_destroy(wire);
    assert_true(braid_now_seconds() - t0 < 2.0);
}

int main(int argc, char **argv) {
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "test_kv_stage_wire needs 2 ranks (mpirun -np 2)\n");
        MPI_Finalize();
        return 1;
    }
    if (rank == 1) {
        lender();
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }
    MPI_Status st;
    int len;
    MPI_Probe(1, TAG_DESC, MPI_COMM_WORLD, &st);
    MPI_Get_count(&st, MPI_BYTE, &len);
    uint8_t *desc = malloc((size_t)len);
    MPI_Recv(desc, len, MPI_BYTE, 1, TAG_DESC, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    BraidError err;
    if (kv_mover_create(&B.mover, &err) || kv_mover_connect(B.mover, 1, desc, (size_t)len, &B.peer, &err)) {
        fprintf(stderr, "borrower: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = 0; i < RING_BUFS; i++) B.bufs[i] = malloc(RING_CHUNK);
    B.dst = malloc(DATA_BYTES);
    B.want = malloc(DATA_BYTES);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_follow_the_watermark),
        cmocka_unit_test(test_other_generation_fails),
        cmocka_unit_test(test_end_mid_move),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    uint64_t done[3] = {CMD_DONE, 0, 0};
    MPI_Send(done, 3, MPI_UINT64_T, 1, TAG_CMD, MPI_COMM_WORLD);
    kv_mover_destroy(B.mover);
    for (int i = 0; i < RING_BUFS; i++) free(B.bufs[i]);
    free(B.dst), free(B.want), free(desc);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return failed ? 1 : 0;
}
