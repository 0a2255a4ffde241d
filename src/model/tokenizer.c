#define _GNU_SOURCE /* qsort_r */
#include "model/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "model/bpe.h"
#include "model/unicode.h"

#define SPM_SPACE "\xE2\x96\x81" /* U+2581 ▁ */

int token_list_push(TokenList *list, int32_t id) {
    if (braid_grow((void **)&list->ids, &list->cap, list->n + 1, sizeof *list->ids)) return -1;
    list->ids[list->n++] = id;
    return 0;
}

/* GPT-2's reversible byte -> printable code point map: printable Latin-1 bytes map to themselves,
 * the rest to 256, 257, ... in byte order. */
static void build_byte_alphabet(Tokenizer *tok) {
    int next = 256;
    for (int i = 0; i < 512; i++) tok->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        tok->byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)next++;
        tok->cp_to_byte[tok->byte_to_cp[b]] = (int16_t)b;
    }
}

static int32_t get_id(const GgufFile *f, const char *key, int32_t fallback) {
    int64_t v;
    return gguf_get_int(f, key, &v) == 0 ? (int32_t)v : fallback;
}

static int load_vocab(const GgufFile *f, Tokenizer *tok, BraidError *err) {
    const GgufValue *tokens = gguf_find(f, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != GGUF_TYPE_ARRAY || tokens->arr.elem_type != GGUF_TYPE_STRING || tokens->arr.count == 0 ||
        tokens->arr.count > (1u << 24))
        return braid_error_set(err, "tokenizer: tokenizer.ggml.tokens missing or not a string array");
    tok->n_vocab = (int)tokens->arr.count;
    tok->pieces = tokens->arr.strings;
    tok->types = malloc((size_t)tok->n_vocab * sizeof *tok->types);
    tok->piece_ids = strmap_create((size_t)tok->n_vocab);
    if (!tok->types || !tok->piece_ids) return braid_error_set(err, "tokenizer: out of memory");
    const GgufValue *types = gguf_find(f, "tokenizer.ggml.token_type");
    int have_types = types && types->type == GGUF_TYPE_ARRAY && types->arr.raw && types->arr.count == tokens->arr.count;
    for (int i = 0; i < tok->n_vocab; i++) {
        tok->types[i] = have_types ? (int32_t)gguf_array_get_int(types, (uint64_t)i) : TOKEN_TYPE_NORMAL;
        /* First occurrence wins so duplicate pieces keep their lowest id, as HF does. */
        int32_t existing;
        if (!strmap_get(tok->piece_ids, tok->pieces[i].data, tok->pieces[i].len, &existing) &&
            strmap_put(tok->piece_ids, tok->pieces[i].data, tok->pieces[i].len, i))
            return braid_error_set(err, "tokenizer: out of memory");
    }
    const GgufValue *scores = gguf_find(f, "tokenizer.ggml.scores");
    if (tok->kind == TOKENIZER_SPM) {
        tok->scores = calloc((size_t)tok->n_vocab, sizeof *tok->scores);
        if (!tok->scores) return braid_error_set(err, "tokenizer: out of memory");
        if (scores && scores->type == GGUF_TYPE_ARRAY && scores->arr.raw && scores->arr.count == tokens->arr.count)
            for (int i = 0; i < tok->n_vocab; i++) tok->scores[i] = (float)gguf_array_get_float(scores, (uint64_t)i);
    }
    return 0;
}

static int load_merges(const GgufFile *f, Tokenizer *tok, BraidError *err) {
    const GgufValue *merges = gguf_find(f, "tokenizer.ggml.merges");
    if (!merges || merges->type != GGUF_TYPE_ARRAY || merges->arr.elem_type != GGUF_TYPE_STRING)
        return braid_error_set(err, "tokenizer: a gpt2 tokenizer needs tokenizer.ggml.merges");
    tok->merge_ranks = strmap_create((size_t)merges->arr.count);
    if (!tok->merge_ranks) return braid_error_set(err, "tokenizer: out of memory");
    for (uint64_t i = 0; i < merges->arr.count; i++) {
        GgufString m = merges->arr.strings[i];
        int32_t existing;
        if (strmap_get(tok->merge_ranks, m.data, m.len, &existing)) continue;
        if (strmap_put(tok->merge_ranks, m.data, m.len, (int32_t)i)) return braid_error_set(err, "tokenizer: out of memory");
    }
    return 0;
}

