/*
 * braid-bench — the load driver: replays request files and drives agent workloads against a Braid
 * (or any OpenAI-compatible) server over HTTP, compares servers side by side, generates dry traces,
 * and plots runs. This entry point dispatches subcommands;
 * each returns the exit status (0 ok, 1 runtime failure, 2 usage error) and prints its own --help.
 */
#include <stdio.h>
#include <string.h>

#include "compare.h"
#include "gen.h"
#include "http_client.h"
#include "plot.h"
#include "replay.h"
#include "run.h"

static const char usage[] =
    "usage: braid-bench <command> [options]\n"
    "\n"
    "commands:\n"
    "  replay   send a `braid batch` input file to a server with C concurrent clients; results in braid batch's format\n"
    "  run      drive a workload's agent workflows against a server; per-request log, summary, replayable trace\n"
    "  gen      write a workload's trace without a server (dry run with synthetic outputs)\n"
    "  plot     chart runs side by side: cache hit rate over time and the latency CDF (PNG, via gnuplot)\n"
    "  compare  the same requests against several OpenAI-compatible servers in interleaved rounds: ratios\n"
    "           to the first server with their spread, a table, a plot, vLLM-shaped JSON\n"
    "\n"
    "Run 'braid-bench <command> --help' for the options of one command.\n";

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = {{"replay", replay_main}, {"run", run_main}, {"gen", bench_gen_main}, {"plot", plot_main}, {"compare", compare_main}};
    BraidError err;
    /* libcurl's global state must be set up before any thread exists. */
    if (http_client_global_init(&err)) {
        fprintf(stderr, "braid-bench: %s\n", err.msg);
        return 1;
    }
    int status = -1;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) status = commands[i].run(argc - 1, argv + 1);
    if (status < 0) {
        fprintf(stderr, "braid-bench: unknown command '%s'\n\n%s", argv[1], usage);
        status = 2;
    }
    http_client_global_cleanup();
    return status;
}
