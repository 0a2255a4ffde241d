/*
 * test_residual_attention_cuda.c — ForkKV's CUDA kernels (residual_attention.cu, lora_delta.cu)
 * against their CPU references. Skips (exit 77) when no GPU is visible.
 *
 * - cuda_residual_attention against cpu_residual_attention, sequence by sequence, on random
 *   inputs: shuffled base and residual block tables (independent block ids), explicit positions
 *   (contiguous, spliced with a gap, and permuted so that causality follows the recorded
 *   positions, not the slot order), GQA groups 1, 3, 4 and 8, adapters of rank 16 and 8 in one
 *   rank-16 pool (the upper lanes of the narrow adapter's slots hold garbage it must not read), an
 *   adapter with V adapted only, base-model sequences, full and partial rotary dims, both RoPE
 *   pairings, decode (one query per sequence, 1 to 4 splits) and prefill (tiles of 4 queries).
 * - cuda_lora_delta against a double-precision loop: mixed adapters per token, a projection that
 *   one adapter leaves alone, base tokens and columns outside the projection untouched bit for bit.
 * - cuda_lora_residual_store against a double-precision loop: slot -1 and base tokens write
 *   nothing, lanes past an adapter's rank are zero, a missing A writes zeros.
 *
 * Inputs are exact in both bf16 (the CUDA pools) and IEEE half (the CPU pools), so both sides see
 * the same numbers and the tolerances only cover arithmetic:
 * - attention: the CUDA output is rounded to bf16 (8 significant bits): at most 2^-8 relative.
 *   On top, fp32 reassociation of dot products and sums, __expf and sincosf against expf and
 *   cosf/sinf: a few fp32 ulps of O(1) values, far below ATTN_ABS_TOL = 2e-4.
 * - LoRA: every result is a sum of products accumulated in fp32 in some order; the standard bound
 *   for n terms is |error| <= n · 2^-24 · sum |terms| (gamma_n), used as is.
 */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/residual_attention.h"
#include "kernels/cuda/cuda_kernels.h"
#include "model/tensor_types.h"

#define ATTN_REL_TOL (1.0 / 256.0) /* bf16 output rounding: half an ulp of an 8-bit significand */
#define ATTN_ABS_TOL 2e-4          /* fp32 reassociation, __expf, sincosf */
#define FP32_UNIT_ROUNDOFF (1.0 / 16777216.0)
#define MAX_SEQS 8
#define N_ADAPTER_IDS 4 /* 0 base, 1 rank 16, 2 rank 8, 3 rank 8 adapting V only */

