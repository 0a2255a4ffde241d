/*
 * bench_rotate — the ROTATE cache operation (issue 17, first part) on a real GGUF model: how close
 * a rotated block's keys are to keys recomputed at the new positions, and what one costs.
 *   bench_rotate --model PATH [--device cpu|cuda] [--deltas 1,16,256,1024,4096,8191,-1,...]
 *                [--blocks 256] [--batch 1,64] [--repeats 5]
 * Error sweep, one JSON line per delta: a 48-token prompt (3 blocks of 16) is prefilled at
 * positions p.. and rotated by delta, and the same prompt is prefilled at p + delta (p = 0 for
 * delta >= 0, -delta otherwise). Reported: max |K_rot - K_recomputed| in layer 0 (where the
 * pre-RoPE keys cannot depend on position, so this is the rotation plus storage rounding) and
 * over all layers (plus the forward's own drift between the two prefills), both also relative to
 * the layer's largest |K|; max |K_rot - fp64 rotation of the stored keys| (the kernel's own
 * precision); and max |logit diff| of the next token decoded over the rotated blocks against the
 * fresh prefill, beside the same difference for the unrotated blocks decoded at their original
 * positions (equal in exact arithmetic: the forward's own noise under a shift of every position). Positions past the model's context length are computed like any other (RoPE is
 * defined there); the line says when the recomputed prompt reaches past it.
 * Cost, one JSON line per batch size: microseconds per block (and per block per layer) to rotate
 * --blocks distinct blocks in lists of `batch` operations, best of --repeats passes. CPU
 * rotations are synchronous; on CUDA the time includes a device synchronization per pass.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef BRAID_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "cli/cli_common.h"
#include "common/timeutil.h"
#include "kernels/cpu/ops.h"
#include "model/model.h"
#include "worker/backend.h"

#define MAX_LIST 32
#define BS 16
#define N_TOK 48 /* three full blocks */

static int parse_ints(const char *text, int *out) {
    int n = 0;
    char *copy = strdup(text), *save = NULL;
    if (!copy) return 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && n < MAX_LIST; tok = strtok_r(NULL, ",", &save)) out[n++] = atoi(tok);
    free(copy);
    return n;
}

/* Prefills N_TOK tokens at positions offset.. into table[0..2]; returns the greedy next token. */
static int prefill_at(Backend *b, const int32_t *ids, int32_t offset, const int32_t *table, int32_t *next, BraidError *err) {
    int32_t pos[N_TOK], slots[N_TOK], start[] = {0, N_TOK}, ctx[] = {N_TOK}, row[] = {N_TOK - 1};
    for (int t = 0; t < N_TOK; t++) pos[t] = offset + t, slots[t] = table[t / BS] * BS + t % BS;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = N_TOK, .tokens = ids, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    ForwardOutput out = {.argmax = next};
    return backend_forward(b, &fb, &out, err);
}

/* Logits of `token` decoded at `pos` after the prompt in table[0..2] (writes slot 0 of table[3]). */
static int decode_at(Backend *b, int32_t token, int32_t pos, const int32_t *table, float *logits, BraidError *err) {
    int32_t p[] = {pos}, slots[] = {table[3] * BS}, start[] = {0, 1}, ctx[] = {N_TOK + 1}, row[] = {0}, next;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = 1, .tokens = &token, .positions = p, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    ForwardOutput out = {.argmax = &next, .logits = logits};
    return backend_forward(b, &fb, &out, err);
}

typedef struct {
    double layer0_abs, layer0_rel, all_abs, all_rel, kernel_abs, logit_abs, key_max, shift_noise;
} SweepErrors;

/* Folds one block's keys into the errors: rot (after the turn), ref (recomputed), before (stored
 * before the turn). */
static void block_errors(const ModelWeights *w, const float *rot, const float *ref, const float *before, int32_t delta,
                         SweepErrors *e) {
    const ModelConfig *c = &w->cfg;
    size_t layer = (size_t)c->n_kv_heads * BS * c->head_dim, rows = layer / c->head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        double kmax = 1e-30, emax = 0.0;
        for (size_t i = l * layer; i < (l + 1) * layer; i++) {
            kmax = fmax(kmax, fabs(ref[i]));
            e->key_max = fmax(e->key_max, fabs(ref[i]));
            emax = fmax(emax, fabs((double)rot[i] - ref[i]));
        }
        if (l == 0) e->layer0_abs = fmax(e->layer0_abs, emax), e->layer0_rel = fmax(e->layer0_rel, emax / kmax);
        e->all_abs = fmax(e->all_abs, emax);
        e->all_rel = fmax(e->all_rel, emax / kmax);
    }
    bool inter = c->rope_pairing == ROPE_PAIRING_INTERLEAVED;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        double ang = (double)delta * c->rope_position_scale * cpu_rope_inv_freq(i, c->rope_dim, c->rope_base, w->rope_freq_factors);
        double cs = cos(ang), sn = sin(ang);
        int a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + c->rope_dim / 2;
        for (size_t r = 0; r < (size_t)c->n_layers * rows; r++) {
            const float *x = before + r * c->head_dim, *y = rot + r * c->head_dim;
            e->kernel_abs = fmax(e->kernel_abs, fabs(y[a] - (x[a] * cs - x[b] * sn)));
            e->kernel_abs = fmax(e->kernel_abs, fabs(y[b] - (x[a] * sn + x[b] * cs)));
        }
    }
}

