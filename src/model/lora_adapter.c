#include "model/lora_adapter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/synthetic_lora.h"
#include "model/tensor_types.h"

static const char *const PROJ_STEMS[LORA_PROJ_COUNT] = {"attn_q", "attn_k", "attn_v", "attn_output"};

const char *lora_proj_stem(LoraProj proj) { return proj < LORA_PROJ_COUNT ? PROJ_STEMS[proj] : "?"; }

void lora_proj_dims(const ModelConfig *base, LoraProj proj, int *in, int *out) {
    int q_dim = base->n_heads * base->head_dim, kv_dim = base->n_kv_heads * base->head_dim;
    *in = proj == LORA_PROJ_O ? q_dim : base->dim;
    *out = proj == LORA_PROJ_Q ? q_dim : proj == LORA_PROJ_O ? base->dim : kv_dim;
}

/* A tensor name of the layout: layer, projection and half ('a' or 'b'); -1 when it is not one. */
static int parse_tensor_name(const char *name, int n_layers, int *layer, LoraProj *proj, char *half) {
    int l = -1, consumed = 0;
    char stem[32], h = 0;
    if (sscanf(name, "blk.%d.%31[a-z_].weight.lora_%c%n", &l, stem, &h, &consumed) != 3 || name[consumed] != '\0') return -1;
    if (l < 0 || l >= n_layers || (h != 'a' && h != 'b')) return -1;
    for (int p = 0; p < LORA_PROJ_COUNT; p++)
        if (strcmp(stem, PROJ_STEMS[p]) == 0) {
            *layer = l, *proj = (LoraProj)p, *half = h;
            return 0;
        }
    return -1;
}

/* Widens a 2-D F32/F16/BF16 tensor to fp32 (n elements, GGUF row-major). */
static float *widen_tensor(const GgufTensor *t, size_t n) {
    float *out = malloc(n * sizeof *out);
    if (!out) return NULL;
    const uint8_t *src = t->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        if (t->type == TENSOR_F32) {
            memcpy(&out[i], src + 4 * i, 4);
            continue;
        }
        memcpy(&h, src + 2 * i, 2);
        out[i] = t->type == TENSOR_F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
    return out;
}

typedef struct {
    const char *path;
    const ModelConfig *base;
    LoraAdapter *ad;
    BraidError *err;
} LoadCtx;

/* Checks one tensor's type, shape and rank against the base model, and keeps it as fp32. */
static int take_tensor(LoadCtx *lc, const GgufTensor *t) {
    int layer, in, out;
    LoraProj proj;
    char half;
    if (parse_tensor_name(t->name, lc->base->n_layers, &layer, &proj, &half))
        return braid_error_set(lc->err, "lora %s: tensor '%s' is not an attention LoRA tensor of this %d-layer model "
                                        "(expected blk.N.attn_{q,k,v,output}.weight.lora_{a,b})",
                               lc->path, t->name, lc->base->n_layers);
    if (t->type != TENSOR_F32 && t->type != TENSOR_F16 && t->type != TENSOR_BF16)
        return braid_error_set(lc->err, "lora %s: tensor '%s' has type %s (expected F32, F16 or BF16)", lc->path, t->name,
                               tensor_type_name(t->type));
    lora_proj_dims(lc->base, proj, &in, &out);
    /* ne[0] is the contiguous dimension: A is [in, rank], B is [rank, out]. */
    uint64_t width = half == 'a' ? t->ne[0] : t->ne[1], want = half == 'a' ? (uint64_t)in : (uint64_t)out;
    uint64_t rank = half == 'a' ? t->ne[1] : t->ne[0];
    if (t->n_dims != 2 || width != want || rank == 0 || rank > LORA_MAX_RANK)
        return braid_error_set(lc->err, "lora %s: tensor '%s' has shape [%llu, %llu]; the base model needs %s with %s = %d "
                                        "and 1 <= rank <= %d",
                               lc->path, t->name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                               half == 'a' ? "[in, rank]" : "[rank, out]", half == 'a' ? "in" : "out", (int)want, LORA_MAX_RANK);
    if (lc->ad->rank == 0) lc->ad->rank = (int)rank;
    if (rank != (uint64_t)lc->ad->rank)
        return braid_error_set(lc->err, "lora %s: tensor '%s' has rank %llu but the adapter's other tensors have rank %d",
                               lc->path, t->name, (unsigned long long)rank, lc->ad->rank);
    LoraPair *pair = &lc->ad->pairs[(size_t)layer * LORA_PROJ_COUNT + proj];
    float **slot = half == 'a' ? &pair->a : &pair->b;
    if (*slot) return braid_error_set(lc->err, "lora %s: tensor '%s' appears twice", lc->path, t->name);
    size_t n = (size_t)t->ne[0] * t->ne[1];
    if (!(*slot = widen_tensor(t, n))) return braid_error_set(lc->err, "lora %s: out of memory for tensor '%s'", lc->path, t->name);
    lc->ad->bytes += n * sizeof(float);
    /* A NaN or infinite weight would poison every sequence using the adapter (found by fuzz_lora_adapter). */
    for (size_t i = 0; i < n; i++)
        if (!isfinite((*slot)[i]))
            return braid_error_set(lc->err, "lora %s: tensor '%s' holds a non-finite value (%g) at element %zu", lc->path, t->name,
                                   (double)(*slot)[i], i);
    return 0;
}

