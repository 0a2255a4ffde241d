/* The ratio chart of braid-bench compare; the contract is in compare_plot.h. */
#include "compare_plot.h"

#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "plot_gnuplot.h"
#include "strbuf.h"

/* A clustered histogram with error bars: one cluster per metric, one bar per server after the
 * first; the data go inline ($ratios). A missing ratio (NAN) is written as "?" (gnuplot skips it). */
static char *build_script(const char *out, const char *title, const char *const *servers, int n_servers, const char *const *metrics,
                          int n_metrics, const CompareRatio *ratios) {
    StrBuf s = {0};
    strbuf_appendf(&s, "set terminal %s size 1200,560 noenhanced\nset output ", plot_gnuplot_png_terminal());
    plot_gnuplot_quote(&s, out);
    strbuf_append(&s, "\nset title ");
    plot_gnuplot_quote(&s, title);
    strbuf_append(&s, "\nset ylabel 'ratio to the first server (median over rounds, bars: min-max)'\n"
                      "set style data histogram\nset style histogram errorbars gap 1 lw 1\n"
                      "set style fill solid 0.6 border -1\nset xtics rotate by -30\nset grid ytics\nset key top left\n"
                      "set yrange [0:*]\nset datafile missing '?'\n$ratios << EOD\n");
    for (int m = 0; m < n_metrics; m++) {
        strbuf_appendf(&s, "\"%s\"", metrics[m]);
        for (int k = 1; k < n_servers; k++) {
            const CompareRatio *r = &ratios[k * n_metrics + m];
            if (isnan(r->median)) strbuf_append(&s, " ? ? ?");
            else strbuf_appendf(&s, " %.6g %.6g %.6g", r->median, r->min, r->max);
        }
        strbuf_append_char(&s, '\n');
    }
    strbuf_append(&s, "EOD\nplot ");
    for (int k = 1; k < n_servers; k++) {
        int col = 2 + 3 * (k - 1);
        strbuf_appendf(&s, "%s$ratios using %d:%d:%d%s title ", k > 1 ? ", " : "", col, col + 1, col + 2, k == 1 ? ":xtic(1)" : "");
        plot_gnuplot_quote(&s, servers[k]);
    }
    strbuf_append(&s, ", 1 with lines lc rgb 'black' dt 2 title ");
    plot_gnuplot_quote(&s, servers[0]);
    strbuf_append(&s, "\n");
    if (strbuf_failed(&s)) {
        strbuf_free(&s);
        return NULL;
    }
    return strbuf_take(&s);
}

int compare_plot_write(const char *out, const char *title, const char *const *server_labels, int n_servers,
                       const char *const *metric_labels, int n_metrics, const CompareRatio *ratios, BraidError *err) {
    if (!plot_gnuplot_installed()) return braid_error_set(err, "gnuplot is not installed or not on PATH (apt-get install gnuplot-nox)");
    char *script = build_script(out, title, server_labels, n_servers, metric_labels, n_metrics, ratios);
    if (!script) return braid_error_set(err, "out of memory building the gnuplot script");
    bool ran = plot_gnuplot_run(script, false);
    free(script);
    if (!ran) return braid_error_set(err, "gnuplot failed on the chart for %s (its messages are above)", out);
    struct stat st;
    if (stat(out, &st) != 0 || st.st_size == 0) return braid_error_set(err, "gnuplot wrote no %s", out);
    return 0;
}