static int sweep_one(Backend *b, const int32_t *ids, int32_t delta, float *bufs[3], float *logits[3], BraidError *err) {
    const ModelWeights *w = b->weights;
    const int32_t moved[] = {1, 2, 3, 4}, fresh[] = {5, 6, 7, 8};
    int32_t p = delta >= 0 ? 0 : -delta, next, next_ref;
    if (prefill_at(b, ids, p, moved, &next, err) || prefill_at(b, ids, p + delta, fresh, &next_ref, err)) return -1;
    SweepErrors e = {0};
    float *before = bufs[0], *rot = bufs[1], *ref = bufs[2];
    /* The same decode at the original positions: RoPE makes it equal to the fresh prefill's in
     * exact arithmetic, so its difference is the forward's own noise under a shift. */
    if (decode_at(b, next, p + N_TOK, moved, logits[2], err)) return -1;
    for (int k = 0; k < 3; k++) {
        CacheOp op = {.kind = CACHE_OP_ROTATE, .src = moved[k], .dst = 0, .delta = delta};
        if (backend_read_block(b, moved[k], before, NULL, NULL, err) || backend_apply_cache_ops(b, &op, 1, err) ||
            backend_read_block(b, moved[k], rot, NULL, NULL, err) || backend_read_block(b, fresh[k], ref, NULL, NULL, err))
            return -1;
        block_errors(w, rot, ref, before, delta, &e);
    }
    if (decode_at(b, next, p + delta + N_TOK, moved, logits[0], err) || decode_at(b, next, p + delta + N_TOK, fresh, logits[1], err))
        return -1;
    for (int i = 0; i < w->cfg.vocab_size; i++) {
        e.logit_abs = fmax(e.logit_abs, fabs((double)logits[0][i] - logits[1][i]));
        e.shift_noise = fmax(e.shift_noise, fabs((double)logits[2][i] - logits[1][i]));
    }
    int last = (delta >= 0 ? p + delta : p) + N_TOK - 1; /* the later of the two prompts' last position */
    printf("{\"delta\": %d, \"p\": %d, \"max_abs_key\": %.3g, \"layer0_max_abs\": %.3g, \"layer0_max_rel\": %.3g, \"all_layers_max_abs\": %.3g, "
           "\"all_layers_max_rel\": %.3g, \"kernel_vs_fp64_max_abs\": %.3g, \"decode_logit_max_abs\": %.3g, "
           "\"shift_noise_logit_max_abs\": %.3g, "
           "\"past_context\": %s}\n",
           delta, p, e.key_max, e.layer0_abs, e.layer0_rel, e.all_abs, e.all_rel, e.kernel_abs, e.logit_abs, e.shift_noise,
           last >= w->cfg.context_length ? "true" : "false");
    fflush(stdout);
    return 0;
}

static void device_sync(const Backend *b) {
#ifdef BRAID_HAVE_CUDA
    if (b->cfg.kind == BACKEND_CUDA) cudaDeviceSynchronize();
#else
    (void)b;
#endif
}

/* Best time of `repeats` passes rotating blocks 1..n_blocks, `batch` operations per list. */
static double time_rotations(Backend *b, int n_blocks, int batch, int repeats, CacheOp *ops, BraidError *err) {
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        device_sync(b);
        double t0 = braid_now_seconds();
        for (int first = 0; first < n_blocks; first += batch) {
            int n = n_blocks - first < batch ? n_blocks - first : batch;
            for (int i = 0; i < n; i++)
                ops[i] = (CacheOp){.kind = CACHE_OP_ROTATE, .src = 1 + first + i, .dst = 0, .delta = (r & 1) ? -777 : 777};
            if (backend_apply_cache_ops(b, ops, n, err)) return -1;
        }
        device_sync(b);
        double t = braid_now_seconds() - t0;
        if (t < best) best = t;
    }
    return best;
}

