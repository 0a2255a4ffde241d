/*
 * Per-row kernels against double-precision references: RMSNorm, SwiGLU, softmax, RoPE (both
 * pairings, far from position 0, partial rotary, frequency factors, linear scaling), paged
 * causal attention through a shuffled block table with GQA and explicit positions, and the fp16 KV
 * store (round to nearest even; F16C and the portable conversion give the same bits).
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
#include "kernels/cpu/vec.h"
#include "model/tensor_types.h"

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
    double *w = malloc((size_t)n * sizeof *w), max = -1e300, sum = 0;
    assert_non_null(w);
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
    free(w);
}

/* x rounded through an IEEE half (the conversions in tensor_types.c, independent of the kernels). */
static float through_half(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

static void test_paged_attention(void **state) {
    (void)state;
    enum { BS = 4, NB = 9, NKV = 2, NH = 6, HD = 64, CTX = 22, NQ = 5 };
    const int table[6] = {7, 2, 5, 1, 8, 3}; /* shuffled; block 0 never used */
    uint16_t *kpool = calloc(NB * NKV * BS * HD, sizeof *kpool), *vpool = calloc(NB * NKV * BS * HD, sizeof *vpool);
    assert_non_null(kpool);
    assert_non_null(vpool);
    int32_t slot_pos[NB * BS];
    for (int i = 0; i < NB * BS; i++) slot_pos[i] = -1;
    KvLayerView kv = {.k = kpool, .v = vpool, .slot_pos = slot_pos, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
    /* Positions are explicit and not the slot order: slot j holds position perm[j]. */
    int pos[CTX];
    for (int j = 0; j < CTX; j++) pos[j] = (j * 7) % CTX + 100;
    float knew[CTX * NKV * HD], vnew[CTX * NKV * HD];
    int32_t slots[CTX + 1];
    /* Already on the fp16 grid, so the cache holds exactly what the fp32 reference reads. */
    for (int i = 0; i < CTX * NKV * HD; i++) knew[i] = through_half(rnd()), vnew[i] = through_half(rnd());
    for (int j = 0; j < CTX; j++) {
        slots[j] = table[j / BS] * BS + j % BS;
        slot_pos[slots[j]] = pos[j];
    }
    cpu_kv_store(&kv, slots, knew, vnew, CTX);
    /* slot -1 writes nothing */
    float junk[NKV * HD];
    for (int i = 0; i < NKV * HD; i++) junk[i] = 1e4f;
    int32_t nowhere = -1;
    uint16_t *kcopy = malloc(NB * NKV * BS * HD * sizeof *kcopy), *vcopy = malloc(NB * NKV * BS * HD * sizeof *vcopy);
    assert_non_null(kcopy);
    assert_non_null(vcopy);
    memcpy(kcopy, kpool, NB * NKV * BS * HD * sizeof *kcopy);
    memcpy(vcopy, vpool, NB * NKV * BS * HD * sizeof *vcopy);
    cpu_kv_store(&kv, &nowhere, junk, junk, 1);
    assert_memory_equal(kcopy, kpool, NB * NKV * BS * HD * sizeof *kcopy);
    assert_memory_equal(vcopy, vpool, NB * NKV * BS * HD * sizeof *vcopy);
    free(kcopy);
    free(vcopy);

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

/* A context of several attention chunks (cpu_attention splits it every 256 slots and merges):
 * each query within 1e-5 of the double reference, with causal limits inside, at and across chunk
 * edges, and a token computed alone (the split path) gives the same bits as in a batch of five. */
static void test_attention_long_context(void **state) {
    (void)state;
    enum { BS = 16, NKV = 3, NH = 9, HD = 64, CTX = 700, NBT = (CTX + BS - 1) / BS, NB = NBT + 3, NQ = 5 };
    uint16_t *kpool = calloc((size_t)NB * NKV * BS * HD, sizeof *kpool), *vpool = calloc((size_t)NB * NKV * BS * HD, sizeof *vpool);
    float *knew = malloc((size_t)CTX * NKV * HD * sizeof *knew), *vnew = malloc((size_t)CTX * NKV * HD * sizeof *vnew);
    int32_t *slot_pos = malloc(NB * BS * sizeof *slot_pos), *slots = malloc(CTX * sizeof *slots);
    int *pos = malloc(CTX * sizeof *pos);
    float *kk = malloc((size_t)CTX * HD * sizeof *kk), *vv = malloc((size_t)CTX * HD * sizeof *vv);
    assert_true(kpool && vpool && knew && vnew && slot_pos && slots && pos && kk && vv);
    int32_t table[NBT];
    for (int b = 0; b < NBT; b++) table[b] = 1 + (b * 17) % (NB - 1); /* scattered: 17 is coprime with NB − 1 */
    for (int i = 0; i < NB * BS; i++) slot_pos[i] = -1;
    KvLayerView kv = {.k = kpool, .v = vpool, .slot_pos = slot_pos, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
    for (int i = 0; i < CTX * NKV * HD; i++) knew[i] = through_half(rnd()), vnew[i] = through_half(rnd());
    for (int j = 0; j < CTX; j++) {
        pos[j] = j;
        slots[j] = table[j / BS] * BS + j % BS;
        slot_pos[slots[j]] = j;
    }
    cpu_kv_store(&kv, slots, knew, vnew, CTX);
    float q[NQ * NH * HD], out[NQ * NH * HD], alone[NH * HD];
    int32_t qpos[NQ] = {699, 400, 255, 256, 10};
    for (int i = 0; i < NQ * NH * HD; i++) q[i] = 3.0f * rnd(); /* peaked softmax: chunk maxima differ */
    assert_int_equal(cpu_attention(&kv, table, CTX, q, qpos, NQ, NH, out), 0);
    for (int t = 0; t < NQ; t++) {
        assert_int_equal(cpu_attention(&kv, table, CTX, q + t * NH * HD, &qpos[t], 1, NH, alone), 0);
        assert_memory_equal(alone, out + t * NH * HD, sizeof alone);
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / NKV);
            for (int j = 0; j < CTX; j++) {
                memcpy(kk + j * HD, knew + ((size_t)j * NKV + g) * HD, HD * sizeof(float));
                memcpy(vv + j * HD, vnew + ((size_t)j * NKV + g) * HD, HD * sizeof(float));
            }
            double ref[HD];
            attention_reference(q + (t * NH + h) * HD, qpos[t], kk, vv, pos, CTX, HD, ref);
            for (int d = 0; d < HD; d++) assert_float_equal(out[(t * NH + h) * HD + d], ref[d], 1e-5);
        }
    }
    free(kpool); free(vpool); free(knew); free(vnew); free(slot_pos); free(slots); free(pos); free(kk); free(vv);
}

/* Two sequences in one batched call give exactly what two separate calls give. */
static void test_attention_batch_matches_per_sequence(void **state) {
    (void)state;
    enum { BS = 4, NB = 8, NKV = 1, NH = 2, HD = 16 };
    uint16_t *k = calloc(NB * NKV * BS * HD, sizeof *k), *v = calloc(NB * NKV * BS * HD, sizeof *v);
    assert_non_null(k);
    assert_non_null(v);
    int32_t slot_pos[NB * BS];
    for (int i = 0; i < NB * NKV * BS * HD; i++) k[i] = fp32_to_fp16(rnd()), v[i] = fp32_to_fp16(rnd());
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

/* cpu_kv_store keeps values on the fp16 grid exactly and rounds others to nearest even (ties to
 * the even mantissa, subnormal halves, overflow to inf, NaN quieted), in the vector part of a row
 * and in its scalar tail alike: each value is stored at two places of a 20-wide head. */
static void test_kv_store_fp16(void **state) {
    (void)state;
    enum { HD = 20, NKV = 1, BS = 2, NB = 2 };
    const struct {
        float in;
        uint16_t out;
    } cases[HD] = {
        /* representable: stored as is */
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3c00}, {-2.5f, 0xc100}, {65504.0f, 0x7bff},
        {0x1p-14f, 0x0400} /* smallest normal */, {0x3p-24f, 0x0003} /* subnormal */, {0.333251953125f, 0x3555},
        {INFINITY, 0x7c00}, {NAN, 0x7e00},
        /* not representable: nearest, ties to even */
        {1.0f + 0x1p-11f, 0x3c00} /* tie, down to even */, {1.0f + 0x3p-11f, 0x3c02} /* tie, up to even */,
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01} /* just past the tie */, {0.1f, 0x2e66}, {0x1p-25f, 0x0000} /* tie to 0 */,
        {0x3p-25f, 0x0002} /* subnormal tie, up to even */, {0x1p-25f + 0x1p-40f, 0x0001}, {65519.0f, 0x7bff},
        {65520.0f, 0x7c00} /* tie past the largest half: inf */, {1e-30f, 0x0000},
    };
    float k_new[2 * HD], v_new[2 * HD];
    for (int i = 0; i < HD; i++) {
        k_new[i] = cases[i].in, v_new[i] = -cases[i].in;
        k_new[HD + (i + 10) % HD] = cases[i].in; /* the first row's tail is the second row's head */
        v_new[HD + (i + 10) % HD] = -cases[i].in;
    }
    uint16_t k[NB * NKV * BS * HD], v[NB * NKV * BS * HD];
    int32_t slot_pos[NB * BS] = {0};
    memset(k, 0xff, sizeof k);
    memset(v, 0xff, sizeof v);
    KvLayerView kv = {.k = k, .v = v, .slot_pos = slot_pos, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
    const int32_t slots[2] = {3, 1};
    cpu_kv_store(&kv, slots, k_new, v_new, 2);
    for (int i = 0; i < HD; i++) {
        const uint16_t *k0 = k + 3 * HD, *k1 = k + 1 * HD, *v0 = v + 3 * HD, *v1 = v + 1 * HD;
        uint16_t neg = (uint16_t)(cases[i].out ^ 0x8000u);
        if (k0[i] != cases[i].out || k1[(i + 10) % HD] != cases[i].out || v0[i] != neg || v1[(i + 10) % HD] != neg)
            fail_msg("case %d (%a): stored %04x %04x / %04x %04x, want %04x / %04x", i, (double)cases[i].in, k0[i],
                     k1[(i + 10) % HD], v0[i], v1[(i + 10) % HD], cases[i].out, neg);
        /* representable values come back exactly */
        if (i < 9) assert_true(vec_half_to_float(k0[i]) == cases[i].in);
    }
    /* slots 0 and 2 untouched */
    for (int i = 0; i < HD; i++)
        assert_true(k[i] == 0xffff && k[2 * HD + i] == 0xffff && v[i] == 0xffff && v[2 * HD + i] == 0xffff);
}

/* fp32_to_fp16 (the non-F16C builds' KV store) against an independent rounding in double — the
 * value of the nearest half, ties to the even one, ±inf from 65520 on — and, where the build has
 * F16C, bit for bit against VCVTPS2PH (NaN payloads included): every half, the midpoints between
 * neighbouring halves and the floats on either side of them, and a stride through all floats. */
static double nearest_half_value(float f) {
    double a = fabs((double)f);
    if (a >= 65520.0) return copysign(INFINITY, (double)f);
    int e;
    frexp(a, &e); /* a = m · 2^e, m in [0.5, 1) */
    double spacing = ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10);
    return copysign(nearbyint(a / spacing) * spacing, (double)f); /* nearbyint: ties to even */
}

static void check_half_conversion(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    uint16_t got = fp32_to_fp16(f);
#if defined(__F16C__)
    uint16_t want = (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    if (got != want) fail_msg("fp32 %08x: fp32_to_fp16 %04x, F16C %04x", bits, got, want);
#endif
    if (isnan(f)) {
        if (!isnan(fp16_to_fp32(got))) fail_msg("fp32 %08x: NaN became %04x", bits, got);
        return;
    }
    double value = (double)fp16_to_fp32(got), want_value = nearest_half_value(f);
    if (value != want_value || !signbit(value) != !signbit(f))
        fail_msg("fp32 %08x: half %04x = %.9g, nearest half %.9g", bits, got, value, want_value);
}

static void test_half_conversion(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = fp16_to_fp32((uint16_t)h);
#if defined(__F16C__)
        if (!isnan(f)) assert_true(_cvtsh_ss((uint16_t)h) == f);
#endif
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        check_half_conversion(bits);
        if (!isfinite(f) || (h & 0x7fffu) == 0x7bffu) continue;
        float mid = (f + fp16_to_fp32((uint16_t)(h + 1))) * 0.5f; /* exact: halves have 11 significant bits */
        uint32_t mb;
        memcpy(&mb, &mid, sizeof mb);
        check_half_conversion(mb);
        check_half_conversion(mb - 1);
        check_half_conversion(mb + 1);
    }
    for (uint64_t b = 0; b < 0x100000000ull; b += 4093) check_half_conversion((uint32_t)b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_swiglu_softmax),
        cmocka_unit_test(test_rope_against_reference),
        cmocka_unit_test(test_rope_properties),
        cmocka_unit_test(test_paged_attention),
        cmocka_unit_test(test_attention_batch_matches_per_sequence),
        cmocka_unit_test(test_attention_long_context),
        cmocka_unit_test(test_kv_store_fp16),
        cmocka_unit_test(test_half_conversion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
