/*
 * Per-row kernels against double-precision references: RMSNorm, SwiGLU, softmax, RoPE (both
 * pairings, far from position 0, partial rotary, frequency factors, linear scaling), and paged
 * causal attention through a shuffled block table with GQA and explicit positions.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"

static uint64_t rng_state = 99;
static float rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) % 2000001) / 1000000.0f - 1.0f;
}

static void test_rmsnorm(void **state) {
    (void)state;
    float x[96], w[96], out[96];
    double ss = 0;
    for (int i = 0; i < 96; i++) {
        x[i] = rnd() * 3;
        w[i] = rnd();
        ss += (double)x[i] * x[i];
    }
    cpu_rmsnorm(out, x, w, 96, 1e-5f);
    double inv = 1.0 / sqrt(ss / 96 + 1e-5);
    for (int i = 0; i < 96; i++) assert_float_equal(out[i], x[i] * inv * w[i], 1e-5);
    cpu_rmsnorm(x, x, w, 96, 1e-5f); /* in place */
    assert_memory_equal(x, out, sizeof out);
}

static void test_swiglu_softmax(void **state) {
    (void)state;
    float g[5] = {-3, -0.5f, 0, 1, 4}, u[5] = {2, 2, 2, 2, 0.5f};
    cpu_swiglu(g, u, 5);
    float in[5] = {-3, -0.5f, 0, 1, 4};
    for (int i = 0; i < 5; i++) assert_float_equal(g[i], in[i] / (1 + exp(-in[i])) * u[i], 1e-6);
    float s[4] = {1000, 1001, 999, -1e30f};
    cpu_softmax(s, 4);
    double e0 = exp(-1), e1 = 1, e2 = exp(-2), z = e0 + e1 + e2;
    assert_float_equal(s[0], e0 / z, 1e-6);
    assert_float_equal(s[1], e1 / z, 1e-6);
    assert_float_equal(s[2], e2 / z, 1e-6);
    assert_float_equal(s[3], 0, 1e-30);
}

/* Reference rotation in double for one head, in the given pairing. */
static void rope_reference(const float *in, double *out, int head_dim, int rope_dim, RopePairing pairing, int pos, double base,
                           double scale, const float *factors) {
    for (int i = 0; i < head_dim; i++) out[i] = in[i];
    for (int i = 0; i < rope_dim / 2; i++) {
        double inv = pow(base, -2.0 * i / rope_dim) / (factors ? factors[i] : 1.0), a = pos * scale * inv;
        int p = pairing == ROPE_PAIRING_INTERLEAVED ? 2 * i : i, q = pairing == ROPE_PAIRING_INTERLEAVED ? 2 * i + 1 : i + rope_dim / 2;
        out[p] = in[p] * cos(a) - in[q] * sin(a);
        out[q] = in[p] * sin(a) + in[q] * cos(a);
    }
}

static void rotate(float *v, int n_heads, int head_dim, int rope_dim, RopePairing pairing, int pos, float base, float scale,
                   const float *factors) {
    float c[128], s[128];
    cpu_rope_angles(pos, rope_dim, base, scale, factors, c, s);
    cpu_rope_apply(v, n_heads, head_dim, rope_dim, pairing, c, s);
}

static void test_rope_against_reference(void **state) {
    (void)state;
    const int positions[] = {0, 1, 37, 1000, 8000};
    const RopePairing pairings[] = {ROPE_PAIRING_INTERLEAVED, ROPE_PAIRING_HALF_SPLIT};
    for (size_t pi = 0; pi < 2; pi++)
        for (size_t k = 0; k < sizeof positions / sizeof positions[0]; k++) {
            float v[2 * 64], orig[2 * 64];
            for (int i = 0; i < 128; i++) orig[i] = v[i] = rnd();
            rotate(v, 2, 64, 64, pairings[pi], positions[k], 100000.0f, 1.0f, NULL);
            for (int h = 0; h < 2; h++) {
                double ref[64];
                rope_reference(orig + 64 * h, ref, 64, 64, pairings[pi], positions[k], 100000.0, 1.0, NULL);
                /* fp32 angles (pos · inv_freq) carry ~pos·6e-8 rad of error, like the usual fp32 RoPE */
                for (int i = 0; i < 64; i++) assert_float_equal(v[64 * h + i], ref[i], 2e-6 + 6e-8 * positions[k]);
            }
        }
}

