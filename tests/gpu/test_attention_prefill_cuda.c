/*
 * test_attention_prefill_cuda.c — the two prefill attention kernels (cuda_attention_prefill_flash,
 * the default, and cuda_attention_prefill, the wmma fallback) against a double-precision CPU
 * reference and against each other. Skips (exit 77) when no GPU is visible.
 *
 * Inputs are random bf16 values (exact on both sides) in a paged pool with shuffled block ids:
 * - head_dim 64 and 128; GQA groups 1, 3, 4, 8; block sizes 8, 16, 32;
 * - query chunks of 1 to 1000 tokens (partial last 64-row tiles of 1, 17, 44, 63 rows; exact
 *   multiples of 64), with and without a cached prefix, several sequences in one launch;
 * - position-based visibility: prefix positions permuted, and some prefix keys placed after
 *   the chunk's first positions (a splice from later in the conversation): invisible to the early
 *   queries even though their slots come first;
 * - a decode sequence (no tile) between prefill sequences: its output row must stay untouched
 *   (the output is poisoned with NaN first, so a row written twice or out of bounds shows up);
 * - large score magnitudes (queries scaled by 8): the running max changes across key tiles.
 * The reference sees keys [0, n_ctx) with slot_pos <= the query's position, as cuda_kernels.h
 * states; chunk positions increase, so the kernels' "never load keys past the tile" agrees.
 *
 * Tolerance: both kernels round P to bf16 (relative 2^-9 per weight, so the normalised weights
 * move by at most ~2^-8 of themselves: |ΔO| <= 2^-8 max|v|, max|v| = 1 here) and round O to bf16
 * (2^-9 relative); fp32 accumulation and exp2f are far below. ABS_TOL = 2^-8 + 1e-4, REL_TOL 2^-8.
 * A fragment-layout, masking or bounds error gives errors of O(0.1) or NaN.
 *
 * Unless BRAID_TEST_QUICK is set, the 8B shape at 4096 tokens (32 / 8 heads of 128, one sequence)
 * is also run with both kernels: they must agree (and match the reference on sampled rows), and
 * the time of each is printed as "prefill-attention kernel=... ms=... tflops=..." (causal FLOPs).
 */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_kernels.h"
#include "model/tensor_types.h"

#define ABS_TOL (1.0 / 256.0 + 1e-4)
#define REL_TOL (1.0 / 256.0)
#define MAX_SEQS 6
#define TILE_ROWS 64 /* the tile height both kernels take */

