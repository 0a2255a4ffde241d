/*
 * compare.h — `braid-bench compare URL_A URL_B ...`: the same workload (a `braid batch` input file)
 * against several OpenAI-compatible servers, side by side.
 *
 * Rounds are interleaved: round r runs the file against every server in turn, starting with server
 * r mod S, so no server always goes first (warm caches, a neighbour's load). Each run is measured
 * per request from its own send (bench_metrics.h). Per metric and round, the ratio of each server's
 * figure to the first server's in that round; over the rounds, the median ratio and its spread
 * (min, max). A table goes to stdout; --plot writes a PNG of the ratios with their spread (gnuplot);
 * --result-json writes every run in `vllm bench serve`'s shape plus the ratios. Cached-token counts
 * are shown with a note: their granularity differs by server (Braid counts whole KV blocks).
 * Exit status: 0; 1 when a request failed or an output could not be written; 2 on a usage error.
 * Called by: bench_main.c.
 */
#ifndef BRAID_BENCH_DRIVER_COMPARE_H
#define BRAID_BENCH_DRIVER_COMPARE_H

int compare_main(int argc, char **argv);

#endif
