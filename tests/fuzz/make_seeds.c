/*
 * Writes the GGUF fuzz seed corpus (small valid files that reach deep into the reader, the config
 * loader and both tokenizer models) into the directory given:  make_seeds tests/fuzz/corpus_gguf
 * With --lora, the LoRA adapter corpus instead (adapters for fuzz_lora_base.h's model: F32, F16
 * and BF16 pairs, one adapter with every projection, and near misses the loader refuses):
 *   make_seeds --lora tests/fuzz/corpus_lora
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_lora_base.h"
#include "gguf_writer.h"
#include "model/lora_adapter.h"
#include "model/tensor_types.h"

static void save(const char *dir, const char *name, GgufWriter *w) {
    size_t size;
    uint8_t *buf = gw_finish(w, &size);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, size, f) != size) {
        fprintf(stderr, "make_seeds: cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
    free(buf);
}

static void llama_metadata(GgufWriter *w) {
    gw_kv_str(w, "general.architecture", "llama");
    gw_kv_u32(w, "llama.block_count", 1);
    gw_kv_u32(w, "llama.embedding_length", 32);
    gw_kv_u32(w, "llama.feed_forward_length", 64);
    gw_kv_u32(w, "llama.attention.head_count", 4);
    gw_kv_u32(w, "llama.attention.head_count_kv", 2);
    gw_kv_f32(w, "llama.rope.freq_base", 10000.0f);
    gw_kv_str(w, "llama.rope.scaling.type", "linear");
    gw_kv_f32(w, "llama.rope.scaling.factor", 2.0f);
}

/* One adapter pair of projection p in layer l, rank r, of tensor type (F32, F16 or BF16). */
static void lora_pair(GgufWriter *w, int layer, LoraProj p, int rank, uint32_t type) {
    ModelConfig base = fuzz_lora_base();
    int in, out;
    lora_proj_dims(&base, p, &in, &out);
    static uint8_t values[8 * 64 * 4];
    for (size_t i = 0; i < sizeof values / 4; i++) {
        float v = (float)((i * 37) % 17) / 16.0f - 0.5f;
        if (type == TENSOR_F32) memcpy(values + 4 * i, &v, 4);
        else { /* F16 / BF16 halves of small values: an exponent that reads as a normal number either way */
            uint16_t h = (uint16_t)(0x3800 + (i * 131) % 0x400);
            memcpy(values + 2 * i, &h, 2);
        }
    }
    size_t elem = type == TENSOR_F32 ? 4 : 2;
    char name[64];
    uint64_t ne_a[2] = {(uint64_t)in, (uint64_t)rank}, ne_b[2] = {(uint64_t)rank, (uint64_t)out};
    snprintf(name, sizeof name, "blk.%d.%s.weight.lora_a", layer, lora_proj_stem(p));
    gw_tensor(w, name, type, 2, ne_a, values, (size_t)in * rank * elem);
    snprintf(name, sizeof name, "blk.%d.%s.weight.lora_b", layer, lora_proj_stem(p));
    gw_tensor(w, name, type, 2, ne_b, values, (size_t)out * rank * elem);
}

static void lora_header(GgufWriter *w) {
    gw_init(w);
    gw_kv_str(w, "general.architecture", "llama");
    gw_kv_str(w, "general.type", "adapter");
    gw_kv_str(w, "adapter.type", "lora");
    gw_kv_f32(w, "adapter.lora.alpha", 4.0f);
}

static int write_lora_seeds(const char *dir) {
    GgufWriter w;
    lora_header(&w); /* one F32 pair */
    lora_pair(&w, 0, LORA_PROJ_Q, 2, TENSOR_F32);
    save(dir, "q_f32.gguf", &w);
    lora_header(&w); /* every projection of both layers, F16 */
    for (int l = 0; l < 2; l++)
        for (int p = 0; p < LORA_PROJ_COUNT; p++) lora_pair(&w, l, (LoraProj)p, 2, TENSOR_F16);
    save(dir, "all_f16.gguf", &w);
    lora_header(&w); /* BF16, rank 1, K and V of the last layer */
    lora_pair(&w, 1, LORA_PROJ_K, 1, TENSOR_BF16);
    lora_pair(&w, 1, LORA_PROJ_V, 1, TENSOR_BF16);
    save(dir, "kv_bf16_rank1.gguf", &w);
    lora_header(&w); /* refused: ranks differ between pairs */
    lora_pair(&w, 0, LORA_PROJ_Q, 2, TENSOR_F32);
    lora_pair(&w, 0, LORA_PROJ_O, 3, TENSOR_F32);
    save(dir, "mixed_rank.gguf", &w);
    lora_header(&w); /* refused: an MLP tensor */
    lora_pair(&w, 0, LORA_PROJ_V, 2, TENSOR_F32);
    uint64_t ne[2] = {8, 2};
    static const float zeros[16];
    gw_tensor(&w, "blk.0.ffn_up.weight.lora_a", TENSOR_F32, 2, ne, zeros, sizeof zeros);
    save(dir, "mlp_tensor.gguf", &w);
    lora_header(&w); /* refused: the first fuzz finding, an infinite F16 weight (0x7C00) in B */
    lora_pair(&w, 0, LORA_PROJ_K, 1, TENSOR_F16);
    uint16_t a16[8] = {0}, b16[4] = {0, 0x7C00, 0, 0};
    uint64_t ne_a[2] = {8, 1}, ne_b[2] = {1, 4};
    gw_tensor(&w, "blk.1.attn_v.weight.lora_a", TENSOR_F16, 2, ne_a, a16, sizeof a16);
    gw_tensor(&w, "blk.1.attn_v.weight.lora_b", TENSOR_F16, 2, ne_b, b16, sizeof b16);
    save(dir, "regress-inf-weight.gguf", &w);
    printf("make_seeds: wrote 6 LoRA seeds to %s\n", dir);
    return 0;
}

