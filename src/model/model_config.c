#include "model/model_config.h"

#include <stdio.h>
#include <string.h>

static int require_int(const GgufFile *f, const char *arch, const char *suffix, int *out, BraidError *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    if (gguf_get_int(f, key, &v)) return braid_error_set(err, "model: required metadata '%s' missing or not an integer", key);
    if (v <= 0 || v > (1 << 30)) return braid_error_set(err, "model: metadata '%s' = %lld is out of range", key, (long long)v);
    *out = (int)v;
    return 0;
}

static int optional_int(const GgufFile *f, const char *arch, const char *suffix, int fallback) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    return gguf_get_int(f, key, &v) == 0 && v > 0 && v < (1 << 30) ? (int)v : fallback;
}

static double optional_float(const GgufFile *f, const char *arch, const char *suffix, double fallback) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    return gguf_get_float(f, key, &v) == 0 ? v : fallback;
}

static void copy_gguf_string(const GgufFile *f, const char *key, char *dst, size_t cap, const char *fallback) {
    GgufString s;
    if (gguf_get_string(f, key, &s) == 0) {
        size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
        memcpy(dst, s.data, n);
        dst[n] = '\0';
    } else {
        snprintf(dst, cap, "%s", fallback);
    }
}

static int read_rope_scaling(const GgufFile *f, ModelConfig *cfg, BraidError *err) {
    char key[128], type[32];
    cfg->rope_position_scale = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", cfg->arch);
    copy_gguf_string(f, key, type, sizeof type, "none");
    double factor = optional_float(f, cfg->arch, "rope.scaling.factor", 0.0);
    if (factor <= 0.0) factor = optional_float(f, cfg->arch, "rope.scale_linear", 1.0);
    if (strcmp(type, "none") == 0 || strcmp(type, "linear") == 0) {
        if (factor <= 0.0) return braid_error_set(err, "model: rope scaling factor %g must be positive", factor);
        if (strcmp(type, "linear") == 0 || factor != 1.0) cfg->rope_position_scale = (float)(1.0 / factor);
        return 0;
    }
    return braid_error_set(err, "model: RoPE scaling type '%s' is not supported (none and linear are; llama3-style "
                                "scaling comes from the rope_freqs tensor)", type);
}

static const struct {
    const char *name;
    ModelArch kind;
} known_archs[] = {{"llama", MODEL_ARCH_LLAMA}, {"qwen2", MODEL_ARCH_QWEN2}, {"qwen3", MODEL_ARCH_QWEN3}};

const char *model_arch_supported_list(void) { return "llama, qwen2, qwen3"; }

static int read_arch(const GgufFile *f, ModelConfig *cfg, BraidError *err) {
    GgufString s;
    if (gguf_get_string(f, "general.architecture", &s) != 0)
        return braid_error_set(err, "model: general.architecture is missing (supported: %s)", model_arch_supported_list());
    for (size_t i = 0; i < sizeof known_archs / sizeof known_archs[0]; i++)
        if (s.len == strlen(known_archs[i].name) && memcmp(s.data, known_archs[i].name, s.len) == 0) {
            snprintf(cfg->arch, sizeof cfg->arch, "%s", known_archs[i].name);
            cfg->arch_kind = known_archs[i].kind;
            return 0;
        }
    int shown = s.len > 64 ? 64 : (int)s.len;
    return braid_error_set(err, "model: architecture '%.*s' is not supported (supported: %s)", shown, s.data,
                           model_arch_supported_list());
}

/* Per-architecture structure: RoPE pairing, Q/K/V bias, Q/K norm, head size. */
static int read_arch_layout(const GgufFile *f, ModelConfig *cfg, BraidError *err) {
    /* GGUF writers permute llama's Q/K rows for interleaved pairs; qwen2/qwen3 stay in HF's NEOX order. */
    cfg->rope_pairing = cfg->arch_kind == MODEL_ARCH_LLAMA ? ROPE_PAIRING_INTERLEAVED : ROPE_PAIRING_HALF_SPLIT;
    cfg->qkv_bias = cfg->arch_kind == MODEL_ARCH_QWEN2 || gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL;
    cfg->qk_norm = cfg->arch_kind == MODEL_ARCH_QWEN3;
    int value_length = optional_int(f, cfg->arch, "attention.value_length", cfg->head_dim);
    if (value_length != cfg->head_dim)
        return braid_error_set(err, "model: %s.attention.value_length %d differs from the key length %d (not supported)",
                               cfg->arch, value_length, cfg->head_dim);
    cfg->sliding_window = optional_int(f, cfg->arch, "attention.sliding_window", 0);
    if (cfg->sliding_window > 0 && cfg->sliding_window < cfg->context_length) cfg->context_length = cfg->sliding_window;
    return 0;
}

int model_config_from_gguf(const GgufFile *f, ModelConfig *cfg, BraidError *err) {
    memset(cfg, 0, sizeof *cfg);
    copy_gguf_string(f, "general.name", cfg->name, sizeof cfg->name, "(unnamed)");
    if (read_arch(f, cfg, err)) return -1;
    if (require_int(f, cfg->arch, "block_count", &cfg->n_layers, err) ||
        require_int(f, cfg->arch, "embedding_length", &cfg->dim, err) ||
        require_int(f, cfg->arch, "feed_forward_length", &cfg->ff_dim, err) ||
        require_int(f, cfg->arch, "attention.head_count", &cfg->n_heads, err))
        return -1;
    cfg->n_kv_heads = optional_int(f, cfg->arch, "attention.head_count_kv", cfg->n_heads);
    cfg->head_dim = optional_int(f, cfg->arch, "attention.key_length", cfg->dim / cfg->n_heads);
    cfg->context_length = optional_int(f, cfg->arch, "context_length", 2048);
    cfg->rope_dim = optional_int(f, cfg->arch, "rope.dimension_count", cfg->head_dim);
    cfg->rope_base = (float)optional_float(f, cfg->arch, "rope.freq_base", 10000.0);
    cfg->norm_eps = (float)optional_float(f, cfg->arch, "attention.layer_norm_rms_epsilon", 1e-5);
    const GgufValue *tokens = gguf_find(f, "tokenizer.ggml.tokens");
    cfg->vocab_size = optional_int(f, cfg->arch, "vocab_size", tokens && tokens->type == GGUF_TYPE_ARRAY ? (int)tokens->arr.count : 0);
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return braid_error_set(err, "model: %d attention heads are not a multiple of %d KV heads", cfg->n_heads, cfg->n_kv_heads);
    if (cfg->rope_dim > cfg->head_dim || cfg->rope_dim % 2 != 0)
        return braid_error_set(err, "model: RoPE dimension %d must be even and at most the head size %d", cfg->rope_dim, cfg->head_dim);
    if (cfg->vocab_size <= 0) return braid_error_set(err, "model: vocabulary size unknown (no tokenizer.ggml.tokens)");
    if (cfg->rope_base <= 0.0f) return braid_error_set(err, "model: rope.freq_base %g must be positive", cfg->rope_base);
    if (read_arch_layout(f, cfg, err)) return -1;
    return read_rope_scaling(f, cfg, err);
}

const char *rope_pairing_name(RopePairing pairing) {
    return pairing == ROPE_PAIRING_INTERLEAVED ? "interleaved (2i, 2i+1)" : "half-split (i, i+d/2)";
}