static int compare_special_length(const void *a, const void *b, void *ctx) {
    const Tokenizer *tok = ctx;
    uint64_t la = tok->pieces[*(const int32_t *)a].len, lb = tok->pieces[*(const int32_t *)b].len;
    return la < lb ? 1 : la > lb ? -1 : (*(const int32_t *)a - *(const int32_t *)b);
}

static int collect_specials(Tokenizer *tok, BraidError *err) {
    tok->special_ids = malloc((size_t)tok->n_vocab * sizeof *tok->special_ids);
    if (!tok->special_ids) return braid_error_set(err, "tokenizer: out of memory");
    for (int i = 0; i < tok->n_vocab; i++)
        if ((tok->types[i] == TOKEN_TYPE_CONTROL || tok->types[i] == TOKEN_TYPE_USER_DEFINED) && tok->pieces[i].len > 0)
            tok->special_ids[tok->n_special++] = i;
    qsort_r(tok->special_ids, (size_t)tok->n_special, sizeof *tok->special_ids, compare_special_length, tok);
    return 0;
}

static void add_stop(Tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab || tok->n_stop >= TOKENIZER_MAX_STOP) return;
    for (int i = 0; i < tok->n_stop; i++)
        if (tok->stop_ids[i] == id) return;
    tok->stop_ids[tok->n_stop++] = id;
}

static void collect_stops(const GgufFile *f, Tokenizer *tok) {
    add_stop(tok, tok->eos_id);
    add_stop(tok, get_id(f, "tokenizer.ggml.eot_token_id", -1));
    add_stop(tok, get_id(f, "tokenizer.ggml.eom_token_id", -1));
    static const char *const end_of_turn[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>", "</s>"};
    for (size_t i = 0; i < sizeof end_of_turn / sizeof end_of_turn[0]; i++) {
        int32_t id = tokenizer_find_piece(tok, end_of_turn[i]);
        if (id >= 0 && tok->types[id] == TOKEN_TYPE_CONTROL) add_stop(tok, id);
    }
}

static void find_byte_tokens(Tokenizer *tok) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        static const char hex[] = "0123456789ABCDEF";
        memcpy(name, "<0x", 3);
        name[3] = hex[b >> 4];
        name[4] = hex[b & 15];
        name[5] = '>';
        name[6] = '\0';
        tok->byte_ids[b] = tokenizer_find_piece(tok, name);
    }
}

int tokenizer_load(const GgufFile *f, Tokenizer *tok, BraidError *err) {
    memset(tok, 0, sizeof *tok);
    GgufString model;
    if (gguf_get_string(f, "tokenizer.ggml.model", &model)) return braid_error_set(err, "tokenizer: tokenizer.ggml.model missing");
    if (gguf_string_equals(model, "gpt2")) tok->kind = TOKENIZER_BPE;
    else if (gguf_string_equals(model, "llama")) tok->kind = TOKENIZER_SPM;
    else return braid_error_set(err, "tokenizer: model '%.*s' is not supported (gpt2 and llama are)", (int)(model.len > 64 ? 64 : model.len), model.data);
    GgufString pre = {"default", 7};
    gguf_get_string(f, "tokenizer.ggml.pre", &pre);
    snprintf(tok->pre_name, sizeof tok->pre_name, "%.*s", (int)(pre.len < 31 ? pre.len : 31), pre.data);
    if (tok->kind == TOKENIZER_BPE && pretokenizer_from_name(tok->pre_name, &tok->pre))
        return braid_error_set(err, "tokenizer: pre-tokenizer '%s' is not supported (gpt2, smollm, llama3 / llama-bpe, qwen2 are)", tok->pre_name);
    if (load_vocab(f, tok, err) || (tok->kind == TOKENIZER_BPE && load_merges(f, tok, err)) || collect_specials(tok, err)) {
        tokenizer_free(tok);
        return -1;
    }
    build_byte_alphabet(tok);
    find_byte_tokens(tok);
    tok->bos_id = get_id(f, "tokenizer.ggml.bos_token_id", -1);
    tok->eos_id = get_id(f, "tokenizer.ggml.eos_token_id", -1);
    tok->unk_id = get_id(f, "tokenizer.ggml.unknown_token_id", -1);
    tok->add_bos = tok->kind == TOKENIZER_SPM;
    tok->add_space_prefix = tok->kind == TOKENIZER_SPM;
    gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &tok->add_bos);
    gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &tok->add_space_prefix);
    if (tok->bos_id >= tok->n_vocab || tok->eos_id >= tok->n_vocab || tok->unk_id >= tok->n_vocab) {
        tokenizer_free(tok);
        return braid_error_set(err, "tokenizer: special token id outside the vocabulary of %d", tok->n_vocab);
    }
    collect_stops(f, tok);
    return 0;
}

