/* Run directories to plottable series; the contract is in plot_data.h. */
#include "plot_data.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    double t_done, prompt, cached;
} Completion;

int plot_for_each_json_line(const char *path, int (*on_line)(const json_t *o, void *ctx), void *ctx, BraidError *err) {
    FILE *f = fopen(path, "r");
    if (!f) return braid_error_set(err, "cannot open %s", path);
    char *line = NULL;
    size_t cap = 0;
    int rc = 0, line_no = 0;
    while (rc == 0 && getline(&line, &cap, f) > 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        if (!json_is_object(o)) rc = braid_error_set(err, "%s:%d: not a JSON object (%s)", path, line_no, o ? "wrong type" : jerr.text);
        else if (on_line(o, ctx)) rc = braid_error_set(err, "%s:%d: out of memory", path, line_no);
        json_decref(o);
    }
    free(line);
    fclose(f);
    return rc;
}

static bool succeeded(const json_t *o) {
    return json_integer_value(json_object_get(o, "status")) == 200 && !json_object_get(o, "error");
}

static double number(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* A growable array of doubles or of Completions, as raw bytes. */
typedef struct {
    void *items;
    size_t n, cap, size;
} Vec;

static void *vec_push(Vec *v) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 256;
        void *grown = realloc(v->items, cap * v->size);
        if (!grown) return NULL;
        v->items = grown;
        v->cap = cap;
    }
    return (char *)v->items + v->size * v->n++;
}

static int add_completion(const json_t *o, void *ctx) {
    if (!succeeded(o)) return 0;
    Completion *c = vec_push(ctx);
    if (!c) return -1;
    *c = (Completion){.t_done = number(o, "t_send_s") + number(o, "latency_ms") / 1e3, .prompt = number(o, "prompt_tokens"),
                      .cached = number(o, "cached_tokens")};
    return 0;
}

static int compare_completion(const void *a, const void *b) {
    double x = ((const Completion *)a)->t_done, y = ((const Completion *)b)->t_done;
    return (x > y) - (x < y);
}

static int series_alloc(PlotSeries *s, size_t n, BraidError *err) {
    *s = (PlotSeries){.x = malloc((n + 1) * sizeof *s->x), .y = malloc((n + 1) * sizeof *s->y), .n = (int)n};
    if (s->x && s->y) return 0;
    plot_series_free(s);
    return braid_error_set(err, "out of memory for %zu points", n);
}

int plot_read_hit_rate(const char *dir, PlotSeries *out, BraidError *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/requests.jsonl", dir);
    Vec v = {.size = sizeof(Completion)};
    int rc = plot_for_each_json_line(path, add_completion, &v, err);
    if (rc == 0) rc = series_alloc(out, v.n, err);
    if (rc == 0) {
        Completion *c = v.items;
        if (v.n > 1) qsort(c, v.n, sizeof *c, compare_completion);
        double prompt = 0, cached = 0;
        for (size_t i = 0; i < v.n; i++) {
            prompt += c[i].prompt;
            cached += c[i].cached;
            out->x[i] = c[i].t_done;
            out->y[i] = prompt > 0 ? 100 * cached / prompt : 0;
        }
    }
    free(v.items);
    return rc;
}

static int add_workflow_latency(const json_t *o, void *ctx) {
    double *x = vec_push(ctx);
    if (!x) return -1;
    *x = number(o, "latency_s");
    return 0;
}

static int add_request_latency(const json_t *o, void *ctx) {
    if (!succeeded(o)) return 0;
    double *x = vec_push(ctx);
    if (!x) return -1;
    *x = number(o, "latency_ms") / 1e3;
    return 0;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int plot_read_latency_cdf(const char *dir, bool want_per_request, PlotSeries *out, bool *per_request, BraidError *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/workflows.jsonl", dir);
    *per_request = want_per_request || access(path, R_OK) != 0;
    if (*per_request) snprintf(path, sizeof path, "%s/requests.jsonl", dir);
    Vec v = {.size = sizeof(double)};
    int rc = plot_for_each_json_line(path, *per_request ? add_request_latency : add_workflow_latency, &v, err);
    /* One point more than latencies: the curve starts at 0 at the shortest latency. */
    if (rc == 0 && v.n > 0) rc = series_alloc(out, v.n + 1, err);
    if (rc == 0 && v.n > 0) {
        double *lat = v.items;
        if (v.n > 1) qsort(lat, v.n, sizeof *lat, compare_doubles);
        out->x[0] = lat[0];
        out->y[0] = 0;
        for (size_t i = 0; i < v.n; i++) {
            out->x[i + 1] = lat[i];
            out->y[i + 1] = (double)(i + 1) / (double)v.n;
        }
    }
    free(v.items);
    return rc;
}

/* A timeline row: arrival time, tokens, and the modeled latency in `cached`'s neighbour. */
typedef struct {
    double t, prompt, cached, latency;
} TimelineRow;

static int add_timeline_row(const json_t *o, void *ctx) {
    const char *type = json_string_value(json_object_get(o, "type"));
    if (!type || strcmp(type, "request") != 0) return 0; /* the header line */
    TimelineRow *r = vec_push(ctx);
    if (!r) return -1;
    *r = (TimelineRow){.t = number(o, "t"), .prompt = number(o, "prompt_tokens"), .cached = number(o, "cached_tokens"),
                       .latency = number(o, "latency_s")};
    return 0;
}

int plot_read_timeline(const char *path, PlotSeries *hit, PlotSeries *cdf, BraidError *err) {
    Vec v = {.size = sizeof(TimelineRow)};
    *hit = *cdf = (PlotSeries){0};
    int rc = plot_for_each_json_line(path, add_timeline_row, &v, err);
    if (rc == 0 && v.n > 0) rc = series_alloc(hit, v.n, err);
    if (rc == 0 && v.n > 0) rc = series_alloc(cdf, v.n + 1, err);
    if (rc == 0 && v.n > 0) {
        TimelineRow *r = v.items;
        double prompt = 0, cached = 0, *lat = malloc(v.n * sizeof *lat);
        if (!lat) rc = braid_error_set(err, "out of memory for %zu points", v.n);
        for (size_t i = 0; rc == 0 && i < v.n; i++) { /* rows come in arrival order */
            prompt += r[i].prompt;
            cached += r[i].cached;
            hit->x[i] = r[i].t;
            hit->y[i] = prompt > 0 ? 100 * cached / prompt : 0;
            lat[i] = r[i].latency;
        }
        if (rc == 0) {
            qsort(lat, v.n, sizeof *lat, compare_doubles);
            cdf->x[0] = lat[0];
            cdf->y[0] = 0;
            for (size_t i = 0; i < v.n; i++) {
                cdf->x[i + 1] = lat[i];
                cdf->y[i + 1] = (double)(i + 1) / (double)v.n;
            }
        }
        free(lat);
    }
    if (rc) {
        plot_series_free(hit);
        plot_series_free(cdf);
    }
    free(v.items);
    return rc;
}

int plot_series_write(const PlotSeries *s, FILE *f) {
    for (int i = 0; i < s->n; i++)
        if (fprintf(f, "%.6f %.6f\n", s->x[i], s->y[i]) < 0) return -1;
    return 0;
}

void plot_series_free(PlotSeries *s) {
    free(s->x);
    free(s->y);
    *s = (PlotSeries){0};
}
