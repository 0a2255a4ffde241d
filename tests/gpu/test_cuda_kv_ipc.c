/*
 * KV blocks between two CUDA instances on one GPU through CUDA IPC (worker/cuda_kv_ipc.h), with two
 * real processes (CUDA refuses to open an IPC handle in the process that made it). Skips (exit 77)
 * without a GPU.
 * The lender (this process) prefills a 48-token prompt into device blocks 1..3 of a CUDA backend
 * on the default model, reads them back as the reference, exports its pool and starts itself again
 * as the borrower (`--borrower`), handing over the description and the reference on a pipe. The
 * borrower, with its own CUDA backend, opens the lender's pool, copies the run 1..3 to its blocks
 * 5..7 and checks keys, values and positions bit for bit; then it times 256-block runs copied over
 * IPC against cudaMemcpy of the same bytes inside its own pool and prints both rates (GB/s, bytes
 * read + written once each) as one JSON line: {"bench":"kv_ipc", ...} for scripts/gpu-suite.sh.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "common/timeutil.h"
#include "model/model.h"
#include "test_paths.h"
#include "worker/backend.h"
#include "worker/cuda_kv_ipc.h"

#define BS 16
#define N_BLOCKS 300
#define PROMPT 48
#define BENCH_RUN 256
#define BENCH_REPEATS 10

static int die(const char *what, const char *msg) {
    fprintf(stderr, "FAIL %s: %s\n", what, msg);
    return 1;
}

static int make_backend(BraidModel *m, Backend *b, BraidError *err) {
    if (braid_model_load(test_model_path(), m, err)) return -1;
    BackendConfig cfg = backend_config_default(BACKEND_CUDA, &m->weights.cfg, N_BLOCKS, BS, 64);
    return backend_create(b, &m->weights, &cfg, err);
}

/* Keys, values and positions of blocks first..first+2 (the reference the borrower must reproduce). */
typedef struct {
    size_t floats; /* per block, keys (or values) */
    float *keys, *values;
    int32_t positions[3 * BS];
} Blocks;

static int read_blocks(Backend *b, int first, Blocks *out, BraidError *err) {
    const ModelConfig *c = &b->weights->cfg;
    out->floats = (size_t)c->n_layers * c->n_kv_heads * BS * c->head_dim;
    out->keys = malloc(3 * out->floats * sizeof(float));
    out->values = malloc(3 * out->floats * sizeof(float));
    if (!out->keys || !out->values) return braid_error_set(err, "out of memory");
    for (int i = 0; i < 3; i++)
        if (backend_read_block(b, first + i, out->keys + i * out->floats, out->values + i * out->floats, out->positions + i * BS, err))
            return -1;
    return 0;
}

static int write_all(int fd, const void *p, size_t n) {
    for (const char *c = p; n > 0;) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n) {
    for (char *c = p; n > 0;) {
        ssize_t r = read(fd, c, n);
        if (r <= 0) return -1;
        c += r, n -= (size_t)r;
    }
    return 0;
}

/* ---- borrower ---- */

