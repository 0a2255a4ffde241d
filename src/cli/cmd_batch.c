/* braid batch — offline serving of a JSONL file of requests through one engine instance. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/api/api_directives.h"
#include "coord/auto_splice.h"
#include "coord/directive_plan.h"
#include "cli/cli_common.h"
#include "cli/cli_span_guard.h"
#include "cli/cli_lora.h"
#include "cli/commands.h"
#include "common/timeutil.h"
#include "model/model.h"
#include "common/log.h"
#include "sim/trace_writer.h"
#include "common/float_b64.h"
#include "cli/batch_chat.h"
#include "grammar/grammar.h"
#include "worker/engine.h"
#include "worker/kv_pool.h"
#include "worker/occupancy_log.h"

static const char batch_usage[] =
    "usage: braid batch --input requests.jsonl --output results.jsonl [options]\n"
    "  --model PATH             GGUF file (default: $BRAID_MODEL or " BRAID_DEFAULT_MODEL ")\n"
    "                           or synthetic:NAME[:TOKENIZER.gguf] (llama3-8b, llama3-1b, smollm2-135m): that\n"
    "                           shape with generated weights and the default model's tokenizer (benchmarks)\n"
    "  --kv-blocks N            KV pool size in blocks (default 512)\n"
    "  --block-size B           tokens per block (default 16)\n"
    "  --max-batch-tokens T     token budget per step, shared by prefill chunks and decodes (default 512)\n"
    "  --max-running N          most sequences in flight (default 64)\n"
    "  --cache radix|off        prefix cache (default radix)\n"
    "  --admit-output off|auto|N\n"
    "                           output-aware admission: admit a request only when the KV pool, once its prompt's\n"
    "                           blocks are held, still has room for the expected rest of the output of every running\n"
    "                           request and its own (min(max_tokens, E) tokens each; auto: E = the mean output of the\n"
    "                           requests finished so far, max_tokens until one has; N: E = N), so decode growth does\n"
    "                           not preempt; off (default): admit on the prompt alone\n"
    CLI_CHAT_TEMPLATE_USAGE
    CLI_CACHE_FLAGS_USAGE
    CLI_SEGMENT_FLAGS_USAGE
    CLI_SPAN_GUARD_USAGE
    "                           (in batch the mode applies to every line without its own \"segment_reuse\")\n"
    CLI_SEGMENT_LSH_USAGE
    "  --prefetch on|off        load host-tier blocks the policy expects the next calls to use into free device\n"
    "                           blocks on pure-decode steps (PBKV's conservative prefetch; never evicts for it;\n"
    "                           default on when the policy can value them: pbkv)\n"
    CLI_PBKV_FLAGS_USAGE
    "  --events PATH            JSONL log of cache decisions: per request hit, load, preempt, cancel; every\n"
    "                           cache event (blocks stored / removed per tier, with the reason and hashes)\n"
    "  --trace-out PATH         write a replayable trace (docs/TRACE_FORMAT.md) for braid sim\n"
    "  --trace-tokens           put each prompt's token ids in the trace too (braid sim --segment-reuse reads them)\n"
    "  --hidden-out PATH        write each request's prefill hidden state (the post-norm hidden state of its\n"
    "                           last prompt token, which PBKV's graph predictor reads) as JSONL {\"id\", \"hidden\"}\n"
    "                           (base64 float32; docs/TRACE_FORMAT.md) for braid train-predictor / braid sim --hidden\n"
    "  --logits-out PATH        write each request's first-token logits (the full vocabulary, base64 float32) as\n"
    "                           JSONL {\"id\", \"logits\"}: drift studies compare runs with and without segment reuse\n"
    CLI_OCCUPANCY_FLAGS_USAGE
    CLI_LORA_FLAGS_USAGE
    "  --threads N              CPU threads (default: all cores)\n"
    "  --device D               cpu, cuda or auto = cuda when built with it and a GPU is visible (default auto)\n"
    "  --no-cuda-graphs         CUDA: launch decode steps directly instead of replaying captured graphs\n"
    "  --cpu-matmul M           CPU arithmetic: int8 (default; integer dot products on activations rounded to\n"
    "                           8 bits per 32 values, as llama.cpp does: several times the batched decode\n"
    "                           throughput of fp32, top-1 agreement with transformers at llama.cpp's level) or\n"
    "                           fp32 (the closest to the transformers reference; the golden tests hold it to 5e-2)\n"
    "Input lines: {\"id\", \"prompt\" | \"messages\", \"max_tokens\", \"temperature\", \"top_p\", \"top_k\", \"seed\",\n"
    "              \"tenant\", \"adapter\" (a --lora NAME), \"workflow_id\", \"agent\", \"segment_reuse\",\n"
    "              \"directives\", \"conversation_id\", \"auto_splice\" (\"amortize\" | \"forget\": a splice planned against\n"
    "              the conversation's earlier lines),\n"
    "              \"response_format\" ({\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}})\n"
    "              or \"grammar\" (a grammar spec: {\"schema\", \"prefix\", \"suffix\", \"min_items\", \"max_items\", \"separator\",\n"
    "              \"trigger\"}; docs/STRUCTURED_OUTPUTS.md)}. Output lines, in input order:\n"
    "{\"id\", \"text\", \"prompt_tokens\", \"completion_tokens\", \"cached_tokens\" (device + host), \"cached_tokens_host\",\n"
    " \"segment_reused_tokens\" (prompt tokens whose K/V came from reused segments), \"ttft_ms\", \"latency_ms\", \"preemptions\", \"finish_reason\"} (+ \"error\" for a rejected request).\n"
    "Summary on stderr: prompt tokens served from the device tier, from the host tier, computed; demotions,\n"
    "load-backs and evictions per tier (counts).\n";

typedef struct {
    const char *model, *input, *output, *events_path, *trace_path, *hidden_path, *logits_path, *occupancy_path, *chat_template;
    double occupancy_interval;
    long kv_blocks, block_size, max_batch_tokens, max_running, threads;
    bool cache, no_graphs, trace_tokens;
    CpuMatmulMath cpu_matmul;
    BackendKind device;
    const EvictPolicy *policy;
    CliHostTier host;
    CliLora lora;
    int prefetch; /* -1: on when the policy has prefetch_value; 0 off; 1 on */
    long prefetch_blocks; /* --prefetch-blocks; 0 = the scheduler's default */
    bool prefetch_copies_thread; /* --prefetch-copies thread: the CPU backend's copy thread (worker/backend.h) */
    double pbkv_gamma;    /* --pbkv-gamma; 0 = the policy's default */
    int pbkv_future;      /* --pbkv-future: 1 on, -1 off, 0 = the policy's default (on) */
    SegmentReuseMode segment_reuse;
    long approx_window;
    bool segment_lsh, segment_lsh_anywhere; /* --segment-lsh on / anywhere */
    double segment_tau_seg, segment_tau_ctx;
    SpanGuardConfig span_guard; /* --segment-probe-tokens, --segment-probe-min-cos, --approx-window-deep */
    int admit_output;     /* --admit-output (sched_admit.h); 0 = off */
} BatchArgs;