static void test_rope_properties(void **state) {
    (void)state;
    /* Pair norms are preserved. */
    float v[64], orig[64];
    for (int i = 0; i < 64; i++) orig[i] = v[i] = rnd();
    rotate(v, 1, 64, 64, ROPE_PAIRING_INTERLEAVED, 4321, 10000.0f, 1.0f, NULL);
    for (int i = 0; i < 32; i++)
        assert_float_equal(hypotf(v[2 * i], v[2 * i + 1]), hypotf(orig[2 * i], orig[2 * i + 1]), 1e-5);
    /* The pairings are related by the permutation llama GGUF conversion applies to Q/K rows:
     * half-split index i <-> interleaved 2i, i + d/2 <-> 2i + 1. */
    float half[64], inter[64];
    for (int i = 0; i < 64; i++) half[i] = rnd();
    for (int i = 0; i < 32; i++) {
        inter[2 * i] = half[i];
        inter[2 * i + 1] = half[i + 32];
    }
    rotate(half, 1, 64, 64, ROPE_PAIRING_HALF_SPLIT, 777, 10000.0f, 1.0f, NULL);
    rotate(inter, 1, 64, 64, ROPE_PAIRING_INTERLEAVED, 777, 10000.0f, 1.0f, NULL);
    for (int i = 0; i < 32; i++) {
        assert_float_equal(inter[2 * i], half[i], 1e-6);
        assert_float_equal(inter[2 * i + 1], half[i + 32], 1e-6);
    }
    /* Scores depend on relative position only: <R(5)q, R(3)k> == <R(1005)q, R(1003)k>. */
    float q1[64], k1[64], q2[64], k2[64];
    for (int i = 0; i < 64; i++) q1[i] = q2[i] = rnd(), k1[i] = k2[i] = rnd();
    rotate(q1, 1, 64, 64, ROPE_PAIRING_INTERLEAVED, 5, 10000.0f, 1.0f, NULL);
    rotate(k1, 1, 64, 64, ROPE_PAIRING_INTERLEAVED, 3, 10000.0f, 1.0f, NULL);
    rotate(q2, 1, 64, 64, ROPE_PAIRING_INTERLEAVED, 1005, 10000.0f, 1.0f, NULL);
    rotate(k2, 1, 64, 64, ROPE_PAIRING_INTERLEAVED, 1003, 10000.0f, 1.0f, NULL);
    double d1 = 0, d2 = 0;
    for (int i = 0; i < 64; i++) d1 += q1[i] * k1[i], d2 += q2[i] * k2[i];
    assert_float_equal(d1, d2, 2e-4);
    /* Partial rotary leaves the tail alone; factors and linear scaling match the reference. */
    float part[64], p0[64], factors[16];
    for (int i = 0; i < 64; i++) part[i] = p0[i] = rnd();
    for (int i = 0; i < 16; i++) factors[i] = 1.0f + (float)i;
    rotate(part, 1, 64, 32, ROPE_PAIRING_INTERLEAVED, 300, 500000.0f, 0.25f, factors);
    double ref[64];
    rope_reference(p0, ref, 64, 32, ROPE_PAIRING_INTERLEAVED, 300, 500000.0, 0.25, factors);
    for (int i = 0; i < 64; i++) assert_float_equal(part[i], ref[i], 1e-5);
    for (int i = 32; i < 64; i++) assert_true(part[i] == p0[i]);
}

/* Naive causal attention in double: query (pos qp) over keys with positions kpos. */
static void attention_reference(const float *q, int qp, const float *k, const float *v, const int *kpos, int n, int hd, double *out) {
    double w[64], max = -1e300, sum = 0;
    for (int j = 0; j < n; j++) {
        if (kpos[j] > qp) { w[j] = -INFINITY; continue; }
        double s = 0;
        for (int d = 0; d < hd; d++) s += (double)q[d] * k[j * hd + d];
        w[j] = s / sqrt(hd);
        if (w[j] > max) max = w[j];
    }
    for (int j = 0; j < n; j++) sum += (w[j] = isinf(w[j]) ? 0 : exp(w[j] - max));
    for (int d = 0; d < hd; d++) {
        out[d] = 0;
        for (int j = 0; j < n; j++) out[d] += w[j] / sum * v[j * hd + d];
    }
}

