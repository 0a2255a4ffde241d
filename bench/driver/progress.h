/*
 * progress.h — the progress display of `braid-bench run` on stderr: workflows done of N, requests,
 * errors, the token-level cache hit rate so far, elapsed time.
 *
 * On a terminal the line is redrawn in place (at most a few times a second); otherwise (a log
 * file, CI) a plain line is printed at every further tenth of the workflows or every 15 s, so logs
 * stay short.
 * Called by: run.c's main thread only. Thread-safety: none; one thread owns a Progress.
 */
#ifndef BRAID_BENCH_DRIVER_PROGRESS_H
#define BRAID_BENCH_DRIVER_PROGRESS_H

#include <stdbool.h>
#include <stdio.h>

typedef struct {
    int workflows_done, requests, errors;
    long long prompt_tokens, cached_tokens;
    double elapsed_s;
} ProgressSnapshot;

typedef struct {
    FILE *out;
    bool tty;
    int total;             /* workflows in the run */
    double last_draw_s;    /* elapsed time of the last output */
    int last_tenth;        /* non-TTY: the last tenth of the workflows reported */
    int last_done, last_requests; /* non-TTY: what the last line said, so finish does not repeat it */
} Progress;

void progress_init(Progress *p, FILE *out, int total_workflows);
/* Shows the snapshot if it is time to (see above). */
void progress_show(Progress *p, const ProgressSnapshot *s);
/* Shows the final state and ends the line. */
void progress_finish(Progress *p, const ProgressSnapshot *s);

#endif