static int parse_args(int argc, char **argv, BatchArgs *a) {
    enum { O_MODEL = 256, O_IN, O_OUT, O_BLOCKS, O_BS, O_MBT, O_RUN, O_CACHE, O_POLICY, O_EVENTS, O_THREADS, O_TRACE, O_DEVICE, O_NO_GRAPHS,
           O_CPU_MATMUL, O_LIST_POLICIES, O_HOST_BLOCKS, O_HOST_GIB, O_PREFETCH, O_HIDDEN, O_SEGMENTS, O_WINDOW, O_LOGITS, O_TRACE_TOKENS, O_LORA, O_LORA_CACHE, O_RESIDUAL_BLOCKS,
           O_OCCUPANCY, O_OCCUPANCY_INTERVAL, O_PBKV_GAMMA, O_PBKV_FUTURE, O_PREFETCH_BLOCKS, O_PREFETCH_COPIES, O_CHAT_TEMPLATE,
           O_SEG_LSH, O_TAU_SEG, O_TAU_CTX, O_PROBE_TOKENS, O_PROBE_COS, O_WINDOW_DEEP, O_APPROX_PREFIX, O_PROBE_VALUES, O_MIN_SPAN, O_SPAN_TAIL, O_ADMIT_OUTPUT };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL}, {"input", required_argument, 0, O_IN}, {"output", required_argument, 0, O_OUT},
        {"kv-blocks", required_argument, 0, O_BLOCKS}, {"block-size", required_argument, 0, O_BS},
        {"max-batch-tokens", required_argument, 0, O_MBT}, {"max-running", required_argument, 0, O_RUN},
        {"cache", required_argument, 0, O_CACHE}, {"policy", required_argument, 0, O_POLICY},
        {"events", required_argument, 0, O_EVENTS}, {"threads", required_argument, 0, O_THREADS},
        {"trace-out", required_argument, 0, O_TRACE}, {"device", required_argument, 0, O_DEVICE},
        {"no-cuda-graphs", no_argument, 0, O_NO_GRAPHS}, {"cpu-matmul", required_argument, 0, O_CPU_MATMUL},
        {"list-policies", no_argument, 0, O_LIST_POLICIES}, {"host-kv-blocks", required_argument, 0, O_HOST_BLOCKS},
        {"host-kv-gib", required_argument, 0, O_HOST_GIB}, {"prefetch", required_argument, 0, O_PREFETCH},
        {"hidden-out", required_argument, 0, O_HIDDEN}, {"segment-reuse", required_argument, 0, O_SEGMENTS},
        {"approx-window", required_argument, 0, O_WINDOW}, {"segment-lsh", required_argument, 0, O_SEG_LSH},
        {"segment-tau-seg", required_argument, 0, O_TAU_SEG}, {"segment-tau-ctx", required_argument, 0, O_TAU_CTX}, {"logits-out", required_argument, 0, O_LOGITS},
        {"trace-tokens", no_argument, 0, O_TRACE_TOKENS},
        {"lora", required_argument, 0, O_LORA}, {"lora-cache", required_argument, 0, O_LORA_CACHE},
        {"residual-blocks", required_argument, 0, O_RESIDUAL_BLOCKS},
        {"occupancy-log", required_argument, 0, O_OCCUPANCY}, {"occupancy-interval", required_argument, 0, O_OCCUPANCY_INTERVAL},
        {"pbkv-gamma", required_argument, 0, O_PBKV_GAMMA}, {"prefetch-blocks", required_argument, 0, O_PREFETCH_BLOCKS},
        {"pbkv-future", required_argument, 0, O_PBKV_FUTURE},
        {"prefetch-copies", required_argument, 0, O_PREFETCH_COPIES},
        {"chat-template", required_argument, 0, O_CHAT_TEMPLATE}, {"admit-output", required_argument, 0, O_ADMIT_OUTPUT},
        CLI_SPAN_GUARD_OPTIONS(O_PROBE_TOKENS, O_PROBE_COS, O_WINDOW_DEEP, O_APPROX_PREFIX, O_PROBE_VALUES, O_MIN_SPAN, O_SPAN_TAIL),
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (BatchArgs){.prefetch = -1, .segment_reuse = SEGMENT_REUSE_EXACT, .approx_window = CLI_DEFAULT_APPROX_WINDOW, .kv_blocks = 512, .block_size = 16, .max_batch_tokens = 512, .max_running = 64, .cache = true,
                     .policy = &evict_policy_lru, .device = backend_cuda_available() ? BACKEND_CUDA : BACKEND_CPU,
                     .cpu_matmul = CPU_MATMUL_DEFAULT, .host = CLI_HOST_TIER_DEFAULT, .occupancy_interval = 1.0,
                     .span_guard = cli_span_guard_defaults()};
    int c;
    BraidError err;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: a->model = optarg; break;
        case O_CHAT_TEMPLATE: a->chat_template = optarg; break;
        case O_IN: a->input = optarg; break;
        case O_OUT: a->output = optarg; break;
        case O_EVENTS: a->events_path = optarg; break;
        case O_TRACE: a->trace_path = optarg; break;
        case O_HIDDEN: a->hidden_path = optarg; break;
        case O_LOGITS: a->logits_path = optarg; break;
        case O_TRACE_TOKENS: a->trace_tokens = true; break;
        case O_OCCUPANCY: a->occupancy_path = optarg; break;
        case O_OCCUPANCY_INTERVAL: if (cli_parse_float("--occupancy-interval", optarg, 0.001, 3600, &a->occupancy_interval)) return 2; break;
        case O_BLOCKS: if (cli_parse_int("--kv-blocks", optarg, 2, 1 << 24, &a->kv_blocks)) return 2; break;
        case O_BS: if (cli_parse_int("--block-size", optarg, 1, 1024, &a->block_size)) return 2; break;
        case O_MBT: if (cli_parse_int("--max-batch-tokens", optarg, 1, 1 << 20, &a->max_batch_tokens)) return 2; break;
        case O_RUN: if (cli_parse_int("--max-running", optarg, 1, 1 << 16, &a->max_running)) return 2; break;
        case O_ADMIT_OUTPUT: if (cli_parse_admit_output("batch", optarg, &a->admit_output, true)) return 2; break;
        case O_THREADS: if (cli_parse_int("--threads", optarg, 1, 1024, &a->threads)) return 2; break;
        case O_NO_GRAPHS: a->no_graphs = true; break;
        case O_CPU_MATMUL:
            if (cpu_matmul_math_parse(optarg, &a->cpu_matmul)) {
                fprintf(stderr, "braid batch: --cpu-matmul expects int8 or fp32, got '%s'\n", optarg);
                return 2;
            }
            break;
        case O_DEVICE:
            if (backend_parse_kind(optarg, &a->device, &err)) {
                fprintf(stderr, "braid batch: --device: %s\n", err.msg);
                return 2;
            }
            break;
        case O_CACHE:
            if (strcmp(optarg, "radix") && strcmp(optarg, "off")) {
                fprintf(stderr, "braid batch: --cache expects radix or off, got '%s'\n", optarg);
                return 2;
            }
            a->cache = strcmp(optarg, "radix") == 0;
            break;
        case O_POLICY:
            if (!(a->policy = cli_parse_policy("batch", optarg, true))) return 2;
            break;
        case O_LIST_POLICIES: cli_list_policies(stdout); return 1;
        case O_SEGMENTS: if (cli_parse_segment_reuse("batch", optarg, &a->segment_reuse, true)) return 2; break;
        case O_WINDOW: if (cli_parse_int("--approx-window", optarg, 0, 1 << 20, &a->approx_window)) return 2; break;
        case O_SEG_LSH:
            if (strcmp(optarg, "on") && strcmp(optarg, "off") && strcmp(optarg, "anywhere")) {
                fprintf(stderr, "braid batch: --segment-lsh expects on, anywhere or off, got '%s'\n", optarg);
                return 2;
            }
            a->segment_lsh = strcmp(optarg, "off") != 0;
            a->segment_lsh_anywhere = strcmp(optarg, "anywhere") == 0;
            break;
        case O_TAU_SEG: if (cli_parse_float("--segment-tau-seg", optarg, 0, 1, &a->segment_tau_seg)) return 2; break;
        case O_TAU_CTX: if (cli_parse_float("--segment-tau-ctx", optarg, 0, 1, &a->segment_tau_ctx)) return 2; break;
        case O_PROBE_TOKENS: if (cli_span_guard_parse("segment-probe-tokens", optarg, &a->span_guard)) return 2; break;
        case O_PROBE_COS: if (cli_span_guard_parse("segment-probe-min-cos", optarg, &a->span_guard)) return 2; break;
        case O_WINDOW_DEEP: if (cli_span_guard_parse("approx-window-deep", optarg, &a->span_guard)) return 2; break;
        case O_APPROX_PREFIX: if (cli_span_guard_parse("approx-prefix", optarg, &a->span_guard)) return 2; break;
        case O_PROBE_VALUES: if (cli_span_guard_parse("segment-probe-values", optarg, &a->span_guard)) return 2; break;
        case O_MIN_SPAN: if (cli_span_guard_parse("segment-min-span", optarg, &a->span_guard)) return 2; break;
        case O_SPAN_TAIL: if (cli_span_guard_parse("segment-tail", optarg, &a->span_guard)) return 2; break;
        case O_HOST_BLOCKS: if (cli_parse_host_kv_blocks("batch", optarg, &a->host, true)) return 2; break;
        case O_HOST_GIB: if (cli_parse_host_kv_gib("batch", optarg, &a->host, true)) return 2; break;
        case O_PREFETCH:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "braid batch: --prefetch expects on or off, got '%s'\n", optarg);
                return 2;
            }
            a->prefetch = strcmp(optarg, "on") == 0;
            break;
        case O_PBKV_GAMMA: if (cli_parse_pbkv_gamma("batch", optarg, &a->pbkv_gamma, true)) return 2; break;
        case O_PBKV_FUTURE: if (cli_parse_pbkv_future("batch", optarg, &a->pbkv_future, true)) return 2; break;
        case O_PREFETCH_COPIES:
            if (cli_parse_prefetch_copies("batch", optarg, &a->prefetch_copies_thread, true)) return 2;
            break;
        case O_PREFETCH_BLOCKS: /* auto: S_bw measured (worker/prefetch_budget.h) */
            if (strcmp(optarg, "auto") == 0) a->prefetch_blocks = 0;
            else if (cli_parse_int("--prefetch-blocks", optarg, 1, 65536, &a->prefetch_blocks)) return 2;
            break;
        case O_LORA: if (cli_parse_lora("batch", optarg, &a->lora, true)) return 2; break;
        case O_LORA_CACHE: if (cli_parse_lora_cache("batch", optarg, &a->lora, true)) return 2; break;
        case O_RESIDUAL_BLOCKS: if (cli_parse_residual_blocks("batch", optarg, &a->lora, true)) return 2; break;
        case 'h': fputs(batch_usage, stdout); return 1;
        default: fputs(batch_usage, stderr); return 2;
        }
    }
    if (!a->input || !a->output) {
        fprintf(stderr, "braid batch: --input and --output are required\n%s", batch_usage);
        return 2;
    }
    if (a->prefetch == 1 && !a->policy->prefetch_value) {
        fprintf(stderr, "braid batch: --prefetch on needs a policy that values host-tier blocks (pbkv); %s does not\n", a->policy->name);
        return 2;
    }
    if (a->prefetch < 0) a->prefetch = a->policy->prefetch_value != NULL;
    if (cli_check_pbkv_gamma("batch", a->policy, a->pbkv_gamma, true)) return 2;
    if (cli_check_pbkv_future("batch", a->policy, a->pbkv_future, true)) return 2;
    if (a->prefetch_blocks > 0 && !a->prefetch) {
        fprintf(stderr, "braid batch: --prefetch-blocks caps the prefetch, which is off (policy %s)\n", a->policy->name);
        return 2;
    }
    if (cli_check_lora("batch", &a->lora, true)) return 2;
    return 0;
}

