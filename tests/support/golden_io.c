#include "golden_io.h"

#include "test_paths.h"

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
