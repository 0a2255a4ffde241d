/*
 * braid manifest export — write a Leyline cache manifest (manifest_line.h) of hot chunks:
 * from a running server (GET /v1/cache/manifest) or offline from traces that carry token ids
 * (braid-bench gen --trace-tokens, braid batch --trace-out --trace-tokens), chunked and counted by
 * the coordinator's own recorder (manifest_recorder.h) with the model's tokenizer and seed.
 */
#include <curl/curl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "coord/manifest_recorder.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "sim/trace.h"
#include "worker/engine.h"

static const char manifest_usage[] =
    "usage: braid manifest export --url http://HOST:PORT --out m.jsonl [--min-count N] [--api-key K] [--tenant T]\n"
    "       braid manifest export --trace t.jsonl [--trace t2.jsonl ...] [--model M] --out m.jsonl [--min-count N]\n"
    "Writes a manifest of hot chunks, one JSON line each, most counted first:\n"
    "  {\"content_hash\", \"chunk_tokens\", \"count\", \"tenant\", \"position\", \"prev_hash\"[, \"adapter\"]}\n"
    "which braid serve --warm-start prefills at start-up.\n"
    "  --url URL          a running braid serve (its GET /v1/cache/manifest; a trailing /v1 is fine)\n"
    "  --api-key K        sent as 'Authorization: Bearer K' (a server with --api-keys needs one; a key gets only\n"
    "                     its own tenant's chunks)\n"
    "  --tenant T         only tenant T's chunks (servers without API keys)\n"
    "  --trace PATH       offline: a trace whose request lines carry \"tokens\" (braid-bench gen --trace-tokens,\n"
    "                     braid batch --trace-out --trace-tokens); repeat for several. Each prompt is chunked and\n"
    "                     counted in its tenant's and adapter's namespace as the server's recorder would\n"
    "  --model PATH       offline: the GGUF whose tokenizer (chunk anchors) and shape (hash seed) the manifest is\n"
    "                     for (default: $BRAID_MODEL or " BRAID_DEFAULT_MODEL ")\n"
    "  --capacity N       offline: chunks counted at most (default 16384; the least counted is forgotten first)\n"
    "  --min-count N      only chunks seen at least N times (default 1)\n"
    "  --out PATH         the manifest to write (required)\n";

typedef struct {
    const char *url, *api_key, *tenant, *model, *out;
    const char **traces;
    int n_traces;
    long min_count, capacity;
} ManifestArgs;

static int parse_args(int argc, char **argv, ManifestArgs *a) {
    enum { O_URL = 256, O_KEY, O_TENANT, O_TRACE, O_MODEL, O_CAPACITY, O_MIN_COUNT, O_OUT };
    static const struct option opts[] = {
        {"url", required_argument, 0, O_URL}, {"api-key", required_argument, 0, O_KEY}, {"tenant", required_argument, 0, O_TENANT},
        {"trace", required_argument, 0, O_TRACE}, {"model", required_argument, 0, O_MODEL},
        {"capacity", required_argument, 0, O_CAPACITY}, {"min-count", required_argument, 0, O_MIN_COUNT},
        {"out", required_argument, 0, O_OUT}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (ManifestArgs){.min_count = 1, .capacity = MANIFEST_RECORDER_DEFAULT_CAPACITY};
    if (!(a->traces = calloc((size_t)argc + 1, sizeof *a->traces))) return fprintf(stderr, "braid manifest: out of memory\n"), 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_URL: a->url = optarg; break;
        case O_KEY: a->api_key = optarg; break;
        case O_TENANT: a->tenant = optarg; break;
        case O_TRACE: a->traces[a->n_traces++] = optarg; break;
        case O_MODEL: a->model = optarg; break;
        case O_OUT: a->out = optarg; break;
        case O_CAPACITY: if (cli_parse_int("--capacity", optarg, 1, 1 << 26, &a->capacity)) return 2; break;
        case O_MIN_COUNT: if (cli_parse_int("--min-count", optarg, 1, 1L << 40, &a->min_count)) return 2; break;
        case 'h': fputs(manifest_usage, stdout); return -1;
        default: fputs(manifest_usage, stderr); return 2;
        }
    }
    const char *problem = optind < argc                ? "unexpected argument"
                          : !a->out                    ? "--out is required"
                          : !a->url == !a->n_traces    ? "give either --url or --trace"
                          : a->url && a->model         ? "--model is for --trace (the server knows its model)"
                          : a->n_traces && a->api_key  ? "--api-key is for --url"
                                                       : NULL;
    if (problem) {
        fprintf(stderr, "braid manifest export: %s%s%s\n%s", problem, optind < argc ? " " : "", optind < argc ? argv[optind] : "",
                manifest_usage);
        return 2;
    }
    return 0;
}

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f)) ok = false;
    if (!ok) fprintf(stderr, "braid manifest export: cannot write %s\n", path);
    return ok ? 0 : 1;
}

static int count_lines(const char *text) {
    int n = 0;
    for (const char *p = text; *p; p++) n += *p == '\n';
    return n;
}

/* ---- from a server ---- */

typedef struct {
    char *data;
    size_t len;
    bool oom;
} Body;

static size_t collect(char *chunk, size_t size, size_t n, void *ctx) {
    Body *b = ctx;
    size_t add = size * n;
    char *grown = realloc(b->data, b->len + add + 1);
    if (!grown) return b->oom = true, 0;
    memcpy(grown + b->len, chunk, add);
    b->data = grown;
    b->len += add;
    b->data[b->len] = '\0';
    return add;
}

