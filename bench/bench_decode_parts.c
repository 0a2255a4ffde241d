/*
 * bench_decode_parts — where a batched CPU decode step's time goes, on a real GGUF model: the
 * matmuls (--cpu-matmul, default the engine's arithmetic) of every layer (QKV, output, MLP), the vocabulary head, and paged attention of
 * `batch` sequences over `ctx` cached tokens each, timed separately. Each part is the best of
 * --repeats passes over all the layers, since on a shared machine noise only ever adds time.
 * Prints one JSON line per batch size to stdout.
 *   bench_decode_parts --model PATH [--batch 1,16] [--ctx 150] [--threads 2] [--repeats 10] [--cpu-matmul fp32|int8]
 *                      [--int8-layout packed|gguf]
 * int8 reads the weights packed as the engine's int8 backend packs them (kernels/cpu/int8_pack.h);
 * --int8-layout gguf keeps the file's layout, to compare the two.
 * The attention K/V hold fixed fp16 values, not a real prompt's: its cost depends on sizes only.
 * It also times the floor a decode pass cannot go below on this machine: reading every weight byte
 * the pass reads (layers and head), once in one parallel region (the streaming bandwidth) and once
 * in one parallel region per matmul as the engine runs them (adding the fork/join cost), and prints
 * the bytes and the bandwidths.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "common/timeutil.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/int8_pack.h"
#include "kernels/cpu/matmul.h"
#include "model/model.h"
#include "worker/kv_pool.h"

#define MAX_BATCHES 8

typedef struct {
    double layers_s, head_s, attention_s;
} PartTimes;

/* Folds bytes [begin, end) of p into a sum (8-byte words, several accumulators so the loads
 * pipeline); the sum only keeps the compiler from dropping the reads. */
static uint64_t fold_bytes(const uint8_t *p, size_t begin, size_t end) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = begin;
    for (; i + 32 <= end; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        a += w[0];
        b ^= w[1];
        c += w[2];
        d ^= w[3];
    }
    for (; i < end; i++) a += p[i];
    return a + b + c + d;
}

/* The weight matrices of one decode pass, in the engine's order (every layer's seven, then the
 * head), and the engine's matmul calls over them: group[k] consecutive matrices share one parallel
 * region (Q/K/V, output, gate/up, down; the head). Returns the matrix count; *n_groups the calls. */
static int pass_matrices(const ModelWeights *w, const WeightMatrix **out, int *group, int *n_groups) {
    static const int layer_groups[4] = {3, 1, 2, 1};
    int n = 0, g = 0;
    for (int l = 0; l < w->cfg.n_layers; l++) {
        const LayerWeights *L = &w->layers[l];
        const WeightMatrix *seven[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) out[n++] = seven[i];
        for (int i = 0; i < 4; i++) group[g++] = layer_groups[i];
    }
    out[n++] = &w->output;
    group[g++] = 1;
    *n_groups = g;
    return n;
}

static size_t matrix_bytes(const WeightMatrix *m) { return (size_t)m->rows * m->row_bytes; }

#define READ_CHUNK (64 * 1024)

/* Reads every byte of ms[0..n) in one parallel region, READ_CHUNK pieces shared out by guided
 * scheduling as the matmuls share their rows; first[i] is scratch for n + 1 chunk offsets. */
static uint64_t read_region(const WeightMatrix *const *ms, int n, size_t *first) {
    first[0] = 0;
    for (int i = 0; i < n; i++) first[i + 1] = first[i] + (matrix_bytes(ms[i]) + READ_CHUNK - 1) / READ_CHUNK;
    uint64_t total = 0;
#pragma omp parallel for schedule(guided) reduction(+ : total)
    for (size_t k = 0; k < first[n]; k++) {
        int lo = 0, hi = n - 1; /* the matrix holding chunk k: the last i with first[i] <= k */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (first[mid] <= k) lo = mid;
            else hi = mid - 1;
        }
        size_t begin = (k - first[lo]) * READ_CHUNK, bytes = matrix_bytes(ms[lo]);
        total += fold_bytes(ms[lo]->data, begin, begin + READ_CHUNK < bytes ? begin + READ_CHUNK : bytes);
    }
    return total;
}