/* Reads an optional numeric field into *out; a wrong type or a value outside [lo, hi] (or not an
 * integer when `integer`) fills r->error naming the field and returns -1. */
static int json_field_number(json_t *obj, const char *key, double lo, double hi, bool integer, double *out, SchedRequest *r) {
    json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    if (!json_is_number(v) || (integer && !json_is_integer(v))) {
        snprintf(r->error, sizeof r->error, "%s must be %s", key, integer ? "an integer" : "a number");
        return -1;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        snprintf(r->error, sizeof r->error, "%s = %g is outside [%g, %g]", key, x, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* Reads one input object into a request; on a bad line fills r->error and returns -1. */
/* A line's "directives", as the server reads them (api_directives.h, directive_plan.h): checked as a
 * whole, resolved against the prompt (ids becomes the prompt the request runs). */
static int load_directives(const BraidModel *m, const json_t *value, bool chat, TokenList *ids, SchedRequest *r) {
    ApiDirective *d = NULL;
    int n = 0;
    ApiError e;
    int rc = api_directives_parse(value, &d, &n, &e);
    if (rc == 0 && n > 0) rc = directive_plan(&m->tokenizer, chat, ids, d, n, NULL, 0, &r->directives, &e);
    api_directives_free(d, n);
    if (rc) snprintf(r->error, sizeof r->error, "%s", e.message);
    return rc;
}

/* A line's "conversation_id" and "auto_splice", as the server reads them (api_directives.h,
 * auto_splice.h): without a splice of the line's own, one planned against its conversation's
 * earlier lines (in file order, the server's arrival order), named one past its directives. */
static int load_auto_splice(json_t *obj, AutoSpliceStore *store, const TokenList *ids, SchedRequest *r) {
    json_t *conv = json_object_get(obj, "conversation_id"), *directives = json_object_get(obj, "directives");
    if (conv && !json_is_string(conv)) return snprintf(r->error, sizeof r->error, "conversation_id must be a string"), -1;
    const char *conversation = conv ? json_string_value(conv) : NULL;
    r->directives.conversation = cache_conversation_scope(conversation);
    ApiError e;
    int mode;
    if (api_auto_splice_parse(json_object_get(obj, "auto_splice"), &mode, &e)) return snprintf(r->error, sizeof r->error, "%s", e.message), -1;
    if (mode <= CACHE_SPLICE_NONE || r->directives.splice_mode != CACHE_SPLICE_NONE) return 0;
    int index = json_is_array(directives) ? (int)json_array_size(directives) : 0;
    int rc = auto_splice_request(store, r->tenant, r->adapter, conversation, r->workflow, ids->ids, ids->n, mode, index, &r->directives);
    if (rc < 0) return snprintf(r->error, sizeof r->error, "out of memory planning auto_splice"), -1;
    return 0;
}

/* A line's structured output: "response_format" (OpenAI's json_object / json_schema / text) or a raw
 * "grammar" spec (grammar/grammar.h; a JSON object or its text), checked here so a bad one is this
 * line's error; the engine compiles it against the vocabulary. */
static int load_grammar(json_t *obj, SchedRequest *r) {
    json_t *rf = json_object_get(obj, "response_format"), *g = json_object_get(obj, "grammar");
    if (!rf && !g) return 0;
    if (rf && g) return snprintf(r->error, sizeof r->error, "give either response_format or grammar, not both"), -1;
    char why[400];
    char *spec = NULL;
    if (g && json_is_string(g)) {
        spec = strdup(json_string_value(g));
    } else if (g && json_is_object(g)) {
        spec = json_dumps(g, JSON_COMPACT);
    } else if (g) {
        return snprintf(r->error, sizeof r->error, "grammar must be a grammar spec object or its JSON text"), -1;
    } else {
        char *text = json_dumps(rf, JSON_COMPACT | JSON_ENCODE_ANY);
        spec = text ? grammar_spec_from_response_format(text, strlen(text), why, sizeof why) : NULL;
        free(text);
        if (!spec) return why[0] ? (snprintf(r->error, sizeof r->error, "%s", why), -1) : 0; /* "text": unconstrained */
    }
    if (!spec) return snprintf(r->error, sizeof r->error, "out of memory"), -1;
    if (grammar_spec_check(spec, strlen(spec), why, sizeof why)) {
        snprintf(r->error, sizeof r->error, "%s: %s", rf ? "response_format" : "grammar", why);
        free(spec);
        return -1;
    }
    r->grammar_spec = spec;
    return 0;
}

static int load_request(const BraidModel *m, json_t *obj, int line, SegmentReuseMode default_segment_mode, SchedRequest *r,
                        BatchChatMode *chat, AutoSpliceStore *auto_store) {
    json_t *id = json_object_get(obj, "id"), *prompt = json_object_get(obj, "prompt"), *messages = json_object_get(obj, "messages");
    char idbuf[64];
    if (json_is_string(id)) r->id = strdup(json_string_value(id));
    else if (json_is_integer(id)) snprintf(idbuf, sizeof idbuf, "%lld", (long long)json_integer_value(id)), r->id = strdup(idbuf);
    else snprintf(idbuf, sizeof idbuf, "line-%d", line), r->id = strdup(idbuf);
    r->max_tokens = 128;
    r->sampling = sampling_params_default();
    double max_tokens = 128, temperature = 0, top_p = 1, top_k = 0, seed = 0;
    if (json_field_number(obj, "max_tokens", 1, 1 << 20, true, &max_tokens, r) ||
        json_field_number(obj, "temperature", 0, 100, false, &temperature, r) ||
        json_field_number(obj, "top_p", 1e-9, 1, false, &top_p, r) ||
        json_field_number(obj, "top_k", 0, 1 << 24, true, &top_k, r) ||
        json_field_number(obj, "seed", 0, 9007199254740992.0, true, &seed, r))
        return -1;
    r->max_tokens = (int)max_tokens;
    r->sampling = (SamplingParams){.temperature = (float)temperature, .top_p = (float)top_p, .top_k = (int)top_k, .seed = (uint64_t)seed};
    json_t *v = json_object_get(obj, "ignore_eos");
    if (v && !json_is_boolean(v)) return snprintf(r->error, sizeof r->error, "ignore_eos must be true or false"), -1;
    r->ignore_eos = json_is_true(v);
    if (load_grammar(obj, r)) return -1;
    v = json_object_get(obj, "segment_reuse");
    int mode = v ? segment_reuse_parse(json_string_value(v)) : (int)default_segment_mode;
    if (mode < 0) return snprintf(r->error, sizeof r->error, "segment_reuse must be \"off\", \"exact\" or \"approx\""), -1;
    if (mode > (int)default_segment_mode)
        return snprintf(r->error, sizeof r->error, "segment_reuse \"%s\" is above this run's --segment-reuse %s",
                        segment_reuse_name((SegmentReuseMode)mode), segment_reuse_name(default_segment_mode)), -1;
    r->segment_mode = (uint8_t)mode;
    /* The request's identity, as the server's SUBMIT carries it: exact strings, "" or absent = none. */
    static const char *const text_fields[] = {"tenant", "adapter", "workflow_id", "agent"};
    char **targets[] = {&r->tenant, &r->adapter, &r->workflow, &r->agent};
    for (size_t i = 0; i < sizeof text_fields / sizeof text_fields[0]; i++) {
        json_t *t = json_object_get(obj, text_fields[i]);
        if (t && !json_is_string(t)) return snprintf(r->error, sizeof r->error, "%s must be a string", text_fields[i]), -1;
        if (t && json_string_length(t) > 0 && !(*targets[i] = strdup(json_string_value(t))))
            return snprintf(r->error, sizeof r->error, "out of memory"), -1;
    }
    BraidError err;
    TokenList ids = {0};
    int rc;
    if (json_is_string(prompt)) {
        rc = tokenizer_encode(&m->tokenizer, json_string_value(prompt), json_string_length(prompt), false, m->tokenizer.add_bos, &ids, &err);
    } else if (json_is_array(messages) && json_array_size(messages) > 0) {
        /* Chat lines read, render and get their tools' grammar exactly as the HTTP API's requests. */
        if (batch_chat_load(m, obj, &ids, &r->grammar_spec, chat, r->error, sizeof r->error)) return free(ids.ids), -1;
        rc = 0;
    } else {
        return snprintf(r->error, sizeof r->error, "each line needs a \"prompt\" string or a non-empty \"messages\" array"), -1;
    }
    if (rc) return snprintf(r->error, sizeof r->error, "%s", err.msg), -1;
    if (ids.n == 0) return free(ids.ids), snprintf(r->error, sizeof r->error, "the prompt is empty"), -1;
    if (load_directives(m, json_object_get(obj, "directives"), json_is_array(messages) && !json_is_string(prompt), &ids, r))
        return free(ids.ids), -1;
    if (load_auto_splice(obj, auto_store, &ids, r)) return free(ids.ids), -1;
    r->tokens = ids.ids;
    r->n_tokens = r->n_prompt = ids.n;
    r->cap_tokens = ids.cap;
    return 0;
}

static void write_trace_line(FILE *f, const SchedRequest *r, int seq, int block_size, int dim, bool with_tokens) {
    TraceRecord rec = {.seq = seq, .t = 0.0, .id = r->id, .workflow = r->workflow, .agent = r->agent, .tenant = r->tenant,
                       .adapter = r->adapter, .prompt = r->tokens, .prompt_tokens = r->n_prompt,
                       .output_tokens = r->n_tokens > r->n_prompt ? r->n_tokens - r->n_prompt : 0, .block_size = block_size,
                       .hidden = r->hidden, .hidden_dim = r->hidden ? dim : 0, .with_tokens = with_tokens};
    if (trace_write_request(f, &rec)) LOG_WARN("batch", "could not write the trace line of request %s", r->id ? r->id : "");
}

/* One {"id", key: base64 float32} line; nothing when values is NULL. */
static void write_floats_line(FILE *f, const SchedRequest *r, const char *key, const float *values, int n) {
    if (!values) return;
    char *b64 = float_b64_encode(values, n);
    json_t *o = b64 ? json_pack("{s:s, s:s}", "id", r->id ? r->id : "", key, b64) : NULL;
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (!line || fprintf(f, "%s\n", line) < 0) LOG_WARN("batch", "could not write the %s of request %s", key, r->id ? r->id : "");
    free(line);
    json_decref(o);
    free(b64);
}

static void write_result(FILE *out, const BraidModel *m, const SchedRequest *r, const BatchChatMode *chat, int index, double t0) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->id ? r->id : ""));
    int n_out = r->n_tokens > r->n_prompt ? r->n_tokens - r->n_prompt : 0;
    size_t len = 0;
    char *text = n_out ? tokenizer_decode(&m->tokenizer, r->tokens + r->n_prompt, n_out, &len) : strdup("");
    json_object_set_new(o, "text", json_stringn_nocheck(text ? text : "", text ? len : 0));
    free(text);
    json_object_set_new(o, "prompt_tokens", json_integer(r->n_prompt));
    json_object_set_new(o, "completion_tokens", json_integer(n_out));
    json_object_set_new(o, "cached_tokens", json_integer(r->cached_tokens > 0 ? r->cached_tokens : 0));
    json_object_set_new(o, "cached_tokens_host", json_integer(r->cached_tokens > 0 && r->cached_tokens_host > 0 ? r->cached_tokens_host : 0));
    json_object_set_new(o, "segment_reused_tokens", json_integer(r->reused_tokens > 0 ? r->reused_tokens : 0));
    json_object_set_new(o, "shared_prefix_tokens", json_integer(r->shared_tokens > 0 ? r->shared_tokens : 0));
    json_object_set_new(o, "ttft_ms", json_real(r->t_first_token > 0 ? (r->t_first_token - t0) * 1e3 : 0));
    json_object_set_new(o, "latency_ms", json_real(r->t_finish > 0 ? (r->t_finish - t0) * 1e3 : 0));
    json_object_set_new(o, "preemptions", json_integer(r->preemptions));
    json_object_set_new(o, "finish_reason", json_string(r->finish_reason ? r->finish_reason : "error"));
    if (r->error[0]) json_object_set_new(o, "error", json_string(r->error));
    if (r->directive_outcomes) json_object_set_new(o, "directive_outcomes", json_loads(r->directive_outcomes, 0, NULL));
    if (!r->error[0]) batch_chat_finish(chat, o, json_string_value(json_object_get(o, "text")), json_string_length(json_object_get(o, "text")),
                                        (uint64_t)index);
    char *line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    fprintf(out, "%s\n", line);
    free(line);
    json_decref(o);
}

