/*
 * braid — serving cluster for LLM agent workflows. This entry point dispatches subcommands.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const char usage[] =
    "usage: braid <command> [options]\n"
    "\n"
    "commands:\n"
    "  info        describe a GGUF model: architecture, dimensions, RoPE, tensors, tokenizer, chat template\n"
    "  generate    complete a prompt on the CPU (completion on stdout, statistics on stderr)\n"
    "  tokenize    text on stdin -> token ids on stdout\n"
    "  detokenize  token ids on stdin -> text on stdout\n"
    "  batch       serve a JSONL file of requests offline (paged KV pool, radix prefix cache with a host-memory\n"
    "              tier, continuous batching)\n"
    "  serve       the cluster under mpirun: OpenAI-compatible HTTP API on rank 0, model instances on the rest\n"
    "  sim         replay a request trace through the cache code (LRU or the Belady bound), no model\n"
    "  train-predictor  learn the Markov next-agent predictor from request traces and report its accuracy\n"
    "  manifest    export a cache manifest of hot chunks (from a server or from traces) for serve --warm-start\n"
    "\n"
    "Run 'braid <command> --help' for the options of one command.\n"
    "The model defaults to $BRAID_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf.\n";

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    static const struct { const char *name; int (*run)(int, char **); } commands[] = {
        {"info", cmd_info}, {"generate", cmd_generate}, {"tokenize", cmd_tokenize}, {"detokenize", cmd_detokenize}, {"batch", cmd_batch}, {"sim", cmd_sim},
        {"serve", cmd_serve}, {"train-predictor", cmd_train_predictor}, {"manifest", cmd_manifest},
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "braid: unknown command '%s'\n\n%s", argv[1], usage);
    return 2;
}