void tokenizer_free(Tokenizer *tok) {
    free(tok->types);
    free(tok->scores);
    free(tok->special_ids);
    strmap_destroy(tok->piece_ids);
    strmap_destroy(tok->merge_ranks);
    memset(tok, 0, sizeof *tok);
}

int32_t tokenizer_find_piece(const Tokenizer *tok, const char *piece) {
    int32_t id;
    return strmap_get(tok->piece_ids, piece, strlen(piece), &id) ? id : -1;
}

bool tokenizer_is_stop(const Tokenizer *tok, int32_t id) {
    for (int i = 0; i < tok->n_stop; i++)
        if (tok->stop_ids[i] == id) return true;
    return false;
}

/* ---- byte-level BPE ---- */

typedef struct {
    const Tokenizer *tok;
    TokenList *out;
    char *buf;   /* byte-level encoding of the current word */
    size_t *bounds;
    size_t cap;  /* capacity of buf (bytes) and bounds (entries) */
    char *key;   /* "left right" scratch */
    size_t key_cap;
} BpeState;

static int bpe_rank(void *user, const char *text, size_t start, size_t left_len, size_t right_len, double *priority) {
    BpeState *st = user;
    size_t need = left_len + right_len + 1;
    if (need > st->key_cap) {
        char *key = realloc(st->key, need * 2);
        if (!key) return 0;
        st->key = key;
        st->key_cap = need * 2;
    }
    memcpy(st->key, text + start, left_len);
    st->key[left_len] = ' ';
    memcpy(st->key + left_len + 1, text + start + left_len, right_len);
    int32_t rank;
    if (!strmap_get(st->tok->merge_ranks, st->key, need, &rank)) return 0;
    *priority = rank;
    return 1;
}

static int emit_piece_or_bytes(const Tokenizer *tok, const char *piece, size_t len, TokenList *out) {
    int32_t id;
    if (strmap_get(tok->piece_ids, piece, len, &id)) return token_list_push(out, id);
    /* A merged symbol always exists in a consistent vocabulary; otherwise fall back to its single
     * byte-level characters. A byte the vocabulary has no token for (SmolLM2 lacks a few control
     * bytes and the never-valid UTF-8 lead bytes) is dropped, as HF tokenizers' byte-level BPE does,
     * rather than turned into an unknown/end-of-text token the model would act on. */
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int n = utf8_decode((const uint8_t *)piece + i, len - i, &cp);
        if (strmap_get(tok->piece_ids, piece + i, (size_t)n, &id) && token_list_push(out, id)) return -1;
        i += (size_t)n;
    }
    return 0;
}

static int bpe_word(void *user, const char *word, size_t len) {
    BpeState *st = user;
    const Tokenizer *tok = st->tok;
    if (len * 2 + 1 > st->cap) {
        size_t cap = len * 2 + 16;
        char *buf = realloc(st->buf, cap);
        if (!buf) return -1;
        st->buf = buf;
        size_t *bounds = realloc(st->bounds, cap * sizeof *bounds);
        if (!bounds) return -1;
        st->bounds = bounds;
        st->cap = cap;
    }
    size_t used = 0;
    for (size_t i = 0; i < len; i++) {
        st->bounds[i] = used;
        used += (size_t)utf8_encode(tok->byte_to_cp[(uint8_t)word[i]], st->buf + used);
    }
    st->bounds[len] = used;
    BpeSymbol *sym;
    if (bpe_merge(st->buf, st->bounds, (int)len, bpe_rank, st, &sym)) return -1;
    int rc = 0;
    for (int i = 0; i >= 0 && rc == 0; i = sym[i].next) rc = emit_piece_or_bytes(tok, st->buf + sym[i].start, sym[i].len, st->out);
    free(sym);
    return rc;
}