static int read_requests(const BraidModel *m, const char *path, SegmentReuseMode segment_mode, SchedRequest **out, BatchChatMode **chats_out,
                         int *n_out) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "braid batch: cannot open %s\n", path);
        return -1;
    }
    SchedRequest *reqs = NULL;
    BatchChatMode *chats = NULL;
    int n = 0, cap = 0, line_no = 0;
    /* auto_splice's recent prompts per conversation, while the lines are read. */
    AutoSpliceStore *auto_store = auto_splice_store_create(4096, 1 << 20);
    if (!auto_store) {
        fprintf(stderr, "braid batch: out of memory reading %s\n", path);
        fclose(f);
        return -1;
    }
    char *line = NULL;
    size_t line_cap = 0;
    while (getline(&line, &line_cap, f) > 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        if (n == cap) {
            SchedRequest *grown = realloc(reqs, (size_t)(cap ? cap * 2 : 64) * sizeof *reqs);
            if (grown) reqs = grown;
            BatchChatMode *grown_chats = grown ? realloc(chats, (size_t)(cap ? cap * 2 : 64) * sizeof *chats) : NULL;
            if (grown_chats) chats = grown_chats;
            if (!grown || !grown_chats) {
                fprintf(stderr, "braid batch: out of memory reading %s at line %d\n", path, line_no);
                for (int i = 0; i < n; i++) sched_request_free(&reqs[i]);
                free(reqs);
                free(chats);
                free(line);
                fclose(f);
                auto_splice_store_free(auto_store);
                return -1;
            }
            cap = cap ? cap * 2 : 64;
        }
        SchedRequest *r = &reqs[n];
        memset(r, 0, sizeof *r);
        memset(&chats[n], 0, sizeof chats[n]);
        json_error_t jerr;
        json_t *obj = json_loads(line, 0, &jerr);
        n++;
        if (!json_is_object(obj)) {
            char idbuf[32];
            snprintf(idbuf, sizeof idbuf, "line-%d", line_no);
            r->id = strdup(idbuf);
            snprintf(r->error, sizeof r->error, "line %d is not a JSON object: %s", line_no, obj ? "wrong type" : jerr.text);
        } else {
            load_request(m, obj, line_no, segment_mode, r, &chats[n - 1], auto_store);
        }
        if (r->error[0]) {
            r->state = REQ_FINISHED;
            r->finish_reason = "error";
        }
        json_decref(obj);
    }
    free(line);
    fclose(f);
    auto_splice_store_free(auto_store);
    *out = reqs;
    *chats_out = chats;
    *n_out = n;
    return 0;
}

