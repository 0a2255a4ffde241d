/*
 * bench_cuda — the CUDA backend on one GPU, measured the way the CUDA issue asks:
 *   ceilings: device-to-device copy bandwidth (bytes read + written) and the cuBLAS bf16 GEMM rate;
 *   decode: aggregate tokens/s of B sequences decoding together (each after a P-token prompt),
 *           with the step time, for each B in --batches; graphs on (default) and, for B=1, off;
 *   prefill: one N-token prompt into an empty context (tokens/s and achieved TFLOP/s), once per
 *            attention kernel of --prefill-kernels (wmma: the backend's default shared-memory kernel;
 *            flash: the register kernel, opt-in; chosen through BRAID_CUDA_PREFILL as the backend reads it).
 * The model is a GGUF file or synthetic:llama3-8b (random bf16 weights generated on the GPU).
 * Every result is one JSON line on stdout; a table goes to stderr.
 *   bench_cuda --model PATH|synthetic:NAME [--batches 1,16,64,256] [--prompt 128] [--steps 64]
 *              [--prefill 512] [--prefill-kernels flash,wmma] [--no-ceilings] [--no-graphs]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cli/cli_common.h"
#include "common/timeutil.h"
#include "model/model.h"
#include "model/synthetic_model.h"
#include "worker/backend.h"

#define BLOCK 16

typedef struct {
    const char *model;
    char batches[128];
    char prefill_kernels[64];
    long prompt, steps, prefill;
    bool ceilings, graphs;
} BenchArgs;

/* Device-side timing of the work enqueued between start and stop on the default stream. */
static void timer_start(cudaEvent_t ev[2]) {
    cudaEventCreate(&ev[0]);
    cudaEventCreate(&ev[1]);
    cudaEventRecord(ev[0], 0);
}

static float timer_stop_ms(cudaEvent_t ev[2]) {
    float ms = 0;
    cudaEventRecord(ev[1], 0);
    cudaEventSynchronize(ev[1]);
    cudaEventElapsedTime(&ms, ev[0], ev[1]);
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    return ms;
}

static double copy_bandwidth_gbs(void) {
    size_t bytes = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return -1;
    cudaMemset(a, 1, bytes);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    int reps = 10;
    cudaEvent_t ev[2];
    timer_start(ev);
    for (int i = 0; i < reps; i++) cudaMemcpy(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice);
    float ms = timer_stop_ms(ev);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * bytes * reps / (ms * 1e-3) / 1e9;
}

/* Pinned host <-> device copy rate (GB/s, one direction) of 256 MiB transfers: the host KV tier's
 * ceiling (issue 34: STORE/LOAD against pinned cudaMemcpy). to_device picks the direction. */
static double pinned_copy_gbs(bool to_device) {
    size_t bytes = (size_t)256 << 20;
    void *host = NULL, *dev = NULL;
    if (cudaMallocHost(&host, bytes) != cudaSuccess) return -1;
    if (cudaMalloc(&dev, bytes) != cudaSuccess) {
        cudaFreeHost(host);
        return -1;
    }
    memset(host, 1, bytes);
    enum cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    cudaMemcpy(to_device ? dev : host, to_device ? host : dev, bytes, kind);
    int reps = 8;
    cudaEvent_t ev[2];
    timer_start(ev);
    for (int i = 0; i < reps; i++) cudaMemcpy(to_device ? dev : host, to_device ? host : dev, bytes, kind);
    float ms = timer_stop_ms(ev);
    cudaFree(dev);
    cudaFreeHost(host);
    return (double)bytes * reps / (ms * 1e-3) / 1e9;
}

/* Random bf16 inputs: zeros would hide the real rate (see the device notes). */
static void fill_random(uint16_t *dev, size_t n) {
    uint16_t *h = malloc(n * 2);
    uint32_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        h[i] = (uint16_t)(0x3c00 + ((s >> 16) & 0x3ff)) ^ (uint16_t)((s & 1) << 15);
    }
    cudaMemcpy(dev, h, n * 2, cudaMemcpyHostToDevice);
    free(h);
}

