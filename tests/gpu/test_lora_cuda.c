/*
 * LoRA adapters and ForkKV on the CUDA backend (worker/cuda_lora.h) against the CPU backend (the
 * oracle) on the real default model and the committed adapters, the same ForwardBatch on both.
 * Skips (exit 77) without a GPU.
 * - Separate mode: one batch mixing the base model, the planner and the coder on one prompt and the
 *   planner again on a shorter one (prefill: multi-tile and single-tile sequences), then decode
 *   steps of all four together (no graph: adapter steps never replay one), then a base-only
 *   decode step on the same backend (the graph path). Logits within test_cuda_backend's bf16
 *   tolerance; each adapter's CUDA row is nearer the CPU row of its own adapter than to the CPU's
 *   base row (the delta reached the right sequence); greedy tokens equal except at near-ties.
 * - Shared mode (ForkKV): the planner prefills a context (base and residual written), then in one
 *   batch the coder forks it (the context's whole base blocks shared and not rewritten, its own
 *   residual table) beside a base-model sequence (ordinary attention in the same step); then decode
 *   steps of all three (ResidualAttention's decode tiles beside ordinary decode). Logits close to
 *   the CPU backend's, greedy tokens equal except at near-ties.
 * - A ForkKV batch on a backend without a residual pool, and an unknown adapter id, are refused.
 * Decode steps are teacher-forced with the CPU's greedy tokens, so both backends always see the
 * same contexts and every step's logits stay comparable; "greedy tokens equal" is then checked
 * per step: CUDA's argmax must be the CPU's wherever the CPU's top-2 gap is at least NEAR_TIE.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "golden_io.h"
#include "model/lora_adapter.h"
#include "model/model.h"
#include "test_paths.h"
#include "worker/backend.h"
#include "worker/sampler.h"

#define LOGIT_MAX_TOLERANCE 1.0  /* test_cuda_backend's: bf16 weights + KV over 30 layers, worst element */
#define LOGIT_MEAN_TOLERANCE 0.1 /* typical element */
#define NEAR_TIE 1.0             /* a greedy flip is accepted only under this CPU top-2 gap (test_engine's) */

enum { BS = 16, BLOCKS = 64, RES_BLOCKS = 64, MAX_BATCH = 512, MAX_SEQ_BLOCKS = 8, MAX_SEQ_TOKENS = MAX_SEQ_BLOCKS * BS };
enum { BASE = 0, PLANNER = 1, CODER = 2 };
enum { DECODE_STEPS = 10, MAX_SEQS = 4 };

static BraidModel model;
static LoraSet lora;
static TokenList context, question;

/* One sequence of a step: it computes positions [from, to) of tokens. Base slots below base_from
 * and residual slots below res_from are cached (written nowhere); res_table NULL = separate mode. */
typedef struct {
    int32_t tokens[MAX_SEQ_TOKENS];
    int from, to;
    int adapter;
    int32_t table[MAX_SEQ_BLOCKS], res[MAX_SEQ_BLOCKS];
    bool forked;
    int base_from, res_from;
    const char *name;
} Seq;

/* What one comparison saw, for the printed notes and the asserts. */
typedef struct {
    double max, sum;
    size_t count;
    int steps, flips;
} Diff;

static int encode(const char *text, bool parse_special, TokenList *out) {
    return golden_encode(&model, text, parse_special, out);
}

static int setup(void **state) {
    (void)state;
    if (golden_load_model_and_adapters(&model, &lora)) return -1;
    return encode("<|im_start|>system\nYou are part of a software team. The project is a calculator app written in C with "
                  "functions add, subtract, multiply and divide, each in its own file, with unit tests for each.<|im_end|>\n",
                  true, &context) ||
                   encode("<|im_start|>user\nWrite the function subtract.<|im_end|>\n<|im_start|>assistant\n", false, &question)
               ? -1
               : 0;
}

static int teardown(void **state) {
    (void)state;
    free(context.ids);
    free(question.ids);
    lora_set_free(&lora);
    braid_model_free(&model);
    return 0;
}

static void make_backend(Backend *b, BackendKind kind, int residual_blocks) {
    BackendConfig bc = backend_config_default(kind, &model.weights.cfg, BLOCKS, BS, MAX_BATCH);
    bc.max_seqs = MAX_SEQS;
    bc.lora = &lora;
    bc.residual_blocks = residual_blocks;
    bc.residual_rank = residual_blocks > 0 ? lora_set_max_rank(&lora) : 0;
    BraidError err;
    if (backend_create(b, &model.weights, &bc, &err)) fail_msg("%s backend: %s", backend_kind_name(kind), err.msg);
    if (residual_blocks > 0) assert_true(b->residual_kv_bytes > 0);
}