/* Counts, never ratios: prompt tokens at first admission split into device hits, host hits and
 * computed; the cache's block moves per tier. */
static void print_summary(const Engine *e, const SchedRequest *reqs, int n, double elapsed) {
    const SchedCounters *c = &e->sched.counters;
    const KvCacheCounters *k = &e->sched.cache.counters;
    int done = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i].error[0]) failed++;
        else done++;
    }
    unsigned long long device = c->cached_prompt_tokens_device, host = c->cached_prompt_tokens_host,
                       computed = c->computed_prompt_tokens, reused = c->segment_reused_prompt_tokens;
    fprintf(stderr,
            "[batch] %d requests (%d completed, %d rejected) in %.2f s: %.1f generated tok/s, %.1f req/s\n"
            "[batch] prompt tokens %llu: device hits %llu, host hits %llu, segment-reused %llu, computed %llu "
            "(segment reuse %s: %llu candidates, %llu exact, %llu approx, %llu rejected; %.3g prefill FLOPs saved)\n"
            "[batch] KV blocks: demotions %llu, load-backs %llu, device evictions %llu, host evictions %llu, dropped %llu; "
            "preemptions %llu, peak pool use %d of %d blocks, %llu steps (%llu pure decode); "
            "prefetched %llu, used %llu, wasted %llu (in %llu steps)\n",
            n, done, failed, elapsed, e->generated_tokens / elapsed, done / elapsed, device + host + reused + computed, device, host,
            reused, computed, segment_reuse_name(e->cfg.segment_reuse), (unsigned long long)k->segment_candidates,
            (unsigned long long)k->segments_exact, (unsigned long long)k->segments_approx,
            (unsigned long long)(k->segments_rejected_context + k->segments_rejected_window), c->segment_flops_saved,
            (unsigned long long)k->demoted_blocks, (unsigned long long)k->loaded_blocks,
            (unsigned long long)k->device_evicted_blocks, (unsigned long long)k->host_evicted_blocks,
            (unsigned long long)k->dropped_blocks, (unsigned long long)c->preemptions, c->peak_in_use,
            kv_cache_total(&e->sched.cache, CACHE_TIER_DEVICE), (unsigned long long)c->steps, (unsigned long long)c->pure_decode_steps,
            (unsigned long long)k->prefetched_blocks, (unsigned long long)k->prefetch_hit_blocks,
            (unsigned long long)k->prefetch_wasted_blocks, (unsigned long long)c->prefetch_steps);
    if (e->cfg.segment_lsh)
        fprintf(stderr, "[batch] near-duplicate segments (LSH): %llu chunks with candidates, %llu admitted, %llu rejected, %llu tokens reused\n",
                (unsigned long long)k->segment_lsh_candidates, (unsigned long long)k->segment_lsh_admitted,
                (unsigned long long)(k->segment_lsh_rejected_tau + k->segment_lsh_rejected_guard),
                (unsigned long long)k->segment_lsh_reused_tokens);
    const SpanGuardCounters *g = &e->sched.guard_counters;
    if (g->probes_ok + g->probes_rejected > 0 || g->head_tokens > 0)
        fprintf(stderr, "[batch] span guards: %llu probes admitted, %llu rejected, %llu head tokens and %llu rejected tokens "
                        "recomputed, %.1f ms of probe K/V reads\n",
                (unsigned long long)g->probes_ok, (unsigned long long)g->probes_rejected, (unsigned long long)g->head_tokens,
                (unsigned long long)g->rejected_tokens, e->probe_read_seconds * 1e3);
    if (e->constrained_tokens > 0)
        fprintf(stderr, "[batch] structured outputs: %llu constrained tokens, %.1f ms of grammar work on the host (%.1f us per token, %.2f%% of the run)\n",
                (unsigned long long)e->constrained_tokens, e->grammar_seconds * 1e3, e->grammar_seconds * 1e6 / (double)e->constrained_tokens,
                100.0 * e->grammar_seconds / elapsed);
}