static int check_metadata(const GgufFile *f, const char *path, const ModelConfig *base, float *alpha, BraidError *err) {
    GgufString s;
    if (gguf_get_string(f, "general.type", &s) || !gguf_string_equals(s, "adapter"))
        return braid_error_set(err, "lora %s: general.type is not 'adapter' (not a GGUF adapter file)", path);
    if (gguf_get_string(f, "adapter.type", &s) || !gguf_string_equals(s, "lora"))
        return braid_error_set(err, "lora %s: adapter.type is not 'lora'", path);
    if (gguf_get_string(f, "general.architecture", &s) == 0 && !gguf_string_equals(s, base->arch))
        return braid_error_set(err, "lora %s: general.architecture '%.*s' does not match the base model's '%s'", path,
                               (int)(s.len < 64 ? s.len : 64), s.data, base->arch);
    double a;
    if (gguf_get_float(f, "adapter.lora.alpha", &a) || !isfinite(a) || a <= 0)
        return braid_error_set(err, "lora %s: adapter.lora.alpha is missing or not a positive number", path);
    *alpha = (float)a;
    return 0;
}

/* Every pair complete: both halves present, or neither. At least one pair. */
static int check_pairs(const LoraAdapter *ad, const char *path, BraidError *err) {
    int n_pairs = 0;
    for (int l = 0; l < ad->n_layers; l++)
        for (int p = 0; p < LORA_PROJ_COUNT; p++) {
            const LoraPair *pair = &ad->pairs[(size_t)l * LORA_PROJ_COUNT + p];
            if (!pair->a != !pair->b)
                return braid_error_set(err, "lora %s: tensor 'blk.%d.%s.weight.lora_%c' is missing (its pair is present)", path, l,
                                       PROJ_STEMS[p], pair->a ? 'b' : 'a');
            n_pairs += pair->a != NULL;
        }
    return n_pairs ? 0 : braid_error_set(err, "lora %s: the file holds no LoRA tensor pair", path);
}

int lora_adapter_load(const char *path, const char *name, const ModelConfig *base, LoraAdapter *out, BraidError *err) {
    if (synthetic_lora_spec(path)) return synthetic_lora_create(path, name, base, out, err); /* issue 34: no file */
    memset(out, 0, sizeof *out);
    GgufFile *f = NULL;
    if (gguf_open(path, &f, err)) return braid_error_wrap(err, "lora adapter '%s'", name);
    LoraAdapter *ad = out;
    ad->n_layers = base->n_layers;
    ad->pairs = calloc((size_t)base->n_layers * LORA_PROJ_COUNT, sizeof *ad->pairs);
    ad->name = strdup(name);
    int rc = !ad->pairs || !ad->name ? braid_error_set(err, "lora %s: out of memory", path) : 0;
    if (rc == 0) rc = check_metadata(f, path, base, &ad->alpha, err);
    LoadCtx lc = {.path = path, .base = base, .ad = ad, .err = err};
    for (uint64_t i = 0; rc == 0 && i < f->n_tensors; i++) rc = take_tensor(&lc, &f->tensors[i]);
    if (rc == 0) rc = check_pairs(ad, path, err);
    gguf_close(f);
    if (rc) {
        lora_adapter_free(ad);
        return -1;
    }
    ad->scale = ad->alpha / (float)ad->rank;
    return 0;
}

void lora_adapter_free(LoraAdapter *a) {
    for (int i = 0; a->pairs && i < a->n_layers * LORA_PROJ_COUNT; i++) {
        free(a->pairs[i].a);
        free(a->pairs[i].b);
    }
    free(a->pairs);
    free(a->name);
    memset(a, 0, sizeof *a);
}

int lora_set_add_spec(LoraSet *set, const char *spec, const ModelConfig *base, BraidError *err) {
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec || !eq[1])
        return braid_error_set(err, "--lora '%s': expected NAME=PATH (e.g. coder=adapters/coder.gguf)", spec);
    size_t name_len = (size_t)(eq - spec);
    if (name_len > 256) return braid_error_set(err, "--lora '%.64s...': the name is longer than 256 bytes", spec);
    char name[257];
    memcpy(name, spec, name_len);
    name[name_len] = '\0';
    if (lora_set_find(set, name) > 0) return braid_error_set(err, "--lora: adapter name '%s' is given twice", name);
    LoraAdapter ad;
    if (lora_adapter_load(eq + 1, name, base, &ad, err)) return -1;
    if (lora_set_install(set, &ad, NULL, err)) {
        lora_adapter_free(&ad);
        return -1;
    }
    return 0;
}

