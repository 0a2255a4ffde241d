#include "worker/forkkv_cost.h"

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/residual_attention.h"
#include "kernels/cpu/vec.h"
#include "model/lora_adapter.h"

/* EWMA weight of a new sample once the first few have set the level (plain means until then). */
#define EWMA_ALPHA 0.1
#define EWMA_WARMUP 10

static double ewma(double old, double sample, int *n) {
    (*n)++;
    double w = *n <= EWMA_WARMUP ? 1.0 / *n : EWMA_ALPHA;
    return old + w * (sample - old);
}

void forkkv_cost_init(ForkKvCost *c, int n_layers, int n_heads, int n_kv_heads, int head_dim, int rank) {
    *c = (ForkKvCost){.n_layers = n_layers, .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim, .rank = rank,
                      .kv_dim_over_rank = rank > 0 ? (double)n_kv_heads * head_dim / rank : 1.0,
                      /* bench/RESULTS.md, ForkKV live: 0.106 ms decode and 2.918 ms for a 64-query chunk
                       * over 1 024 slots per layer; ratios 3.26 and 1.89. */
                      .plain_decode_s = 0.106e-3 / 1024, .rho_decode = 3.26, .plain_prefill_s = 2.918e-3 / (64.0 * 1024),
                      .rho_prefill = 1.89, .token_s = 3e-3};
}

enum { PROBE_CTX = 1024, PROBE_CHUNK = 64, PROBE_BS = 16, PROBE_CALLS = 5 };

/* This thread's CPU seconds: what a call cost, whatever else the machine runs meanwhile. */
static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* CPU seconds per call of plain attention and of ResidualAttention over the probe's context,
 * queries at its end, on this one thread (the caller runs it inside a parallel region, so the
 * kernels' own are nested and inactive); the cheapest of PROBE_CALLS each. */
static void probe(const KvLayerView *kv, const int32_t *table, const ResidualLayerView *res, const ResidualAdapter *ad,
                  const RopeTable *rope, const float *q, const int32_t *qpos, int nq, int n_heads, float *out, double *plain,
                  double *residual) {
    *plain = *residual = 1e30;
    for (int i = 0; i < PROBE_CALLS; i++) {
        double t0 = thread_seconds();
        cpu_attention(kv, table, PROBE_CTX, q, qpos, nq, n_heads, out);
        double t1 = thread_seconds();
        cpu_residual_attention(kv, table, res, table, PROBE_CTX, ad, rope, q, qpos, nq, n_heads, out);
        double t2 = thread_seconds();
        if (t1 - t0 < *plain) *plain = t1 - t0;
        if (t2 - t1 < *residual) *residual = t2 - t1;
    }
}

int forkkv_cost_measure(ForkKvCost *c) {
    int hd = c->head_dim, nkv = c->n_kv_heads, nh = c->n_heads, r = c->rank > 0 ? c->rank : 1, nb = PROBE_CTX / PROBE_BS;
    if (hd < 2 || hd % 2 || nkv < 1 || nh % nkv || r > LORA_MAX_RANK) return 0; /* shapes the probe does not cover: defaults */
    size_t kv_n = (size_t)nb * nkv * PROBE_BS * hd, res_n = (size_t)nb * PROBE_BS * r;
    uint16_t *k = malloc(kv_n * 2), *v = malloc(kv_n * 2), *kr = malloc(res_n * 2), *vr = malloc(res_n * 2);
    int32_t *slot_pos = malloc((size_t)nb * PROBE_BS * 4), *table = malloc((size_t)nb * 4), *qpos = malloc(PROBE_CHUNK * 4);
    float *cs = malloc((size_t)PROBE_CTX * hd / 2 * 4), *sn = malloc((size_t)PROBE_CTX * hd / 2 * 4);
    float *bk = malloc((size_t)nkv * hd * r * 4), *q = malloc((size_t)PROBE_CHUNK * nh * hd * 4);
    float *out = malloc((size_t)PROBE_CHUNK * nh * hd * 4);
    int rc = -1;
    if (k && v && kr && vr && slot_pos && table && qpos && cs && sn && bk && q && out) {
        uint32_t x = 12345;
        for (size_t i = 0; i < kv_n; i++) x = x * 1664525u + 1013904223u, k[i] = v[i] = vec_float_to_half((float)(x >> 20) / 4096.0f - 0.5f);
        for (size_t i = 0; i < res_n; i++) x = x * 1664525u + 1013904223u, kr[i] = vr[i] = vec_float_to_half((float)(x >> 20) / 4096.0f - 0.5f);
        for (int i = 0; i < nkv * hd * r; i++) x = x * 1664525u + 1013904223u, bk[i] = (float)(x >> 20) / 40960.0f - 0.05f;
        for (int i = 0; i < PROBE_CHUNK * nh * hd; i++) x = x * 1664525u + 1013904223u, q[i] = (float)(x >> 20) / 4096.0f - 0.5f;
        for (int b = 0; b < nb; b++) table[b] = b;
        for (int j = 0; j < PROBE_CTX; j++) slot_pos[j] = j;
        for (int p = 0; p < PROBE_CTX; p++) cpu_rope_angles(p, hd, 10000.0f, 1.0f, NULL, cs + (size_t)p * hd / 2, sn + (size_t)p * hd / 2);
        for (int t = 0; t < PROBE_CHUNK; t++) qpos[t] = PROBE_CTX - PROBE_CHUNK + t;
        KvLayerView kv = {k, v, slot_pos, PROBE_BS, nkv, hd};
        ResidualLayerView res = {kr, vr, PROBE_BS, r};
        ResidualAdapter ad = {bk, bk, r, 1.0f};
        RopeTable rope = {cs, sn, PROBE_CTX, hd, hd, ROPE_PAIRING_INTERLEAVED};
        double dec_plain, dec_res, pre_plain, pre_res;
        /* A team of two with one member at work: the kernels' parallel regions inside are nested,
         * and the runtime's single active level runs them on this thread alone. */
#pragma omp parallel num_threads(2)
#pragma omp master
        {
            probe(&kv, table, &res, &ad, &rope, q + (size_t)(PROBE_CHUNK - 1) * nh * hd, qpos + PROBE_CHUNK - 1, 1, nh, out,
                  &dec_plain, &dec_res);
            probe(&kv, table, &res, &ad, &rope, q, qpos, PROBE_CHUNK, nh, out, &pre_plain, &pre_res);
        }
        /* The live steps (c->token_s, wall seconds) use every thread: so does this cost, spread. */
        int threads = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
        c->plain_decode_s = dec_plain / PROBE_CTX / threads;
        c->rho_decode = dec_res / dec_plain;
        c->plain_prefill_s = pre_plain / ((double)PROBE_CHUNK * PROBE_CTX) / threads;
        c->rho_prefill = pre_res / pre_plain;
        rc = 0;
    }
    free(k); free(v); free(kr); free(vr); free(slot_pos); free(table); free(qpos); free(cs); free(sn); free(bk); free(q); free(out);
    return rc;
}

double forkkv_cost_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    int threads = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    return (t.tv_sec + t.tv_nsec * 1e-9) / threads;
}

