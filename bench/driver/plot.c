/* braid-bench plot: series → gnuplot script → PNG; the contract is in plot.h. */
#include "plot.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plot_data.h"
#include "plot_gnuplot.h"
#include "plot_occupancy.h"
#include "strbuf.h"

static const char plot_usage[] =
    "usage: braid-bench plot [LABEL=]INPUT... --out chart.png [--latency workflow|request] [--title TEXT]\n"
    "       braid-bench plot --occupancy [LABEL=]LOG... --out occupancy.png [--title TEXT]\n"
    "  Draws the inputs side by side on one PNG, one line per input, labelled LABEL or the input's name.\n"
    "  An input is a `braid-bench run` directory or a `braid sim --timeline` file. Left: the token-level\n"
    "  cache hit rate over time (cumulative; a run's requests.jsonl by completion time, a timeline's rows\n"
    "  by arrival time in the trace). Right: the CDF of end-to-end latency, per workflow (a run's\n"
    "  workflows.jsonl, the default) or per request (a timeline: the modeled request latencies).\n"
    "  --occupancy: the inputs are --occupancy-log files (braid serve / braid batch); one panel per tier\n"
    "  (device, host) with the blocks used (in use + cached) and in use by running requests over time, per\n"
    "  input and instance, and the pool size dashed.\n"
    "  Needs gnuplot (apt-get install gnuplot-nox).\n";

typedef struct {
    const char *out, *title;
    bool per_request, occupancy;
    char **dirs;   /* the inputs' paths (LABEL= removed) */
    char **labels; /* their legend labels */
    int n_dirs;
} PlotArgs;

/* The input's name for the legend: its last path component. */
static const char *label_of(const char *dir, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", dir);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    const char *slash = strrchr(buf, '/');
    return slash && slash[1] ? slash + 1 : buf;
}

/* Splits each input into label and path: "LABEL=PATH" when the whole argument is no existing path
 * and has an '='; otherwise the path, labelled by its last component. Returns 0 or -1 (memory). */
static int split_inputs(PlotArgs *a, char **inputs) {
    a->dirs = calloc((size_t)a->n_dirs, sizeof *a->dirs);
    a->labels = calloc((size_t)a->n_dirs, sizeof *a->labels);
    if (!a->dirs || !a->labels) return -1;
    for (int k = 0; k < a->n_dirs; k++) {
        const char *in = inputs[k], *eq = strchr(in, '=');
        char buf[4096];
        if (eq && eq > in && access(in, F_OK) != 0) {
            a->labels[k] = strndup(in, (size_t)(eq - in));
            a->dirs[k] = strdup(eq + 1);
        } else {
            a->labels[k] = strdup(label_of(in, buf, sizeof buf));
            a->dirs[k] = strdup(in);
        }
        if (!a->labels[k] || !a->dirs[k]) return -1;
    }
    return 0;
}

static void free_inputs(PlotArgs *a) {
    for (int k = 0; k < a->n_dirs; k++) {
        if (a->dirs) free(a->dirs[k]);
        if (a->labels) free(a->labels[k]);
    }
    free(a->dirs);
    free(a->labels);
    a->dirs = a->labels = NULL;
}

static bool is_regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Returns 0 to run, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, PlotArgs *a) {
    enum { O_OUT = 256, O_LATENCY, O_TITLE, O_OCCUPANCY };
    static const struct option opts[] = {{"out", required_argument, 0, O_OUT}, {"latency", required_argument, 0, O_LATENCY},
                                         {"occupancy", no_argument, 0, O_OCCUPANCY},
                                         {"title", required_argument, 0, O_TITLE}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (PlotArgs){.title = "braid-bench runs"};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_OUT: a->out = optarg; break;
        case O_TITLE: a->title = optarg; break;
        case O_OCCUPANCY: a->occupancy = true; break;
        case O_LATENCY:
            if (strcmp(optarg, "workflow") && strcmp(optarg, "request")) {
                fprintf(stderr, "braid-bench plot: --latency expects workflow or request, got '%s'\n", optarg);
                return 2;
            }
            a->per_request = strcmp(optarg, "request") == 0;
            break;
        case 'h': fputs(plot_usage, stdout); return 1;
        default: fputs(plot_usage, stderr); return 2;
        }
    }
    a->n_dirs = argc - optind;
    if (!a->out || a->n_dirs == 0) {
        fprintf(stderr, "braid-bench plot: %s\n%s", !a->out ? "--out is required" : "name at least one run directory or timeline",
                plot_usage);
        return 2;
    }
    if (split_inputs(a, argv + optind)) {
        free_inputs(a);
        fprintf(stderr, "braid-bench plot: out of memory\n");
        return 2;
    }
    return 0;
}

