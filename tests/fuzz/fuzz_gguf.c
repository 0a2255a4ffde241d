/*
 * Fuzz target for the GGUF reader and everything that consumes its metadata: the model config
 * and the tokenizer (then a short encode/decode). Built as a libFuzzer binary with -DBRAID_FUZZ=ON
 * (clang), and replayed over the seed corpus plus random mutations by replay_main.c in every CI run.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink; /* keeps the touched bytes from being optimized away */

static void touch_value(const GgufValue *v) {
    if (v->type != GGUF_TYPE_ARRAY) {
        sink += v->u64;
        return;
    }
    for (uint64_t i = 0; i < v->arr.count; i++) {
        if (v->arr.strings) sink += v->arr.strings[i].len ? (uint8_t)v->arr.strings[i].data[v->arr.strings[i].len - 1] : 0;
        else if (v->arr.items) touch_value(&v->arr.items[i]);
        else if (v->arr.elem_type != GGUF_TYPE_STRING) sink += (uint64_t)gguf_array_get_int(v, i);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    GgufFile *f;
    BraidError err;
    if (gguf_open_memory(data, size, &f, &err)) return 0;
    for (uint64_t i = 0; i < f->n_kv; i++) touch_value(&f->kvs[i].value);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const uint8_t *t = f->tensors[i].data;
        if (f->tensors[i].nbytes) sink += t[0] + t[f->tensors[i].nbytes - 1];
    }
    ModelConfig cfg;
    (void)model_config_from_gguf(f, &cfg, &err);
    Tokenizer tok;
    if (tokenizer_load(f, &tok, &err) == 0) {
        static const char text[] = "Hello, world! 123 <s> <|im_start|> \xc3\xa9\xe4\xb8\xad \xff";
        TokenList ids = {0};
        if (tokenizer_encode(&tok, text, sizeof text - 1, true, true, &ids, &err) == 0) {
            size_t len;
            free(tokenizer_decode(&tok, ids.ids, ids.n, &len));
        }
        free(ids.ids);
        tokenizer_free(&tok);
    }
    gguf_close(f);
    return 0;
}