#define CUDA_OK(call)                                                                                                   \
    do {                                                                                                                \
        cudaError_t e_ = (call);                                                                                        \
        if (e_ != cudaSuccess) fail_msg("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));    \
    } while (0)

typedef cudaError_t (*PrefillKernel)(const CudaAttention *, const int32_t *, int, cudaStream_t);

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static double uniform(void) { /* [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static int random_below(int n) { return (int)(uniform() * n); }

static uint16_t random_bf16(double scale) { return fp32_to_bf16((float)((uniform() * 2.0 - 1.0) * scale)); }

static void shuffle(int32_t *v, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = random_below(i + 1);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

typedef struct {
    const char *name;
    int n_heads, n_kv_heads, head_dim, block_size, n_seqs;
    int n_ctx[MAX_SEQS], n_q[MAX_SEQS];
    int late_prefix_keys; /* prefix keys whose positions fall after the chunk's first positions */
    double q_scale;
} Scenario;

/* Host side of a scenario: pool, tables, positions, queries (all bf16 bit patterns / int32). */
typedef struct {
    const Scenario *sc;
    int n_blocks, table_stride, n_tokens, q_dim;
    size_t pool_elems;
    uint16_t *k, *v, *q;  /* pool (n_blocks, n_kv_heads, block_size, head_dim); q (n_tokens, q_dim) */
    int32_t *slot_pos;    /* (n_blocks, block_size) */
    int32_t *tables;      /* (n_seqs, table_stride) */
    int32_t seq_start[MAX_SEQS + 1], n_ctx[MAX_SEQS];
    int32_t *positions;   /* (n_tokens) */
    int32_t *tiles;       /* (n_tiles, 2) */
    int n_tiles;
} Case;

static int32_t *slot_of(const Case *c, int s, int j) {
    int bs = c->sc->block_size;
    return &c->slot_pos[c->tables[s * c->table_stride + j / bs] * bs + j % bs];
}

static void place_sequence(Case *c, int s, const int32_t *ids, int *next) {
    const Scenario *sc = c->sc;
    int n_ctx = sc->n_ctx[s], n_q = sc->n_q[s], n_prefix = n_ctx - n_q;
    for (int b = 0; b * sc->block_size < n_ctx; b++) c->tables[s * c->table_stride + b] = ids[(*next)++];
    /* Prefix: a permutation of 0..n_prefix-1; the last late_prefix_keys of them moved past the
     * chunk's first positions. Chunk: increasing from n_prefix - late / 2. */
    int late = sc->late_prefix_keys < n_prefix ? sc->late_prefix_keys : n_prefix;
    int chunk_base = n_prefix - late / 2;
    int32_t *perm = malloc((size_t)(n_prefix > 0 ? n_prefix : 1) * sizeof *perm);
    assert_non_null(perm);
    for (int j = 0; j < n_prefix; j++) perm[j] = j;
    shuffle(perm, n_prefix);
    for (int j = 0; j < n_prefix; j++) *slot_of(c, s, j) = perm[j] >= n_prefix - late ? perm[j] + late : perm[j];
    for (int t = 0; t < n_q; t++) {
        *slot_of(c, s, n_prefix + t) = chunk_base + t;
        c->positions[c->seq_start[s] + t] = chunk_base + t;
    }
    free(perm);
}

static void case_init(Case *c, const Scenario *sc) {
    memset(c, 0, sizeof *c);
    c->sc = sc;
    int bs = sc->block_size, used = 0;
    for (int s = 0; s < sc->n_seqs; s++) {
        int nb = (sc->n_ctx[s] + bs - 1) / bs;
        used += nb;
        if (nb > c->table_stride) c->table_stride = nb;
        c->seq_start[s + 1] = c->seq_start[s] + sc->n_q[s];
        c->n_ctx[s] = sc->n_ctx[s];
        if (sc->n_q[s] > 1) c->n_tiles += (sc->n_q[s] + TILE_ROWS - 1) / TILE_ROWS;
    }
    c->n_tokens = c->seq_start[sc->n_seqs];
    c->q_dim = sc->n_heads * sc->head_dim;
    c->n_blocks = used + 3; /* block 0 and two unused ones hold garbage the kernels must not read */
    c->pool_elems = (size_t)c->n_blocks * sc->n_kv_heads * bs * sc->head_dim;
    c->k = malloc(c->pool_elems * 2);
    c->v = malloc(c->pool_elems * 2);
    c->q = malloc((size_t)c->n_tokens * c->q_dim * 2);
    c->slot_pos = malloc((size_t)c->n_blocks * bs * 4);
    c->tables = calloc((size_t)sc->n_seqs * c->table_stride, 4);
    c->positions = malloc((size_t)c->n_tokens * 4);
    c->tiles = malloc((size_t)(c->n_tiles > 0 ? c->n_tiles : 1) * 2 * 4);
    int32_t *ids = malloc((size_t)c->n_blocks * 4);
    assert_true(c->k && c->v && c->q && c->slot_pos && c->tables && c->positions && c->tiles && ids);
    for (size_t i = 0; i < c->pool_elems; i++) c->k[i] = random_bf16(1.0), c->v[i] = random_bf16(1.0);
    for (size_t i = 0; i < (size_t)c->n_tokens * c->q_dim; i++) c->q[i] = random_bf16(sc->q_scale);
    for (int i = 0; i < c->n_blocks * bs; i++) c->slot_pos[i] = INT_MAX;
    for (int i = 0; i < c->n_blocks - 1; i++) ids[i] = i + 1;
    shuffle(ids, c->n_blocks - 1);
    int next = 0, t = 0;
    for (int s = 0; s < sc->n_seqs; s++) {
        place_sequence(c, s, ids, &next);
        if (sc->n_q[s] <= 1) continue; /* a decode sequence: no tile, as in backend_cuda.c */
        for (int r0 = 0; r0 < sc->n_q[s]; r0 += TILE_ROWS, t++) c->tiles[2 * t] = s, c->tiles[2 * t + 1] = r0;
    }
    free(ids);
}

static void case_free(Case *c) {
    free(c->k), free(c->v), free(c->q), free(c->slot_pos), free(c->tables), free(c->positions), free(c->tiles);
}

/* Reference output of token row `row` (sequence s), head h, into out (head_dim). */
static void reference_row(const Case *c, int s, int row, int h, double *out) {
    const Scenario *sc = c->sc;
    int hd = sc->head_dim, bs = sc->block_size, kvh = h / (sc->n_heads / sc->n_kv_heads);
    const uint16_t *q = c->q + (size_t)row * c->q_dim + (size_t)h * hd;
    int32_t qpos = c->positions[row];
    double m = -INFINITY, l = 0.0, scale = 1.0 / sqrt((double)hd);
    double *scores = malloc((size_t)c->n_ctx[s] * sizeof *scores);
    assert_non_null(scores);
    for (int j = 0; j < c->n_ctx[s]; j++) {
        scores[j] = -INFINITY;
        if (*slot_of(c, s, j) > qpos) continue;
        size_t block = (size_t)c->tables[s * c->table_stride + j / bs];
        const uint16_t *k = c->k + ((block * sc->n_kv_heads + kvh) * bs + j % bs) * hd;
        double dot = 0.0;
        for (int d = 0; d < hd; d++) dot += (double)bf16_to_fp32(q[d]) * bf16_to_fp32(k[d]);
        scores[j] = dot * scale;
        if (scores[j] > m) m = scores[j];
    }
    for (int d = 0; d < hd; d++) out[d] = 0.0;
    for (int j = 0; j < c->n_ctx[s]; j++) {
        if (scores[j] == -INFINITY) continue;
        double p = exp(scores[j] - m);
        l += p;
        size_t block = (size_t)c->tables[s * c->table_stride + j / bs];
        const uint16_t *v = c->v + ((block * sc->n_kv_heads + kvh) * bs + j % bs) * hd;
        for (int d = 0; d < hd; d++) out[d] += p * bf16_to_fp32(v[d]);
    }
    for (int d = 0; d < hd; d++) out[d] = l > 0.0 ? out[d] / l : 0.0;
    free(scores);
}

typedef struct {
    CudaAttention a;
    void *ptrs[16];
    int n;
    int32_t *tiles_dev;
} DeviceCase;

static void *upload(DeviceCase *d, const void *host, size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes > 0 ? bytes : 4));
    if (bytes) CUDA_OK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    assert_true(d->n < 16);
    d->ptrs[d->n++] = p;
    return p;
}