/* ---- the script ---- */

/* One panel: plot each non-empty data file tmp/prefix_k.dat. */
static void script_panel(StrBuf *s, const PlotArgs *a, const char *tmp, const char *prefix, const bool *has_data, const char *style,
                         const bool *per_request, bool all_per_request) {
    strbuf_append(s, "plot ");
    bool first = true;
    for (int k = 0; k < a->n_dirs; k++) {
        if (!has_data[k]) continue;
        char path[4200], title[4200];
        snprintf(path, sizeof path, "%s/%s_%d.dat", tmp, prefix, k);
        snprintf(title, sizeof title, "%s%s", a->labels[k],
                 per_request && per_request[k] && !all_per_request ? " (per request)" : "");
        strbuf_appendf(s, "%s", first ? "" : ", \\\n     ");
        plot_gnuplot_quote(s, path);
        strbuf_appendf(s, " using 1:2 with %s lw 2 title ", style);
        plot_gnuplot_quote(s, title);
        first = false;
    }
    strbuf_append(s, "\n");
}

static char *build_script(const PlotArgs *a, const char *tmp, const char *terminal, const bool *has_hit, const bool *has_cdf,
                          const bool *per_request) {
    /* The panel is per request when asked, or when every input gives request latencies (timelines). */
    bool all_per_request = true;
    for (int k = 0; k < a->n_dirs; k++)
        if (has_cdf[k] && !per_request[k]) all_per_request = false;
    StrBuf s = {0};
    strbuf_appendf(&s, "set terminal %s size 1400,560 noenhanced\nset output ", terminal);
    plot_gnuplot_quote(&s, a->out);
    strbuf_appendf(&s, "\nset multiplot layout 1,2 title ");
    plot_gnuplot_quote(&s, a->title);
    strbuf_appendf(&s, "\nset grid\nset key bottom right\n");
    strbuf_appendf(&s, "set title 'Token-level prefix-cache hit rate (cumulative)'\n"
                   "set xlabel 'time since start of run (s; a sim timeline: arrival time in the trace)'\nset ylabel 'hit rate (%% of prompt tokens)'\nset yrange [0:100]\n");
    script_panel(&s, a, tmp, "hit", has_hit, "steps", NULL, false);
    strbuf_appendf(&s, "set title 'End-to-end latency CDF (%s)'\nset xlabel 'latency (s)'\nset ylabel 'fraction of %s'\n"
                   "set yrange [0:1]\nset xrange [0:*]\n",
               all_per_request ? "per request" : "per workflow", all_per_request ? "requests" : "workflows");
    script_panel(&s, a, tmp, "cdf", has_cdf, "steps", per_request, all_per_request);
    strbuf_append(&s, "unset multiplot\n");
    return strbuf_take(&s); /* NULL when out of memory */
}

/* ---- data files ---- */

static int write_series(const char *tmp, const char *prefix, int k, const PlotSeries *s, BraidError *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s_%d.dat", tmp, prefix, k);
    FILE *f = fopen(path, "w");
    if (!f) return braid_error_set(err, "cannot write %s", path);
    int rc = plot_series_write(s, f);
    if (fclose(f) != 0 || rc) return braid_error_set(err, "error writing %s", path);
    return 0;
}