void forkkv_cost_observe_step(ForkKvCost *c, int n_tokens, int n_decode, double seconds) {
    /* A prefill-heavy step prices a computed prompt token (its attention included). */
    if (n_tokens >= 32 && n_decode * 4 <= n_tokens && seconds > 0) c->token_s = ewma(c->token_s, seconds / n_tokens, &c->token_samples);
}

void forkkv_cost_observe_regret(ForkKvCost *c, int evicted_blocks, int prompt_blocks) {
    if (prompt_blocks > 0) c->regret = ewma(c->regret, (double)evicted_blocks / prompt_blocks, &c->regret_samples);
}

ForkKvChoice forkkv_cost_choose(const ForkKvCost *c, const ForkKvRequest *r) {
    double n = r->n_prompt, m = r->max_tokens, held = r->held < r->n_prompt ? r->held : r->n_prompt, fresh = n - held;
    double base = r->base < n ? r->base : n, own = r->own < n ? r->own : n;
    bool known = r->residual_known; /* false: the model before the recompute term (braid sim --auto-cost 1-3) */
    double residual = r->residual < n ? (r->residual > 0 ? r->residual : 0) : n, fork_reuses = base < residual ? base : residual;
    if (known) fresh = n - fork_reuses; /* a fork computes every block its residuals lack, base cached or not */
    double rho_d = c->rho_decode > 1 ? c->rho_decode - 1 : 0, rho_p = c->rho_prefill > 1 ? c->rho_prefill - 1 : 0;
    ForkKvChoice ch;
    ch.penalty_s = c->n_layers * (rho_d * c->plain_decode_s * m * (n + m / 2) + rho_p * c->plain_prefill_s * fresh * (n - fresh / 2));
    double res = 1.0 / c->kv_dim_over_rank;
    double saved = (n - own) - ((n - base) + n * res) + (r->copies > 0 ? r->copies : 0) * (1.0 - res);
    ch.saving_s = saved > 0 ? c->token_s * c->regret * saved : 0.0;
    ch.recompute_s = known ? c->token_s * (own - fork_reuses) : 0.0;
    ch.shared = ch.saving_s > ch.penalty_s + ch.recompute_s;
    return ch;
}
