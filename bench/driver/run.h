/*
 * run.h — `braid-bench run`: drives one workload's agent workflows against a live server (at most
 * C active at once) and records what happened: DIR/requests.jsonl, workflows.jsonl, summary.json,
 * trace.jsonl (replayable by `braid sim`), and a summary table on stderr, with a progress line
 * while it runs.
 * Called by: bench_main.c. Returns the exit status (0 ok; 1 when the run failed or any request or
 * workflow end failed; 2 usage error).
 */
#ifndef BRAID_BENCH_DRIVER_RUN_H
#define BRAID_BENCH_DRIVER_RUN_H

int run_main(int argc, char **argv);

#endif