static void device_case_init(DeviceCase *d, const Case *c) {
    const Scenario *sc = c->sc;
    memset(d, 0, sizeof *d);
    size_t q_bytes = (size_t)c->n_tokens * c->q_dim * 2;
    d->a = (CudaAttention){
        .q = upload(d, c->q, q_bytes), .out = upload(d, NULL, q_bytes),
        .k_cache = upload(d, c->k, c->pool_elems * 2), .v_cache = upload(d, c->v, c->pool_elems * 2),
        .slot_pos = upload(d, c->slot_pos, (size_t)c->n_blocks * sc->block_size * 4),
        .positions = upload(d, c->positions, (size_t)c->n_tokens * 4),
        .seq_start = upload(d, c->seq_start, (size_t)(sc->n_seqs + 1) * 4),
        .seq_n_ctx = upload(d, c->n_ctx, (size_t)sc->n_seqs * 4),
        .block_tables = upload(d, c->tables, (size_t)sc->n_seqs * c->table_stride * 4),
        .table_stride = c->table_stride, .n_heads = sc->n_heads, .n_kv_heads = sc->n_kv_heads,
        .head_dim = sc->head_dim, .block_size = sc->block_size,
    };
    d->tiles_dev = upload(d, c->tiles, (size_t)c->n_tiles * 2 * 4);
}

static void device_case_free(DeviceCase *d) {
    for (int i = 0; i < d->n; i++) cudaFree(d->ptrs[i]);
}