static int encode_bpe(const Tokenizer *tok, const char *text, size_t len, TokenList *out) {
    BpeState st = {.tok = tok, .out = out};
    int rc = pretokenize(tok->pre, text, len, bpe_word, &st);
    free(st.buf);
    free(st.bounds);
    free(st.key);
    return rc ? -1 : 0;
}

/* ---- SentencePiece BPE ---- */

static int spm_rank(void *user, const char *text, size_t start, size_t left_len, size_t right_len, double *priority) {
    const Tokenizer *tok = user;
    int32_t id;
    if (!strmap_get(tok->piece_ids, text + start, left_len + right_len, &id)) return 0;
    if (tok->types[id] != TOKEN_TYPE_NORMAL && tok->types[id] != TOKEN_TYPE_USER_DEFINED) return 0;
    *priority = -(double)tok->scores[id];
    return 1;
}

static int spm_emit(const Tokenizer *tok, const char *piece, size_t len, TokenList *out) {
    int32_t id;
    if (strmap_get(tok->piece_ids, piece, len, &id)) return token_list_push(out, id);
    for (size_t i = 0; i < len; i++) {
        id = tok->byte_ids[(uint8_t)piece[i]];
        if (id < 0) id = tok->unk_id;
        if (id >= 0 && token_list_push(out, id)) return -1;
    }
    return 0;
}

static int encode_spm(const Tokenizer *tok, const char *text, size_t len, bool prefix_space, TokenList *out) {
    /* Spaces become ▁ (3 bytes), plus an optional leading ▁. */
    size_t cap = len * 3 + 4, used = 0;
    char *buf = malloc(cap);
    size_t *bounds = malloc((cap + 1) * sizeof *bounds);
    int n = 0, rc = -1;
    if (!buf || !bounds) goto done;
    if (prefix_space) {
        bounds[n++] = used;
        memcpy(buf + used, SPM_SPACE, 3);
        used += 3;
    }
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = utf8_decode((const uint8_t *)text + i, len - i, &cp);
        bounds[n++] = used;
        if (text[i] == ' ') {
            memcpy(buf + used, SPM_SPACE, 3);
            used += 3;
        } else {
            memcpy(buf + used, text + i, (size_t)k);
            used += (size_t)k;
        }
        i += (size_t)k;
    }
    bounds[n] = used;
    if (n == 0) { rc = 0; goto done; }
    BpeSymbol *sym;
    if (bpe_merge(buf, bounds, n, spm_rank, (void *)tok, &sym)) goto done;
    rc = 0;
    for (int i = 0; i >= 0 && rc == 0; i = sym[i].next) rc = spm_emit(tok, buf + sym[i].start, sym[i].len, out);
    free(sym);
done:
    free(buf);
    free(bounds);
    return rc;
}

/* ---- special tokens and the public entry points ---- */

/* Returns the id of the longest special token starting at text[0..len), or -1. */
static int32_t match_special(const Tokenizer *tok, const char *text, size_t len) {
    for (int i = 0; i < tok->n_special; i++) {
        const GgufString *p = &tok->pieces[tok->special_ids[i]];
        if (p->len <= len && memcmp(p->data, text, p->len) == 0) return tok->special_ids[i];
    }
    return -1;
}

static int encode_fragment(const Tokenizer *tok, const char *text, size_t len, bool at_start, TokenList *out) {
    if (len == 0) return 0;
    if (tok->kind == TOKENIZER_BPE) return encode_bpe(tok, text, len, out);
    return encode_spm(tok, text, len, tok->add_space_prefix && at_start, out);
}

