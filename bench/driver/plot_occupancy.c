/* braid-bench plot --occupancy: occupancy logs -> per-tier step lines; the contract is in plot_occupancy.h. */
#include "plot_occupancy.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plot_data.h"
#include "plot_gnuplot.h"
#include "strbuf.h"

enum { TIER_DEVICE, TIER_HOST, N_TIERS };
static const char *const tier_names[N_TIERS] = {"device", "host"};

typedef struct {
    double t;
    int instance, tier, total, in_use, used;
} Sample;

typedef struct {
    Sample *s;
    int n, cap;
    bool oom;
} Samples;

static int add_sample(const json_t *o, void *ctx) {
    Samples *v = ctx;
    const char *tier = json_string_value(json_object_get(o, "tier"));
    int t = tier && strcmp(tier, "host") == 0 ? TIER_HOST : tier && strcmp(tier, "device") == 0 ? TIER_DEVICE : -1;
    if (t < 0) return 0; /* a tier this plot does not know (a later format): left out */
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 256;
        Sample *grown = realloc(v->s, (size_t)cap * sizeof *grown);
        if (!grown) return -1;
        v->s = grown;
        v->cap = cap;
    }
    int total = (int)json_integer_value(json_object_get(o, "total")), free_blocks = (int)json_integer_value(json_object_get(o, "free"));
    v->s[v->n++] = (Sample){.t = json_number_value(json_object_get(o, "t")), .instance = (int)json_integer_value(json_object_get(o, "instance")),
                            .tier = t, .total = total, .in_use = (int)json_integer_value(json_object_get(o, "in_use")),
                            .used = total - free_blocks};
    return 0;
}

/* tmp/occ_<input>_<instance>_<tier>.dat: "seconds in_use used total" per sample of that instance and tier. */
static void data_path(char *buf, size_t cap, const char *tmp, int input, int instance, int tier) {
    snprintf(buf, cap, "%s/occ_%d_%d_%d.dat", tmp, input, instance, tier);
}

typedef struct {
    int input, instance, tier;
} Curve;

typedef struct {
    Curve *c;
    int n, cap;
} Curves;

/* Writes one input's samples, split by instance and tier, recording each curve written. */
static int write_input(const Samples *v, int input, const char *tmp, Curves *curves, BraidError *err) {
    double t0 = v->n > 0 ? v->s[0].t : 0;
    for (int i = 0; i < v->n; i++)
        if (v->s[i].t < t0) t0 = v->s[i].t;
    for (int i = 0; i < v->n; i++) {
        const Sample *first = &v->s[i];
        bool seen = false;
        for (int k = 0; k < curves->n && !seen; k++)
            seen = curves->c[k].input == input && curves->c[k].instance == first->instance && curves->c[k].tier == first->tier;
        if (seen) continue;
        if (curves->n == curves->cap) {
            int cap = curves->cap ? 2 * curves->cap : 16;
            Curve *grown = realloc(curves->c, (size_t)cap * sizeof *grown);
            if (!grown) return braid_error_set(err, "out of memory");
            curves->c = grown;
            curves->cap = cap;
        }
        curves->c[curves->n++] = (Curve){.input = input, .instance = first->instance, .tier = first->tier};
        char path[4200];
        data_path(path, sizeof path, tmp, input, first->instance, first->tier);
        FILE *f = fopen(path, "w");
        if (!f) return braid_error_set(err, "cannot write %s", path);
        for (int j = i; j < v->n; j++)
            if (v->s[j].instance == first->instance && v->s[j].tier == first->tier)
                fprintf(f, "%.3f %d %d %d\n", v->s[j].t - t0, v->s[j].in_use, v->s[j].used, v->s[j].total);
        if (fclose(f)) return braid_error_set(err, "error writing %s", path);
    }
    return 0;
}

