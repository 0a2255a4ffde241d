/*
 * test_residual_attention.c — ForkKV's ResidualAttention (kernels/cpu/residual_attention.h)
 * against attention over the materialised K/V.
 *
 * The reference rebuilds every key and value in double from the same stored halves
 * (K = K_base + scale·RoPE_pos(B_k·K_res), V = V_base + scale·B_v·V_res) and attends naively, so
 * the kernel may differ from it only by fp32 rounding. Also: an adapter that adapts neither K nor V
 * gives plain paged attention (cpu_attention) exactly as computed over the base pool, tiles past
 * the kernel's query tile join correctly, positions (not slot order) decide causality, and the
 * residual store writes what it is given and nothing for slot -1, and the keys rebuilt once per
 * call (a prefill chunk) give bit for bit what the former per-tile rebuild gives.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/residual_attention.h"
#include "kernels/cpu/vec.h"

enum { BS = 4, NB = 10, NKV = 2, NH = 6, HD = 32, ROPE = 32, RANK_POOL = 8, CTX = 27, NQ = 19, NPOS = 256 };

static uint32_t rng = 12345;
static float rnd(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

typedef struct {
    uint16_t kb[NB * NKV * BS * HD], vb[NB * NKV * BS * HD];
    uint16_t kr[NB * BS * RANK_POOL], vr[NB * BS * RANK_POOL];
    int32_t slot_pos[NB * BS];
    int32_t table[7], res_table[7];
    int pos[CTX];
    float cos[NPOS * ROPE / 2], sin[NPOS * ROPE / 2];
    float bk[NKV * HD * RANK_POOL], bv[NKV * HD * RANK_POOL];
} Fixture;

static void fill(Fixture *f) {
    const int32_t table[7] = {7, 2, 5, 1, 8, 3, 9}, res_table[7] = {4, 9, 1, 6, 2, 8, 3};
    memcpy(f->table, table, sizeof table);
    memcpy(f->res_table, res_table, sizeof res_table);
    for (size_t i = 0; i < sizeof f->kb / sizeof f->kb[0]; i++) f->kb[i] = vec_float_to_half(rnd()), f->vb[i] = vec_float_to_half(rnd());
    for (size_t i = 0; i < sizeof f->kr / sizeof f->kr[0]; i++) f->kr[i] = vec_float_to_half(rnd()), f->vr[i] = vec_float_to_half(rnd());
    for (int i = 0; i < NB * BS; i++) f->slot_pos[i] = -1;
    for (int j = 0; j < CTX; j++) {
        f->pos[j] = (j * 5) % CTX + 40; /* explicit positions, not the slot order */
        f->slot_pos[table[j / BS] * BS + j % BS] = f->pos[j];
    }
    for (int p = 0; p < NPOS; p++) cpu_rope_angles(p, ROPE, 10000.0f, 1.0f, NULL, f->cos + p * ROPE / 2, f->sin + p * ROPE / 2);
    for (int i = 0; i < NKV * HD * RANK_POOL; i++) f->bk[i] = rnd(), f->bv[i] = rnd();
}

/* The materialised K/V of KV head g, context slot j (in double). */
static void full_kv(const Fixture *f, const ResidualAdapter *ad, int g, int j, double *k, double *v) {
    int blk = f->table[j / BS], rblk = f->res_table[j / BS], off = j % BS;
    size_t at = (((size_t)blk * NKV + g) * BS + off) * HD, rat = ((size_t)rblk * BS + off) * RANK_POOL;
    float lk[HD], lv[HD];
    for (int d = 0; d < HD; d++) {
        double sk = 0, sv = 0;
        for (int i = 0; i < ad->rank; i++) {
            if (ad->b_k) sk += (double)ad->b_k[(g * HD + d) * ad->rank + i] * vec_half_to_float(f->kr[rat + i]);
            if (ad->b_v) sv += (double)ad->b_v[(g * HD + d) * ad->rank + i] * vec_half_to_float(f->vr[rat + i]);
        }
        lk[d] = (float)(ad->scale * sk);
        lv[d] = (float)(ad->scale * sv);
    }
    cpu_rope_apply(lk, 1, HD, ROPE, ROPE_PAIRING_INTERLEAVED, f->cos + f->pos[j] * ROPE / 2, f->sin + f->pos[j] * ROPE / 2);
    for (int d = 0; d < HD; d++) {
        k[d] = vec_half_to_float(f->kb[at + d]) + lk[d];
        v[d] = vec_half_to_float(f->vb[at + d]) + lv[d];
    }
}

