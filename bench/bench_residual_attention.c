/*
 * bench_residual_attention — the cost of ForkKV's ResidualAttention against plain paged attention
 * on the CPU, same shapes, one run (ratios).
 *
 *   bench_residual_attention [--ctx N] [--queries Q] [--rank R] [--iters I] [--cpu-time]
 *
 * SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head_dim 64), blocks of 16, one
 * sequence of N context slots and Q queries at its end (Q = 1: a decode step; Q > 1: a prefill
 * chunk), per layer. Times are means over I calls of cpu_attention, cpu_residual_attention_per_tile
 * (the former schedule: keys rebuilt per query tile) and cpu_residual_attention (a prefill
 * chunk: keys rebuilt once per call) on the same base pool (the residual pool holds rank-R residuals, B_k and B_v set),
 * with the threads OMP_NUM_THREADS gives (--cpu-time: the process's CPU time instead of the wall
 * clock, robust to a loaded machine's descheduling; use it with OMP_NUM_THREADS=1), interleaved call by call so that load on a shared machine
 * falls on all three alike. Prints one Markdown row: the times, each ResidualAttention schedule
 * over plain attention, and per-tile over the current one (the speed-up); exits 1 when the two
 * schedules' outputs differ in any bit.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/residual_attention.h"
#include "kernels/cpu/vec.h"

enum { BS = 16, NKV = 3, HD = 64, NH = 9, MAX_POS = 32768 };

static clockid_t timer = CLOCK_MONOTONIC;

static double now(void) {
    struct timespec t;
    clock_gettime(timer, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int ctx = 1024, nq = 1, rank = 16, iters = 50;
    static const struct option opts[] = {{"ctx", 1, 0, 'c'}, {"queries", 1, 0, 'q'}, {"rank", 1, 0, 'r'}, {"iters", 1, 0, 'i'}, {"cpu-time", 0, 0, 't'}, {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (o == 'c') ctx = atoi(optarg);
        else if (o == 'q') nq = atoi(optarg);
        else if (o == 'r') rank = atoi(optarg);
        else if (o == 'i') iters = atoi(optarg);
        else if (o == 't') timer = CLOCK_PROCESS_CPUTIME_ID;
        else return fputs("usage: bench_residual_attention [--ctx N] [--queries Q] [--rank R] [--iters I] [--cpu-time]\n", stderr), 2;
    }
    if (ctx < 1 || ctx > MAX_POS || nq < 1 || nq > ctx || rank < 1 || rank > 1024 || iters < 1)
        return fputs("bench_residual_attention: need 1 <= queries <= ctx <= 32768, 1 <= rank <= 1024, iters >= 1\n", stderr), 2;
    int nb = ctx / BS + 2;
    uint16_t *k = malloc((size_t)nb * NKV * BS * HD * 2), *v = malloc((size_t)nb * NKV * BS * HD * 2);
    uint16_t *kr = malloc((size_t)nb * BS * rank * 2), *vr = malloc((size_t)nb * BS * rank * 2);
    int32_t *slot_pos = malloc((size_t)nb * BS * 4), *table = malloc((size_t)nb * 4), *qpos = malloc((size_t)nq * 4);
    float *cs = malloc((size_t)(ctx + 1) * 32 * 4), *sn = malloc((size_t)(ctx + 1) * 32 * 4);
    float *bk = malloc((size_t)NKV * HD * rank * 4), *bv = malloc((size_t)NKV * HD * rank * 4);
    float *q = malloc((size_t)nq * NH * HD * 4), *out = malloc((size_t)nq * NH * HD * 4);
    if (!k || !v || !kr || !vr || !slot_pos || !table || !qpos || !cs || !sn || !bk || !bv || !q || !out)
        return fputs("bench_residual_attention: out of memory\n", stderr), 1;
    unsigned seed = 7;
    for (size_t i = 0; i < (size_t)nb * NKV * BS * HD; i++) k[i] = v[i] = vec_float_to_half((float)(rand_r(&seed) % 200 - 100) / 400);
    for (size_t i = 0; i < (size_t)nb * BS * rank; i++) kr[i] = vr[i] = vec_float_to_half((float)(rand_r(&seed) % 200 - 100) / 400);
    for (int i = 0; i < NKV * HD * rank; i++) bk[i] = bv[i] = (float)(rand_r(&seed) % 200 - 100) / 2000;
    for (int i = 0; i < nq * NH * HD; i++) q[i] = (float)(rand_r(&seed) % 200 - 100) / 100;
    for (int b = 0; b < nb; b++) table[b] = b;
    for (int j = 0; j < nb * BS; j++) slot_pos[j] = j < ctx ? j : MAX_POS;
    for (int p = 0; p <= ctx; p++) cpu_rope_angles(p, HD, 10000.0f, 1.0f, NULL, cs + (size_t)p * 32, sn + (size_t)p * 32);
    for (int t = 0; t < nq; t++) qpos[t] = ctx - nq + t;
    KvLayerView kv = {k, v, slot_pos, BS, NKV, HD};
    ResidualLayerView res = {kr, vr, BS, rank};
    ResidualAdapter ad = {bk, bv, rank, 2.0f};
    RopeTable rope = {cs, sn, ctx + 1, HD, HD, ROPE_PAIRING_INTERLEAVED};
    float *out_ref = malloc((size_t)nq * NH * HD * 4);
    if (!out_ref) return fputs("bench_residual_attention: out of memory\n", stderr), 1;
    /* One untimed call of each first: page faults and thread start-up are not the kernel's cost. */
    cpu_attention(&kv, table, ctx, q, qpos, nq, NH, out);
    if (cpu_residual_attention_per_tile(&kv, table, &res, table, ctx, &ad, &rope, q, qpos, nq, NH, out_ref) ||
        cpu_residual_attention(&kv, table, &res, table, ctx, &ad, &rope, q, qpos, nq, NH, out))
        return fputs("bench_residual_attention: out of memory\n", stderr), 1;
    if (memcmp(out, out_ref, (size_t)nq * NH * HD * 4) != 0)
        return fputs("bench_residual_attention: the once-per-call rebuild differs from the per-tile one\n", stderr), 1;
    double plain = 0, per_tile = 0, once = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = now();
        cpu_attention(&kv, table, ctx, q, qpos, nq, NH, out);
        double t1 = now();
        int rc = cpu_residual_attention_per_tile(&kv, table, &res, table, ctx, &ad, &rope, q, qpos, nq, NH, out_ref);
        double t2 = now();
        rc |= cpu_residual_attention(&kv, table, &res, table, ctx, &ad, &rope, q, qpos, nq, NH, out);
        double t3 = now();
        if (rc) return fputs("bench_residual_attention: out of memory\n", stderr), 1;
        plain += t1 - t0, per_tile += t2 - t1, once += t3 - t2;
    }
    plain *= 1e3 / iters, per_tile *= 1e3 / iters, once *= 1e3 / iters;
    printf("| %d | %d | %d | %.3f ms | %.3f ms | %.3f ms | %.2fx | %.2fx | %.2fx |\n", ctx, nq, rank, plain, per_tile, once,
           per_tile / plain, once / plain, per_tile / once);
    return 0;
}