#define CUDA_OK(call)                                                                                                   \
    do {                                                                                                                \
        cudaError_t e_ = (call);                                                                                        \
        if (e_ != cudaSuccess) fail_msg("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));    \
    } while (0)

/* ---- inputs ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double uniform(void) { /* [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static int random_below(int n) { return (int)(uniform() * n); }

/* A value in [-scale, scale) that bf16 and IEEE half both hold exactly: rounded to bf16's 8
 * significant bits, and 0 below half's normal range (where half would drop bits). */
static float exact_value(double scale) {
    float v = bf16_to_fp32(fp32_to_bf16((float)((uniform() * 2.0 - 1.0) * scale)));
    return fabsf(v) < 0x1p-14f ? 0.0f : v;
}

static float *exact_values(size_t n, double scale) {
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = exact_value(scale);
    return v;
}

static float *plain_values(size_t n, double scale) {
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = (float)((uniform() * 2.0 - 1.0) * scale);
    return v;
}

static uint16_t *to_bf16(const float *v, size_t n) {
    uint16_t *o = malloc(n * sizeof *o);
    assert_non_null(o);
    for (size_t i = 0; i < n; i++) o[i] = fp32_to_bf16(v[i]);
    return o;
}

static uint16_t *to_half(const float *v, size_t n) {
    uint16_t *o = malloc(n * sizeof *o);
    assert_non_null(o);
    for (size_t i = 0; i < n; i++) o[i] = fp32_to_fp16(v[i]);
    return o;
}

/* perm[0..n) = a random permutation of first..first+n-1. */
static void shuffled_ids(int32_t *perm, int n, int first) {
    for (int i = 0; i < n; i++) perm[i] = first + i;
    for (int i = n - 1; i > 0; i--) {
        int j = random_below(i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ---- device memory: every allocation of a test, freed together ---- */

typedef struct {
    void *ptrs[64];
    int n;
} DeviceArena;

static void *dev_alloc(DeviceArena *arena, size_t bytes) {
    assert_true(arena->n < (int)(sizeof arena->ptrs / sizeof arena->ptrs[0]));
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
    arena->ptrs[arena->n++] = p;
    return p;
}

static void *dev_upload(DeviceArena *arena, const void *host, size_t bytes) {
    void *p = dev_alloc(arena, bytes);
    CUDA_OK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void dev_free_all(DeviceArena *arena) {
    for (int i = 0; i < arena->n; i++) cudaFree(arena->ptrs[i]);
    arena->n = 0;
}

/* ---- adapters: one projection's pairs for every id, host copies and the device tables ---- */

typedef struct {
    float *a[N_ADAPTER_IDS], *b[N_ADAPTER_IDS]; /* host (rank, in) / (out, rank); NULL: not adapted */
    int32_t rank[N_ADAPTER_IDS];
    float scale[N_ADAPTER_IDS];
    CudaLoraProjection dev;
} ProjectionPairs;

/* Adapter 1 has rank 16, adapters 2 and 3 rank 8; `skip_id` (if > 0) leaves this projection alone. */
static void make_projection(ProjectionPairs *p, int in, int out, int skip_id, DeviceArena *arena) {
    static const int32_t ranks[N_ADAPTER_IDS] = {0, 16, 8, 8};
    static const float alphas[N_ADAPTER_IDS] = {0, 8, 8, 16};
    const float *dev_a[N_ADAPTER_IDS] = {NULL}, *dev_b[N_ADAPTER_IDS] = {NULL};
    memset(p, 0, sizeof *p);
    for (int id = 1; id < N_ADAPTER_IDS; id++) {
        p->rank[id] = ranks[id];
        p->scale[id] = alphas[id] / (float)ranks[id];
        if (id == skip_id) continue;
        p->a[id] = plain_values((size_t)ranks[id] * in, 0.5);
        p->b[id] = plain_values((size_t)out * ranks[id], 0.5);
        dev_a[id] = dev_upload(arena, p->a[id], (size_t)ranks[id] * in * sizeof(float));
        dev_b[id] = dev_upload(arena, p->b[id], (size_t)out * ranks[id] * sizeof(float));
    }
    p->dev.a = dev_upload(arena, dev_a, sizeof dev_a);
    p->dev.b = dev_upload(arena, dev_b, sizeof dev_b);
    p->dev.rank = dev_upload(arena, p->rank, sizeof p->rank);
    p->dev.scale = dev_upload(arena, p->scale, sizeof p->scale);
    p->dev.n_ids = N_ADAPTER_IDS;
    p->dev.max_rank = ranks[1];
}

static void free_projection(ProjectionPairs *p) {
    for (int id = 0; id < N_ADAPTER_IDS; id++) free(p->a[id]), free(p->b[id]);
}

/* ---- ResidualAttention ---- */

typedef enum { POS_CONTIGUOUS, POS_SPLICED, POS_PERMUTED } PositionPattern;

typedef struct {
    const char *name;
    int n_heads, n_kv_heads, head_dim, rope_dim, interleaved, block_size;
    float position_scale;
    int tile_queries, n_splits, n_seqs;
    int n_ctx[MAX_SEQS], n_q[MAX_SEQS], adapter[MAX_SEQS];
    PositionPattern positions[MAX_SEQS];
} Scenario;

enum { POOL_RANK = 16 };

/* Host side of one scenario: pools in exact values, tables, positions, queries. */
typedef struct {
    const Scenario *sc;
    int n_blocks, table_stride, n_tokens, q_dim, n_positions;
    float *k_base, *v_base;         /* (n_blocks, n_kv_heads, block_size, head_dim) */
    float *k_res, *v_res;           /* (n_blocks, block_size, POOL_RANK) */
    float *q;                       /* (n_tokens, q_dim) */
    int32_t *slot_pos;              /* (n_blocks, block_size) */
    int32_t *tables, *res_tables;   /* (n_seqs, table_stride) */
    int32_t seq_start[MAX_SEQS + 1];
    int32_t *positions;             /* (n_tokens) */
    ProjectionPairs k_proj, v_proj; /* only B is used by attention */
} AttnCase;

static int32_t position_of(PositionPattern pattern, const int32_t *perm, int j, int n_ctx) {
    switch (pattern) {
    case POS_CONTIGUOUS: return 3 + j;
    case POS_SPLICED: return 40 + j + (j >= n_ctx / 2 ? 29 : 0); /* a segment moved 29 positions on */
    case POS_PERMUTED: return 11 + perm[j];
    }
    return 0;
}

/* Gives sequence s its blocks (base and residual ids drawn from two shuffles) and positions. */
static void place_sequence(AttnCase *c, int s, const int32_t *base_ids, const int32_t *res_ids, int *next_block) {
    const Scenario *sc = c->sc;
    int bs = sc->block_size, n_ctx = sc->n_ctx[s];
    int32_t *perm = malloc((size_t)(n_ctx > 0 ? n_ctx : 1) * sizeof *perm);
    assert_non_null(perm);
    shuffled_ids(perm, n_ctx, 0);
    for (int b = 0; b * bs < n_ctx; b++, (*next_block)++) {
        c->tables[s * c->table_stride + b] = base_ids[*next_block];
        c->res_tables[s * c->table_stride + b] = res_ids[*next_block];
    }
    for (int j = 0; j < n_ctx; j++) {
        int32_t pos = position_of(sc->positions[s], perm, j, n_ctx);
        c->slot_pos[c->tables[s * c->table_stride + j / bs] * bs + j % bs] = pos;
        if (pos + 1 > c->n_positions) c->n_positions = pos + 1;
    }
    /* The queries are the context's last n_q tokens: each at its own slot's recorded position. */
    for (int t = 0; t < sc->n_q[s]; t++) {
        int j = n_ctx - sc->n_q[s] + t;
        c->positions[c->seq_start[s] + t] = c->slot_pos[c->tables[s * c->table_stride + j / bs] * bs + j % bs];
    }
    free(perm);
}

static void attn_case_init(AttnCase *c, const Scenario *sc, DeviceArena *arena) {
    memset(c, 0, sizeof *c);
    c->sc = sc;
    int bs = sc->block_size, kv_dim = sc->n_kv_heads * sc->head_dim, blocks_used = 0;
    c->seq_start[0] = 0;
    for (int s = 0; s < sc->n_seqs; s++) {
        int nb = (sc->n_ctx[s] + bs - 1) / bs;
        blocks_used += nb;
        if (nb > c->table_stride) c->table_stride = nb;
        c->seq_start[s + 1] = c->seq_start[s] + sc->n_q[s];
    }
    c->n_tokens = c->seq_start[sc->n_seqs];
    c->q_dim = sc->n_heads * sc->head_dim;
    c->n_blocks = blocks_used + 3; /* block 0 (null) and two never used */
    size_t base_elems = (size_t)c->n_blocks * kv_dim * bs, res_elems = (size_t)c->n_blocks * bs * POOL_RANK;
    c->k_base = exact_values(base_elems, 1.0);
    c->v_base = exact_values(base_elems, 1.0);
    /* Every lane random, also those past a rank-8 adapter's: they must never be read. */
    c->k_res = exact_values(res_elems, 1.0);
    c->v_res = exact_values(res_elems, 1.0);
    c->q = exact_values((size_t)c->n_tokens * c->q_dim, 2.0);
    c->slot_pos = malloc((size_t)c->n_blocks * bs * sizeof *c->slot_pos);
    c->tables = calloc((size_t)sc->n_seqs * c->table_stride, sizeof *c->tables);
    c->res_tables = calloc((size_t)sc->n_seqs * c->table_stride, sizeof *c->res_tables);
    c->positions = malloc((size_t)c->n_tokens * sizeof *c->positions);
    int32_t *base_ids = malloc((size_t)c->n_blocks * sizeof *base_ids), *res_ids = malloc((size_t)c->n_blocks * sizeof *res_ids);
    assert_true(c->slot_pos && c->tables && c->res_tables && c->positions && base_ids && res_ids);
    for (int i = 0; i < c->n_blocks * bs; i++) c->slot_pos[i] = INT_MAX; /* never-written slots */
    shuffled_ids(base_ids, c->n_blocks - 1, 1);
    shuffled_ids(res_ids, c->n_blocks - 1, 1);
    int next_block = 0;
    for (int s = 0; s < sc->n_seqs; s++) place_sequence(c, s, base_ids, res_ids, &next_block);
    free(base_ids);
    free(res_ids);
    /* Attention reads B_k, B_v (kv_dim, rank); the A sides are generated but unused here. */
    make_projection(&c->k_proj, 8, kv_dim, 3, arena);
    make_projection(&c->v_proj, 8, kv_dim, 0, arena);
}

static void attn_case_free(AttnCase *c) {
    free(c->k_base), free(c->v_base), free(c->k_res), free(c->v_res), free(c->q);
    free(c->slot_pos), free(c->tables), free(c->res_tables), free(c->positions);
    free_projection(&c->k_proj);
    free_projection(&c->v_proj);
}

/* The CPU reference for sequence s: out (n_q[s], q_dim). with_adapter 0 runs plain attention. */
static void cpu_reference(const AttnCase *c, int s, int with_adapter, const uint16_t *kb16, const uint16_t *vb16,
                          const uint16_t *kr16, const uint16_t *vr16, float *out) {
    const Scenario *sc = c->sc;
    KvLayerView kv = {(uint16_t *)kb16, (uint16_t *)vb16, c->slot_pos, sc->block_size, sc->n_kv_heads, sc->head_dim};
    ResidualLayerView res = {(uint16_t *)kr16, (uint16_t *)vr16, sc->block_size, POOL_RANK};
    int id = with_adapter ? sc->adapter[s] : 0;
    ResidualAdapter ad = {c->k_proj.b[id], c->v_proj.b[id], c->k_proj.rank[id], c->k_proj.scale[id]};
    int half = sc->rope_dim / 2;
    float *cos_t = malloc((size_t)c->n_positions * half * sizeof *cos_t), *sin_t = malloc((size_t)c->n_positions * half * sizeof *sin_t);
    assert_true(cos_t && sin_t);
    for (int p = 0; p < c->n_positions; p++)
        cpu_rope_angles(p, sc->rope_dim, 10000.0f, sc->position_scale, NULL, cos_t + (size_t)p * half, sin_t + (size_t)p * half);
    RopeTable rope = {cos_t, sin_t, c->n_positions, sc->rope_dim, sc->head_dim,
                      sc->interleaved ? ROPE_PAIRING_INTERLEAVED : ROPE_PAIRING_HALF_SPLIT};
    int t0 = c->seq_start[s];
    assert_int_equal(cpu_residual_attention(&kv, c->tables + s * c->table_stride, &res, c->res_tables + s * c->table_stride,
                                            sc->n_ctx[s], &ad, &rope, c->q + (size_t)t0 * c->q_dim, c->positions + t0,
                                            sc->n_q[s], sc->n_heads, out),
                     0);
    free(cos_t);
    free(sin_t);
}

/* Runs cuda_residual_attention on the case; returns the output (n_tokens, q_dim) as floats. */
static float *run_cuda(const AttnCase *c, DeviceArena *arena) {
    const Scenario *sc = c->sc;
    size_t base_elems = (size_t)c->n_blocks * sc->n_kv_heads * sc->block_size * sc->head_dim;
    size_t res_elems = (size_t)c->n_blocks * sc->block_size * POOL_RANK, q_elems = (size_t)c->n_tokens * c->q_dim;
    uint16_t *kb = to_bf16(c->k_base, base_elems), *vb = to_bf16(c->v_base, base_elems);
    uint16_t *kr = to_bf16(c->k_res, res_elems), *vr = to_bf16(c->v_res, res_elems), *q = to_bf16(c->q, q_elems);
    int32_t n_ctx[MAX_SEQS], tiles[2 * 64], n_tiles = 0;
    for (int s = 0; s < sc->n_seqs; s++) {
        n_ctx[s] = sc->n_ctx[s];
        for (int r0 = 0; r0 < sc->n_q[s]; r0 += sc->tile_queries, n_tiles++) {
            assert_true(n_tiles < 64);
            tiles[2 * n_tiles] = s;
            tiles[2 * n_tiles + 1] = r0;
        }
    }
    float inv_freq[64];
    for (int i = 0; i < sc->rope_dim / 2; i++) inv_freq[i] = cpu_rope_inv_freq(i, sc->rope_dim, 10000.0f, NULL);

    CudaResidualAttention a = {
        .base = {.q = dev_upload(arena, q, q_elems * 2), .out = dev_alloc(arena, q_elems * 2),
                 .k_cache = dev_upload(arena, kb, base_elems * 2), .v_cache = dev_upload(arena, vb, base_elems * 2),
                 .slot_pos = dev_upload(arena, c->slot_pos, (size_t)c->n_blocks * sc->block_size * 4),
                 .positions = dev_upload(arena, c->positions, (size_t)c->n_tokens * 4),
                 .seq_start = dev_upload(arena, c->seq_start, (size_t)(sc->n_seqs + 1) * 4),
                 .seq_n_ctx = dev_upload(arena, n_ctx, (size_t)sc->n_seqs * 4),
                 .block_tables = dev_upload(arena, c->tables, (size_t)sc->n_seqs * c->table_stride * 4),
                 .table_stride = c->table_stride, .n_heads = sc->n_heads, .n_kv_heads = sc->n_kv_heads,
                 .head_dim = sc->head_dim, .block_size = sc->block_size},
        .res = {.k = dev_upload(arena, kr, res_elems * 2), .v = dev_upload(arena, vr, res_elems * 2),
                .block_size = sc->block_size, .rank = POOL_RANK},
        .res_block_tables = dev_upload(arena, c->res_tables, (size_t)sc->n_seqs * c->table_stride * 4),
        .seq_adapter = dev_upload(arena, sc->adapter, (size_t)sc->n_seqs * 4),
        .k_proj = c->k_proj.dev,
        .v_proj = c->v_proj.dev,
        .rope = {.n_heads = sc->n_heads, .n_kv_heads = sc->n_kv_heads, .head_dim = sc->head_dim, .rope_dim = sc->rope_dim,
                 .interleaved = sc->interleaved, .position_scale = sc->position_scale,
                 .inv_freq = dev_upload(arena, inv_freq, sizeof inv_freq)},
    };
    /* Poison the output: a row the kernels forget shows up as NaN. */
    CUDA_OK(cudaMemset(a.base.out, 0xFF, q_elems * 2));
    size_t n_partials = cuda_residual_partials_floats(n_tiles, sc->n_heads, sc->tile_queries, sc->n_splits, sc->head_dim, POOL_RANK);
    float *partials = dev_alloc(arena, n_partials * sizeof(float));
    const int32_t *tiles_dev = dev_upload(arena, tiles, (size_t)n_tiles * 2 * 4);
    CUDA_OK(cuda_residual_attention(&a, tiles_dev, n_tiles, sc->tile_queries, sc->n_splits, partials, 0));
    CUDA_OK(cudaDeviceSynchronize());
    uint16_t *out16 = malloc(q_elems * 2);
    float *out = malloc(q_elems * sizeof *out);
    assert_true(out16 && out);
    CUDA_OK(cudaMemcpy(out16, a.base.out, q_elems * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < q_elems; i++) out[i] = bf16_to_fp32(out16[i]);
    free(out16), free(kb), free(vb), free(kr), free(vr), free(q);
    return out;
}

/* Compares sequence s of the CUDA output with the CPU reference; fails naming the first element
 * out of tolerance. Returns the largest |adapted - plain| of the reference (the adapter's effect). */
static double check_sequence(const AttnCase *c, int s, const float *gpu, const float *ref, const float *plain, double *worst) {
    const Scenario *sc = c->sc;
    double effect = 0.0;
    for (int t = 0; t < sc->n_q[s]; t++)
        for (int i = 0; i < c->q_dim; i++) {
            size_t at = (size_t)t * c->q_dim + i;
            double g = gpu[(size_t)(c->seq_start[s] + t) * c->q_dim + i], r = ref[at], tol = ATTN_REL_TOL * fabs(r) + ATTN_ABS_TOL;
            double d = fabs(g - r);
            if (d > *worst) *worst = d;
            if (!(d <= tol))
                fail_msg("%s: sequence %d (adapter %d, n_ctx %d), query %d (position %d), head %d, dim %d: cuda %.6f, cpu %.6f, "
                         "|diff| %.3g > tolerance %.3g",
                         sc->name, s, sc->adapter[s], sc->n_ctx[s], t, c->positions[c->seq_start[s] + t], i / sc->head_dim,
                         i % sc->head_dim, g, r, d, tol);
            double e = fabs(r - plain[at]);
            if (e > effect) effect = e;
        }
    return effect;
}

static void test_residual_attention(void **state) {
    const Scenario *sc = *state;
    DeviceArena arena = {{0}, 0};
    AttnCase c;
    attn_case_init(&c, sc, &arena);
    float *gpu = run_cuda(&c, &arena);
    size_t base_elems = (size_t)c.n_blocks * sc->n_kv_heads * sc->block_size * sc->head_dim;
    size_t res_elems = (size_t)c.n_blocks * sc->block_size * POOL_RANK;
    uint16_t *kb = to_half(c.k_base, base_elems), *vb = to_half(c.v_base, base_elems);
    uint16_t *kr = to_half(c.k_res, res_elems), *vr = to_half(c.v_res, res_elems);
    double worst = 0.0;
    for (int s = 0; s < sc->n_seqs; s++) {
        size_t n = (size_t)sc->n_q[s] * c.q_dim;
        float *ref = malloc(n * sizeof *ref), *plain = malloc(n * sizeof *plain);
        assert_true(ref && plain);
        cpu_reference(&c, s, 1, kb, vb, kr, vr, ref);
        cpu_reference(&c, s, 0, kb, vb, kr, vr, plain);
        double effect = check_sequence(&c, s, gpu, ref, plain, &worst);
        /* The comparison means something only if the residuals move the output well past the
         * tolerance: a kernel that ignored them would then fail above. */
        if (sc->adapter[s] != 0 && !(effect > 0.05))
            fail_msg("%s: sequence %d: the adapter changes the reference output by only %.3g; the inputs do not exercise the "
                     "residual path",
                     sc->name, s, effect);
        free(ref);
        free(plain);
    }
    printf("    %s: max |cuda - cpu| %.3g over %d tokens\n", sc->name, worst, c.n_tokens);
    free(kb), free(vb), free(kr), free(vr), free(gpu);
    attn_case_free(&c);
    dev_free_all(&arena);
}

/* ---- LoRA delta and residual store ---- */

enum { LORA_IN = 576, LORA_TOKENS = 37, Y_STRIDE = 1000, Y_COL0 = 100, LORA_OUT = 300 };

static void random_token_adapters(int32_t *ids, int n) {
    for (int t = 0; t < n; t++) ids[t] = random_below(N_ADAPTER_IDS + 1); /* N_ADAPTER_IDS itself: out of range */
    ids[0] = 1, ids[1] = 2, ids[2] = 0, ids[3] = 3; /* every kind present whatever the draw */
}

/* u_r = A[r] · x in double, and the sum of |terms| (for the rounding bound). */
static double dot_with_bound(const float *a_row, const float *x, int in, double *abs_sum) {
    double s = 0.0, m = 0.0;
    for (int i = 0; i < in; i++) {
        s += (double)a_row[i] * x[i];
        m += fabs((double)a_row[i] * x[i]);
    }
    *abs_sum = m;
    return s;
}

static void test_lora_delta(void **state) {
    (void)state;
    DeviceArena arena = {{0}, 0};
    ProjectionPairs p;
    make_projection(&p, LORA_IN, LORA_OUT, 3, &arena); /* adapter 3 leaves this projection alone */
    float *x = exact_values((size_t)LORA_TOKENS * LORA_IN, 1.0), *y0 = plain_values((size_t)LORA_TOKENS * Y_STRIDE, 1.0);
    int32_t ids[LORA_TOKENS];
    random_token_adapters(ids, LORA_TOKENS);
    uint16_t *x16 = to_bf16(x, (size_t)LORA_TOKENS * LORA_IN);
    size_t y_bytes = (size_t)LORA_TOKENS * Y_STRIDE * sizeof(float);
    float *y_dev = dev_upload(&arena, y0, y_bytes), *scratch = dev_alloc(&arena, (size_t)LORA_TOKENS * p.dev.max_rank * 4);
    CUDA_OK(cuda_lora_delta(&p.dev, dev_upload(&arena, ids, sizeof ids), dev_upload(&arena, x16, (size_t)LORA_TOKENS * LORA_IN * 2),
                            LORA_TOKENS, LORA_IN, y_dev + Y_COL0, Y_STRIDE, LORA_OUT, scratch, 0));
    CUDA_OK(cudaDeviceSynchronize());
    float *y = malloc(y_bytes);
    assert_non_null(y);
    CUDA_OK(cudaMemcpy(y, y_dev, y_bytes, cudaMemcpyDeviceToHost));
    int adapted_rows = 0;
    for (int t = 0; t < LORA_TOKENS; t++) {
        int id = ids[t], adapted = id >= 1 && id < N_ADAPTER_IDS && p.a[id];
        adapted_rows += adapted;
        double u[16], u_bound[16];
        for (int r = 0; adapted && r < p.rank[id]; r++) {
            u[r] = p.scale[id] * dot_with_bound(p.a[id] + (size_t)r * LORA_IN, x + (size_t)t * LORA_IN, LORA_IN, &u_bound[r]);
            u_bound[r] *= p.scale[id];
        }
        for (int col = 0; col < Y_STRIDE; col++) {
            size_t at = (size_t)t * Y_STRIDE + col;
            int o = col - Y_COL0;
            if (!adapted || o < 0 || o >= LORA_OUT) {
                if (memcmp(&y[at], &y0[at], sizeof(float)) != 0)
                    fail_msg("lora delta: token %d (adapter %d), column %d must be untouched: %.9g became %.9g", t, id, col,
                             y0[at], y[at]);
                continue;
            }
            double want = y0[at], bound = fabs(y0[at]);
            for (int r = 0; r < p.rank[id]; r++) {
                double b = p.b[id][(size_t)o * p.rank[id] + r];
                want += b * u[r];
                bound += fabs(b) * u_bound[r];
            }
            double tol = (LORA_IN + p.rank[id] + 2) * FP32_UNIT_ROUNDOFF * bound;
            if (!(fabs(y[at] - want) <= tol))
                fail_msg("lora delta: token %d (adapter %d, rank %d), output %d: cuda %.9g, reference %.9g, |diff| %.3g > %.3g", t,
                         id, p.rank[id], o, y[at], want, fabs(y[at] - want), tol);
        }
    }
    assert_true(adapted_rows > 0);
    free(x), free(y0), free(x16), free(y);
    free_projection(&p);
    dev_free_all(&arena);
}

enum { RES_BLOCKS = 6, RES_BS = 8, SENTINEL_BF16 = 0x4049 /* 3.140625: never a product of these inputs */ };

/* Checks one written residual lane c of token t against bf16(A[c] · x[t]) (0 past the rank). */
static void check_residual_lane(const ProjectionPairs *p, const char *side, int t, int id, int slot, int c, const float *x,
                                uint16_t got) {
    if (!p->a[id] || c >= p->rank[id]) {
        if (got != 0)
            fail_msg("residual store: %s, token %d (adapter %d), slot %d, lane %d must be 0 (past rank %d or not adapted), got "
                     "bits 0x%04x",
                     side, t, id, slot, c, p->rank[id], got);
        return;
    }
    double abs_sum, want = dot_with_bound(p->a[id] + (size_t)c * LORA_IN, x + (size_t)t * LORA_IN, LORA_IN, &abs_sum);
    /* The fp32 sum s is off by at most gamma·abs_sum, and bf16(s) by 2^-8·|s| more. */
    double sum_err = LORA_IN * FP32_UNIT_ROUNDOFF * abs_sum, tol = (fabs(want) + sum_err) / 256.0 + sum_err;
    if (!(fabs(bf16_to_fp32(got) - want) <= tol))
        fail_msg("residual store: %s, token %d (adapter %d), slot %d, lane %d: cuda %.6g, reference %.6g, |diff| %.3g > %.3g", side,
                 t, id, slot, c, bf16_to_fp32(got), want, fabs(bf16_to_fp32(got) - want), tol);
}

static void test_lora_residual_store(void **state) {
    (void)state;
    DeviceArena arena = {{0}, 0};
    ProjectionPairs pk, pv;
    make_projection(&pk, LORA_IN, 64, 3, &arena); /* adapter 3 adapts V only: its K lanes are zeros */
    make_projection(&pv, LORA_IN, 64, 0, &arena);
    float *x = exact_values((size_t)LORA_TOKENS * LORA_IN, 1.0);
    int32_t ids[LORA_TOKENS], slots[LORA_TOKENS], perm[RES_BLOCKS * RES_BS];
    random_token_adapters(ids, LORA_TOKENS);
    shuffled_ids(perm, RES_BLOCKS * RES_BS - RES_BS, RES_BS); /* distinct slots outside null block 0 */
    for (int t = 0; t < LORA_TOKENS; t++) slots[t] = t % 5 == 4 ? -1 : perm[t];
    size_t elems = (size_t)RES_BLOCKS * RES_BS * POOL_RANK;
    uint16_t *pool = malloc(elems * 2), *got_k = malloc(elems * 2), *got_v = malloc(elems * 2);
    uint16_t *x16 = to_bf16(x, (size_t)LORA_TOKENS * LORA_IN);
    assert_true(pool && got_k && got_v);
    for (size_t i = 0; i < elems; i++) pool[i] = SENTINEL_BF16;
    CudaResidualLayer res = {dev_upload(&arena, pool, elems * 2), dev_upload(&arena, pool, elems * 2), RES_BS, POOL_RANK};
    CUDA_OK(cuda_lora_residual_store(&pk.dev, &pv.dev, dev_upload(&arena, ids, sizeof ids),
                                     dev_upload(&arena, x16, (size_t)LORA_TOKENS * LORA_IN * 2), LORA_TOKENS, LORA_IN,
                                     dev_upload(&arena, slots, sizeof slots), &res, 0));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got_k, res.k, elems * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got_v, res.v, elems * 2, cudaMemcpyDeviceToHost));
    char written[RES_BLOCKS * RES_BS] = {0};
    for (int t = 0; t < LORA_TOKENS; t++) {
        int id = ids[t];
        if (slots[t] < 0 || id < 1 || id >= N_ADAPTER_IDS) continue;
        written[slots[t]] = 1;
        for (int c = 0; c < POOL_RANK; c++) {
            check_residual_lane(&pk, "K", t, id, slots[t], c, x, got_k[(size_t)slots[t] * POOL_RANK + c]);
            check_residual_lane(&pv, "V", t, id, slots[t], c, x, got_v[(size_t)slots[t] * POOL_RANK + c]);
        }
    }
    for (int slot = 0; slot < RES_BLOCKS * RES_BS; slot++)
        for (int c = 0; !written[slot] && c < POOL_RANK; c++)
            if (got_k[(size_t)slot * POOL_RANK + c] != SENTINEL_BF16 || got_v[(size_t)slot * POOL_RANK + c] != SENTINEL_BF16)
                fail_msg("residual store: slot %d lane %d belongs to no adapted token (slot -1, base model or unused) but was "
                         "written",
                         slot, c);
    free(x), free(pool), free(got_k), free(got_v), free(x16);
    free_projection(&pk);
    free_projection(&pv);
    dev_free_all(&arena);
}

/* ---- scenarios ---- */

/* SmolLM2-135M's attention shape (9 query heads on 3 KV heads, head_dim 64, half-split RoPE). */
static const Scenario DECODE_G3 = {
    .name = "decode G=3 hd=64 half-split, 1 split", .n_heads = 9, .n_kv_heads = 3, .head_dim = 64, .rope_dim = 64,
    .interleaved = 0, .block_size = 16, .position_scale = 1.0f, .tile_queries = 1, .n_splits = 1, .n_seqs = 7,
    .n_ctx = {1, 17, 45, 130, 300, 64, 33}, .n_q = {1, 1, 1, 1, 1, 1, 1}, .adapter = {1, 2, 0, 1, 3, 2, 1},
    .positions = {POS_CONTIGUOUS, POS_PERMUTED, POS_SPLICED, POS_PERMUTED, POS_SPLICED, POS_CONTIGUOUS, POS_PERMUTED},
};
static const Scenario DECODE_G3_SPLIT = {
    .name = "decode G=3 hd=64 half-split, 4 splits", .n_heads = 9, .n_kv_heads = 3, .head_dim = 64, .rope_dim = 64,
    .interleaved = 0, .block_size = 16, .position_scale = 1.0f, .tile_queries = 1, .n_splits = 4, .n_seqs = 5,
    .n_ctx = {2, 95, 257, 400, 31}, .n_q = {1, 1, 1, 1, 1}, .adapter = {2, 1, 1, 3, 0},
    .positions = {POS_PERMUTED, POS_SPLICED, POS_PERMUTED, POS_CONTIGUOUS, POS_SPLICED},
};
/* head_dim 128 with half of it rotated, interleaved pairs, linear position scaling. */
static const Scenario DECODE_G4 = {
    .name = "decode G=4 hd=128 interleaved rope_dim 64, 3 splits", .n_heads = 8, .n_kv_heads = 2, .head_dim = 128,
    .rope_dim = 64, .interleaved = 1, .block_size = 16, .position_scale = 0.5f, .tile_queries = 1, .n_splits = 3,
    .n_seqs = 4, .n_ctx = {70, 129, 5, 222}, .n_q = {1, 1, 1, 1}, .adapter = {1, 2, 1, 3},
    .positions = {POS_SPLICED, POS_PERMUTED, POS_CONTIGUOUS, POS_PERMUTED},
};
static const Scenario DECODE_MHA = {
    .name = "decode G=1 hd=32 half-split rope_dim 16, block 8", .n_heads = 4, .n_kv_heads = 4, .head_dim = 32,
    .rope_dim = 16, .interleaved = 0, .block_size = 8, .position_scale = 1.0f, .tile_queries = 1, .n_splits = 2,
    .n_seqs = 3, .n_ctx = {9, 61, 100}, .n_q = {1, 1, 1}, .adapter = {2, 1, 3},
    .positions = {POS_CONTIGUOUS, POS_PERMUTED, POS_SPLICED},
};
/* A prefill chunk after a cached prefix, a whole prompt, and a permuted one; tiles of 4 queries. */
static const Scenario PREFILL_G3 = {
    .name = "prefill G=3 hd=64 half-split, tiles of 4", .n_heads = 9, .n_kv_heads = 3, .head_dim = 64, .rope_dim = 64,
    .interleaved = 0, .block_size = 16, .position_scale = 1.0f, .tile_queries = 4, .n_splits = 1, .n_seqs = 3,
    .n_ctx = {70, 33, 40}, .n_q = {21, 33, 18}, .adapter = {1, 2, 3},
    .positions = {POS_CONTIGUOUS, POS_CONTIGUOUS, POS_PERMUTED},
};
static const Scenario PREFILL_G8 = {
    .name = "prefill G=8 hd=128 half-split, block 32, tiles of 4, 2 splits", .n_heads = 16, .n_kv_heads = 2,
    .head_dim = 128, .rope_dim = 128, .interleaved = 0, .block_size = 32, .position_scale = 1.0f, .tile_queries = 4,
    .n_splits = 2, .n_seqs = 3, .n_ctx = {50, 90, 12}, .n_q = {13, 6, 12}, .adapter = {2, 1, 0},
    .positions = {POS_SPLICED, POS_PERMUTED, POS_CONTIGUOUS},
};

static int gpu_visible(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) fprintf(stderr, "cudaGetDeviceCount: %s\n", cudaGetErrorString(e));
    return e == cudaSuccess && n > 0;
}

int main(void) {
    if (!gpu_visible()) {
        fprintf(stderr, "no GPU visible: skipping the ForkKV CUDA kernel tests\n");
        return 77;
    }
    cudaError_t e = cuda_kernels_init();
    if (e != cudaSuccess) {
        fprintf(stderr, "cuda_kernels_init: %s\n", cudaGetErrorString(e));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_residual_attention, (void *)&DECODE_G3),
        cmocka_unit_test_prestate(test_residual_attention, (void *)&DECODE_G3_SPLIT),
        cmocka_unit_test_prestate(test_residual_attention, (void *)&DECODE_G4),
        cmocka_unit_test_prestate(test_residual_attention, (void *)&DECODE_MHA),
        cmocka_unit_test_prestate(test_residual_attention, (void *)&PREFILL_G3),
        cmocka_unit_test_prestate(test_residual_attention, (void *)&PREFILL_G8),
        cmocka_unit_test(test_lora_delta),
        cmocka_unit_test(test_lora_residual_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