/* A sequence whose first n tokens are prompt; blocks first_block, first_block + 1, ... */
static void seq_init(Seq *s, const char *name, const int32_t *prompt, int n, int adapter, int first_block) {
    memset(s, 0, sizeof *s);
    assert_true(n + DECODE_STEPS <= MAX_SEQ_TOKENS);
    memcpy(s->tokens, prompt, (size_t)n * sizeof *prompt);
    s->to = n;
    s->adapter = adapter;
    s->name = name;
    for (int i = 0; i < MAX_SEQ_BLOCKS; i++) s->table[i] = first_block + i;
}

/* Gives s its own residual table (ForkKV) from first_block on. */
static void seq_fork(Seq *s, int first_res_block) {
    s->forked = true;
    for (int i = 0; i < MAX_SEQ_BLOCKS; i++) s->res[i] = first_res_block + i;
}

/* Runs one step of the sequences (each its [from, to)) on b: logits (n, vocab) of each one's last
 * token. Returns 0, or -1 with err set when the backend refuses the batch. */
static int run_step(Backend *b, Seq *const *seqs, int n, float *logits, BraidError *err) {
    int32_t tokens[MAX_BATCH], pos[MAX_BATCH], slots[MAX_BATCH], res_slots[MAX_BATCH];
    int32_t start[MAX_SEQS + 1], ctx[MAX_SEQS], rows[MAX_SEQS], adapters[MAX_SEQS], argmax[MAX_SEQS];
    const int32_t *tables[MAX_SEQS], *res_tables[MAX_SEQS];
    bool any_forked = false;
    int t = 0;
    for (int i = 0; i < n; i++) {
        const Seq *s = seqs[i];
        start[i] = t;
        for (int p = s->from; p < s->to; p++, t++) {
            assert_true(t < MAX_BATCH);
            tokens[t] = s->tokens[p];
            pos[t] = p;
            slots[t] = p >= s->base_from ? s->table[p / BS] * BS + p % BS : -1;
            res_slots[t] = s->forked && p >= s->res_from ? s->res[p / BS] * BS + p % BS : -1;
        }
        ctx[i] = s->to;
        rows[i] = t - 1;
        adapters[i] = s->adapter;
        tables[i] = s->table;
        res_tables[i] = s->forked ? s->res : NULL;
        any_forked |= s->forked;
    }
    start[n] = t;
    ForwardBatch fb = {.n_tokens = t, .tokens = tokens, .positions = pos, .slot_mapping = slots, .n_seqs = n,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = n, .logit_rows = rows,
                       .seq_adapter = adapters, .res_block_tables = any_forked ? res_tables : NULL,
                       .res_slot_mapping = any_forked ? res_slots : NULL};
    ForwardOutput out = {.argmax = argmax, .logits = logits};
    return backend_forward(b, &fb, &out, err);
}

static float *alloc_logits(int rows) {
    float *p = malloc((size_t)rows * model.weights.cfg.vocab_size * sizeof *p);
    assert_non_null(p);
    return p;
}

static double row_max_diff(const float *a, const float *b, int vocab) {
    double worst = 0.0;
    for (int v = 0; v < vocab; v++) worst = fmax(worst, fabs((double)a[v] - b[v]));
    return worst;
}

/* Compares the rows of a step: no NaN, each row's differences into d, and CUDA's argmax equal to
 * the CPU's unless the CPU's top-2 gap is a near-tie. */
static void compare_rows(const char *what, Seq *const *seqs, int n, const float *cpu, const float *gpu, Diff *d) {
    int vocab = model.weights.cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        const float *a = cpu + (size_t)i * vocab, *b = gpu + (size_t)i * vocab;
        double row_max = 0.0;
        for (int v = 0; v < vocab; v++) {
            assert_false(isnan(b[v]));
            double diff = fabs((double)a[v] - b[v]);
            row_max = fmax(row_max, diff);
            d->sum += diff;
        }
        d->count += (size_t)vocab;
        d->max = fmax(d->max, row_max);
        int best_cpu = sampler_argmax(a, vocab), best_gpu = sampler_argmax(b, vocab);
        double gap = golden_top2_gap(a, vocab);
        if (best_cpu != best_gpu) {
            d->flips++;
            fprintf(stderr, "%s: %s: greedy differs (cpu %d, cuda %d) at a CPU top-2 gap of %.3f\n", what, seqs[i]->name, best_cpu,
                    best_gpu, gap);
            if (gap >= NEAR_TIE) fail_msg("%s: %s: greedy token differs where the CPU's top-2 gap is %.3f", what, seqs[i]->name, gap);
        }
        d->steps++;
    }
}