/* base (a trailing "/" or "/v1" dropped) + the endpoint and its query. */
static char *manifest_url(CURL *curl, const ManifestArgs *a) {
    size_t n = strlen(a->url);
    while (n > 0 && a->url[n - 1] == '/') n--;
    if (n >= 3 && strncmp(a->url + n - 3, "/v1", 3) == 0) n -= 3;
    char *tenant = a->tenant ? curl_easy_escape(curl, a->tenant, 0) : NULL;
    size_t cap = n + 128 + (tenant ? strlen(tenant) : 0);
    char *url = malloc(cap);
    if (url) snprintf(url, cap, "%.*s/v1/cache/manifest?min_count=%ld%s%s", (int)n, a->url, a->min_count, tenant ? "&tenant=" : "", tenant ? tenant : "");
    curl_free(tenant);
    return url;
}

static int export_from_server(const ManifestArgs *a) {
    CURL *curl = curl_easy_init();
    char *url = curl ? manifest_url(curl, a) : NULL, auth[512];
    struct curl_slist *headers = NULL;
    Body body = {0};
    if (!url) {
        fprintf(stderr, "braid manifest export: cannot set up the HTTP client\n");
        curl_easy_cleanup(curl);
        return 1;
    }
    if (a->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", a->api_key);
        headers = curl_slist_append(headers, auth);
    }
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 60L);
    CURLcode cc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    int rc = 1;
    if (cc != CURLE_OK) fprintf(stderr, "braid manifest export: GET %s: %s\n", url, body.oom ? "out of memory" : curl_easy_strerror(cc));
    else if (status != 200) fprintf(stderr, "braid manifest export: GET %s: HTTP %ld: %s\n", url, status, body.data ? body.data : "");
    else if ((rc = write_file(a->out, body.data ? body.data : "")) == 0)
        fprintf(stderr, "braid manifest export: %d chunks (count >= %ld) written to %s\n", count_lines(body.data ? body.data : ""),
                a->min_count, a->out);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    free(url);
    free(body.data);
    return rc;
}

/* ---- from traces ---- */

/* Feeds every request with token ids to the recorder; counts those without. */
static int observe_trace(ManifestRecorder *r, const char *path, int *with_tokens, int *without) {
    Trace trace;
    BraidError err;
    if (trace_load(path, &trace, &err)) return fprintf(stderr, "braid manifest export: %s\n", err.msg), 1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < trace.n; i++) {
        const TraceRequest *q = &trace.reqs[i];
        if (!q->tokens) {
            (*without)++;
            continue;
        }
        (*with_tokens)++;
        if (manifest_recorder_observe(r, q->tenant, q->adapter, q->tokens, q->prompt_tokens)) {
            fprintf(stderr, "braid manifest export: out of memory counting %s\n", path);
            rc = 1;
        }
    }
    trace_free(&trace);
    return rc;
}

static int export_from_traces(const ManifestArgs *a) {
    GgufFile *gguf = NULL;
    Tokenizer tok = {0};
    ModelConfig mc;
    BraidError err;
    const char *model = cli_model_path(a->model);
    if (gguf_open(model, &gguf, &err) || model_config_from_gguf(gguf, &mc, &err) || tokenizer_load(gguf, &tok, &err)) {
        fprintf(stderr, "braid manifest export: the model's tokenizer and shape name the chunks: %s\n", err.msg);
        gguf_close(gguf);
        return 1;
    }
    ManifestRecorderConfig rc_cfg = {.capacity = (int)a->capacity, .anchors = tok.special_ids, .n_anchors = tok.n_special,
                                     .model_seed = engine_model_seed(&mc)};
    ManifestRecorder *r = manifest_recorder_create(&rc_cfg, &err);
    int rc = r ? 0 : (fprintf(stderr, "braid manifest export: %s\n", err.msg), 1), with_tokens = 0, without = 0;
    for (int i = 0; rc == 0 && i < a->n_traces; i++) rc = observe_trace(r, a->traces[i], &with_tokens, &without);
    if (rc == 0 && with_tokens == 0) {
        fprintf(stderr, "braid manifest export: no request line carries \"tokens\" (write traces with --trace-tokens)\n");
        rc = 1;
    }
    char *text = rc == 0 ? manifest_recorder_export(r, a->min_count, NULL) : NULL;
    if (rc == 0 && !text) {
        fprintf(stderr, "braid manifest export: out of memory\n");
        rc = 1;
    }
    if (rc == 0 && (rc = write_file(a->out, text)) == 0)
        fprintf(stderr, "braid manifest export: %d chunks (count >= %ld) from %d prompts%s written to %s\n", count_lines(text),
                a->min_count, with_tokens, without ? " (requests without token ids skipped)" : "", a->out);
    free(text);
    manifest_recorder_destroy(r);
    tokenizer_free(&tok);
    gguf_close(gguf);
    return rc;
}

int cmd_manifest(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "export") != 0) {
        bool help = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
        fputs(manifest_usage, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    ManifestArgs a;
    int rc = parse_args(argc - 1, argv + 1, &a);
    if (rc == 0) rc = a.url ? export_from_server(&a) : export_from_traces(&a);
    free(a.traces);
    return rc < 0 ? 0 : rc;
}