static void test_paged_attention(void **state) {
    (void)state;
    enum { BS = 4, NB = 9, NKV = 2, NH = 6, HD = 64, CTX = 22, NQ = 5 };
    const int table[6] = {7, 2, 5, 1, 8, 3}; /* shuffled; block 0 never used */
    float *kpool = calloc(NB * NKV * BS * HD, sizeof(float)), *vpool = calloc(NB * NKV * BS * HD, sizeof(float));
    int32_t slot_pos[NB * BS];
    for (int i = 0; i < NB * BS; i++) slot_pos[i] = -1;
    KvLayerView kv = {.k = kpool, .v = vpool, .slot_pos = slot_pos, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
    /* Positions are explicit and not the slot order: slot j holds position perm[j]. */
    int pos[CTX];
    for (int j = 0; j < CTX; j++) pos[j] = (j * 7) % CTX + 100;
    float knew[CTX * NKV * HD], vnew[CTX * NKV * HD];
    int32_t slots[CTX + 1];
    for (int i = 0; i < CTX * NKV * HD; i++) knew[i] = rnd(), vnew[i] = rnd();
    for (int j = 0; j < CTX; j++) {
        slots[j] = table[j / BS] * BS + j % BS;
        slot_pos[slots[j]] = pos[j];
    }
    cpu_kv_store(&kv, slots, knew, vnew, CTX);
    /* slot -1 writes nothing */
    float junk[NKV * HD];
    for (int i = 0; i < NKV * HD; i++) junk[i] = 1e9f;
    int32_t nowhere = -1;
    cpu_kv_store(&kv, &nowhere, junk, junk, 1);
    for (int i = 0; i < NB * NKV * BS * HD; i++) assert_true(kpool[i] != 1e9f && vpool[i] != 1e9f);

    float q[NQ * NH * HD], out[NQ * NH * HD];
    int32_t qpos[NQ] = {100, 105, 110, 121, 50}; /* 50 sees nothing */
    for (int i = 0; i < NQ * NH * HD; i++) q[i] = rnd();
    int32_t tab[6];
    memcpy(tab, table, sizeof tab);
    assert_int_equal(cpu_attention(&kv, tab, CTX, q, qpos, NQ, NH, out), 0);
    for (int t = 0; t < NQ; t++)
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / NKV);
            float kk[CTX * HD], vv[CTX * HD];
            for (int j = 0; j < CTX; j++) {
                memcpy(kk + j * HD, knew + (j * NKV + g) * HD, HD * sizeof(float));
                memcpy(vv + j * HD, vnew + (j * NKV + g) * HD, HD * sizeof(float));
            }
            double ref[HD];
            if (qpos[t] < 100) {
                for (int d = 0; d < HD; d++) assert_float_equal(out[(t * NH + h) * HD + d], 0.0f, 1e-7);
                continue;
            }
            attention_reference(q + (t * NH + h) * HD, qpos[t], kk, vv, pos, CTX, HD, ref);
            for (int d = 0; d < HD; d++) assert_float_equal(out[(t * NH + h) * HD + d], ref[d], 1e-5);
        }
    free(kpool);
    free(vpool);
}

/* Two sequences in one batched call give exactly what two separate calls give. */
static void test_attention_batch_matches_per_sequence(void **state) {
    (void)state;
    enum { BS = 4, NB = 8, NKV = 1, NH = 2, HD = 16 };
    float *k = calloc(NB * NKV * BS * HD, sizeof(float)), *v = calloc(NB * NKV * BS * HD, sizeof(float));
    int32_t slot_pos[NB * BS];
    for (int i = 0; i < NB * NKV * BS * HD; i++) k[i] = rnd(), v[i] = rnd();
    for (int i = 0; i < NB * BS; i++) slot_pos[i] = i % BS + (i / BS % 2) * BS; /* blocks pair up as positions 0..7 */
    KvLayerView kv = {.k = k, .v = v, .slot_pos = slot_pos, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
    const int32_t t0[2] = {2, 3}, t1[2] = {6, 7};
    const int32_t *tables[2] = {t0, t1};
    int32_t seq_start[3] = {0, 3, 4}, n_ctx[2] = {8, 6}, pos[4] = {5, 6, 7, 5};
    float q[4 * NH * HD], batched[4 * NH * HD], single[4 * NH * HD];
    for (int i = 0; i < 4 * NH * HD; i++) q[i] = rnd();
    AttentionSeqs seqs = {.n_seqs = 2, .seq_start = seq_start, .block_tables = tables, .n_ctx = n_ctx};
    assert_int_equal(cpu_attention_batch(&kv, &seqs, q, pos, 4, NH, batched), 0);
    assert_int_equal(cpu_attention(&kv, t0, 8, q, pos, 3, NH, single), 0);
    assert_int_equal(cpu_attention(&kv, t1, 6, q + 3 * NH * HD, pos + 3, 1, NH, single + 3 * NH * HD), 0);
    assert_memory_equal(batched, single, sizeof single);
    free(k);
    free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_swiglu_softmax),
        cmocka_unit_test(test_rope_against_reference),
        cmocka_unit_test(test_rope_properties),
        cmocka_unit_test(test_paged_attention),
        cmocka_unit_test(test_attention_batch_matches_per_sequence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
