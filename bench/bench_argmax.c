/*
 * bench_argmax — the greedy (top-1) token Braid predicts at every position of given token
 * sequences, for measuring top-1 agreement with a reference (bench/golden_agreement.py).
 * Each input line is one sequence: `n_prompt n_total id_0 … id_{n_total−1}`. The first n_prompt
 * tokens go through one prefill with logits for every position; the rest are decoded one token
 * at a time (teacher-forced), as a serving engine decodes them. Each output line holds the
 * n_total argmax ids of the corresponding input line, position by position.
 *   bench_argmax [--model PATH] [--cpu-matmul fp32|int8] [--threads N] < sequences.txt
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli_common.h"
#include "model/model.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

#define MAX_TOKENS 8192

/* Reads one `n_prompt n_total ids…` line into tokens; returns n_total, 0 at the end, -1 when malformed. */
static int read_sequence(FILE *in, int32_t *tokens, int *n_prompt) {
    int n_total;
    int got = fscanf(in, "%d %d", n_prompt, &n_total);
    if (got == EOF) return 0;
    if (got != 2 || *n_prompt < 1 || n_total < *n_prompt || n_total > MAX_TOKENS) return -1;
    for (int i = 0; i < n_total; i++)
        if (fscanf(in, "%d", &tokens[i]) != 1) return -1;
    return n_total;
}

/* Writes the argmax of every position of tokens[0..n_total) (prefill of n_prompt, then decode steps). */
static int predict_sequence(SequenceRunner *runner, const int32_t *tokens, int n_prompt, int n_total, int vocab, BraidError *err) {
    float *logits = malloc((size_t)n_prompt * vocab * sizeof *logits);
    if (!logits) return braid_error_set(err, "out of memory for %d logit rows", n_prompt);
    int rc = 0;
    sequence_runner_reset(runner);
    if (sequence_runner_eval(runner, tokens, n_prompt, true, logits, err)) rc = -1;
    for (int p = 0; rc == 0 && p < n_prompt; p++) printf("%s%d", p ? " " : "", sampler_argmax(logits + (size_t)p * vocab, vocab));
    for (int p = n_prompt; rc == 0 && p < n_total; p++) {
        if (sequence_runner_eval(runner, &tokens[p], 1, false, logits, err)) rc = -1;
        else printf(" %d", sampler_argmax(logits, vocab));
    }
    printf("\n");
    free(logits);
    return rc;
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    long threads = 2;
    CpuMatmulMath math = CPU_MATMUL_DEFAULT;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"cpu-matmul", required_argument, 0, 'a'},
                                         {"threads", required_argument, 0, 't'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:a:t:", opts, NULL)) != -1) {
        if (c == 'm') model_path = optarg;
        else if (c == 'a' && cpu_matmul_math_parse(optarg, &math) == 0) continue;
        else if (c == 't' && cli_parse_int("--threads", optarg, 1, 1024, &threads) == 0) continue;
        else {
            fprintf(stderr, "usage: bench_argmax [--model PATH] [--cpu-matmul fp32|int8] [--threads N] < sequences\n");
            return 2;
        }
    }
    cli_set_threads((int)threads);
    BraidModel model;
    BraidError err;
    if (braid_model_load(cli_model_path(model_path), &model, &err)) {
        fprintf(stderr, "bench_argmax: %s\n", err.msg);
        return 1;
    }
    int vocab = model.weights.cfg.vocab_size, rc = 0;
    int32_t *tokens = malloc(MAX_TOKENS * sizeof *tokens);
    SequenceRunner runner;
    if (!tokens || sequence_runner_init_math(&runner, &model.weights, MAX_TOKENS, BACKEND_CPU, math, &err)) {
        fprintf(stderr, "bench_argmax: %s\n", tokens ? err.msg : "out of memory");
        return 1;
    }
    for (int line = 1;; line++) {
        int n_prompt, n_total = read_sequence(stdin, tokens, &n_prompt);
        if (n_total == 0) break;
        if (n_total < 0) {
            fprintf(stderr, "bench_argmax: input line %d: expected `n_prompt n_total ids…` with at most %d tokens\n", line, MAX_TOKENS);
            rc = 1;
            break;
        }
        if (predict_sequence(&runner, tokens, n_prompt, n_total, vocab, &err)) {
            fprintf(stderr, "bench_argmax: input line %d: %s\n", line, err.msg);
            rc = 1;
            break;
        }
    }
    sequence_runner_free(&runner);
    free(tokens);
    braid_model_free(&model);
    return rc;
}
