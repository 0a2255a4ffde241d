/* braid generate — one completion on the CPU, streamed to stdout; statistics on stderr. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "common/timeutil.h"
#include "model/model.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

static const char generate_usage[] =
    "usage: braid generate [options] --prompt TEXT\n"
    "  --model PATH        GGUF file (default: $BRAID_MODEL or " BRAID_DEFAULT_MODEL ")\n"
    "                      or synthetic:NAME[:TOKENIZER.gguf] (llama3-8b, llama3-1b, smollm2-135m): that\n"
    "                      shape with generated weights and the default model's tokenizer (benchmarks)\n"
    "  --prompt TEXT       the prompt; '-' reads it from stdin\n"
    "  --chat              wrap the prompt as one user message in the model's chat template\n"
    "  --system TEXT       with --chat: a system message (default: the template's own, if any)\n"
    "  --chat-template FILE  with --chat: a Jinja chat template instead of the model's own\n"
    "  --max-tokens N      most tokens to generate (default 128)\n"
    "  --temperature T     0 = greedy (default 0)\n"
    "  --top-p P           nucleus sampling mass in (0, 1] (default 1 = off)\n"
    "  --top-k K           keep the K most likely tokens, 0 = off (default 0)\n"
    "  --seed S            sampling seed (default 0)\n"
    "  --ignore-eos        keep generating past end-of-turn tokens (for benchmarks)\n"
    "  --threads N         CPU threads (default: all cores)\n"
    "  --device D          cpu, cuda or auto = cuda when this build has it and a GPU is visible (default auto)\n"
    "  --cpu-matmul M      CPU arithmetic: int8 (default; activations rounded to 8 bits per 32 values, as\n"
    "                      llama.cpp does) or fp32 (slower; the closest to the transformers reference)\n"
    "The completion alone goes to stdout; timings go to stderr.\n";

typedef struct {
    const char *model, *prompt, *system, *chat_template;
    BackendKind device;
    CpuMatmulMath cpu_matmul;
    int chat, ignore_eos, threads;
    long max_tokens;
    SamplingParams sampling;
} GenerateArgs;

static int parse_args(int argc, char **argv, GenerateArgs *a) {
    enum { OPT_SYSTEM = 256, OPT_MAX, OPT_TEMP, OPT_TOPP, OPT_TOPK, OPT_SEED, OPT_IGNORE_EOS, OPT_THREADS, OPT_DEVICE, OPT_CPU_MATMUL, OPT_CHAT_TEMPLATE };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'}, {"chat", no_argument, 0, 'c'},
        {"system", required_argument, 0, OPT_SYSTEM}, {"max-tokens", required_argument, 0, OPT_MAX},
        {"temperature", required_argument, 0, OPT_TEMP}, {"top-p", required_argument, 0, OPT_TOPP},
        {"top-k", required_argument, 0, OPT_TOPK}, {"seed", required_argument, 0, OPT_SEED},
        {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS}, {"threads", required_argument, 0, OPT_THREADS},
        {"device", required_argument, 0, OPT_DEVICE}, {"cpu-matmul", required_argument, 0, OPT_CPU_MATMUL},
        {"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    a->max_tokens = 128;
    a->sampling = sampling_params_default();
    a->device = backend_cuda_available() ? BACKEND_CUDA : BACKEND_CPU;
    a->cpu_matmul = CPU_MATMUL_DEFAULT;
    int c;
    BraidError err;
    long v;
    double d;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:ch", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'p': a->prompt = optarg; break;
        case 'c': a->chat = 1; break;
        case OPT_SYSTEM: a->system = optarg; break;
        case OPT_CHAT_TEMPLATE: a->chat_template = optarg; break;
        case OPT_MAX: if (cli_parse_int("--max-tokens", optarg, 1, 1 << 20, &a->max_tokens)) return 2; break;
        case OPT_TEMP: if (cli_parse_float("--temperature", optarg, 0, 100, &d)) return 2; a->sampling.temperature = (float)d; break;
        case OPT_TOPP: if (cli_parse_float("--top-p", optarg, 1e-6, 1, &d)) return 2; a->sampling.top_p = (float)d; break;
        case OPT_TOPK: if (cli_parse_int("--top-k", optarg, 0, 1 << 24, &v)) return 2; a->sampling.top_k = (int)v; break;
        case OPT_SEED: if (cli_parse_int("--seed", optarg, 0, __LONG_MAX__, &v)) return 2; a->sampling.seed = (uint64_t)v; break;
        case OPT_IGNORE_EOS: a->ignore_eos = 1; break;
        case OPT_THREADS: if (cli_parse_int("--threads", optarg, 1, 1024, &v)) return 2; a->threads = (int)v; break;
        case OPT_DEVICE:
            if (backend_parse_kind(optarg, &a->device, &err)) {
                fprintf(stderr, "braid generate: --device: %s\n", err.msg);
                return 2;
            }
            break;
        case OPT_CPU_MATMUL:
            if (cpu_matmul_math_parse(optarg, &a->cpu_matmul)) {
                fprintf(stderr, "braid generate: --cpu-matmul expects int8 or fp32, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h': fputs(generate_usage, stdout); return 1;
        default: fputs(generate_usage, stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "braid generate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->prompt) {
        fprintf(stderr, "braid generate: --prompt is required\n%s", generate_usage);
        return 2;
    }
    if (a->system && !a->chat) {
        fprintf(stderr, "braid generate: --system needs --chat\n");
        return 2;
    }
    return 0;
}

/* The prompt as token ids: raw text, or one user message (plus optional system) in the template. */
static int build_prompt(const BraidModel *m, const GenerateArgs *a, const char *text, TokenList *ids, BraidError *err) {
    if (!a->chat) return tokenizer_encode(&m->tokenizer, text, strlen(text), false, m->tokenizer.add_bos, ids, err);
    ChatMessage msgs[2];
    int n = 0;
    if (a->system) msgs[n++] = (ChatMessage){"system", a->system};
    msgs[n++] = (ChatMessage){"user", text};
    char *rendered = chat_template_render(&m->chat, msgs, n, err);
    if (!rendered) return -1;
    int rc = tokenizer_encode(&m->tokenizer, rendered, strlen(rendered), true, m->tokenizer.add_bos, ids, err);
    free(rendered);
    return rc;
}

