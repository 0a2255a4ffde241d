/*
 * bench_kv_move — KV block moves over UCX (src/transport/kv_mover.h) between 2 MPI ranks:
 *   mpirun -np 2 bench_kv_move [--blocks 16,64,256] [--pool-blocks 1024] [--repeats 5] [--large-mib 64]
 * Rank 1 owns a pool laid out like Braid's CPU KV pool for the default model (30 layers, K and V,
 * fp16, 3 KV heads x 16 slots x 64 dims = 6 KiB per layer-block; one contiguous region of
 * 2 x 30 x pool-blocks x 6 KiB, indexed (kv, layer, block)) and progresses its mover; rank 0 moves
 * N blocks into a local staging area laid out the same way and times each batch from
 * kv_mover_batch_begin to the poll that reports it landed:
 *   per_block  N random distinct block ids, 60 gets of 6 KiB per block (60 x N gets)
 *   coalesced  the same ids sorted, each run of consecutive ids one get per (kv, layer)
 *   run        N consecutive blocks: 60 gets of N x 6 KiB
 *   large      one get of --large-mib MiB (the transport's streaming figure)
 *   get_6k     one get of 6 KiB at a time, batch after batch (latency of a lone read)
 * Prints one JSON line per measurement with blocks/s and GB/s (10^9 bytes/s) of the fastest of
 * --repeats passes (noise only ever slows a pass down); the first pass of each is checked byte for
 * byte. The transports UCX chose are printed on stderr and in each line.
 */
#include <getopt.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timeutil.h"
#include "transport/kv_mover.h"

#define LAYERS 30
#define BLOCK_BYTES ((size_t)3 * 16 * 64 * 2) /* 3 KV heads x 16 slots x 64 dims x fp16 = 6 KiB */
#include "bench_list_arg.h"

#define MAX_LIST BENCH_LIST_MAX
enum { TAG_DESC = 1, TAG_DONE = 2 };

typedef struct {
    KvMover *m;
    int peer;
    long pool_blocks;
    int repeats;
    const char *transports;
} Reader;

static uint8_t pattern_byte(size_t off) { return (uint8_t)((off * 0x9E3779B97F4A7C15ull) >> 56) ^ (uint8_t)off; }

static size_t pool_offset(long pool_blocks, int kv, int layer, long block) {
    return (((size_t)kv * LAYERS + (size_t)layer) * (size_t)pool_blocks + (size_t)block) * BLOCK_BYTES;
}


static uint64_t next_rand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* One get of the plan: len bytes at src in the pool to dst_off in the staging area. */
typedef struct {
    size_t src, dst_off, len;
} Get;

/* Runs the plan as one batch, busy-polling; seconds, or < 0 on failure (printed). */
static double run_batch(Reader *r, const Get *g, long n, uint8_t *dst) {
    BraidError err;
    KvMoveBatch *b;
    double t0 = braid_now_seconds();
    if (kv_mover_batch_begin(r->m, r->peer, &b, &err)) goto fail;
    for (long i = 0; i < n; i++)
        if (kv_mover_get(b, 0, g[i].src, dst + g[i].dst_off, g[i].len, &err)) goto fail_batch;
    int rc;
    while ((rc = kv_mover_poll(b, &err)) == 0) {
    }
    if (rc < 0) goto fail_batch;
    double dt = braid_now_seconds() - t0;
    kv_mover_batch_end(b);
    return dt;
fail_batch:
    kv_mover_batch_end(b);
fail:
    fprintf(stderr, "bench_kv_move: %s\n", err.msg);
    return -1;
}

static int check(const Get *g, long n, const uint8_t *dst) {
    for (long i = 0; i < n; i++)
        for (size_t k = 0; k < g[i].len; k++)
            if (dst[g[i].dst_off + k] != pattern_byte(g[i].src + k)) {
                fprintf(stderr, "bench_kv_move: get %ld (pool offset %zu): byte %zu differs\n", i, g[i].src, k);
                return -1;
            }
    return 0;
}

/* Times the plan (fastest of the repeats; the first checked) and prints its line. */
static int measure(Reader *r, const char *mode, long blocks, const Get *g, long n, uint8_t *dst) {
    double best = 1e30;
    size_t bytes = 0;
    for (long i = 0; i < n; i++) bytes += g[i].len;
    for (int rep = 0; rep < r->repeats; rep++) {
        if (rep == 0) memset(dst, 0, bytes);
        double dt = run_batch(r, g, n, dst);
        if (dt < 0) return -1;
        if (rep == 0 && check(g, n, dst)) return -1;
        if (dt < best) best = dt;
    }
    printf("{\"mode\":\"%s\",\"blocks\":%ld,\"gets\":%ld,\"bytes\":%zu,\"seconds\":%.6f,\"us_per_get\":%.3f,"
           "\"blocks_per_s\":%.1f,\"gb_per_s\":%.4f,\"transports\":\"%s\"}\n",
           mode, blocks, n, bytes, best, best * 1e6 / (double)n, blocks ? (double)blocks / best : 0.0, (double)bytes / best / 1e9,
           r->transports);
    fflush(stdout);
    return 0;
}