static int run(const BraidModel *model, BackendKind kind, const int *deltas, int n_deltas, int n_blocks, const int *batches,
               int n_batches, int repeats, BraidError *err) {
    const ModelConfig *c = &model->weights.cfg;
    int pool = n_blocks + 1 > 9 ? n_blocks + 1 : 9;
    BackendConfig cfg = backend_config_default(kind, c, pool, BS, 64);
    Backend b;
    if (backend_create(&b, &model->weights, &cfg, err)) return -1;
    const char *text = "You are the planner agent. Break the task into small steps and list them in order. Keep every "
                       "step short, number the steps, and never skip a step even when it looks obvious to you. When "
                       "a step fails, say which one and stop there instead of guessing what should come next.";
    TokenList ids = {0};
    size_t keys = (size_t)c->n_layers * c->n_kv_heads * BS * c->head_dim;
    float *bufs[3] = {malloc(keys * sizeof(float)), malloc(keys * sizeof(float)), malloc(keys * sizeof(float))};
    float *logits[3];
    for (int i = 0; i < 3; i++) logits[i] = malloc((size_t)c->vocab_size * sizeof(float));
    CacheOp *ops = malloc((size_t)n_blocks * sizeof *ops);
    int rc = -1;
    if (!bufs[0] || !bufs[1] || !bufs[2] || !logits[0] || !logits[1] || !logits[2] || !ops) {
        braid_error_set(err, "bench_rotate: out of memory");
        goto done;
    }
    if (tokenizer_encode(&model->tokenizer, text, strlen(text), false, false, &ids, err)) goto done;
    if (ids.n < N_TOK) {
        braid_error_set(err, "bench_rotate: the prompt has %d tokens, fewer than %d", ids.n, N_TOK);
        goto done;
    }
    for (int i = 0; i < n_deltas; i++)
        if (sweep_one(&b, ids.ids, deltas[i], bufs, logits, err)) goto done;
    for (int i = 0; i < n_batches; i++) {
        int batch = batches[i] < n_blocks ? batches[i] : n_blocks;
        double t = time_rotations(&b, n_blocks, batch, repeats, ops, err);
        if (t < 0) goto done;
        double us = t * 1e6 / n_blocks;
        printf("{\"device\": \"%s\", \"batch\": %d, \"blocks\": %d, \"block_size\": %d, \"layers\": %d, \"kv_heads\": %d, "
               "\"head_dim\": %d, \"us_per_block\": %.2f, \"us_per_block_layer\": %.3f}\n",
               backend_kind_name(kind), batch, n_blocks, BS, c->n_layers, c->n_kv_heads, c->head_dim, us, us / c->n_layers);
        fflush(stdout);
    }
    rc = 0;
done:
    free(ids.ids);
    for (int i = 0; i < 3; i++) free(bufs[i]);
    for (int i = 0; i < 3; i++) free(logits[i]);
    free(ops);
    backend_destroy(&b);
    return rc;
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"device", required_argument, 0, 'd'},
                                         {"deltas", required_argument, 0, 'D'}, {"blocks", required_argument, 0, 'n'},
                                         {"batch", required_argument, 0, 'b'},  {"repeats", required_argument, 0, 'r'},
                                         {0, 0, 0, 0}};
    const char *model_path = NULL, *device = "cpu", *delta_text = "1,16,256,1024,4096,8191,-1,-16,-256,-1024,-4096,-8191";
    const char *batch_text = "1,64";
    int n_blocks = 256, repeats = 5, c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'd': device = optarg; break;
        case 'D': delta_text = optarg; break;
        case 'n': n_blocks = atoi(optarg); break;
        case 'b': batch_text = optarg; break;
        case 'r': repeats = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: bench_rotate --model PATH [--device cpu|cuda] [--deltas 1,-16] [--blocks N] [--batch 1,64] "
                            "[--repeats R]\n");
            return 2;
        }
    }
    int deltas[MAX_LIST], batches[MAX_LIST];
    int n_deltas = parse_ints(delta_text, deltas), n_batches = parse_ints(batch_text, batches);
    for (int i = 0; i < n_batches; i++)
        if (batches[i] < 1) n_batches = 0;
    if (n_blocks < 1 || repeats < 1 || n_batches == 0) {
        fprintf(stderr, "bench_rotate: --blocks, --repeats and --batch need positive values\n");
        return 2;
    }
    BraidModel model;
    BraidError err;
    BackendKind kind;
    if (backend_parse_kind(device, &kind, &err) || braid_model_load(cli_model_path(model_path), &model, &err)) {
        fprintf(stderr, "bench_rotate: %s\n", err.msg);
        return 1;
    }
    int rc = run(&model, kind, deltas, n_deltas, n_blocks, batches, n_batches, repeats, &err);
    if (rc) fprintf(stderr, "bench_rotate: %s\n", err.msg);
    braid_model_free(&model);
    return rc ? 1 : 0;
}
