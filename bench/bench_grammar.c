/*
 * bench_grammar — grammar-constrained decoding costs on a real vocabulary, no forward pass:
 *   - vocabulary trie build (once per model);
 *   - spec compile time per schema (what every constrained request pays on the leader);
 *   - token-mask time per decoding step over two traces per schema: "doc" feeds the tokenization
 *     of a realistic document that fits the schema, token by token; "random" samples random
 *     allowed tokens (random logits, argmax over the mask), the worst case for state variety.
 *     Each trace runs with a fresh matcher (its per-state mask cache starts cold, as a new
 *     request's does); median, p99 and max per step are reported, with the first step apart.
 *     "cached" replays the doc trace as a second request of the same spec through a grammar
 *     cache (what the engine does for repeated specs): the per-state walks are already paid.
 *   bench_grammar [--model PATH] [--steps N] [--seed S]
 * BENCH_GRAMMAR_VERBOSE=1 prints the doc-trace steps above 1 ms with the token they preceded.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "common/timeutil.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "worker/grammar_tokens.h"

typedef struct {
    const char *name, *spec, *doc;
} BenchCase;

static const BenchCase CASES[] = {
    {"json_object", "{\"schema\":{\"type\":\"object\"}}",
     "{\"name\": \"Ada Lovelace\", \"born\": 1815, \"fields\": [\"mathematics\", \"computing\"], \"notes\": {\"first program\": true, "
     "\"collaborator\": \"Charles Babbage\", \"score\": 9.75}}"},
    {"person_schema",
     "{\"schema\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
     "\"email\":{\"type\":\"string\",\"format\":\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":8},"
     "\"address\":{\"$ref\":\"#/$defs/Address\"},\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
     "\"active\":{\"type\":\"boolean\"},\"manager\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}},"
     "\"required\":[\"name\",\"age\",\"address\",\"role\",\"active\"],"
     "\"$defs\":{\"Address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
     "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"street\",\"city\",\"zip\"]}}}}",
     "{\"name\": \"Grace Hopper\", \"age\": 85, \"email\": \"grace@navy.mil\", \"tags\": [\"cobol\", \"compilers\", \"navy\"], "
     "\"address\": {\"street\": \"1 Harbor Road\", \"city\": \"Arlington\", \"zip\": \"22201\"}, \"role\": \"admin\", \"active\": true, "
     "\"manager\": null}"},
    {"tool_call",
     "{\"prefix\":\"<tool_call>\\n\",\"suffix\":\"\\n</tool_call>\",\"max_items\":4,\"separator\":\"\\n\",\"schema\":{\"anyOf\":["
     "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":{\"type\":\"object\",\"properties\":"
     "{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]}},\"required\":[\"city\"]}},\"required\":[\"name\",\"arguments\"]},"
     "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"search\"},\"arguments\":{\"type\":\"object\",\"properties\":"
     "{\"query\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\"}},\"required\":[\"query\"]}},\"required\":[\"name\",\"arguments\"]}]}}",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n"
     "{\"name\": \"search\", \"arguments\": {\"query\": \"weather in Paris tomorrow\", \"limit\": 5}}\n</tool_call>"},
    {"bounded_str",
     "{\"schema\":{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\",\"maxLength\":40},"
     "\"summary\":{\"type\":\"string\",\"minLength\":10,\"maxLength\":200}},\"required\":[\"title\",\"summary\"]}}",
     "{\"title\": \"Grammar-constrained decoding\", \"summary\": \"A token mask computed from a JSON Schema keeps every "
     "sampled token inside the language of valid outputs, at a few microseconds per step.\"}"},
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, const char *trace, double *us, int n) {
    if (n == 0) return;
    double first = us[0];
    qsort(us + 1, (size_t)(n - 1), sizeof *us, cmp_double);
    double med = n > 1 ? us[1 + (n - 1) / 2] : first, p99 = n > 1 ? us[1 + (int)((n - 2) * 0.99)] : first,
           max = n > 1 ? us[n - 1] : first, sum = 0;
    for (int i = 0; i < n; i++) sum += us[i];
    printf("%-14s %-6s steps %4d  mask us: median %7.1f  p99 %8.1f  max %8.1f  first %8.1f  mean %7.1f\n", name, trace, n, med, p99,
           max, first, sum / n);
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    long steps = 400, seed = 1;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"steps", required_argument, 0, 'n'},
                                         {"seed", required_argument, 0, 's'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:n:s:", opts, NULL)) != -1) {
        if (c == 'm') model_path = optarg;
        else if (c == 'n' && cli_parse_int("--steps", optarg, 1, 100000, &steps) == 0) continue;
        else if (c == 's' && cli_parse_int("--seed", optarg, 0, 1 << 30, &seed) == 0) continue;
        else {
            fprintf(stderr, "usage: bench_grammar [--model PATH] [--steps N] [--seed S]\n");
            return 2;
        }
    }
    BraidError err;
    BraidModel model;
    if (braid_model_load(cli_model_path(model_path), &model, &err)) {
        fprintf(stderr, "bench_grammar: %s\n", err.msg);
        return 1;
    }
    const Tokenizer *tok = &model.tokenizer;
    double t0 = braid_now_seconds();
    GrammarVocab *vocab = grammar_vocab_from_tokenizer(tok, &err);
    double t_vocab = braid_now_seconds() - t0;
    if (!vocab) {
        fprintf(stderr, "bench_grammar: %s\n", err.msg);
        return 1;
    }
    int n_vocab = grammar_vocab_size(vocab), words = grammar_mask_words(n_vocab);
    printf("vocabulary: %d tokens, trie built in %.1f ms (once per model)\n", n_vocab, t_vocab * 1e3);
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    double *us = malloc((size_t)(steps + 4096) * sizeof *us);
    int rc = 0;
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        const BenchCase *bc = &CASES[k];
        char why[512];
        int reps = 20;
        t0 = braid_now_seconds();
        for (int r = 0; r < reps; r++) grammar_free(grammar_compile(bc->spec, strlen(bc->spec), why, sizeof why));
        double t_compile = (braid_now_seconds() - t0) / reps;
        printf("%-14s compile %.1f us\n", bc->name, t_compile * 1e6);
        /* doc trace */
        TokenList tl = {0};
        if (tokenizer_encode(tok, bc->doc, strlen(bc->doc), true, false, &tl, &err)) {
            fprintf(stderr, "bench_grammar: %s\n", err.msg);
            return 1;
        }
        GrammarMatcher *m = grammar_matcher_create_from_spec(bc->spec, strlen(bc->spec), vocab, why, sizeof why);
        if (!m) {
            fprintf(stderr, "bench_grammar: %s: %s\n", bc->name, why);
            return 1;
        }
        int n = 0;
        for (int i = 0; i < tl.n; i++) {
            t0 = braid_now_seconds();
            int allowed = grammar_matcher_fill_mask(m, mask);
            us[n++] = (braid_now_seconds() - t0) * 1e6;
            if (getenv("BENCH_GRAMMAR_VERBOSE") && us[n - 1] > 1000) {
                char piece[64];
                size_t len = tokenizer_token_bytes(tok, tl.ids[i], piece, sizeof piece - 1);
                piece[len < sizeof piece - 1 ? len : sizeof piece - 1] = 0;
                fprintf(stderr, "  slow step %d (%.0f us) before token '%s'\n", i, us[n - 1], piece);
            }
            if (allowed <= 0 || !(mask[tl.ids[i] >> 5] >> (tl.ids[i] & 31) & 1) || grammar_matcher_accept_token(m, tl.ids[i])) {
                fprintf(stderr, "bench_grammar: %s: document token %d (id %d) refused\n", bc->name, i, tl.ids[i]);
                rc = 1;
                break;
            }
        }
        if (!grammar_matcher_is_complete(m)) {
            fprintf(stderr, "bench_grammar: %s: document not complete\n", bc->name);
            rc = 1;
        }
        report(bc->name, "doc", us, n);
        grammar_matcher_free(m);
        /* The same document as a second request with the same spec, through an engine's grammar
         * cache: its states' walks were paid by the first request. */
        GrammarCache *cache = grammar_cache_create(vocab, 4);
        for (int pass = 0; pass < 2 && cache; pass++) {
            m = grammar_cache_matcher(cache, bc->spec, strlen(bc->spec), why, sizeof why);
            n = 0;
            for (int i = 0; m && i < tl.n; i++) {
                t0 = braid_now_seconds();
                grammar_matcher_fill_mask(m, mask);
                us[n++] = (braid_now_seconds() - t0) * 1e6;
                if (grammar_matcher_accept_token(m, tl.ids[i])) break;
            }
            if (pass == 1) report(bc->name, "cached", us, n);
            grammar_matcher_free(m);
        }
        grammar_cache_free(cache);
        free(tl.ids);
        /* random trace: random allowed tokens until complete-and-chosen-to-stop or the step budget */
        uint64_t s = (uint64_t)seed * 7919 + k;
        m = grammar_matcher_create_from_spec(bc->spec, strlen(bc->spec), vocab, why, sizeof why);
        n = 0;
        int total_allowed = 0;
        while (n < steps) {
            t0 = braid_now_seconds();
            int allowed = grammar_matcher_fill_mask(m, mask);
            us[n++] = (braid_now_seconds() - t0) * 1e6;
            if (allowed <= 0) {
                fprintf(stderr, "bench_grammar: %s: random trace stuck at step %d (%s)\n", bc->name, n, grammar_matcher_error(m));
                rc = 1;
                break;
            }
            total_allowed += allowed;
            /* A uniform pick among the allowed tokens, or (half the time, when there are any) among
             * the allowed ones of the 2000 lowest ids — byte-level BPE puts punctuation and short
             * pieces there, so the output keeps moving through the structure instead of growing
             * one long string. */
            int low = 0;
            for (int w = 0; w < 2000 / 32; w++) low += __builtin_popcount(mask[w]);
            bool use_low = low > 0 && (rng_next(&s) & 1);
            int pick = (int)(rng_next(&s) % (uint64_t)(use_low ? low : allowed)), seen = 0, token = -1;
            for (int w = 0; w < words && token < 0; w++)
                for (uint32_t bits = mask[w]; bits; bits &= bits - 1)
                    if (seen++ == pick) {
                        token = w * 32 + __builtin_ctz(bits);
                        break;
                    }
            if (grammar_matcher_accept_token(m, token)) {
                fprintf(stderr, "bench_grammar: %s: allowed token %d refused\n", bc->name, token);
                rc = 1;
                break;
            }
            if (grammar_matcher_is_terminated(m)) {
                grammar_matcher_free(m);
                m = grammar_matcher_create_from_spec(bc->spec, strlen(bc->spec), vocab, why, sizeof why);
            }
        }
        report(bc->name, "random", us, n);
        grammar_matcher_free(m);
    }
    free(mask);
    free(us);
    grammar_vocab_free(vocab);
    braid_model_free(&model);
    return rc;
}