static int reader_main(Reader *r, const long *moves, int n_moves, long large_mib) {
    long max_blocks = 0;
    for (int i = 0; i < n_moves; i++) max_blocks = moves[i] > max_blocks ? moves[i] : max_blocks;
    size_t stage_bytes = (size_t)max_blocks * 2 * LAYERS * BLOCK_BYTES;
    size_t large = (size_t)large_mib << 20;
    if (large > stage_bytes) stage_bytes = large;
    uint8_t *dst = malloc(stage_bytes);
    Get *g = malloc((size_t)max_blocks * 2 * LAYERS * sizeof *g);
    long *ids = malloc((size_t)r->pool_blocks * sizeof *ids);
    if (!dst || !g || !ids) return -1;
    memset(dst, 1, stage_bytes); /* fault the staging area in before any timing */
    uint64_t seed = 0x5eed;
    for (int mi = 0; mi < n_moves; mi++) {
        long nb = moves[mi];
        /* nb distinct random ids: a partial Fisher-Yates shuffle of the pool's ids */
        for (long i = 0; i < r->pool_blocks; i++) ids[i] = i;
        for (long i = 0; i < nb; i++) {
            long j = i + (long)(next_rand(&seed) % (uint64_t)(r->pool_blocks - i));
            long t = ids[i];
            ids[i] = ids[j];
            ids[j] = t;
        }
        /* per_block: the staging area is (block i, kv, layer) */
        long n = 0;
        for (long i = 0; i < nb; i++)
            for (int kv = 0; kv < 2; kv++)
                for (int l = 0; l < LAYERS; l++, n++)
                    g[n] = (Get){pool_offset(r->pool_blocks, kv, l, ids[i]), (size_t)n * BLOCK_BYTES, BLOCK_BYTES};
        if (measure(r, "per_block", nb, g, n, dst)) return -1;
        /* coalesced: sorted ids, runs of consecutive ids as one get per (kv, layer); staging
         * (kv, layer, i) so a run lands contiguously too */
        qsort(ids, (size_t)nb, sizeof *ids, cmp_long);
        n = 0;
        for (int kv = 0; kv < 2; kv++)
            for (int l = 0; l < LAYERS; l++)
                for (long i = 0; i < nb;) {
                    long j = i + 1;
                    while (j < nb && ids[j] == ids[j - 1] + 1) j++;
                    size_t slot = ((size_t)kv * LAYERS + (size_t)l) * (size_t)nb + (size_t)i;
                    g[n++] = (Get){pool_offset(r->pool_blocks, kv, l, ids[i]), slot * BLOCK_BYTES, (size_t)(j - i) * BLOCK_BYTES};
                    i = j;
                }
        if (measure(r, "coalesced", nb, g, n, dst)) return -1;
        /* run: nb consecutive blocks from a random start */
        long start = (long)(next_rand(&seed) % (uint64_t)(r->pool_blocks - nb + 1));
        n = 0;
        for (int kv = 0; kv < 2; kv++)
            for (int l = 0; l < LAYERS; l++, n++)
                g[n] = (Get){pool_offset(r->pool_blocks, kv, l, start), (size_t)n * (size_t)nb * BLOCK_BYTES,
                             (size_t)nb * BLOCK_BYTES};
        if (measure(r, "run", nb, g, n, dst)) return -1;
    }
    size_t pool_bytes = (size_t)2 * LAYERS * (size_t)r->pool_blocks * BLOCK_BYTES;
    if (large > pool_bytes) large = pool_bytes;
    g[0] = (Get){0, 0, large};
    if (measure(r, "large", 0, g, 1, dst)) return -1;
    /* get_6k: the latency of a lone 6 KiB read (a batch of one, 200 of them; min of means) */
    double best = 1e30;
    for (int rep = 0; rep < r->repeats; rep++) {
        double t0 = braid_now_seconds();
        for (int i = 0; i < 200; i++) {
            Get one = {pool_offset(r->pool_blocks, 0, i % LAYERS, i), 0, BLOCK_BYTES};
            if (run_batch(r, &one, 1, dst) < 0) return -1;
        }
        double dt = (braid_now_seconds() - t0) / 200;
        if (dt < best) best = dt;
    }
    printf("{\"mode\":\"get_6k\",\"blocks\":0,\"gets\":1,\"bytes\":%zu,\"seconds\":%.6f,\"us_per_get\":%.3f,"
           "\"blocks_per_s\":0,\"gb_per_s\":%.4f,\"transports\":\"%s\"}\n",
           BLOCK_BYTES, best, best * 1e6, (double)BLOCK_BYTES / best / 1e9, r->transports);
    free(dst);
    free(g);
    free(ids);
    return 0;
}