static int run_generation(const BraidModel *m, const GenerateArgs *a, const TokenList *prompt, BraidError *err) {
    const ModelConfig *cfg = &m->weights.cfg;
    if (prompt->n == 0) return braid_error_set(err, "the prompt is empty after tokenization");
    if (prompt->n >= cfg->context_length)
        return braid_error_set(err, "the prompt has %d tokens; the model's context is %d", prompt->n, cfg->context_length);
    int budget = (int)a->max_tokens;
    if (prompt->n + budget > cfg->context_length) budget = cfg->context_length - prompt->n;
    SequenceRunner runner;
    Sampler sampler;
    float *logits = malloc((size_t)cfg->vocab_size * sizeof *logits);
    if (!logits || sampler_init(&sampler, cfg->vocab_size, a->sampling.seed)) {
        free(logits);
        return braid_error_set(err, "out of memory");
    }
    if (sequence_runner_init_math(&runner, &m->weights, prompt->n + budget, a->device, a->cpu_matmul, err)) {
        free(logits);
        sampler_free(&sampler);
        return -1;
    }
    double t0 = braid_now_seconds();
    int rc = sequence_runner_eval(&runner, prompt->ids, prompt->n, false, logits, err);
    double t1 = braid_now_seconds(), t_first = t1;
    int generated = 0;
    const char *finish = "length";
    char piece[256];
    while (rc == 0 && generated < budget) {
        int32_t next = sampler_sample(&sampler, logits, &a->sampling);
        if (generated == 0) t_first = braid_now_seconds();
        if (!a->ignore_eos && tokenizer_is_stop(&m->tokenizer, next)) {
            finish = "stop";
            break;
        }
        size_t n = tokenizer_token_bytes(&m->tokenizer, next, piece, sizeof piece);
        fwrite(piece, 1, n < sizeof piece ? n : sizeof piece, stdout);
        fflush(stdout);
        generated++;
        if (generated < budget) rc = sequence_runner_eval(&runner, &next, 1, false, logits, err);
    }
    double t2 = braid_now_seconds();
    if (rc == 0) {
        printf("\n");
        fprintf(stderr, "[generate] prompt %d tokens in %.3f s (%.1f tok/s); completion %d tokens in %.3f s (%.1f tok/s); "
                        "finish: %s\n",
                prompt->n, t1 - t0, prompt->n / (t1 - t0), generated, t2 - t_first,
                generated > 1 ? (generated - 1) / (t2 - t_first) : 0.0, finish);
    }
    sequence_runner_free(&runner);
    sampler_free(&sampler);
    free(logits);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    GenerateArgs a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    char *stdin_prompt = NULL;
    const char *text = a.prompt;
    if (strcmp(a.prompt, "-") == 0) {
        size_t len;
        text = stdin_prompt = cli_read_stdin(&len);
        if (!text) {
            fprintf(stderr, "braid generate: cannot read the prompt from stdin\n");
            return 1;
        }
    }
    int threads = cli_set_threads(a.threads);
    BraidModel model;
    BraidError err;
    double t0 = braid_now_seconds();
    if (braid_model_load(cli_model_path(a.model), &model, &err)) {
        fprintf(stderr, "braid generate: %s\n", err.msg);
        free(stdin_prompt);
        return 1;
    }
    if ((a.chat || a.chat_template) && cli_apply_chat_template("generate", &model, a.chat_template, true)) {
        braid_model_free(&model);
        free(stdin_prompt);
        return 1;
    }
    fprintf(stderr, "[generate] loaded %s (%d layers, %.1f MiB) in %.2f s, device %s, %d threads%s\n", model.weights.cfg.name,
            model.weights.cfg.n_layers, (double)model.weights.total_bytes / (1 << 20), braid_now_seconds() - t0,
            backend_kind_name(a.device), threads,
            a.device == BACKEND_CUDA ? "" : a.cpu_matmul == CPU_MATMUL_INT8 ? ", int8 arithmetic" : ", fp32 arithmetic");
    TokenList prompt = {0};
    rc = build_prompt(&model, &a, text, &prompt, &err) || run_generation(&model, &a, &prompt, &err) ? 1 : 0;
    if (rc) fprintf(stderr, "braid generate: %s\n", err.msg);
    free(prompt.ids);
    free(stdin_prompt);
    braid_model_free(&model);
    return rc;
}