typedef struct {
    FILE *out, *events, *trace, *hidden, *logits;
} BatchFiles;

/* Reads the requests, serves them all, writes results (and the trace). Returns the exit status. */
static int serve_batch(const BraidModel *model, const BatchArgs *a, const LoraSet *lora, BatchFiles *files) {
    SchedRequest *reqs = NULL;
    int n = 0, rc = 0;
    long host_blocks = 0;
    char why[512];
    size_t block_bytes = kv_pool_block_bytes(&model->weights.cfg, (int)a->block_size);
    if (cli_host_tier_blocks(&a->host, a->kv_blocks, block_bytes, 1, &host_blocks, why, sizeof why)) {
        fprintf(stderr, "braid batch: %s\n", why);
        return 1;
    }
    if (!a->cache) host_blocks = 0; /* nothing is cached, so nothing is demoted */
    char tier[128];
    cli_describe_host_tier(host_blocks, block_bytes, tier, sizeof tier);
    bool prefetch = a->prefetch && host_blocks > 1;
    fprintf(stderr, "[batch] %s, eviction policy %s, prefetch %s\n", tier, a->policy->name, prefetch ? "on" : "off");
    BatchChatMode *chats = NULL;
    if (read_requests(model, a->input, a->segment_reuse, &reqs, &chats, &n)) return 1;
    Engine engine;
    BraidError err;
    EngineConfig cfg = {.n_blocks = (int)a->kv_blocks, .block_size = (int)a->block_size, .max_batch_tokens = (int)a->max_batch_tokens,
                        .max_running = (int)a->max_running, .host_blocks = (int)host_blocks, .cache_enabled = a->cache,
                        .policy = a->policy, .policy_options = {.gamma = a->pbkv_gamma, .future = a->pbkv_future}, .prefetch = prefetch,
                        .prefetch_max_blocks = (int)a->prefetch_blocks, .sync_copies = !a->prefetch_copies_thread, .device = a->device, .cuda_graphs_off = a->no_graphs,
                        .cpu_matmul_fp32 = a->cpu_matmul == CPU_MATMUL_FP32, .segment_reuse = a->segment_reuse,
                        .approx_window = (int)a->approx_window, .span_guard = a->span_guard, .segment_lsh = a->segment_lsh,
                        .segment_lsh_anywhere = a->segment_lsh_anywhere, .segment_tau_seg = a->segment_tau_seg,
                        .segment_tau_ctx = a->segment_tau_ctx, .lora = lora, .lora_shared = a->lora.shared, .lora_auto = a->lora.auto_mode,
                        .residual_blocks = cli_residual_blocks(&a->lora, a->kv_blocks), .admit_output = a->admit_output};
    if (a->lora.shared)
        fprintf(stderr, "[batch] LoRA cache %s (ForkKV): %d residual blocks at rank %d\n", a->lora.auto_mode ? "auto" : "shared",
                cfg.residual_blocks, lora_set_max_rank(lora));
    if (engine_init(&engine, model, &cfg, &err)) {
        fprintf(stderr, "braid batch: %s\n", err.msg);
        rc = 1;
        goto done;
    }
    engine.sched.events = files->events;
    OccupancyLog occupancy = {.fd = -1};
    if (a->occupancy_path && occupancy_log_open(&occupancy, a->occupancy_path, true, 0, a->occupancy_interval, &engine.sched.cache, &err)) {
        fprintf(stderr, "braid batch: %s\n", err.msg);
        engine_free(&engine);
        rc = 1;
        goto done;
    }
    double t0 = braid_now_seconds();
    for (int i = 0; i < n; i++) {
        reqs[i].want_hidden = files->hidden != NULL;
        reqs[i].want_first_logits = files->logits != NULL;
        if (!reqs[i].error[0]) engine_submit(&engine, &reqs[i]);
    }
    while (!sched_idle(&engine.sched)) {
        if (engine_step(&engine, &err) < 0) {
            fprintf(stderr, "braid batch: %s\n", err.msg);
            rc = 1;
            break;
        }
        occupancy_log_sample(&occupancy, &engine.sched.cache);
    }
    occupancy_log_close(&occupancy, &engine.sched.cache);
    double elapsed = braid_now_seconds() - t0;
    for (int i = 0; i < n; i++) write_result(files->out, model, &reqs[i], &chats[i], i, t0);
    for (int i = 0; files->trace && i < n; i++)
        if (!reqs[i].error[0]) write_trace_line(files->trace, &reqs[i], i, (int)a->block_size, model->weights.cfg.dim, a->trace_tokens);
    for (int i = 0; files->hidden && i < n; i++) write_floats_line(files->hidden, &reqs[i], "hidden", reqs[i].hidden, model->weights.cfg.dim);
    for (int i = 0; files->logits && i < n; i++)
        write_floats_line(files->logits, &reqs[i], "logits", reqs[i].first_logits, model->weights.cfg.vocab_size);
    print_summary(&engine, reqs, n, elapsed > 0 ? elapsed : 1e-9);
    engine_free(&engine);
done:
    for (int i = 0; i < n; i++) sched_request_free(&reqs[i]);
    free(reqs);
    free(chats);
    return rc;
}

