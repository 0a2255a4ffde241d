/*
 * bench_cpu — CPU microbenchmark on a real GGUF model, defined like llama-bench so the two compare:
 *   pp: prefill of an N-token prompt into an empty context (tokens/s)
 *   tg: single-stream decode of M tokens one at a time, starting from an empty context (tokens/s)
 *   tg@N: the same decode after an N-token prompt (attention over a longer context)
 * Prints one JSON line per repeat to stdout (bench/run_cpu_bench.sh collects them).
 *   bench_cpu --model PATH [--prompt-tokens 512] [--decode-tokens 128] [--threads 2] [--repeats 3]
 *             [--cpu-matmul fp32|int8]   (default: the engine's default arithmetic)
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli_common.h"
#include "common/timeutil.h"
#include "model/model.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

int main(int argc, char **argv) {
    const char *model_path = NULL;
    long prompt_tokens = 512, decode_tokens = 128, threads = 2, repeats = 3;
    CpuMatmulMath math = CPU_MATMUL_DEFAULT;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"prompt-tokens", required_argument, 0, 'p'},
                                         {"decode-tokens", required_argument, 0, 'n'}, {"threads", required_argument, 0, 't'},
                                         {"repeats", required_argument, 0, 'r'}, {"cpu-matmul", required_argument, 0, 'a'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:p:n:t:r:a:", opts, NULL)) != -1) {
        if (c == 'm') model_path = optarg;
        else if (c == 'p' && cli_parse_int("--prompt-tokens", optarg, 1, 1 << 16, &prompt_tokens) == 0) continue;
        else if (c == 'n' && cli_parse_int("--decode-tokens", optarg, 1, 1 << 16, &decode_tokens) == 0) continue;
        else if (c == 't' && cli_parse_int("--threads", optarg, 1, 1024, &threads) == 0) continue;
        else if (c == 'r' && cli_parse_int("--repeats", optarg, 1, 100, &repeats) == 0) continue;
        else if (c == 'a' && cpu_matmul_math_parse(optarg, &math) == 0) continue;
        else {
            fprintf(stderr, "usage: bench_cpu --model PATH [--prompt-tokens N] [--decode-tokens N] [--threads N] [--repeats N] "
                            "[--cpu-matmul fp32|int8]\n");
            return 2;
        }
    }
    cli_set_threads((int)threads);
    BraidModel model;
    BraidError err;
    if (braid_model_load(cli_model_path(model_path), &model, &err)) {
        fprintf(stderr, "bench_cpu: %s\n", err.msg);
        return 1;
    }
    const ModelConfig *cfg = &model.weights.cfg;
    int32_t *tokens = malloc((size_t)prompt_tokens * sizeof *tokens);
    float *logits = malloc((size_t)cfg->vocab_size * sizeof *logits);
    SequenceRunner runner;
    if (!tokens || !logits || sequence_runner_init_math(&runner, &model.weights, (int)(prompt_tokens + decode_tokens), BACKEND_CPU, math, &err)) {
        fprintf(stderr, "bench_cpu: %s\n", tokens && logits ? err.msg : "out of memory");
        return 1;
    }
    /* A deterministic pseudo-random prompt of ordinary (non-special) tokens. */
    uint64_t x = 42;
    for (long i = 0; i < prompt_tokens; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)(100 + (x >> 33) % (uint64_t)(cfg->vocab_size - 100));
    }
    for (long r = 0; r < repeats; r++) {
        double pp = 0, tg = 0, tg_ctx = 0;
        int32_t next = tokens[0];
        /* pp: prefill only */
        sequence_runner_reset(&runner);
        double t0 = braid_now_seconds();
        if (sequence_runner_eval(&runner, tokens, (int)prompt_tokens, false, logits, &err)) break;
        pp = prompt_tokens / (braid_now_seconds() - t0);
        /* tg@N: decode after the prompt */
        t0 = braid_now_seconds();
        for (long i = 0; i < decode_tokens; i++) {
            next = sampler_argmax(logits, cfg->vocab_size);
            if (sequence_runner_eval(&runner, &next, 1, false, logits, &err)) break;
        }
        tg_ctx = decode_tokens / (braid_now_seconds() - t0);
        /* tg: decode from an empty context */
        sequence_runner_reset(&runner);
        next = tokens[0];
        t0 = braid_now_seconds();
        for (long i = 0; i < decode_tokens; i++) {
            if (sequence_runner_eval(&runner, &next, 1, false, logits, &err)) break;
            next = sampler_argmax(logits, cfg->vocab_size);
        }
        tg = decode_tokens / (braid_now_seconds() - t0);
        printf("{\"engine\":\"braid\",\"math\":\"%s\",\"threads\":%ld,\"pp_tokens\":%ld,\"pp_tok_s\":%.2f,\"tg_tokens\":%ld,\"tg_tok_s\":%.2f,"
               "\"tg_after_pp_tok_s\":%.2f}\n",
               math == CPU_MATMUL_INT8 ? "int8" : "fp32", threads, prompt_tokens, pp, decode_tokens, tg, tg_ctx);
        fflush(stdout);
    }
    sequence_runner_free(&runner);
    free(tokens);
    free(logits);
    braid_model_free(&model);
    return 0;
}