static double gemm_tflops(int m) {
    size_t n = (size_t)m * m;
    uint16_t *a, *b, *c;
    if (cudaMalloc((void **)&a, n * 2) || cudaMalloc((void **)&b, n * 2) || cudaMalloc((void **)&c, n * 2)) return -1;
    fill_random(a, n);
    fill_random(b, n);
    cublasHandle_t h;
    cublasCreate(&h);
    float alpha = 1, beta = 0;
    for (int i = 0; i < 3; i++)
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, m, m, &alpha, a, CUDA_R_16BF, m, b, CUDA_R_16BF, m, &beta, c, CUDA_R_16BF, m,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    int reps = 20;
    cudaEvent_t ev[2];
    timer_start(ev);
    for (int i = 0; i < reps; i++)
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, m, m, &alpha, a, CUDA_R_16BF, m, b, CUDA_R_16BF, m, &beta, c, CUDA_R_16BF, m,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    float ms = timer_stop_ms(ev);
    cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return 2.0 * m * (double)m * m * reps / (ms * 1e-3) / 1e12;
}

/* B sequences whose block tables are consecutive runs of pool blocks. */
typedef struct {
    int n, cap_blocks;
    int32_t *tables; /* (n, cap_blocks) */
    int32_t *tokens, *positions, *slots, *seq_start, *n_ctx, *rows, *argmax;
    const int32_t **table_ptrs;
} Fleet;

static int fleet_init(Fleet *f, int n, int max_ctx, int max_tokens) {
    f->n = n;
    f->cap_blocks = (max_ctx + BLOCK - 1) / BLOCK;
    f->tables = malloc((size_t)n * f->cap_blocks * 4);
    f->table_ptrs = malloc((size_t)n * sizeof *f->table_ptrs);
    int cap_tokens = n > max_tokens ? n : max_tokens;
    int32_t **bufs[] = {&f->tokens, &f->positions, &f->slots, &f->rows, &f->argmax};
    for (size_t i = 0; i < 5; i++) *bufs[i] = malloc((size_t)cap_tokens * 4);
    f->seq_start = malloc((size_t)(n + 1) * 4);
    f->n_ctx = calloc((size_t)n, 4);
    if (!f->tables || !f->table_ptrs || !f->tokens || !f->positions || !f->slots || !f->rows || !f->argmax || !f->seq_start || !f->n_ctx)
        return -1;
    for (int s = 0; s < n; s++) {
        for (int b = 0; b < f->cap_blocks; b++) f->tables[s * f->cap_blocks + b] = 1 + s * f->cap_blocks + b;
        f->table_ptrs[s] = f->tables + (size_t)s * f->cap_blocks;
    }
    return 0;
}

static void fleet_free(Fleet *f) {
    free(f->tables); free(f->table_ptrs); free(f->tokens); free(f->positions); free(f->slots); free(f->rows); free(f->argmax);
    free(f->seq_start); free(f->n_ctx);
}

/* Appends `count` tokens to each of sequences [first, first + n_seqs) in one batch. */
static int fleet_step(Backend *be, Fleet *f, int first, int n_seqs, int count, int vocab, BraidError *err) {
    int t = 0;
    for (int i = 0; i < n_seqs; i++) {
        int s = first + i;
        f->seq_start[i] = t;
        for (int k = 0; k < count; k++, t++) {
            int pos = f->n_ctx[s] + k;
            f->tokens[t] = (int32_t)((pos * 7919u + s * 104729u) % (unsigned)vocab);
            f->positions[t] = pos;
            f->slots[t] = f->table_ptrs[s][pos / BLOCK] * BLOCK + pos % BLOCK;
        }
        f->n_ctx[s] += count;
        f->rows[i] = t - 1;
    }
    f->seq_start[n_seqs] = t;
    ForwardBatch b = {.n_tokens = t, .tokens = f->tokens, .positions = f->positions, .slot_mapping = f->slots,
                      .n_seqs = n_seqs, .seq_start = f->seq_start, .block_tables = f->table_ptrs + first,
                      .seq_n_ctx = f->n_ctx + first, .n_logits = n_seqs, .logit_rows = f->rows};
    ForwardOutput out = {.argmax = f->argmax};
    return backend_forward(be, &b, &out, err);
}

static int make_backend(Backend *be, const ModelWeights *w, int n_seqs, int max_ctx, int max_tokens, bool graphs, BraidError *err) {
    int blocks = n_seqs * ((max_ctx + BLOCK - 1) / BLOCK) + 1;
    BackendConfig c = backend_config_default(BACKEND_CUDA, &w->cfg, blocks, BLOCK, max_tokens);
    c.max_seqs = n_seqs;
    c.max_context = max_ctx;
    c.cuda_graphs = graphs;
    return backend_create(be, w, &c, err);
}

