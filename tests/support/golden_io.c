#include "golden_io.h"

#include "test_paths.h"
#include "worker/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *golden_read_jsonl(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "golden: cannot open %s (regenerate with tools/golden/make_golden.sh)\n", path);
        return NULL;
    }
    json_t *lines = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        lineno++;
        if (len == 1 && line[0] == '\n') continue;
        json_error_t jerr;
        json_t *obj = json_loadb(line, (size_t)len, 0, &jerr);
        if (!obj) {
            fprintf(stderr, "golden: %s:%d: %s\n", path, lineno, jerr.text);
            json_decref(lines);
            lines = NULL;
            break;
        }
        json_array_append_new(lines, obj);
    }
    free(line);
    fclose(f);
    return lines;
}

int32_t *golden_int_array(const json_t *array, int *n) {
    *n = (int)json_array_size(array);
    int32_t *out = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *out);
    for (int i = 0; out && i < *n; i++) out[i] = (int32_t)json_integer_value(json_array_get(array, (size_t)i));
    return out;
}

int golden_model_load(GoldenModel *g) {
    BraidError err;
    if (braid_model_load(test_model_path(), &g->model, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    g->prompts = golden_read_jsonl(test_golden_path("logits.jsonl"));
    if (g->prompts) return 0;
    braid_model_free(&g->model);
    return -1;
}

void golden_model_free(GoldenModel *g) {
    json_decref(g->prompts);
    braid_model_free(&g->model);
}

double golden_compare_top_logits(const json_t *p, const float *logits, int n, int vocab, double *mean_out) {
    json_t *top_ids = json_object_get(p, "top_ids"), *top_logits = json_object_get(p, "top_logits");
    if ((int)json_array_size(top_ids) != n) {
        fprintf(stderr, "golden: the reference has %zu positions, the prompt %d\n", json_array_size(top_ids), n);
        *mean_out = INFINITY;
        return INFINITY;
    }
    double max_diff = 0.0, sum = 0.0;
    long count = 0;
    for (int pos = 0; pos < n; pos++) {
        json_t *ids = json_array_get(top_ids, (size_t)pos), *vals = json_array_get(top_logits, (size_t)pos);
        for (size_t k = 0; k < json_array_size(ids); k++) {
            int id = (int)json_integer_value(json_array_get(ids, k));
            double diff = fabs(logits[(size_t)pos * vocab + id] - json_number_value(json_array_get(vals, k)));
            sum += diff;
            count++;
            if (diff > max_diff) max_diff = diff;
        }
    }
    *mean_out = count ? sum / (double)count : 0.0;
    return max_diff;
}

int golden_greedy_mismatches(SequenceRunner *runner, const json_t *p, const float *first_logits, float *scratch, int vocab,
                             double margin_tie, const char *name, int *ties, int *ties_agreeing) {
    int n_greedy, mismatches = 0;
    int32_t *greedy = golden_int_array(json_object_get(p, "greedy"), &n_greedy);
    json_t *margins = json_object_get(p, "greedy_margins");
    const float *step_logits = first_logits;
    BraidError err;
    for (int s = 0; greedy && s < n_greedy; s++) {
        int32_t mine = sampler_argmax(step_logits, vocab);
        double margin = json_number_value(json_array_get(margins, (size_t)s));
        if (margin < margin_tie) {
            (*ties)++;
            *ties_agreeing += mine == greedy[s];
        } else if (mine != greedy[s]) {
            fprintf(stderr, "  %s: greedy step %d: braid %d, reference %d (margin %.4g)\n", name, s, mine, greedy[s], margin);
            mismatches++;
        }
        if (s + 1 < n_greedy) {
            if (sequence_runner_eval(runner, &greedy[s], 1, false, scratch, &err)) {
                fprintf(stderr, "  %s: %s\n", name, err.msg);
                mismatches = -1;
                break;
            }
            step_logits = scratch;
        }
    }
    free(greedy);
    return greedy ? mismatches : -1;
}

int golden_load_adapters(const ModelConfig *cfg, LoraSet *set) {
    static const char *const roles[] = TEST_ADAPTER_ROLES;
    char spec[4200];
    BraidError err;
    *set = (LoraSet){0};
    for (int i = 0; i < TEST_N_ADAPTERS; i++) {
        snprintf(spec, sizeof spec, "%s=%s", roles[i], test_adapter_path(roles[i]));
        if (lora_set_add_spec(set, spec, cfg, &err)) {
            fprintf(stderr, "golden: %s (regenerate with tools/train_lora.py)\n", err.msg);
            lora_set_free(set);
            return -1;
        }
    }
    return 0;
}

int golden_load_model_and_adapters(BraidModel *model, LoraSet *set) {
    BraidError err;
    if (braid_model_load(test_model_path(), model, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return golden_load_adapters(&model->weights.cfg, set);
}

int golden_encode(const BraidModel *model, const char *text, bool parse_special, TokenList *out) {
    BraidError err;
    if (tokenizer_encode(&model->tokenizer, text, strlen(text), parse_special, false, out, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

double golden_top2_gap(const float *logits, int n) {
    float best = -INFINITY, second = -INFINITY;
    for (int v = 0; v < n; v++) {
        if (logits[v] > best) {
            second = best;
            best = logits[v];
        } else if (logits[v] > second) {
            second = logits[v];
        }
    }
    return (double)best - second;
}