static double time_ipc(const CudaKvIpcPeer *peer, const CudaKvPool *mine, BraidError *err) {
    CudaKvRun run = {.src = 10, .dst = 20, .count = BENCH_RUN};
    double best = 1e30;
    for (int r = 0; r < BENCH_REPEATS; r++) {
        double t0 = braid_now_seconds();
        if (cuda_kv_ipc_copy_runs(peer, mine, &run, 1, err) || cudaStreamSynchronize(mine->stream) != cudaSuccess) return -1;
        double t = braid_now_seconds() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* The same bytes with one cudaMemcpy from the borrower's own pool to a scratch buffer (the device
 * copy ceiling). */
static double time_memcpy(const CudaKvPool *mine, size_t bytes) {
    double best = 1e30;
    void *scratch = NULL;
    if (bytes > mine->kv_bytes || cudaMalloc(&scratch, bytes) != cudaSuccess) return -1;
    for (int r = 0; r < BENCH_REPEATS && best >= 0; r++) {
        double t0 = braid_now_seconds();
        if (cudaMemcpyAsync(scratch, mine->kv, bytes, cudaMemcpyDeviceToDevice, mine->stream) != cudaSuccess ||
            cudaStreamSynchronize(mine->stream) != cudaSuccess)
            best = -1;
        double t = braid_now_seconds() - t0;
        if (best >= 0 && t < best) best = t;
    }
    cudaFree(scratch);
    return best;
}

static int borrower(void) {
    CudaKvIpcDesc desc;
    BraidModel m;
    Backend b;
    BraidError err;
    Blocks ref = {0}, got = {0};
    if (read_all(0, &desc, sizeof desc)) return die("borrower", "no description on stdin");
    if (make_backend(&m, &b, &err)) return die("borrower backend", err.msg);
    CudaKvPool mine;
    CudaKvIpcPeer peer;
    if (backend_cuda_kv_pool(&b, &mine, &err) || cuda_kv_ipc_open(&desc, &mine, &peer, &err)) return die("borrower open", err.msg);
    ref.floats = (size_t)m.weights.cfg.n_layers * m.weights.cfg.n_kv_heads * BS * m.weights.cfg.head_dim;
    ref.keys = malloc(3 * ref.floats * sizeof(float));
    ref.values = malloc(3 * ref.floats * sizeof(float));
    if (!ref.keys || !ref.values || read_all(0, ref.keys, 3 * ref.floats * sizeof(float)) ||
        read_all(0, ref.values, 3 * ref.floats * sizeof(float)) || read_all(0, ref.positions, sizeof ref.positions))
        return die("borrower", "reference not received");
    CudaKvRun run = {.src = 1, .dst = 5, .count = 3};
    if (cuda_kv_ipc_copy_runs(&peer, &mine, &run, 1, &err)) return die("copy", err.msg);
    /* A run out of the lender's range is refused, nothing queued. */
    CudaKvRun bad = {.src = N_BLOCKS - 1, .dst = 5, .count = 3};
    if (cuda_kv_ipc_copy_runs(&peer, &mine, &bad, 1, &err) == 0) return die("range check", "a run past the lender's pool was accepted");
    if (read_blocks(&b, 5, &got, &err)) return die("read back", err.msg);
    if (memcmp(got.keys, ref.keys, 3 * ref.floats * sizeof(float)) || memcmp(got.values, ref.values, 3 * ref.floats * sizeof(float)) ||
        memcmp(got.positions, ref.positions, sizeof ref.positions))
        return die("copy", "blocks copied over IPC differ from the lender's");
    fprintf(stderr, "ok   3 blocks copied over CUDA IPC equal the lender's, bit for bit (keys, values, positions)\n");
    size_t bytes = (size_t)BENCH_RUN * (2 * (size_t)mine.n_layers * mine.block_layer_bytes + (size_t)BS * sizeof(int32_t));
    double t_ipc = time_ipc(&peer, &mine, &err), t_copy = time_memcpy(&mine, bytes);
    if (t_ipc < 0 || t_copy < 0) return die("bench", "a timed copy failed");
    double ipc = (double)bytes / t_ipc / 1e9, d2d = (double)bytes / t_copy / 1e9;
    printf("{\"bench\":\"kv_ipc\",\"blocks\":%d,\"bytes\":%zu,\"ipc_gbs\":%.2f,\"d2d_memcpy_gbs\":%.2f,\"ratio\":%.3f}\n", BENCH_RUN, bytes,
           ipc, d2d, ipc / d2d);
    fprintf(stderr, "kv ipc: %d-block run %.2f GB/s over IPC, %.2f GB/s cudaMemcpy in the own pool (%.0f%%)\n", BENCH_RUN, ipc, d2d,
            100.0 * ipc / d2d);
    cuda_kv_ipc_close(&peer);
    backend_destroy(&b);
    braid_model_free(&m);
    return 0;
}

/* ---- lender ---- */

static int prefill(Backend *b, const BraidModel *m, BraidError *err) {
    const char *text = "In a quiet village by the sea, an old lighthouse keeper kept a careful journal of every ship that "
                       "passed his light, its name, its flag and the weather, for forty years and more.";
    TokenList ids = {0};
    if (tokenizer_encode(&m->tokenizer, text, strlen(text), false, m->tokenizer.add_bos, &ids, err)) return -1;
    if (ids.n < PROMPT) return braid_error_set(err, "prompt too short (%d tokens)", ids.n);
    int32_t pos[PROMPT], slots[PROMPT], start[] = {0, PROMPT}, ctx[] = {PROMPT}, row[] = {PROMPT - 1}, next, table[] = {1, 2, 3, 4};
    for (int t = 0; t < PROMPT; t++) pos[t] = t, slots[t] = table[t / BS] * BS + t % BS;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = PROMPT, .tokens = ids.ids, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    ForwardOutput out = {.argmax = &next};
    int rc = backend_forward(b, &fb, &out, err);
    free(ids.ids);
    return rc;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--borrower") == 0) return borrower();
    if (!backend_cuda_available()) {
        fprintf(stderr, "no CUDA backend or GPU here: skipping\n");
        return 77;
    }
    BraidModel m;
    Backend b;
    BraidError err;
    Blocks ref = {0};
    CudaKvPool pool;
    CudaKvIpcDesc desc;
    if (make_backend(&m, &b, &err) || prefill(&b, &m, &err) || read_blocks(&b, 1, &ref, &err) || backend_cuda_kv_pool(&b, &pool, &err) ||
        cuda_kv_ipc_export(&pool, &desc, &err))
        return die("lender", err.msg);
    int to_child[2];
    if (pipe(to_child)) return die("lender", "pipe");
    pid_t pid = fork();
    if (pid < 0) return die("lender", "fork");
    if (pid == 0) { /* exec at once: the child must not touch the parent's CUDA context */
        dup2(to_child[0], 0);
        close(to_child[0]);
        close(to_child[1]);
        execl("/proc/self/exe", argv[0], "--borrower", (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    int sent = write_all(to_child[1], &desc, sizeof desc) == 0 && write_all(to_child[1], ref.keys, 3 * ref.floats * sizeof(float)) == 0 &&
               write_all(to_child[1], ref.values, 3 * ref.floats * sizeof(float)) == 0 &&
               write_all(to_child[1], ref.positions, sizeof ref.positions) == 0;
    close(to_child[1]);
    int status = 0;
    waitpid(pid, &status, 0); /* the lender's pool stays mapped (and alive) until the borrower is done */
    backend_destroy(&b);
    braid_model_free(&m);
    free(ref.keys);
    free(ref.values);
    if (!sent) return die("lender", "could not hand the description over");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return die("borrower", "failed (see above)");
    fprintf(stderr, "PASSED\n");
    return 0;
}
