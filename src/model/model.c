#include "model/model.h"

#include <string.h>

int braid_model_load(const char *path, BraidModel *m, BraidError *err) {
    memset(m, 0, sizeof *m);
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
