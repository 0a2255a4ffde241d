/* braid info — prints what a GGUF model is, without loading more than its metadata and tensor table. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "model/model.h"
#include "model/tensor_types.h"

static const char info_usage[] =
    "usage: braid info [--model PATH] [--tensors]\n"
    "  --model PATH   GGUF file (default: $BRAID_MODEL or " BRAID_DEFAULT_MODEL ")\n"
    "  --tensors      also list every tensor with its type, shape and size\n";

static void print_tensor_summary(const GgufFile *f, int list_all) {
    size_t bytes_by_type[64] = {0};
    int count_by_type[64] = {0};
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const GgufTensor *t = &f->tensors[i];
        if (t->type < 64) {
            bytes_by_type[t->type] += t->nbytes;
            count_by_type[t->type]++;
        }
        if (list_all)
            printf("  %-28s %-5s [%llu, %llu, %llu, %llu] %.2f MiB\n", t->name, tensor_type_name(t->type),
                   (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                   (unsigned long long)t->ne[3], (double)t->nbytes / (1 << 20));
    }
    printf("tensors:          %llu\n", (unsigned long long)f->n_tensors);
    for (int t = 0; t < 64; t++)
        if (count_by_type[t])
            printf("  %-6s          %4d tensors, %8.2f MiB\n", tensor_type_name((uint32_t)t), count_by_type[t],
                   (double)bytes_by_type[t] / (1 << 20));
}

static void print_model(const BraidModel *m, int list_all) {
    const ModelConfig *c = &m->weights.cfg;
    const Tokenizer *tok = &m->tokenizer;
    printf("name:             %s\n", c->name);
    printf("architecture:     %s\n", c->arch);
    printf("layers:           %d\n", c->n_layers);
    printf("embedding:        %d\n", c->dim);
    printf("feed-forward:     %d\n", c->ff_dim);
    printf("heads:            %d query, %d key/value (GQA group %d), head size %d\n", c->n_heads, c->n_kv_heads,
           c->n_heads / c->n_kv_heads, c->head_dim);
    printf("context length:   %d%s\n", c->context_length, c->sliding_window > 0 && c->sliding_window == c->context_length
                                                                ? " (the file's attention sliding window)" : "");
    if (c->qkv_bias || c->qk_norm)
        printf("attention:        %s%s%s\n", c->qkv_bias ? "Q/K/V bias" : "", c->qkv_bias && c->qk_norm ? ", " : "",
               c->qk_norm ? "per-head Q/K RMSNorm before RoPE" : "");
    printf("vocabulary:       %d\n", c->vocab_size);
    printf("rope:             base %g, %d of %d dims, pairing %s, position scale %g%s\n", c->rope_base, c->rope_dim,
           c->head_dim, rope_pairing_name(c->rope_pairing), c->rope_position_scale,
           m->weights.rope_freq_factors ? ", per-frequency factors (rope_freqs)" : "");
    printf("rms norm eps:     %g\n", c->norm_eps);
    printf("output head:      %s\n", m->weights.output_tied ? "tied to the token embedding" : "separate");
    print_tensor_summary(m->gguf, list_all);
    printf("weights:          %.2f MiB\n", (double)m->weights.total_bytes / (1 << 20));
    printf("tokenizer:        %s", tok->kind == TOKENIZER_BPE ? "gpt2 (byte-level BPE)" : "llama (SentencePiece BPE)");
    if (tok->kind == TOKENIZER_BPE) printf(", pre-tokenizer %s", tok->pre_name);
    printf(", %d special tokens\n", tok->n_special);
    printf("special ids:      bos %d, eos %d, unk %d, add bos %s; stop on", tok->bos_id, tok->eos_id, tok->unk_id,
           tok->add_bos ? "yes" : "no");
    for (int i = 0; i < tok->n_stop; i++)
        printf(" %d (%.*s)", tok->stop_ids[i], (int)tok->pieces[tok->stop_ids[i]].len, tok->pieces[tok->stop_ids[i]].data);
    printf("\nchat template:    %s%s%s%s%s\n", chat_template_kind_name(m->chat.kind),
           m->chat.default_system ? " (with a default system prompt)" : "", m->chat.reads_tools ? " (renders tools)" : "",
           m->chat.error ? "; does not compile: " : "", m->chat.error ? m->chat.error : "");
}

int cmd_info(int argc, char **argv) {
    const char *model_flag = NULL;
    int list_all = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"tensors", no_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:th", opts, NULL)) != -1) {
        if (c == 'm') model_flag = optarg;
        else if (c == 't') list_all = 1;
        else if (c == 'h') { fputs(info_usage, stdout); return 0; }
        else { fputs(info_usage, stderr); return 2; }
    }
    if (optind < argc) {
        fprintf(stderr, "braid info: unexpected argument '%s'\n%s", argv[optind], info_usage);
        return 2;
    }
    BraidModel model;
    BraidError err;
    const char *path = cli_model_path(model_flag);
    if (braid_model_load(path, &model, &err)) {
        fprintf(stderr, "braid info: %s\n", err.msg);
        return 1;
    }
    printf("file:             %s (GGUF v%u, %llu metadata keys)\n", path, model.gguf->version,
           (unsigned long long)model.gguf->n_kv);
    print_model(&model, list_all);
    braid_model_free(&model);
    return 0;
}
