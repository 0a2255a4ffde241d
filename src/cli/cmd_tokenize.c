/* braid tokenize / detokenize — stdin to stdout conversions through the model's tokenizer. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

static const char tokenize_usage[] =
    "usage: braid tokenize [--model PATH] [--no-special] [--bos | --no-bos] < text\n"
    "  Prints the token ids of stdin, separated by spaces, then a newline.\n"
    "  --no-special   treat special-token text such as <|im_start|> as plain text\n"
    "  --bos/--no-bos force or suppress the BOS token (default: what the model asks for)\n";

static const char detokenize_usage[] =
    "usage: braid detokenize [--model PATH] < ids\n"
    "  Reads token ids (separated by whitespace) and writes their text to stdout exactly.\n";

/* Only the tokenizer is needed: no weights are validated, so this also works on vocab-only files. */
static int open_tokenizer(const char *cmd, const char *model_flag, GgufFile **gguf, Tokenizer *tok) {
    BraidError err;
    const char *path = cli_model_path(model_flag);
    if (gguf_open(path, gguf, &err) == 0 && tokenizer_load(*gguf, tok, &err) == 0) return 0;
    fprintf(stderr, "braid %s: %s\n", cmd, err.msg);
    gguf_close(*gguf);
    return -1;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model_flag = NULL;
    int parse_special = 1, bos = -1;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"no-special", no_argument, 0, 's'},
                                         {"bos", no_argument, 0, 'b'}, {"no-bos", no_argument, 0, 'n'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        if (c == 'm') model_flag = optarg;
        else if (c == 's') parse_special = 0;
        else if (c == 'b') bos = 1;
        else if (c == 'n') bos = 0;
        else if (c == 'h') { fputs(tokenize_usage, stdout); return 0; }
        else { fputs(tokenize_usage, stderr); return 2; }
    }
    GgufFile *gguf = NULL;
    Tokenizer tok;
    if (open_tokenizer("tokenize", model_flag, &gguf, &tok)) return 1;
    size_t len;
    char *text = cli_read_stdin(&len);
    TokenList ids = {0};
    BraidError err;
    int rc = 1;
    if (!text) fprintf(stderr, "braid tokenize: cannot read stdin\n");
    else if (tokenizer_encode(&tok, text, len, parse_special, bos < 0 ? tok.add_bos : bos == 1, &ids, &err))
        fprintf(stderr, "braid tokenize: %s\n", err.msg);
    else {
        for (int i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.ids[i]);
        printf("\n");
        rc = 0;
    }
    free(text);
    free(ids.ids);
    tokenizer_free(&tok);
    gguf_close(gguf);
    return rc;
}

static int parse_ids(const char *text, const Tokenizer *tok, TokenList *ids) {
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',') p++;
        if (!*p) return 0;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= tok->n_vocab) {
            fprintf(stderr, "braid detokenize: '%.*s' is not a token id in [0, %d)\n", (int)strcspn(p, " \t\r\n,"), p,
                    tok->n_vocab);
            return -1;
        }
        if (token_list_push(ids, (int32_t)v)) return -1;
        p = end;
    }
}

int cmd_detokenize(int argc, char **argv) {
    const char *model_flag = NULL;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        if (c == 'm') model_flag = optarg;
        else if (c == 'h') { fputs(detokenize_usage, stdout); return 0; }
        else { fputs(detokenize_usage, stderr); return 2; }
    }
    GgufFile *gguf = NULL;
    Tokenizer tok;
    if (open_tokenizer("detokenize", model_flag, &gguf, &tok)) return 1;
    size_t len;
    char *text = cli_read_stdin(&len);
    TokenList ids = {0};
    int rc = 1;
    if (!text) fprintf(stderr, "braid detokenize: cannot read stdin\n");
    else if (parse_ids(text, &tok, &ids) == 0) {
        size_t out_len;
        char *out = tokenizer_decode(&tok, ids.ids, ids.n, &out_len);
        if (out) {
            fwrite(out, 1, out_len, stdout);
            rc = 0;
        }
        free(out);
    }
    free(text);
    free(ids.ids);
    tokenizer_free(&tok);
    gguf_close(gguf);
    return rc;
}
