/*
 * gen.h — `braid-bench gen`: the dry trace generator. Runs a workload (bench/workloads) without a
 * server: at most C workflows at once, synthetic outputs of the calls' expected lengths, every
 * prompt tokenized with the model's real tokenizer (only the tokenizer is loaded), arrival times
 * from a simple per-token time model. Writes the trace (docs/TRACE_FORMAT.md) through
 * src/sim/trace_writer.h, lines sorted by arrival time, for `braid sim`.
 *
 * Called by bench_main.c with argv[0] == "gen". Returns the exit status: 0 ok, 1 runtime failure
 * (model, file, workload error), 2 usage error. Prints its own --help.
 */
#ifndef BRAID_BENCH_DRIVER_GEN_H
#define BRAID_BENCH_DRIVER_GEN_H

int bench_gen_main(int argc, char **argv);

#endif
