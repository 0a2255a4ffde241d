/*
 * bench_cache_ops — what the host tier's block copies cost on this machine: STORE (device ->
 * host) and LOAD (host -> device) of whole KV blocks through backend_apply_cache_ops, on a real
 * GGUF model's KV layout. The default copy cost of `braid sim --host-gbs/--host-latency-us` comes
 * from here. Each figure is the best of --repeats passes (noise only ever adds time).
 *   bench_cache_ops --model PATH [--device cpu|cuda] [--blocks 256] [--batch 1,16,256] [--repeats 5]
 * Prints one JSON line per (operation, batch) to stdout: blocks per call, microseconds per call,
 * microseconds per block and GB/s. On the CPU backend copies are synchronous; on CUDA they are
 * queued on the copy stream, so each pass ends by reading one block back (backend_read_block waits
 * for all queued work): the figure is the copies' whole cost, comparable with bench_cuda's pinned
 * cudaMemcpy ceilings.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "common/timeutil.h"
#include "model/model.h"
#include "worker/backend.h"
#include "worker/kv_pool.h"

#define MAX_BATCHES 8

/* Best time of `repeats` passes of n_blocks copies of `kind`, `batch` operations per call. */
static double time_copies(Backend *b, CacheOpKind kind, int n_blocks, int batch, int repeats, CacheOp *ops, BraidError *err) {
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t0 = braid_now_seconds();
        for (int first = 0; first < n_blocks; first += batch) {
            int n = n_blocks - first < batch ? n_blocks - first : batch;
            for (int i = 0; i < n; i++) {
                /* Scattered device ids, as an LRU pool hands them out after a while. */
                int32_t dev = 1 + (int32_t)(((first + i) * 7919L) % n_blocks), host = 1 + first + i;
                ops[i] = (CacheOp){.kind = (uint8_t)kind, .src = kind == CACHE_OP_STORE ? dev : host,
                                   .dst = kind == CACHE_OP_STORE ? host : dev};
            }
            if (backend_apply_cache_ops(b, ops, n, err)) return -1;
        }
        int32_t positions[1024]; /* block_size <= 1024 */
        if (backend_read_block(b, 1, NULL, NULL, positions, err)) return -1;
        double t = braid_now_seconds() - t0;
        if (t < best) best = t;
    }
    return best;
}

static int parse_batches(const char *text, int *out) {
    int n = 0;
    char *copy = strdup(text), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && n < MAX_BATCHES; tok = strtok_r(NULL, ",", &save)) {
        int v = atoi(tok);
        if (v > 0) out[n++] = v;
    }
    free(copy);
    return n;
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"device", required_argument, 0, 'd'},
                                         {"blocks", required_argument, 0, 'n'}, {"batch", required_argument, 0, 'b'},
                                         {"repeats", required_argument, 0, 'r'}, {0, 0, 0, 0}};
    const char *model_path = NULL, *device = "cpu", *batch_text = "1,16,256";
    int n_blocks = 256, repeats = 5, c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'd': device = optarg; break;
        case 'n': n_blocks = atoi(optarg); break;
        case 'b': batch_text = optarg; break;
        case 'r': repeats = atoi(optarg); break;
        default: fprintf(stderr, "usage: bench_cache_ops --model PATH [--device cpu|cuda] [--blocks N] [--batch 1,16] [--repeats R]\n"); return 2;
        }
    }
    int batches[MAX_BATCHES], n_batches = parse_batches(batch_text, batches);
    if (n_blocks < 1 || repeats < 1 || n_batches == 0) {
        fprintf(stderr, "bench_cache_ops: --blocks, --repeats and --batch need positive values\n");
        return 2;
    }
    BraidModel model;
    BraidError err;
    BackendKind kind;
    if (backend_parse_kind(device, &kind, &err) || braid_model_load(cli_model_path(model_path), &model, &err)) {
        fprintf(stderr, "bench_cache_ops: %s\n", err.msg);
        return 1;
    }
    const ModelConfig *mc = &model.weights.cfg;
    BackendConfig bc = backend_config_default(kind, mc, n_blocks + 1, 16, 64);
    bc.host_blocks = n_blocks + 1;
    Backend b;
    CacheOp *ops = malloc((size_t)n_blocks * sizeof *ops);
    if (!ops || backend_create(&b, &model.weights, &bc, &err)) {
        fprintf(stderr, "bench_cache_ops: %s\n", ops ? err.msg : "out of memory");
        braid_model_free(&model);
        return 1;
    }
    double block_bytes = (double)kv_pool_block_bytes(mc, 16);
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        CacheOpKind op = k == 0 ? CACHE_OP_STORE : CACHE_OP_LOAD;
        for (int i = 0; i < n_batches && rc == 0; i++) {
            double t = time_copies(&b, op, n_blocks, batches[i], repeats, ops, &err);
            if (t < 0) {
                fprintf(stderr, "bench_cache_ops: %s\n", err.msg);
                rc = 1;
                break;
            }
            int calls = (n_blocks + batches[i] - 1) / batches[i];
            printf("{\"device\":\"%s\",\"op\":\"%s\",\"batch\":%d,\"block_bytes\":%.0f,\"us_per_call\":%.2f,\"us_per_block\":%.3f,\"gb_per_s\":%.2f}\n",
                   device, cache_op_name(op), batches[i], block_bytes, 1e6 * t / calls, 1e6 * t / n_blocks,
                   block_bytes * n_blocks / t / 1e9);
        }
    }
    backend_destroy(&b);
    free(ops);
    braid_model_free(&model);
    return rc;
}