static int bench_decode(const ModelWeights *w, const BenchArgs *a, int batch, bool graphs, const char *model_name) {
    BraidError err;
    Backend be;
    int max_ctx = (int)(a->prompt + a->steps + 1), vocab = w->cfg.vocab_size;
    int max_tokens = batch > 2048 ? batch : 2048;
    Fleet f = {0};
    if (fleet_init(&f, batch, max_ctx, max_tokens) || make_backend(&be, w, batch, max_ctx, max_tokens, graphs, &err)) {
        fprintf(stderr, "bench_cuda: decode B=%d: %s\n", batch, err.msg);
        fleet_free(&f);
        return -1;
    }
    int per_step = (int)(max_tokens / a->prompt);
    if (per_step < 1) per_step = 1;
    for (int s = 0; s < batch; s += per_step) /* prompts, several sequences per batch */
        if (fleet_step(&be, &f, s, batch - s < per_step ? batch - s : per_step, (int)a->prompt, vocab, &err)) goto fail;
    for (int i = 0; i < 3; i++) /* warm-up: graph capture, cuBLAS heuristics */
        if (fleet_step(&be, &f, 0, batch, 1, vocab, &err)) goto fail;
    double t0 = braid_now_seconds();
    for (int i = 0; i < a->steps - 3; i++)
        if (fleet_step(&be, &f, 0, batch, 1, vocab, &err)) goto fail;
    double dt = braid_now_seconds() - t0, step_ms = dt * 1e3 / (double)(a->steps - 3);
    printf("{\"bench\":\"decode\",\"model\":\"%s\",\"batch\":%d,\"graphs\":%s,\"context\":%ld,\"step_ms\":%.4f,\"tokens_per_s\":%.1f}\n",
           model_name, batch, graphs ? "true" : "false", a->prompt, step_ms, batch * 1e3 / step_ms);
    fprintf(stderr, "decode  B=%-4d graphs=%-3s step %8.3f ms  %10.1f tok/s\n", batch, graphs ? "on" : "off", step_ms,
            batch * 1e3 / step_ms);
    backend_destroy(&be);
    fleet_free(&f);
    return 0;
fail:
    fprintf(stderr, "bench_cuda: decode B=%d: %s\n", batch, err.msg);
    backend_destroy(&be);
    fleet_free(&f);
    return -1;
}

/* Matrix FLOPs per token (2 per weight of every layer matrix; the head only for the last row)
 * plus causal attention FLOPs (QKᵀ and PV) of an n-token prompt. */
static double prefill_flops(const ModelConfig *c, int n) {
    double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    double per_layer = 2.0 * (c->dim * (q + 2 * kv) + q * c->dim + 3.0 * c->dim * c->ff_dim);
    double attention = 2.0 * 2.0 * q * ((double)n * (n + 1) / 2.0);
    return c->n_layers * (per_layer * n + attention) + 2.0 * c->dim * c->vocab_size;
}

static int bench_prefill(const ModelWeights *w, int n, const char *model_name, const char *kernel) {
    BraidError err;
    Backend be;
    Fleet f = {0};
    if (setenv("BRAID_CUDA_PREFILL", kernel, 1)) return -1; /* read by the backend at creation */
    if (fleet_init(&f, 1, n + 1, n) || make_backend(&be, w, 1, n + 1, n, true, &err)) {
        fprintf(stderr, "bench_cuda: prefill: %s\n", err.msg);
        fleet_free(&f);
        return -1;
    }
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        f.n_ctx[0] = 0;
        double t0 = braid_now_seconds();
        if (fleet_step(&be, &f, 0, 1, n, w->cfg.vocab_size, &err)) {
            fprintf(stderr, "bench_cuda: prefill: %s\n", err.msg);
            break;
        }
        double dt = braid_now_seconds() - t0;
        if (rep > 0 && dt < best) best = dt; /* rep 0 warms up */
    }
    double tflops = prefill_flops(&w->cfg, n) / best / 1e12;
    printf("{\"bench\":\"prefill\",\"model\":\"%s\",\"kernel\":\"%s\",\"tokens\":%d,\"ms\":%.3f,\"tokens_per_s\":%.1f,\"tflops\":%.1f}\n",
           model_name, kernel, n, best * 1e3, n / best, tflops);
    fprintf(stderr, "prefill N=%-5d %-5s %9.3f ms  %10.1f tok/s  %6.1f TFLOP/s\n", n, kernel, best * 1e3, n / best, tflops);
    backend_destroy(&be);
    fleet_free(&f);
    return 0;
}