static int owner_main(long pool_blocks) {
    BraidError err;
    KvMover *m;
    size_t bytes = (size_t)2 * LAYERS * (size_t)pool_blocks * BLOCK_BYTES;
    uint8_t *pool = malloc(bytes);
    if (!pool) {
        fprintf(stderr, "bench_kv_move: no memory for a pool of %zu bytes\n", bytes);
        return -1;
    }
    for (size_t i = 0; i < bytes; i++) pool[i] = pattern_byte(i);
    int region;
    WireBuf d = {0};
    if (kv_mover_create(&m, &err) || kv_mover_register(m, pool, bytes, &region, &err) || kv_mover_describe(m, &d, &err)) {
        fprintf(stderr, "bench_kv_move owner: %s\n", err.msg);
        return -1;
    }
    MPI_Send(d.data, (int)d.len, MPI_BYTE, 0, TAG_DESC, MPI_COMM_WORLD);
    wire_buf_free(&d);
    for (unsigned long it = 0;; it++) {
        kv_mover_progress(m); /* TCP emulates RMA: the owner's worker answers the reads */
        if (it % 4096 == 0) {
            int flag = 0;
            MPI_Iprobe(0, TAG_DONE, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
            if (flag) break;
        }
    }
    MPI_Recv(NULL, 0, MPI_BYTE, 0, TAG_DONE, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    kv_mover_destroy(m);
    free(pool);
    return 0;
}

int main(int argc, char **argv) {
    long moves[MAX_LIST] = {16, 64, 256};
    int n_moves = 3;
    long pool_blocks = 1024, large_mib = 64;
    int repeats = 5;
    static const struct option opts[] = {{"blocks", required_argument, 0, 'b'}, {"pool-blocks", required_argument, 0, 'p'},
                                         {"repeats", required_argument, 0, 'r'}, {"large-mib", required_argument, 0, 'l'},
                                         {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int c, bad = size != 2;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'b') bad |= (n_moves = bench_parse_list(optarg, moves)) <= 0;
        else if (c == 'p') bad |= (pool_blocks = strtol(optarg, NULL, 10)) <= 0;
        else if (c == 'r') bad |= (repeats = atoi(optarg)) <= 0;
        else if (c == 'l') bad |= (large_mib = strtol(optarg, NULL, 10)) <= 0;
        else bad = 1;
    }
    for (int i = 0; i < n_moves && !bad; i++) bad |= moves[i] > pool_blocks;
    if (bad) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 bench_kv_move [--blocks 16,64,256] [--pool-blocks 1024] [--repeats 5] "
                            "[--large-mib 64]  (blocks <= pool-blocks)\n");
        MPI_Finalize();
        return 2;
    }
    int rc = 0;
    if (rank == 1) {
        rc = owner_main(pool_blocks);
        if (rc) MPI_Abort(MPI_COMM_WORLD, 1);
    } else {
        Reader r = {.pool_blocks = pool_blocks, .repeats = repeats};
        BraidError err;
        MPI_Status st;
        int len = 0;
        MPI_Probe(1, TAG_DESC, MPI_COMM_WORLD, &st);
        MPI_Get_count(&st, MPI_BYTE, &len);
        uint8_t *desc = malloc(len > 0 ? (size_t)len : 1);
        if (!desc) MPI_Abort(MPI_COMM_WORLD, 1);
        MPI_Recv(desc, len, MPI_BYTE, 1, TAG_DESC, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (kv_mover_create(&r.m, &err) || kv_mover_connect(r.m, 1, desc, (size_t)len, &r.peer, &err)) {
            fprintf(stderr, "bench_kv_move: %s\n", err.msg);
            printf("{\"error\":\"connect\"}\n");
            rc = 1;
        } else {
            r.transports = kv_mover_peer_transports(r.m, r.peer);
            fprintf(stderr, "bench_kv_move: pool of %ld blocks (%.1f MiB), transports \"%s\"\n", pool_blocks,
                    (double)(2 * LAYERS * (size_t)pool_blocks * BLOCK_BYTES) / (1 << 20), r.transports);
            rc = reader_main(&r, moves, n_moves, large_mib) ? 1 : 0;
        }
        MPI_Send(NULL, 0, MPI_BYTE, 1, TAG_DONE, MPI_COMM_WORLD);
        kv_mover_destroy(r.m);
        free(desc);
    }
    MPI_Finalize();
    return rc;
}
