/* sched_admit.c — output-aware admission arithmetic (sched_admit.h). */
#include "worker/sched_admit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sched_admit_output_parse(const char *text, int *mode) {
    if (!text) return -1;
    if (strcmp(text, "off") == 0) return *mode = SCHED_ADMIT_OUTPUT_OFF, 0;
    if (strcmp(text, "auto") == 0) return *mode = SCHED_ADMIT_OUTPUT_AUTO, 0;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 1 || v > (1L << 20)) return -1;
    *mode = (int)v;
    return 0;
}

const char *sched_admit_output_name(int mode, char *buf, int cap) {
    if (mode == SCHED_ADMIT_OUTPUT_OFF) return "off";
    if (mode == SCHED_ADMIT_OUTPUT_AUTO) return "auto";
    snprintf(buf, (size_t)cap, "%d", mode);
    return buf;
}

int sched_admit_expected_output(const SchedAdmit *a, int max_tokens) {
    long e;
    if (a->output_tokens > 0) e = a->output_tokens;
    else if (a->output_tokens == SCHED_ADMIT_OUTPUT_AUTO && a->finished > 0)
        e = (long)((a->output_sum + a->finished - 1) / a->finished); /* the mean, rounded up */
    else e = max_tokens;
    return e < max_tokens ? (int)e : max_tokens;
}

int sched_admit_blocks_due(const SchedAdmit *a, int n_prompt, int max_tokens, int held, int block_size) {
    if (!sched_admit_on(a) || block_size <= 0) return 0;
    /* Counts the last generated token too, whose K/V is never written: at most one block more
     * than strictly needed, which keeps the rule on the safe side of a preemption. */
    long tokens = (long)n_prompt + sched_admit_expected_output(a, max_tokens);
    long due = (tokens + block_size - 1) / block_size - held;
    return due > 0 ? (int)due : 0;
}

void sched_admit_learn(SchedAdmit *a, int generated) {
    if (a->output_tokens != SCHED_ADMIT_OUTPUT_AUTO || generated < 0) return;
    a->finished++;
    a->output_sum += (uint64_t)generated;
}

bool sched_admit_defer(SchedAdmit *a, int room, int due, int n_running) {
    if (!sched_admit_on(a) || n_running == 0 || room >= due) return false;
    a->deferrals++;
    return true;
}
