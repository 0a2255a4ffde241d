/*
 * replay.h — `braid-bench replay`: sends a `braid batch` input file to a server with C concurrent
 * clients and writes results in `braid batch`'s output format, so the two compare line by line.
 *
 * C client threads, each with its own connection, take requests from one shared queue in input
 * order; all start at one instant t0, and TTFT and latency are measured from t0, as braid batch
 * measures from its start (one wave of C requests with C clients compares directly). Results go
 * out in input order. The summary on stderr times each request from its own send (TTFT, TPOT, ITL,
 * E2EL with percentiles, goodput under --slo-*; bench_metrics.h), as other tools do, and
 * --result-json writes it in `vllm bench serve`'s JSON shape. The rounds run in replay_round.c.
 * Called by: bench_main.c. Returns the exit status (0, 1 runtime failure, 2 usage error).
 */
#ifndef BRAID_BENCH_DRIVER_REPLAY_H
#define BRAID_BENCH_DRIVER_REPLAY_H

int replay_main(int argc, char **argv);

#endif