/* Reads directory k's series and writes its data files; flags which panels it has points for. */
static int prepare_dir(const PlotArgs *a, int k, const char *tmp, bool *has_hit, bool *has_cdf, bool *per_request, BraidError *err) {
    PlotSeries hit = {0}, cdf = {0};
    int rc;
    if (is_regular_file(a->dirs[k])) { /* a braid sim --timeline file */
        rc = plot_read_timeline(a->dirs[k], &hit, &cdf, err);
        *per_request = true;
    } else {
        rc = plot_read_hit_rate(a->dirs[k], &hit, err);
        if (rc == 0) rc = plot_read_latency_cdf(a->dirs[k], a->per_request, &cdf, per_request, err);
    }
    if (rc == 0 && hit.n > 0) rc = write_series(tmp, "hit", k, &hit, err);
    if (rc == 0 && cdf.n > 0) rc = write_series(tmp, "cdf", k, &cdf, err);
    *has_hit = hit.n > 0;
    *has_cdf = cdf.n > 0;
    if (rc == 0 && (!*has_hit || !*has_cdf))
        fprintf(stderr, "braid-bench plot: %s has no successful requests%s; left out of %s\n", a->dirs[k], *has_hit ? " with latencies" : "",
                *has_hit ? "the latency panel" : "both panels");
    plot_series_free(&hit);
    plot_series_free(&cdf);
    return rc;
}

static void remove_tmp(const char *tmp, int n_dirs) {
    for (int k = 0; k < n_dirs; k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/hit_%d.dat", tmp, k);
        unlink(path);
        snprintf(path, sizeof path, "%s/cdf_%d.dat", tmp, k);
        unlink(path);
    }
    rmdir(tmp);
}

static bool any(const bool *flags, int n) {
    for (int i = 0; i < n; i++)
        if (flags[i]) return true;
    return false;
}

static int draw(const PlotArgs *a, const char *tmp, BraidError *err) {
    bool *flags = calloc(3 * (size_t)a->n_dirs, sizeof *flags);
    if (!flags) return braid_error_set(err, "out of memory");
    bool *has_hit = flags, *has_cdf = flags + a->n_dirs, *per_request = flags + 2 * a->n_dirs;
    int rc = 0;
    for (int k = 0; rc == 0 && k < a->n_dirs; k++) rc = prepare_dir(a, k, tmp, &has_hit[k], &has_cdf[k], &per_request[k], err);
    if (rc == 0 && (!any(has_hit, a->n_dirs) || !any(has_cdf, a->n_dirs)))
        rc = braid_error_set(err, "nothing to plot: no directory has successful requests");
    char *script = rc == 0 ? build_script(a, tmp, plot_gnuplot_png_terminal(), has_hit, has_cdf, per_request) : NULL;
    if (rc == 0 && !script) rc = braid_error_set(err, "out of memory building the gnuplot script");
    if (rc == 0 && !plot_gnuplot_run(script, false)) rc = braid_error_set(err, "gnuplot failed (its messages are above)");
    struct stat st;
    if (rc == 0 && (stat(a->out, &st) != 0 || st.st_size == 0)) rc = braid_error_set(err, "gnuplot wrote no %s", a->out);
    free(script);
    free(flags);
    return rc;
}

int plot_main(int argc, char **argv) {
    PlotArgs a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    if (!plot_gnuplot_installed()) {
        fprintf(stderr, "braid-bench plot: gnuplot is not installed or not on PATH (apt-get install gnuplot-nox)\n");
        free_inputs(&a);
        return 1;
    }
    char tmp[] = "/tmp/braid-plot.XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("braid-bench plot: cannot create a temporary directory");
        free_inputs(&a);
        return 1;
    }
    BraidError err;
    if (a.occupancy && strcmp(a.title, "braid-bench runs") == 0) a.title = "KV pool occupancy";
    rc = a.occupancy ? plot_occupancy_draw(a.dirs, a.labels, a.n_dirs, a.out, a.title, tmp, &err) : draw(&a, tmp, &err);
    remove_tmp(tmp, a.n_dirs);
    free_inputs(&a);
    if (rc) {
        fprintf(stderr, "braid-bench plot: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "[plot] %d input%s -> %s\n", a.n_dirs, a.n_dirs == 1 ? "" : "s", a.out);
    return 0;
}
