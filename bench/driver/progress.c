/* The run's progress line; the contract is in progress.h. */
#include "progress.h"

#include <unistd.h>

#define TTY_REDRAW_S 0.2
#define LOG_LINE_EVERY_S 15.0
#define BAR_WIDTH 24

void progress_init(Progress *p, FILE *out, int total_workflows) {
    *p = (Progress){.out = out, .tty = isatty(fileno(out)) == 1, .total = total_workflows, .last_draw_s = -1e9, .last_done = -1};
}

static double hit_rate_percent(const ProgressSnapshot *s) {
    return s->prompt_tokens > 0 ? 100.0 * (double)s->cached_tokens / (double)s->prompt_tokens : 0.0;
}

static void print_counts(const Progress *p, const ProgressSnapshot *s) {
    fprintf(p->out, "%d/%d workflows, %d requests, %d errors, hit rate %.1f%%, %.0f s", s->workflows_done, p->total, s->requests,
            s->errors, hit_rate_percent(s), s->elapsed_s);
}

static void draw_bar_line(Progress *p, const ProgressSnapshot *s) {
    int filled = p->total > 0 ? s->workflows_done * BAR_WIDTH / p->total : 0;
    char bar[BAR_WIDTH + 1];
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    fprintf(p->out, "\r[run] [%s] ", bar);
    print_counts(p, s);
    fputs("\033[K", p->out); /* clear what a longer previous line left behind */
    fflush(p->out);
}

static void print_log_line(Progress *p, const ProgressSnapshot *s) {
    fputs("[run] ", p->out);
    print_counts(p, s);
    fputc('\n', p->out);
    fflush(p->out);
    p->last_done = s->workflows_done;
    p->last_requests = s->requests;
}

void progress_show(Progress *p, const ProgressSnapshot *s) {
    if (p->tty) {
        if (s->elapsed_s - p->last_draw_s < TTY_REDRAW_S) return;
        draw_bar_line(p, s);
        p->last_draw_s = s->elapsed_s;
        return;
    }
    int tenth = p->total > 0 ? s->workflows_done * 10 / p->total : 0;
    if (tenth <= p->last_tenth && s->elapsed_s - p->last_draw_s < LOG_LINE_EVERY_S) return;
    print_log_line(p, s);
    p->last_tenth = tenth;
    p->last_draw_s = s->elapsed_s;
}

void progress_finish(Progress *p, const ProgressSnapshot *s) {
    if (p->tty) {
        draw_bar_line(p, s);
        fputc('\n', p->out);
        fflush(p->out);
    } else if (s->workflows_done != p->last_done || s->requests != p->last_requests) {
        print_log_line(p, s);
    }
}
