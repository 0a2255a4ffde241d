/*
 * Fuzz target for LoRA adapter files (lora_adapter_load, src/model/lora_adapter.c: llama.cpp's
 * GGUF adapter layout checked against a base model): the input is loaded as an adapter for the
 * small base model of fuzz_lora_base.h. An accepted adapter must keep what lora_adapter.h
 * promises: a rank in 1..LORA_MAX_RANK, a finite positive alpha and scale = alpha / rank, every
 * projection's pair complete or absent with at least one present, every value finite (a NaN or
 * infinite weight would poison every sequence that uses the adapter), and `bytes` equal to the
 * fp32 memory the pairs take. A refused one must say why, naming the file, and leave the adapter
 * zeroed. Any broken promise calls abort(). Replayed over corpus_lora/ (written by
 * `make_seeds --lora`) plus mutations in every CI run.
 */
#include "fuzz_input_file.h"

#include <math.h>
#include <string.h>

#include "fuzz_lora_base.h"
#include "model/lora_adapter.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken promise: say which, then abort (the fuzzer keeps the input). */
static void require(int ok, const char *promise, const char *detail) {
    if (ok) return;
    fprintf(stderr, "fuzz_lora_adapter: broken promise: %s (%s)\n", promise, detail ? detail : "");
    abort();
}

static bool all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

static void check_adapter(const LoraAdapter *ad, const ModelConfig *base) {
    require(ad->rank >= 1 && ad->rank <= LORA_MAX_RANK, "a rank in 1..LORA_MAX_RANK", NULL);
    require(isfinite(ad->alpha) && ad->alpha > 0, "a finite positive alpha", NULL);
    require(ad->scale == ad->alpha / (float)ad->rank, "scale = alpha / rank", NULL);
    require(ad->n_layers == base->n_layers && ad->name && strcmp(ad->name, "fuzz") == 0, "the base's layers and the given name", NULL);
    size_t bytes = 0;
    int pairs = 0;
    for (int l = 0; l < ad->n_layers; l++)
        for (int p = 0; p < LORA_PROJ_COUNT; p++) {
            const LoraPair *pair = &ad->pairs[(size_t)l * LORA_PROJ_COUNT + p];
            require(!pair->a == !pair->b, "a pair complete or absent", lora_proj_stem((LoraProj)p));
            if (!pair->a) continue;
            int in, out;
            lora_proj_dims(base, (LoraProj)p, &in, &out);
            size_t na = (size_t)ad->rank * (size_t)in, nb = (size_t)out * (size_t)ad->rank;
            require(all_finite(pair->a, na) && all_finite(pair->b, nb), "every adapter value finite", lora_proj_stem((LoraProj)p));
            bytes += (na + nb) * sizeof(float);
            pairs++;
        }
    require(pairs > 0, "at least one pair", NULL);
    require(bytes == ad->bytes, "bytes = the fp32 memory of the pairs", NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_input_file(data, size, path, sizeof path);
    ModelConfig base = fuzz_lora_base();
    LoraAdapter ad;
    BraidError err = {0};
    if (lora_adapter_load(path, "fuzz", &base, &ad, &err) == 0) {
        check_adapter(&ad, &base);
        lora_adapter_free(&ad);
    } else {
        require(err.msg[0] != '\0', "a refusal says why", NULL);
        require(strstr(err.msg, path) != NULL, "a refusal names the file", err.msg);
        require(ad.pairs == NULL && ad.name == NULL && ad.rank == 0, "a refused adapter left zeroed", err.msg);
    }
    close(fd);
    return 0;
}