/* Seconds to read every byte of the pass's matrices, one parallel region per group of group[]. */
static double time_weight_read(const WeightMatrix **ms, const int *group, int n_groups, size_t *first, uint64_t *sink) {
    double t0 = braid_now_seconds();
    for (int g = 0, at = 0; g < n_groups; at += group[g++]) *sink += read_region(ms + at, group[g], first);
    return braid_now_seconds() - t0;
}

static int time_matmuls(const ModelWeights *w, const float *x, int n, float *y[3], CpuMatmulMath math, CpuScratch *scratch,
                        PartTimes *t) {
    double t0 = braid_now_seconds();
    for (int l = 0; l < w->cfg.n_layers; l++) {
        const LayerWeights *L = &w->layers[l];
        const WeightMatrix *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gate_up[2] = {&L->w_gate, &L->w_up};
        if (cpu_matmul_shared_input(qkv, y, 3, x, n, math, scratch) ||
            cpu_matmul(&L->wo, x, n, y[0], math, scratch) ||
            cpu_matmul_shared_input(gate_up, y, 2, x, n, math, scratch) ||
            cpu_matmul(&L->w_down, x, n, y[0], math, scratch))
            return -1;
    }
    double t1 = braid_now_seconds();
    if (cpu_matmul(&w->output, x, n, y[0], math, scratch)) return -1;
    t->layers_s = t1 - t0;
    t->head_s = braid_now_seconds() - t1;
    return 0;
}

/* One pass of attention over every layer: `n` sequences of one query token each, `ctx` slots
 * each, their blocks interleaved through the pool the way blocks grown during decode are. */
static int time_attention(const ModelConfig *cfg, KvPool *pool, int n, int ctx, const float *q, float *out, PartTimes *t) {
    int bs = pool->block_size, nb = (ctx + bs - 1) / bs;
    int32_t *tables = malloc((size_t)n * nb * sizeof *tables), *n_ctx = malloc((size_t)n * sizeof *n_ctx);
    int32_t *seq_start = malloc((size_t)(n + 1) * sizeof *seq_start), *q_pos = malloc((size_t)n * sizeof *q_pos);
    const int32_t **table_ptrs = malloc((size_t)n * sizeof *table_ptrs);
    int rc = tables && n_ctx && seq_start && q_pos && table_ptrs ? 0 : -1;
    for (int s = 0; s < n && rc == 0; s++) {
        for (int b = 0; b < nb; b++) {
            tables[s * nb + b] = 1 + b * n + s;
            for (int o = 0; o < bs; o++) pool->slot_pos[(size_t)tables[s * nb + b] * bs + o] = b * bs + o;
        }
        table_ptrs[s] = tables + (size_t)s * nb;
        n_ctx[s] = ctx;
        seq_start[s] = s;
        q_pos[s] = ctx - 1;
    }
    if (rc == 0) seq_start[n] = n;
    const AttentionSeqs seqs = {.n_seqs = n, .seq_start = seq_start, .block_tables = table_ptrs, .n_ctx = n_ctx};
    double t0 = braid_now_seconds();
    for (int l = 0; l < cfg->n_layers && rc == 0; l++) {
        KvLayerView kv = kv_pool_layer(pool, l);
        rc = cpu_attention_batch(&kv, &seqs, q, q_pos, n, cfg->n_heads, out);
    }
    t->attention_s = braid_now_seconds() - t0;
    free(tables);
    free(n_ctx);
    free(seq_start);
    free(q_pos);
    free((void *)table_ptrs);
    return rc;
}

static int parse_batches(const char *text, int *batches, int *count) {
    char *copy = strdup(text), *save = NULL;
    if (!copy) return -1;
    *count = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (*count == MAX_BATCHES || cli_parse_int("--batch", tok, 1, 256, &v)) {
            free(copy);
            return -1;
        }
        batches[(*count)++] = (int)v;
    }
    free(copy);
    return *count ? 0 : -1;
}