int tokenizer_encode(const Tokenizer *tok, const char *text, size_t len, bool parse_special, bool add_bos, TokenList *out,
                     BraidError *err) {
    if (add_bos && tok->bos_id >= 0 && token_list_push(out, tok->bos_id)) return braid_error_set(err, "tokenizer: out of memory");
    size_t start = 0;
    for (size_t i = 0; parse_special && i < len; i++) {
        int32_t id = match_special(tok, text + i, len - i);
        if (id < 0) continue;
        if (encode_fragment(tok, text + start, i - start, start == 0, out) || token_list_push(out, id))
            return braid_error_set(err, "tokenizer: out of memory");
        i += tok->pieces[id].len - 1;
        start = i + 1;
    }
    if (encode_fragment(tok, text + start, len - start, start == 0, out)) return braid_error_set(err, "tokenizer: out of memory");
    return 0;
}

static size_t piece_bytes_bpe(const Tokenizer *tok, GgufString p, char *buf, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < p.len;) {
        uint32_t cp;
        int k = utf8_decode((const uint8_t *)p.data + i, p.len - i, &cp);
        if (cp < 512 && tok->cp_to_byte[cp] >= 0) {
            if (n < cap) buf[n] = (char)tok->cp_to_byte[cp];
            n++;
        } else { /* not in the byte alphabet (e.g. a user-defined token): copy as is */
            for (int j = 0; j < k; j++, n++)
                if (n < cap) buf[n] = p.data[i + (size_t)j];
        }
        i += (size_t)k;
    }
    return n;
}

static size_t piece_bytes_spm(const Tokenizer *tok, int32_t id, GgufString p, char *buf, size_t cap) {
    if (tok->types[id] == TOKEN_TYPE_BYTE && p.len == 6) {
        if (cap > 0) buf[0] = (char)strtol((char[3]){p.data[3], p.data[4], 0}, NULL, 16);
        return 1;
    }
    size_t n = 0;
    for (size_t i = 0; i < p.len;) {
        if (p.len - i >= 3 && memcmp(p.data + i, SPM_SPACE, 3) == 0) {
            if (n < cap) buf[n] = ' ';
            n++;
            i += 3;
        } else {
            if (n < cap) buf[n] = p.data[i];
            n++;
            i++;
        }
    }
    return n;
}

size_t tokenizer_token_bytes(const Tokenizer *tok, int32_t id, char *buf, size_t cap) {
    if (id < 0 || id >= tok->n_vocab) return 0;
    GgufString p = tok->pieces[id];
    if (tok->types[id] == TOKEN_TYPE_CONTROL || tok->types[id] == TOKEN_TYPE_USER_DEFINED) {
        if (tok->kind == TOKENIZER_SPM && tok->types[id] == TOKEN_TYPE_USER_DEFINED) return piece_bytes_spm(tok, id, p, buf, cap);
        if (cap > 0) memcpy(buf, p.data, p.len < cap ? p.len : cap);
        return p.len;
    }
    return tok->kind == TOKENIZER_BPE ? piece_bytes_bpe(tok, p, buf, cap) : piece_bytes_spm(tok, id, p, buf, cap);
}

char *tokenizer_decode(const Tokenizer *tok, const int32_t *ids, int n, size_t *out_len) {
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_vocab) {
            free(out);
            return NULL;
        }
        size_t need = tokenizer_token_bytes(tok, ids[i], NULL, 0);
        if (len + need + 1 > cap) {
            cap = (len + need + 1) * 2;
            char *grown = realloc(out, cap);
            if (!grown) {
                free(out);
                return NULL;
            }
            out = grown;
        }
        len += tokenizer_token_bytes(tok, ids[i], out + len, need);
    }
    size_t skip = 0;
    if (tok->kind == TOKENIZER_SPM && tok->add_space_prefix && len > 0 && out[0] == ' ' && n > 0 &&
        tok->types[ids[0]] == TOKEN_TYPE_NORMAL)
        skip = 1;
    memmove(out, out + skip, len - skip);
    len -= skip;
    out[len] = '\0';
    if (out_len) *out_len = len;
    return out;
}