static void assert_within_tolerance(const char *what, const Diff *d) {
    double mean = d->sum / (double)d->count;
    fprintf(stderr, "%s: max |diff| %.4f, mean %.5f over %d rows; %d greedy flips (near-ties)\n", what, d->max, mean, d->steps,
            d->flips);
    assert_true(d->max <= LOGIT_MAX_TOLERANCE);
    assert_true(mean <= LOGIT_MEAN_TOLERANCE);
}

/* The same step on both backends, compared; the sequences then advance by the CPU's greedy token
 * (teacher forcing) when advance is set. */
static void step_both(Backend *cpu_b, Backend *gpu_b, Seq *const *seqs, int n, const char *what, Diff *d, float *cpu, float *gpu,
                      bool advance) {
    BraidError err;
    if (run_step(cpu_b, seqs, n, cpu, &err)) fail_msg("cpu: %s", err.msg);
    if (run_step(gpu_b, seqs, n, gpu, &err)) fail_msg("cuda: %s", err.msg);
    compare_rows(what, seqs, n, cpu, gpu, d);
    if (!advance) return;
    int vocab = model.weights.cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        Seq *s = seqs[i];
        s->tokens[s->to] = sampler_argmax(cpu + (size_t)i * vocab, vocab);
        s->from = s->to;
        s->to++;
    }
}

static int32_t *whole_prompt(int *n) {
    *n = context.n + question.n;
    int32_t *t = malloc((size_t)*n * sizeof *t);
    assert_non_null(t);
    memcpy(t, context.ids, (size_t)context.n * sizeof *t);
    memcpy(t + context.n, question.ids, (size_t)question.n * sizeof *t);
    return t;
}

/* The CUDA row of an adapted sequence is nearer the CPU's row of that adapter than the CPU's base
 * row on the same tokens is: the adapter's delta reached that sequence, and only it. */
static void assert_adapter_applied(const char *name, const float *gpu_row, const float *cpu_row, const float *cpu_base_row) {
    int vocab = model.weights.cfg.vocab_size;
    double to_own = row_max_diff(gpu_row, cpu_row, vocab), adapter_effect = row_max_diff(cpu_row, cpu_base_row, vocab);
    fprintf(stderr, "%s: cuda vs cpu %.4f; the adapter moves the cpu logits by %.4f\n", name, to_own, adapter_effect);
    assert_true(to_own < adapter_effect);
}

static void test_separate_mixed_batch(void **state) {
    (void)state;
    int n, vocab = model.weights.cfg.vocab_size;
    int32_t *prompt = whole_prompt(&n);
    Backend cpu_b, gpu_b;
    make_backend(&cpu_b, BACKEND_CPU, 0);
    make_backend(&gpu_b, BACKEND_CUDA, 0);
    Seq base, planner, coder, planner_short;
    seq_init(&base, "base", prompt, n, BASE, 1);
    seq_init(&planner, "planner", prompt, n, PLANNER, 11);
    seq_init(&coder, "coder", prompt, n, CODER, 21);
    seq_init(&planner_short, "planner (context only)", context.ids, context.n, PLANNER, 31);
    Seq *all[] = {&base, &planner, &coder, &planner_short};
    float *cpu = alloc_logits(MAX_SEQS), *gpu = alloc_logits(MAX_SEQS);
    Diff prefill = {0}, decode = {0}, graph = {0};

    step_both(&cpu_b, &gpu_b, all, 4, "separate prefill", &prefill, cpu, gpu, false);
    assert_adapter_applied("separate prefill: planner", gpu + 1 * (size_t)vocab, cpu + 1 * (size_t)vocab, cpu);
    assert_adapter_applied("separate prefill: coder", gpu + 2 * (size_t)vocab, cpu + 2 * (size_t)vocab, cpu);
    assert_within_tolerance("separate prefill (base + planner + coder + planner)", &prefill);
    /* The prefill's greedy tokens, then DECODE_STEPS decode steps of all four in one batch. */
    for (int i = 0; i < 4; i++) {
        Seq *s = all[i];
        s->tokens[s->to] = sampler_argmax(cpu + (size_t)i * vocab, vocab);
        s->from = s->to;
        s->to++;
    }
    for (int k = 0; k < DECODE_STEPS; k++) step_both(&cpu_b, &gpu_b, all, 4, "separate decode", &decode, cpu, gpu, true);
    assert_within_tolerance("separate decode (4 sequences, 3 adapters)", &decode);
    /* A base-only decode step on the adapter backend: the unchanged path, a graph replay. */
    Seq *base_only[] = {&base};
    step_both(&cpu_b, &gpu_b, base_only, 1, "base-only decode (graph)", &graph, cpu, gpu, false);
    assert_within_tolerance("base-only decode on the adapter backend (graph)", &graph);

    free(cpu);
    free(gpu);
    free(prompt);
    backend_destroy(&cpu_b);
    backend_destroy(&gpu_b);
}