static void usage(void) {
    fprintf(stderr, "usage: bench_decode_parts --model PATH [--batch N[,N...]] [--ctx N] [--threads N] [--repeats N] [--cpu-matmul fp32|int8]\n                          [--int8-layout packed|gguf]\n");
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    long ctx = 150, threads = 2, repeats = 10;
    CpuMatmulMath math = CPU_MATMUL_DEFAULT;
    int batches[MAX_BATCHES] = {1, 16}, n_batches = 2;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"batch", required_argument, 0, 'b'},
                                         {"ctx", required_argument, 0, 'c'},   {"threads", required_argument, 0, 't'},
                                         {"repeats", required_argument, 0, 'r'}, {"cpu-matmul", required_argument, 0, 'a'},
                                         {"int8-layout", required_argument, 0, 'l'}, {0, 0, 0, 0}};
    bool packed_layout = true;
    int c;
    while ((c = getopt_long(argc, argv, "m:b:c:t:r:a:l:", opts, NULL)) != -1) {
        if (c == 'm') model_path = optarg;
        else if (c == 'b' && parse_batches(optarg, batches, &n_batches) == 0) continue;
        else if (c == 'c' && cli_parse_int("--ctx", optarg, 1, 1 << 15, &ctx) == 0) continue;
        else if (c == 't' && cli_parse_int("--threads", optarg, 1, 1024, &threads) == 0) continue;
        else if (c == 'r' && cli_parse_int("--repeats", optarg, 1, 1000, &repeats) == 0) continue;
        else if (c == 'a' && cpu_matmul_math_parse(optarg, &math) == 0) continue;
        else if (c == 'l' && (strcmp(optarg, "packed") == 0 || strcmp(optarg, "gguf") == 0)) packed_layout = optarg[0] == 'p';
        else {
            usage();
            return 2;
        }
    }
    cli_set_threads((int)threads);
    BraidModel model;
    BraidError err;
    if (braid_model_load(cli_model_path(model_path), &model, &err)) {
        fprintf(stderr, "bench_decode_parts: %s\n", err.msg);
        return 1;
    }
    ModelWeights packed = {0};
    packed_layout = packed_layout && math == CPU_MATMUL_INT8;
    if (packed_layout && int8_pack_model(&model.weights, &packed, &err)) {
        fprintf(stderr, "bench_decode_parts: %s\n", err.msg);
        return 1;
    }
    const ModelWeights *weights = packed_layout ? &packed : &model.weights;
    const ModelConfig *cfg = &model.weights.cfg;
    int max_n = 1;
    for (int i = 0; i < n_batches; i++)
        if (batches[i] > max_n) max_n = batches[i];
    int block_size = 16, n_blocks = 1 + max_n * (int)((ctx + block_size - 1) / block_size);
    size_t width = (size_t)(cfg->ff_dim > cfg->vocab_size ? cfg->ff_dim : cfg->vocab_size);
    float *x = malloc((size_t)max_n * (size_t)cfg->ff_dim * sizeof *x), *y[3];
    float *q = malloc((size_t)max_n * cfg->n_heads * cfg->head_dim * sizeof *q), *att = malloc((size_t)max_n * cfg->n_heads * cfg->head_dim * sizeof *att);
    for (int i = 0; i < 3; i++) y[i] = malloc((size_t)max_n * width * sizeof *y[i]);
    KvPool pool;
    if (!x || !q || !att || !y[0] || !y[1] || !y[2] || kv_pool_create(&pool, cfg, n_blocks, block_size, &err)) {
        fprintf(stderr, "bench_decode_parts: %s\n", x && q && att ? err.msg : "out of memory");
        return 1;
    }
    for (size_t i = 0; i < (size_t)max_n * cfg->ff_dim; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    for (size_t i = 0; i < (size_t)max_n * cfg->n_heads * cfg->head_dim; i++) q[i] = (float)(i % 17) * 0.01f;
    for (int l = 0; l < pool.n_layers; l++) {
        size_t per_layer = (size_t)n_blocks * pool.n_kv_heads * block_size * pool.head_dim;
        for (size_t i = 0; i < per_layer; i++) pool.k[l][i] = pool.v[l][i] = (uint16_t)(0x3000 + (i * 2654435761u) % 2000);
    }
    /* The floor: reading the pass's weight bytes, best of --repeats. */
    size_t n_max = (size_t)cfg->n_layers * 7 + 1;
    const WeightMatrix **ms = malloc(n_max * sizeof *ms);
    int *group = malloc(((size_t)cfg->n_layers * 4 + 1) * sizeof *group);
    size_t *first = malloc((n_max + 1) * sizeof *first);
    if (!ms || !group || !first) {
        fprintf(stderr, "bench_decode_parts: out of memory\n");
        return 1;
    }
    int n_groups, n_ms = pass_matrices(weights, ms, group, &n_groups), all_in_one = n_ms;
    size_t weight_bytes = 0;
    for (int i = 0; i < n_ms; i++) weight_bytes += matrix_bytes(ms[i]);
    double read_one = 1e9, read_per = 1e9;
    uint64_t sink = 0;
    for (long r = 0; r < repeats; r++) {
        double a = time_weight_read(ms, &all_in_one, 1, first, &sink), b = time_weight_read(ms, group, n_groups, first, &sink);
        if (a < read_one) read_one = a;
        if (b < read_per) read_per = b;
    }
    printf("{\"threads\":%ld,\"weight_bytes\":%zu,\"read_one_region_ms\":%.3f,\"read_one_region_gb_s\":%.2f,"
           "\"read_per_matmul_ms\":%.3f,\"read_per_matmul_gb_s\":%.2f,\"sink\":%llu}\n",
           threads, weight_bytes, read_one * 1e3, weight_bytes / read_one / 1e9, read_per * 1e3, weight_bytes / read_per / 1e9,
           (unsigned long long)(sink & 1));
    free(ms);
    free(group);
    free(first);
    CpuScratch scratch = {0};
    int rc = 0;
    for (int bi = 0; bi < n_batches && rc == 0; bi++) {
        int n = batches[bi];
        PartTimes best = {1e9, 1e9, 1e9}, t = {0, 0, 0};
        for (long r = 0; r < repeats && rc == 0; r++) {
            rc = time_matmuls(weights, x, n, y, math, &scratch, &t) || time_attention(cfg, &pool, n, (int)ctx, q, att, &t);
            if (t.layers_s < best.layers_s) best.layers_s = t.layers_s;
            if (t.head_s < best.head_s) best.head_s = t.head_s;
            if (t.attention_s < best.attention_s) best.attention_s = t.attention_s;
        }
        if (rc) break;
        printf("{\"batch\":%d,\"ctx\":%ld,\"threads\":%ld,\"math\":\"%s\",\"layout\":\"%s\",\"layers_matmul_ms\":%.3f,\"head_matmul_ms\":%.3f,\"attention_ms\":%.3f,"
               "\"sum_ms\":%.3f,\"sum_ms_per_token\":%.3f}\n",
               n, ctx, threads, math == CPU_MATMUL_INT8 ? "int8" : "fp32", packed_layout ? "packed" : "gguf", best.layers_s * 1e3, best.head_s * 1e3, best.attention_s * 1e3,
               (best.layers_s + best.head_s + best.attention_s) * 1e3, (best.layers_s + best.head_s + best.attention_s) * 1e3 / n);
        fflush(stdout);
    }
    if (rc) fprintf(stderr, "bench_decode_parts: out of memory\n");
    cpu_scratch_free(&scratch);
    kv_pool_destroy(&pool);
    free(x);
    free(q);
    free(att);
    for (int i = 0; i < 3; i++) free(y[i]);
    model_weights_free(&packed);
    braid_model_free(&model);
    return rc ? 1 : 0;
}