static void reference(const Fixture *f, const ResidualAdapter *ad, const float *q, int32_t qp, int h, double *out) {
    int g = h / (NH / NKV);
    double k[CTX][HD], v[CTX][HD], w[CTX], max = -1e300, sum = 0;
    for (int j = 0; j < CTX; j++) {
        full_kv(f, ad, g, j, k[j], v[j]);
        w[j] = -INFINITY;
        if (f->pos[j] > qp) continue;
        double s = 0;
        for (int d = 0; d < HD; d++) s += (double)q[d] * k[j][d];
        w[j] = s / sqrt(HD);
        if (w[j] > max) max = w[j];
    }
    for (int j = 0; j < CTX; j++) sum += (w[j] = isinf(w[j]) ? 0 : exp(w[j] - max));
    for (int d = 0; d < HD; d++) {
        out[d] = 0;
        for (int j = 0; j < CTX; j++) out[d] += w[j] / sum * v[j][d];
    }
}

static void run(const Fixture *f, const ResidualAdapter *ad, const float *q, const int32_t *qpos, float *out) {
    KvLayerView kv = {.k = (uint16_t *)f->kb, .v = (uint16_t *)f->vb, .slot_pos = (int32_t *)f->slot_pos, .block_size = BS,
                      .n_kv_heads = NKV, .head_dim = HD};
    ResidualLayerView res = {.k = (uint16_t *)f->kr, .v = (uint16_t *)f->vr, .block_size = BS, .rank = RANK_POOL};
    RopeTable rope = {.cos = f->cos, .sin = f->sin, .n_positions = NPOS, .rope_dim = ROPE, .head_dim = HD,
                      .pairing = ROPE_PAIRING_INTERLEAVED};
    assert_int_equal(cpu_residual_attention(&kv, f->table, &res, f->res_table, CTX, ad, &rope, q, qpos, NQ, NH, out), 0);
}

/* Against the materialised K/V, for ranks below and at the pool's width, across two query tiles. */
static void test_matches_materialised(void **state) {
    (void)state;
    Fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    fill(f);
    float q[NQ * NH * HD], out[NQ * NH * HD];
    int32_t qpos[NQ];
    for (int i = 0; i < NQ * NH * HD; i++) q[i] = rnd();
    for (int t = 0; t < NQ; t++) qpos[t] = 40 + (t * 3) % 30; /* up to 69: some see part, some all */
    const int ranks[2] = {RANK_POOL, 5};
    for (int c = 0; c < 2; c++) {
        ResidualAdapter ad = {.b_k = f->bk, .b_v = f->bv, .rank = ranks[c], .scale = 2.0f / ranks[c]};
        run(f, &ad, q, qpos, out);
        for (int t = 0; t < NQ; t++)
            for (int h = 0; h < NH; h++) {
                double ref[HD];
                reference(f, &ad, q + (t * NH + h) * HD, qpos[t], h, ref);
                for (int d = 0; d < HD; d++) assert_float_equal(out[(t * NH + h) * HD + d], ref[d], 2e-5);
            }
    }
    /* Only V adapted, then only K. */
    ResidualAdapter only_v = {.b_k = NULL, .b_v = f->bv, .rank = RANK_POOL, .scale = 0.5f};
    ResidualAdapter only_k = {.b_k = f->bk, .b_v = NULL, .rank = RANK_POOL, .scale = 0.5f};
    const ResidualAdapter *halves[2] = {&only_v, &only_k};
    for (int c = 0; c < 2; c++) {
        run(f, halves[c], q, qpos, out);
        double ref[HD];
        reference(f, halves[c], q + (7 * NH + 4) * HD, qpos[7], 4, ref);
        for (int d = 0; d < HD; d++) assert_float_equal(out[(7 * NH + 4) * HD + d], ref[d], 2e-5);
    }
    free(f);
}

/* A prefill chunk (two query tiles) rebuilds the keys once per call; the former schedule rebuilt
 * them per tile. Same arithmetic on every key, so the outputs are equal bit for bit. */
