#include "model/model.h"

#include <string.h>

#include "model/synthetic_model.h"

/* A synthetic model (synthetic_model.h): the tokenizer and chat template of a real GGUF (its
 * weights are never read), the shape's matrices without data, the vocabulary the tokenizer's. */
static int load_synthetic(const char *spec, BraidModel *m, BraidError *err) {
    char tokenizer_path[4096];
    ModelWeights probe; /* an unknown name is the error to report, before any file is looked for */
    if (synthetic_model_create(spec, 0, &probe, err)) return -1;
    synthetic_model_free(&probe);
    if (synthetic_model_tokenizer_path(spec, tokenizer_path, sizeof tokenizer_path, err)) return -1;
    if (gguf_open(tokenizer_path, &m->gguf, err) || tokenizer_load(m->gguf, &m->tokenizer, err) ||
        chat_template_load(m->gguf, &m->chat, err)) {
        braid_error_wrap(err, "%s: its tokenizer %s", spec, tokenizer_path);
        braid_model_free(m);
        return -1;
    }
    if (synthetic_model_create(spec, m->tokenizer.n_vocab, &m->weights, err)) {
        braid_model_free(m);
        return -1;
    }
    m->chat.strip_bos = m->tokenizer.add_bos;
    return 0;
}

int braid_model_load(const char *path, BraidModel *m, BraidError *err) {
    memset(m, 0, sizeof *m);
    if (synthetic_model_spec(path)) return load_synthetic(path, m, err);
    ModelConfig cfg;
    if (gguf_open(path, &m->gguf, err)) return -1;
    if (model_config_from_gguf(m->gguf, &cfg, err) || model_weights_load(m->gguf, &cfg, &m->weights, err) ||
        tokenizer_load(m->gguf, &m->tokenizer, err) || chat_template_load(m->gguf, &m->chat, err)) {
        braid_error_wrap(err, "%s", path);
        braid_model_free(m);
        return -1;
    }
    if (m->tokenizer.n_vocab != cfg.vocab_size) {
        braid_error_set(err, "%s: tokenizer has %d tokens but the model's vocabulary is %d", path, m->tokenizer.n_vocab,
                        cfg.vocab_size);
        braid_model_free(m);
        return -1;
    }
    /* The tokenizer adds BOS itself when the model wants one: a template's {{ bos_token }} is dropped. */
    m->chat.strip_bos = m->tokenizer.add_bos;
    return 0;
}

void braid_model_free(BraidModel *m) {
    chat_template_free(&m->chat);
    tokenizer_free(&m->tokenizer);
    if (m->weights.layers) model_weights_free(&m->weights);
    gguf_close(m->gguf);
    memset(m, 0, sizeof *m);
}