static void script_tier(StrBuf *s, const Curves *curves, int tier, char *const *labels, int n_inputs, const char *tmp) {
    strbuf_appendf(s, "set title 'KV blocks, %s tier'\nset xlabel 'seconds since the first sample'\nset ylabel 'blocks'\n"
                      "set yrange [0:*]\nplot ", tier_names[tier]);
    bool first = true;
    for (int k = 0; k < curves->n; k++) {
        const Curve *c = &curves->c[k];
        if (c->tier != tier) continue;
        char path[4200], title[4300];
        data_path(path, sizeof path, tmp, c->input, c->instance, c->tier);
        const char *columns[] = {"using 1:3 with steps lw 2", "using 1:2 with steps lw 1", "using 1:4 with lines dt 2 lw 1"};
        const char *what[] = {"used (in use + cached)", "in use", "pool"};
        for (int col = 0; col < 3; col++) {
            if (n_inputs > 1) snprintf(title, sizeof title, "%s, instance %d: %s", labels[c->input], c->instance, what[col]);
            else snprintf(title, sizeof title, "instance %d: %s", c->instance, what[col]);
            strbuf_append(s, first ? "" : ", \\\n     ");
            plot_gnuplot_quote(s, path);
            strbuf_appendf(s, " %s title ", columns[col]);
            plot_gnuplot_quote(s, title);
            first = false;
        }
    }
    strbuf_append(s, "\n");
}

static char *build_script(const Curves *curves, const bool *has_tier, char *const *labels, int n_inputs, const char *out, const char *title,
                          const char *tmp) {
    int panels = has_tier[TIER_DEVICE] + has_tier[TIER_HOST];
    StrBuf s = {0};
    strbuf_appendf(&s, "set terminal %s size %d,560 noenhanced\nset output ", plot_gnuplot_png_terminal(), panels * 700);
    plot_gnuplot_quote(&s, out);
    strbuf_appendf(&s, "\nset multiplot layout 1,%d title ", panels);
    plot_gnuplot_quote(&s, title);
    strbuf_append(&s, "\nset grid\nset key top left\n");
    for (int tier = 0; tier < N_TIERS; tier++)
        if (has_tier[tier]) script_tier(&s, curves, tier, labels, n_inputs, tmp);
    strbuf_append(&s, "unset multiplot\n");
    return strbuf_take(&s);
}

static void remove_files(const Curves *curves, const char *tmp) {
    char path[4200];
    for (int k = 0; k < curves->n; k++) {
        data_path(path, sizeof path, tmp, curves->c[k].input, curves->c[k].instance, curves->c[k].tier);
        unlink(path);
    }
}

int plot_occupancy_draw(char *const *paths, char *const *labels, int n, const char *out, const char *title, const char *tmp,
                        BraidError *err) {
    Curves curves = {0};
    bool has_tier[N_TIERS] = {false, false};
    int rc = 0;
    for (int k = 0; rc == 0 && k < n; k++) {
        Samples v = {0};
        rc = plot_for_each_json_line(paths[k], add_sample, &v, err);
        if (rc == 0 && v.n == 0) fprintf(stderr, "braid-bench plot: %s has no occupancy samples; left out\n", paths[k]);
        for (int i = 0; i < v.n; i++) has_tier[v.s[i].tier] = true;
        if (rc == 0) rc = write_input(&v, k, tmp, &curves, err);
        free(v.s);
    }
    if (rc == 0 && curves.n == 0) rc = braid_error_set(err, "nothing to plot: no occupancy samples in the inputs");
    char *script = rc == 0 ? build_script(&curves, has_tier, labels, n, out, title, tmp) : NULL;
    if (rc == 0 && !script) rc = braid_error_set(err, "out of memory building the gnuplot script");
    if (rc == 0 && !plot_gnuplot_run(script, false)) rc = braid_error_set(err, "gnuplot failed (its messages are above)");
    struct stat st;
    if (rc == 0 && (stat(out, &st) != 0 || st.st_size == 0)) rc = braid_error_set(err, "gnuplot wrote no %s", out);
    free(script);
    remove_files(&curves, tmp);
    free(curves.c);
    return rc;
}
