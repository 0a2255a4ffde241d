/* gnuplot from braid-bench plot; the contract is in plot_gnuplot.h. */
#include "plot_gnuplot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

bool plot_gnuplot_installed(void) {
    const char *path = getenv("PATH");
    if (!path) return false;
    char *copy = strdup(path), *save = NULL;
    bool found = false;
    for (char *dir = copy ? strtok_r(copy, ":", &save) : NULL; dir && !found; dir = strtok_r(NULL, ":", &save)) {
        char full[4096];
        snprintf(full, sizeof full, "%s/gnuplot", *dir ? dir : ".");
        found = access(full, X_OK) == 0;
    }
    free(copy);
    return found;
}

bool plot_gnuplot_run(const char *script, bool quiet) {
    FILE *p = popen(quiet ? "gnuplot > /dev/null 2>&1" : "gnuplot", "w");
    if (!p) return false;
    fputs(script, p);
    int status = pclose(p);
    return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

const char *plot_gnuplot_png_terminal(void) { return plot_gnuplot_run("set terminal pngcairo\n", true) ? "pngcairo" : "png"; }

void plot_gnuplot_quote(StrBuf *s, const char *text) {
    strbuf_append_char(s, '\'');
    for (const char *p = text; *p; p++) {
        if (*p == '\'') strbuf_append(s, "''");
        else strbuf_append_char(s, *p);
    }
    strbuf_append_char(s, '\'');
}