int lora_set_install(LoraSet *set, LoraAdapter *ad, int *id, BraidError *err) {
    if (lora_set_find(set, ad->name) > 0) return braid_error_set(err, "adapter name '%s' is already loaded", ad->name);
    int n = __atomic_load_n(&set->n, __ATOMIC_ACQUIRE);
    if (n >= LORA_SET_CAPACITY) return braid_error_set(err, "at most %d adapters may be loaded over a server's life", LORA_SET_CAPACITY);
    if (!set->adapters && !(set->adapters = calloc(LORA_SET_CAPACITY, sizeof *set->adapters)))
        return braid_error_set(err, "lora: out of memory");
    set->adapters[n] = *ad;
    memset(ad, 0, sizeof *ad);
    __atomic_store_n(&set->n, n + 1, __ATOMIC_RELEASE); /* readers see the slot filled */
    if (id) *id = n + 1;
    return 0;
}

int lora_set_retire(LoraSet *set, const char *name) {
    int id = lora_set_find(set, name);
    if (id <= 0) return -1;
    LoraAdapter *a = &set->adapters[id - 1];
    __atomic_store_n(&a->retired, 1, __ATOMIC_RELEASE);
    for (int i = 0; a->pairs && i < a->n_layers * LORA_PROJ_COUNT; i++) {
        free(a->pairs[i].a);
        free(a->pairs[i].b);
        a->pairs[i].a = a->pairs[i].b = NULL;
    }
    return 0;
}

int lora_set_was_retired(const LoraSet *set, const char *name) {
    if (!name || lora_set_find(set, name) > 0) return 0;
    int n = set ? __atomic_load_n(&set->n, __ATOMIC_ACQUIRE) : 0;
    for (int i = 0; i < n; i++)
        if (strcmp(set->adapters[i].name, name) == 0) return 1;
    return 0;
}

/* Splits a cache name into its name's length and its generation (1 when it has no suffix); -1 when
 * the suffix is malformed. */
static int split_cache_name(const char *s, size_t *name_len, unsigned *generation) {
    const char *sep = strchr(s, LORA_GENERATION_SEP);
    *name_len = sep ? (size_t)(sep - s) : strlen(s);
    *generation = 1;
    if (!sep) return 0;
    char *end;
    unsigned long g = sep[1] == 'g' ? strtoul(sep + 2, &end, 10) : 0;
    if (g < 2 || g > 1000000 || *end != '\0') return -1;
    *generation = (unsigned)g;
    return 0;
}

static unsigned generation_of(const LoraAdapter *a) { return a->generation > 1 ? a->generation : 1; }

int lora_cache_name(const char *name, unsigned generation, char *out, size_t cap) {
    int n = generation > 1 ? snprintf(out, cap, "%s%cg%u", name, LORA_GENERATION_SEP, generation) : snprintf(out, cap, "%s", name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int lora_name_is(const char *cache_name, const char *name) {
    size_t len;
    unsigned g;
    if (!cache_name || !name || split_cache_name(cache_name, &len, &g)) return 0;
    return strlen(name) == len && strncmp(cache_name, name, len) == 0;
}

int lora_set_find(const LoraSet *set, const char *name) {
    if (!name || !name[0]) return 0;
    size_t len;
    unsigned g;
    if (split_cache_name(name, &len, &g)) return -1;
    int n = set ? __atomic_load_n(&set->n, __ATOMIC_ACQUIRE) : 0;
    for (int i = 0; i < n; i++) {
        const LoraAdapter *a = &set->adapters[i];
        if (__atomic_load_n(&a->retired, __ATOMIC_ACQUIRE) || strlen(a->name) != len || strncmp(a->name, name, len) != 0) continue;
        /* One live adapter per name. A plain name means whichever generation is live; a cache name only its own. */
        return !strchr(name, LORA_GENERATION_SEP) || generation_of(a) == g ? i + 1 : -1;
    }
    return -1;
}

unsigned lora_set_next_generation(const LoraSet *set, const char *name) {
    unsigned g = 1;
    int n = set ? __atomic_load_n(&set->n, __ATOMIC_ACQUIRE) : 0;
    for (int i = 0; i < n; i++)
        if (strcmp(set->adapters[i].name, name) == 0 && generation_of(&set->adapters[i]) >= g) g = generation_of(&set->adapters[i]) + 1;
    return g;
}

const LoraAdapter *lora_set_get(const LoraSet *set, int id) {
    return set && id >= 1 && id <= set->n && !set->adapters[id - 1].retired ? &set->adapters[id - 1] : NULL;
}

void lora_set_free(LoraSet *set) {
    for (int i = 0; i < set->n; i++) lora_adapter_free(&set->adapters[i]);
    free(set->adapters);
    memset(set, 0, sizeof *set);
}

int lora_set_max_rank(const LoraSet *set) {
    int rank = 0;
    for (int i = 0; set && i < set->n; i++)
        if (!set->adapters[i].retired && set->adapters[i].rank > rank) rank = set->adapters[i].rank;
    return rank;
}