static int close_file(FILE *f, const char *path) {
    if (!f || fclose(f) == 0) return 0;
    fprintf(stderr, "braid batch: error writing %s\n", path);
    return 1;
}

int cmd_batch(int argc, char **argv) {
    BatchArgs a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    cli_set_threads((int)a.threads);
    /* Outputs are opened before any work, so an unwritable path fails fast instead of after the run. */
    BatchFiles files = {0};
    const char *bad = NULL;
    if (!(files.out = fopen(a.output, "w"))) bad = a.output;
    else if (a.events_path && !(files.events = fopen(a.events_path, "w"))) bad = a.events_path;
    else if (a.trace_path && !(files.trace = fopen(a.trace_path, "w"))) bad = a.trace_path;
    else if (a.hidden_path && !(files.hidden = fopen(a.hidden_path, "w"))) bad = a.hidden_path;
    else if (a.logits_path && !(files.logits = fopen(a.logits_path, "w"))) bad = a.logits_path;
    BraidModel model;
    BraidError err;
    if (bad) {
        fprintf(stderr, "braid batch: cannot write %s\n", bad);
        rc = 1;
    } else if (braid_model_load(cli_model_path(a.model), &model, &err)) {
        fprintf(stderr, "braid batch: %s\n", err.msg);
        rc = 1;
    } else if (cli_apply_chat_template("batch", &model, a.chat_template, true)) {
        braid_model_free(&model);
        rc = 1;
    } else {
        LoraSet lora;
        rc = cli_load_lora("batch", &a.lora, &model.weights.cfg, &lora, true) ? 1 : serve_batch(&model, &a, &lora, &files);
        lora_set_free(&lora);
        braid_model_free(&model);
    }
    rc |= close_file(files.out, a.output) | close_file(files.events, a.events_path) | close_file(files.trace, a.trace_path) |
          close_file(files.hidden, a.hidden_path) | close_file(files.logits, a.logits_path);
    return rc;
}