static void test_shared_fork(void **state) {
    (void)state;
    int n, vocab = model.weights.cfg.vocab_size, ctx_full = context.n / BS * BS;
    int32_t *prompt = whole_prompt(&n);
    assert_true(ctx_full >= BS);
    Backend cpu_b, gpu_b;
    make_backend(&cpu_b, BACKEND_CPU, RES_BLOCKS);
    make_backend(&gpu_b, BACKEND_CUDA, RES_BLOCKS);
    Seq planner, coder, base;
    float *cpu = alloc_logits(MAX_SEQS), *gpu = alloc_logits(MAX_SEQS);
    Diff prefill = {0}, fork = {0}, decode = {0};

    /* The planner computes the context: base blocks 1.., residual blocks 21.. */
    seq_init(&planner, "planner (context)", context.ids, context.n, PLANNER, 1);
    seq_fork(&planner, 21);
    Seq *first[] = {&planner};
    step_both(&cpu_b, &gpu_b, first, 1, "ForkKV prefill", &prefill, cpu, gpu, false);
    assert_within_tolerance("ForkKV: planner prefills the context", &prefill);
    int32_t planner_next = sampler_argmax(cpu, vocab);

    /* The coder forks it: the context's whole base blocks are the planner's (read, never written),
     * the rest of its base and its whole residual (blocks 31..) its own. Beside it, a base-model
     * sequence on the same prompt in its own blocks. */
    seq_init(&coder, "coder (fork)", prompt, n, CODER, 41);
    for (int i = 0; i < ctx_full / BS; i++) coder.table[i] = planner.table[i];
    coder.base_from = ctx_full;
    seq_fork(&coder, 31);
    seq_init(&base, "base", prompt, n, BASE, 51);
    Seq *second[] = {&coder, &base};
    step_both(&cpu_b, &gpu_b, second, 2, "ForkKV fork", &fork, cpu, gpu, false);
    assert_adapter_applied("ForkKV fork: coder", gpu, cpu, cpu + vocab);
    assert_within_tolerance("ForkKV: coder forks the planner's context, base sequence beside", &fork);

    /* Decode steps of all three, each from its prefill's greedy token: two ResidualAttention
     * decode tiles and one ordinary decode per step. */
    Seq *all[] = {&planner, &coder, &base};
    planner.tokens[planner.to] = planner_next;
    coder.tokens[coder.to] = sampler_argmax(cpu, vocab);
    base.tokens[base.to] = sampler_argmax(cpu + vocab, vocab);
    for (int i = 0; i < 3; i++) all[i]->from = all[i]->to, all[i]->to++;
    for (int k = 0; k < DECODE_STEPS; k++) step_both(&cpu_b, &gpu_b, all, 3, "ForkKV decode", &decode, cpu, gpu, true);
    assert_within_tolerance("ForkKV decode (planner and coder forked, base beside)", &decode);

    free(cpu);
    free(gpu);
    free(prompt);
    backend_destroy(&cpu_b);
    backend_destroy(&gpu_b);
}

static void test_refusals(void **state) {
    (void)state;
    Backend gpu_b;
    make_backend(&gpu_b, BACKEND_CUDA, 0);
    Seq s;
    seq_init(&s, "forked", context.ids, context.n, PLANNER, 1);
    seq_fork(&s, 21);
    Seq *one[] = {&s};
    float *logits = alloc_logits(1);
    BraidError err;
    assert_int_equal(run_step(&gpu_b, one, 1, logits, &err), -1);
    fprintf(stderr, "refused: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "residual pool"));
    s.forked = false;
    s.adapter = lora.n + 1;
    assert_int_equal(run_step(&gpu_b, one, 1, logits, &err), -1);
    fprintf(stderr, "refused: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "adapter id"));
    /* The backend still serves after refusing. */
    s.adapter = PLANNER;
    if (run_step(&gpu_b, one, 1, logits, &err)) fail_msg("%s", err.msg);
    free(logits);
    backend_destroy(&gpu_b);
}

int main(void) {
    if (!backend_cuda_available()) {
        fprintf(stderr, "no CUDA backend or GPU here: skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_separate_mixed_batch),
        cmocka_unit_test(test_shared_fork),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
