/*
 * tokenizer.h — text ⇄ token ids from the vocabulary stored in a GGUF file.
 *
 * Models: byte-level BPE ("gpt2": merges + the pre-tokenizer named by tokenizer.ggml.pre) and
 * SentencePiece BPE ("llama": scores, ▁ for spaces, <0xXX> byte fallback). Special tokens (control
 * and user-defined types) are recognized inside text when parse_special is set, as HF tokenizers do
 * for chat-templated text.
 * Owns: lookup tables. Borrows: token strings point into the GgufFile, which must outlive it.
 * Thread-safety: read-only after tokenizer_load(); encode/decode may run concurrently.
 */
#ifndef BRAID_MODEL_TOKENIZER_H
#define BRAID_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/strmap.h"
#include "model/gguf.h"
#include "model/pretokenize.h"

typedef enum { TOKENIZER_BPE = 0, TOKENIZER_SPM = 1 } TokenizerKind;

/* GGUF token types */
enum { TOKEN_TYPE_NORMAL = 1, TOKEN_TYPE_UNKNOWN = 2, TOKEN_TYPE_CONTROL = 3, TOKEN_TYPE_USER_DEFINED = 4,
       TOKEN_TYPE_UNUSED = 5, TOKEN_TYPE_BYTE = 6 };

#define TOKENIZER_MAX_STOP 8

typedef struct {
    TokenizerKind kind;
    PreTokenizerKind pre;
    char pre_name[32];
    int n_vocab;
    const GgufString *pieces; /* (n_vocab) */
    int32_t *types;           /* (n_vocab) */
    float *scores;            /* (n_vocab) SPM merge scores; NULL for BPE */
    StrMap *piece_ids;        /* piece -> id */
    StrMap *merge_ranks;      /* "left right" -> rank (BPE) */
    int32_t *special_ids;     /* control/user-defined tokens matched in text, longest first */
    int n_special;
    int32_t byte_ids[256];    /* SPM byte fallback ids (-1 when absent) */
    uint32_t byte_to_cp[256]; /* GPT-2 byte-level alphabet */
    int16_t cp_to_byte[512];  /* inverse, -1 when the code point is not in the alphabet */
    int32_t bos_id, eos_id, unk_id;
    bool add_bos, add_space_prefix;
    int32_t stop_ids[TOKENIZER_MAX_STOP]; /* EOS and end-of-turn tokens */
    int n_stop;
} Tokenizer;

int tokenizer_load(const GgufFile *file, Tokenizer *tok, BraidError *err);
void tokenizer_free(Tokenizer *tok);

/* A growable list of token ids; free with free(ids). */
typedef struct {
    int32_t *ids;
    int n, cap;
} TokenList;

/* Appends the tokens of text[0..len) to out. add_bos prepends BOS (use tok->add_bos for the model's
 * default). Returns 0, or -1 with err set (out of memory). */
int tokenizer_encode(const Tokenizer *tok, const char *text, size_t len, bool parse_special, bool add_bos, TokenList *out,
                     BraidError *err);
int token_list_push(TokenList *list, int32_t id);

/* The bytes of one token as text (special tokens give their literal text). Writes at most cap
 * bytes, returns the full length. Use for streaming. */
size_t tokenizer_token_bytes(const Tokenizer *tok, int32_t id, char *buf, size_t cap);

/* Decodes a sequence into a freshly malloc'd NUL-terminated string (*out_len bytes, may contain
 * any bytes). SPM drops the space its encoder prefixed. Returns NULL when out of memory or an id
 * is out of range. */
char *tokenizer_decode(const Tokenizer *tok, const int32_t *ids, int n, size_t *out_len);

bool tokenizer_is_stop(const Tokenizer *tok, int32_t id);
int32_t tokenizer_find_piece(const Tokenizer *tok, const char *piece); /* -1 when absent */

#endif
