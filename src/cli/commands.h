/*
 * commands.h — the `braid` subcommands. Each takes argc/argv after the subcommand name and returns
 * the process exit status (0 ok, 1 runtime failure, 2 usage error); each prints its own --help.
 * Program output goes to stdout, diagnostics and statistics to stderr.
 */
#ifndef BRAID_CLI_COMMANDS_H
#define BRAID_CLI_COMMANDS_H

int cmd_info(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_sim(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_train_predictor(int argc, char **argv);
int cmd_manifest(int argc, char **argv);

#endif