static void test_once_per_call_equals_per_tile(void **state) {
    (void)state;
    Fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    fill(f);
    float q[NQ * NH * HD], out[NQ * NH * HD], per_tile[NQ * NH * HD];
    int32_t qpos[NQ];
    for (int i = 0; i < NQ * NH * HD; i++) q[i] = rnd();
    for (int t = 0; t < NQ; t++) qpos[t] = 40 + (t * 7) % 30;
    KvLayerView kv = {.k = f->kb, .v = f->vb, .slot_pos = f->slot_pos, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
    ResidualLayerView res = {.k = f->kr, .v = f->vr, .block_size = BS, .rank = RANK_POOL};
    RopeTable rope = {.cos = f->cos, .sin = f->sin, .n_positions = NPOS, .rope_dim = ROPE, .head_dim = HD,
                      .pairing = ROPE_PAIRING_INTERLEAVED};
    ResidualAdapter cases[3] = {{.b_k = f->bk, .b_v = f->bv, .rank = RANK_POOL, .scale = 0.25f},
                                {.b_k = f->bk, .b_v = f->bv, .rank = 5, .scale = 0.4f},
                                {.b_k = f->bk, .b_v = NULL, .rank = RANK_POOL, .scale = 1.5f}};
    for (int c = 0; c < 3; c++) {
        memset(out, 0, sizeof out);
        assert_int_equal(cpu_residual_attention(&kv, f->table, &res, f->res_table, CTX, &cases[c], &rope, q, qpos, NQ, NH, out), 0);
        assert_int_equal(
            cpu_residual_attention_per_tile(&kv, f->table, &res, f->res_table, CTX, &cases[c], &rope, q, qpos, NQ, NH, per_tile), 0);
        assert_memory_equal(out, per_tile, sizeof out);
    }
    free(f);
}

/* With no residual (neither K nor V adapted) it is the paged attention of the base pool. */
static void test_no_residual_is_plain_attention(void **state) {
    (void)state;
    Fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    fill(f);
    float q[NQ * NH * HD], out[NQ * NH * HD], plain[NQ * NH * HD];
    int32_t qpos[NQ];
    for (int i = 0; i < NQ * NH * HD; i++) q[i] = rnd();
    for (int t = 0; t < NQ; t++) qpos[t] = 45 + t;
    ResidualAdapter none = {.b_k = NULL, .b_v = NULL, .rank = RANK_POOL, .scale = 1.0f};
    run(f, &none, q, qpos, out);
    KvLayerView kv = {.k = f->kb, .v = f->vb, .slot_pos = f->slot_pos, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
    assert_int_equal(cpu_attention(&kv, f->table, CTX, q, qpos, NQ, NH, plain), 0);
    for (int i = 0; i < NQ * NH * HD; i++) assert_float_equal(out[i], plain[i], 1e-5);
    free(f);
}

static void test_residual_store(void **state) {
    (void)state;
    uint16_t k[NB * BS * RANK_POOL], v[NB * BS * RANK_POOL];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = v[i] = 0x7777;
    ResidualLayerView res = {.k = k, .v = v, .block_size = BS, .rank = RANK_POOL};
    float kin[2 * 5], vin[2 * 5];
    for (int i = 0; i < 10; i++) kin[i] = 0.25f * i, vin[i] = -0.5f * i;
    int32_t slots[2] = {13, -1};
    cpu_residual_store(&res, slots, kin, vin, 5, 2);
    for (int i = 0; i < 5; i++) {
        assert_float_equal(vec_half_to_float(k[13 * RANK_POOL + i]), 0.25f * i, 0);
        assert_float_equal(vec_half_to_float(v[13 * RANK_POOL + i]), -0.5f * i, 0);
    }
    for (int i = 5; i < RANK_POOL; i++) assert_int_equal(k[13 * RANK_POOL + i], 0); /* lanes past the adapter's rank */
    for (int s = 0; s < NB * BS; s++)
        if (s != 13) assert_int_equal(k[s * RANK_POOL], 0x7777); /* slot -1 wrote nothing */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_materialised),
        cmocka_unit_test(test_once_per_call_equals_per_tile),
        cmocka_unit_test(test_no_residual_is_plain_attention),
        cmocka_unit_test(test_residual_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