/* Runs one kernel (output poisoned with NaN first); returns the output as floats; *ms the time
 * of a second, timed launch when ms != NULL. */
static float *run_kernel(DeviceCase *d, const Case *c, PrefillKernel kernel, float *ms) {
    size_t elems = (size_t)c->n_tokens * c->q_dim;
    CUDA_OK(cudaMemset(d->a.out, 0xFF, elems * 2));
    CUDA_OK(kernel(&d->a, d->tiles_dev, c->n_tiles, 0));
    CUDA_OK(cudaDeviceSynchronize());
    uint16_t *out16 = malloc(elems * 2);
    float *out = malloc(elems * sizeof *out);
    assert_true(out16 && out);
    CUDA_OK(cudaMemcpy(out16, d->a.out, elems * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < elems; i++) out[i] = bf16_to_fp32(out16[i]);
    free(out16);
    if (ms) {
        cudaEvent_t ev[2];
        CUDA_OK(cudaEventCreate(&ev[0]));
        CUDA_OK(cudaEventCreate(&ev[1]));
        CUDA_OK(cudaEventRecord(ev[0], 0));
        for (int rep = 0; rep < 5; rep++) CUDA_OK(kernel(&d->a, d->tiles_dev, c->n_tiles, 0));
        CUDA_OK(cudaEventRecord(ev[1], 0));
        CUDA_OK(cudaEventSynchronize(ev[1]));
        CUDA_OK(cudaEventElapsedTime(ms, ev[0], ev[1]));
        *ms /= 5.0f;
        cudaEventDestroy(ev[0]);
        cudaEventDestroy(ev[1]);
    }
    return out;
}

static bool row_sampled(int row, int n_rows, int every) { return every <= 1 || row % every == 0 || row >= n_rows - 3; }

/* Compares out with the reference on every (row, head) of prefill sequences (every `every`-th
 * row plus the last rows when every > 1); decode rows must still be the NaN poison. */
static void check_against_reference(const Case *c, const float *out, const char *kernel_name, int every) {
    const Scenario *sc = c->sc;
    int hd = sc->head_dim;
    double *ref = malloc((size_t)hd * sizeof *ref), worst = 0.0;
    assert_non_null(ref);
    for (int s = 0; s < sc->n_seqs; s++) {
        for (int r = 0; r < sc->n_q[s]; r++) {
            int row = c->seq_start[s] + r;
            if (sc->n_q[s] <= 1) {
                for (int i = 0; i < c->q_dim; i++)
                    if (!isnan(out[(size_t)row * c->q_dim + i]))
                        fail_msg("%s / %s: decode row %d (no tile) was written", sc->name, kernel_name, row);
                continue;
            }
            if (!row_sampled(r, sc->n_q[s], every)) continue;
            for (int h = 0; h < sc->n_heads; h++) {
                reference_row(c, s, row, h, ref);
                for (int d = 0; d < hd; d++) {
                    double got = out[(size_t)row * c->q_dim + (size_t)h * hd + d], err = fabs(got - ref[d]);
                    if (!(err <= ABS_TOL + REL_TOL * fabs(ref[d])))
                        fail_msg("%s / %s: seq %d row %d head %d dim %d: got %.6f, reference %.6f", sc->name, kernel_name, s, r,
                                 h, d, got, ref[d]);
                    if (err > worst) worst = err;
                }
            }
        }
    }
    printf("  %-28s %-6s max |err| vs reference %.2e\n", sc->name, kernel_name, worst);
    free(ref);
}

static void check_kernels_agree(const Case *c, const float *a, const float *b) {
    size_t elems = (size_t)c->n_tokens * c->q_dim;
    double worst = 0.0;
    for (size_t i = 0; i < elems; i++) {
        if (isnan(a[i]) && isnan(b[i])) continue; /* decode rows: both untouched */
        double err = fabs((double)a[i] - b[i]);
        if (!(err <= 2.0 * (ABS_TOL + REL_TOL * fabs(b[i]))))
            fail_msg("%s: flash and wmma differ at element %zu: %.6f vs %.6f", c->sc->name, i, a[i], b[i]);
        if (err > worst) worst = err;
    }
    printf("  %-28s flash vs wmma max |diff| %.2e\n", c->sc->name, worst);
}

static void run_scenario(const Scenario *sc) {
    Case c;
    DeviceCase d;
    case_init(&c, sc);
    device_case_init(&d, &c);
    float *flash = run_kernel(&d, &c, cuda_attention_prefill_flash, NULL);
    float *wmma = run_kernel(&d, &c, cuda_attention_prefill, NULL);
    check_against_reference(&c, flash, "flash", 1);
    check_against_reference(&c, wmma, "wmma", 1);
    check_kernels_agree(&c, flash, wmma);
    free(flash), free(wmma);
    device_case_free(&d);
    case_free(&c);
}

static int setup(void **state) {
    (void)state;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return -1;
    return cuda_kernels_init() == cudaSuccess ? 0 : -1;
}

static void test_gqa4_head128_partial_tile(void **state) {
    (void)state;
    static const Scenario sc = {"gqa4 hd128 300 tokens", 32, 8, 128, 16, 1, {300}, {300}, 0, 1.0};
    run_scenario(&sc);
}

static void test_mha_head128_cached_prefix_and_decode_row(void **state) {
    (void)state;
    /* prefill with a cached prefix, then a decode sequence (no tile), then an exact 64-row chunk,
     * then a 2-token chunk (a tile of 2 rows) */
    static const Scenario sc = {"mha hd128 prefix+decode", 8, 8, 128, 16, 4, {200, 37, 64, 90}, {70, 1, 64, 2}, 6, 1.0};
    run_scenario(&sc);
}

static void test_gqa3_head64_late_prefix_keys(void **state) {
    (void)state;
    static const Scenario sc = {"gqa3 hd64 permuted/late", 9, 3, 64, 8, 2, {150, 129}, {50, 65}, 20, 1.0};
    run_scenario(&sc);
}

static void test_gqa8_head64_long_prefix(void **state) {
    (void)state;
    static const Scenario sc = {"gqa8 hd64 17 after 500", 8, 1, 64, 32, 2, {517, 63}, {17, 63}, 3, 1.0};
    run_scenario(&sc);
}

static void test_head128_long_large_scores(void **state) {
    (void)state;
    static const Scenario sc = {"gqa2 hd128 1000, q x8", 4, 2, 128, 16, 1, {1000}, {1000}, 0, 8.0};
    run_scenario(&sc);
}

/* The 8B attention shape at 4K: agreement, sampled reference rows, and each kernel's time. */
static void test_llama8b_shape_4096(void **state) {
    (void)state;
    if (getenv("BRAID_TEST_QUICK")) skip();
    static const Scenario sc = {"llama3-8b 4096", 32, 8, 128, 16, 1, {4096}, {4096}, 0, 1.0};
    Case c;
    DeviceCase d;
    case_init(&c, &sc);
    device_case_init(&d, &c);
    float ms_flash = 0, ms_wmma = 0;
    float *flash = run_kernel(&d, &c, cuda_attention_prefill_flash, &ms_flash);
    float *wmma = run_kernel(&d, &c, cuda_attention_prefill, &ms_wmma);
    check_kernels_agree(&c, flash, wmma);
    check_against_reference(&c, flash, "flash", 509);
    double flops = 4.0 * sc.n_heads * sc.head_dim * (4096.0 * 4097.0 / 2.0);
    printf("prefill-attention kernel=flash tokens=4096 ms=%.3f tflops=%.1f\n", ms_flash, flops / ms_flash / 1e9);
    printf("prefill-attention kernel=wmma tokens=4096 ms=%.3f tflops=%.1f\n", ms_wmma, flops / ms_wmma / 1e9);
    free(flash), free(wmma);
    device_case_free(&d);
    case_free(&c);
}

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "test_attention_prefill_cuda: no CUDA GPU visible, skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gqa4_head128_partial_tile),
        cmocka_unit_test(test_mha_head128_cached_prefix_and_decode_row),
        cmocka_unit_test(test_gqa3_head64_late_prefix_keys),
        cmocka_unit_test(test_gqa8_head64_long_prefix),
        cmocka_unit_test(test_head128_long_large_scores),
        cmocka_unit_test(test_llama8b_shape_4096),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
