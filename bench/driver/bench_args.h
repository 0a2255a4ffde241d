/*
 * bench_args.h — strict parsing for braid-bench's options: a number's whole text must parse and lie
 * in [lo, hi], a switch's be "on" or "off"; otherwise a message naming the subcommand, the flag, the range and the text goes to
 * stderr and -1 comes back (the caller exits 2). Stateless; any thread.
 */
#ifndef BRAID_BENCH_DRIVER_BENCH_ARGS_H
#define BRAID_BENCH_DRIVER_BENCH_ARGS_H

/* cmd: "replay", "run", ... as the message names it. */
int bench_parse_int(const char *cmd, const char *flag, const char *text, long lo, long hi, long *out);
int bench_parse_float(const char *cmd, const char *flag, const char *text, double lo, double hi, double *out);
/* "on" -> *on = 1, "off" -> *on = 0. */
int bench_parse_on_off(const char *cmd, const char *flag, const char *text, int *on);

#endif