static int write_gguf_seeds(const char *dir) {
    GgufWriter w;

    gw_init(&w); /* empty file: header only */
    save(dir, "empty.gguf", &w);

    gw_init(&w); /* every scalar type, arrays, nesting */
    llama_metadata(&w);
    gw_kv_bool(&w, "b", 1);
    gw_kv_f64(&w, "f64", 1.0);
    gw_kv_u64(&w, "u64", 7);
    gw_kv_array_begin(&w, "nested", 9, 2);
    gw_arr_array_begin(&w, 8, 1); gw_arr_str(&w, "x");
    gw_arr_array_begin(&w, 5, 2); gw_arr_i32(&w, 1); gw_arr_i32(&w, 2);
    save(dir, "metadata.gguf", &w);

    gw_init(&w); /* one tensor of each supported type */
    static uint8_t data[4096];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 31);
    const uint32_t types[] = {TENSOR_F32,  TENSOR_F16,  TENSOR_BF16, TENSOR_Q4_0, TENSOR_Q4_1,
                              TENSOR_Q5_0, TENSOR_Q8_0, TENSOR_Q4_K, TENSOR_Q5_K, TENSOR_Q6_K};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        uint64_t ne[2] = {256, 2};
        char name[32];
        snprintf(name, sizeof name, "tensor.%s", tensor_type_name(types[t]));
        gw_tensor(&w, name, types[t], 2, ne, data, tensor_row_bytes(types[t], 256) * 2);
    }
    save(dir, "tensors.gguf", &w);

    gw_init(&w); /* gpt2 byte-level tokenizer with merges and a special token */
    gw_kv_str(&w, "tokenizer.ggml.model", "gpt2");
    gw_kv_str(&w, "tokenizer.ggml.pre", "smollm");
    gw_kv_array_begin(&w, "tokenizer.ggml.tokens", 8, 6);
    gw_arr_str(&w, "<s>"); gw_arr_str(&w, "H"); gw_arr_str(&w, "e"); gw_arr_str(&w, "He"); gw_arr_str(&w, "\xC4\xA0"); gw_arr_str(&w, "1");
    gw_kv_array_begin(&w, "tokenizer.ggml.token_type", 5, 6);
    gw_arr_i32(&w, 3); for (int i = 0; i < 5; i++) gw_arr_i32(&w, 1);
    gw_kv_array_begin(&w, "tokenizer.ggml.merges", 8, 1);
    gw_arr_str(&w, "H e");
    gw_kv_u32(&w, "tokenizer.ggml.bos_token_id", 0);
    gw_kv_str(&w, "tokenizer.chat_template", "<|im_start|>system\nDefault<|im_end|> != 'system'");
    save(dir, "tokenizer_gpt2.gguf", &w);

    gw_init(&w); /* SentencePiece tokenizer with byte fallback */
    gw_kv_str(&w, "tokenizer.ggml.model", "llama");
    gw_kv_array_begin(&w, "tokenizer.ggml.tokens", 8, 8);
    gw_arr_str(&w, "<unk>"); gw_arr_str(&w, "<s>"); gw_arr_str(&w, "</s>"); gw_arr_str(&w, "<0x41>");
    gw_arr_str(&w, "\xE2\x96\x81"); gw_arr_str(&w, "\xE2\x96\x81H"); gw_arr_str(&w, "H"); gw_arr_str(&w, "e");
    gw_kv_array_begin(&w, "tokenizer.ggml.scores", 6, 8);
    for (int i = 0; i < 8; i++) gw_arr_f32(&w, (float)-i);
    gw_kv_array_begin(&w, "tokenizer.ggml.token_type", 5, 8);
    gw_arr_i32(&w, 2); gw_arr_i32(&w, 3); gw_arr_i32(&w, 3); gw_arr_i32(&w, 6);
    for (int i = 0; i < 4; i++) gw_arr_i32(&w, 1);
    gw_kv_u32(&w, "tokenizer.ggml.unknown_token_id", 0);
    save(dir, "tokenizer_spm.gguf", &w);

    gw_init(&w); /* version 2, custom alignment */
    w.version = 2;
    w.alignment = 64;
    gw_kv_u32(&w, "general.alignment", 64);
    uint64_t ne1[1] = {32};
    gw_tensor(&w, "v", TENSOR_F32, 1, ne1, data, 128);
    save(dir, "v2_align64.gguf", &w);
    printf("make_seeds: wrote 6 seeds to %s\n", dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--lora") == 0) return write_lora_seeds(argv[2]);
    if (argc == 2) return write_gguf_seeds(argv[1]);
    fprintf(stderr, "usage: make_seeds DIR | make_seeds --lora DIR\n");
    return 2;
}