static int parse(int argc, char **argv, BenchArgs *a) {
    *a = (BenchArgs){.prompt = 128, .steps = 64, .prefill = 512, .ceilings = true, .graphs = true};
    snprintf(a->batches, sizeof a->batches, "1,16,64,256");
    snprintf(a->prefill_kernels, sizeof a->prefill_kernels, "flash");
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"batches", required_argument, 0, 'b'},
                                         {"prompt", required_argument, 0, 'p'}, {"steps", required_argument, 0, 's'},
                                         {"prefill", required_argument, 0, 'f'}, {"no-ceilings", no_argument, 0, 'c'},
                                         {"no-graphs", no_argument, 0, 'g'}, {"prefill-kernels", required_argument, 0, 'k'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'm') a->model = optarg;
        else if (c == 'b') snprintf(a->batches, sizeof a->batches, "%s", optarg);
        else if (c == 'p' && !cli_parse_int("--prompt", optarg, 1, 1 << 16, &a->prompt)) continue;
        else if (c == 's' && !cli_parse_int("--steps", optarg, 8, 1 << 16, &a->steps)) continue;
        else if (c == 'f' && !cli_parse_int("--prefill", optarg, 0, 1 << 16, &a->prefill)) continue;
        else if (c == 'c') a->ceilings = false;
        else if (c == 'g') a->graphs = false;
        else if (c == 'k') snprintf(a->prefill_kernels, sizeof a->prefill_kernels, "%s", optarg);
        else return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    BenchArgs a;
    if (parse(argc, argv, &a)) {
        fprintf(stderr, "usage: bench_cuda --model PATH|synthetic:llama3-8b [--batches 1,16,64,256] [--prompt N] [--steps N] "
                        "[--prefill N] [--prefill-kernels flash,wmma] [--no-ceilings] [--no-graphs]\n");
        return 2;
    }
    if (!backend_cuda_available()) {
        fprintf(stderr, "bench_cuda: no CUDA GPU visible\n");
        return 77;
    }
    if (a.ceilings) {
        double bw = copy_bandwidth_gbs(), tf = gemm_tflops(8192), h2d = pinned_copy_gbs(true), d2h = pinned_copy_gbs(false);
        printf("{\"bench\":\"ceilings\",\"d2d_copy_gbs\":%.1f,\"cublas_bf16_tflops\":%.1f,\"pinned_h2d_gbs\":%.1f,"
               "\"pinned_d2h_gbs\":%.1f}\n", bw, tf, h2d, d2h);
        fprintf(stderr, "ceilings: device copy %.1f GB/s (read + write), cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s, pinned cudaMemcpy "
                        "H2D %.1f / D2H %.1f GB/s\n", bw, tf, h2d, d2h);
    }
    const char *spec = cli_model_path(a.model);
    BraidModel model = {0};
    ModelWeights synth;
    const ModelWeights *w;
    BraidError err;
    bool synthetic = synthetic_model_spec(spec);
    if (synthetic ? synthetic_model_create(spec, 0, &synth, &err) : braid_model_load(spec, &model, &err)) {
        fprintf(stderr, "bench_cuda: %s\n", err.msg);
        return 1;
    }
    w = synthetic ? &synth : &model.weights;
    fprintf(stderr, "model %s: %d layers, dim %d, %.2f GB of bf16 weights\n", spec, w->cfg.n_layers, w->cfg.dim,
            (double)w->total_bytes / 1e9);
    int rc = 0;
    for (char *save = NULL, *tok = strtok_r(a.batches, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int b = atoi(tok);
        if (b < 1) continue;
        rc |= bench_decode(w, &a, b, a.graphs, spec);
        if (b == 1 && a.graphs) rc |= bench_decode(w, &a, b, false, spec);
    }
    for (char *save = NULL, *k = strtok_r(a.prefill_kernels, ",", &save); a.prefill > 0 && k; k = strtok_r(NULL, ",", &save))
        rc |= bench_prefill(w, (int)a.prefill, spec, k);
    if (synthetic) synthetic_model_free(&synth);
    else braid_model_free(&model);
    return rc ? 1 : 0;
}
