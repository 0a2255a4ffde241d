/*
 * Fuzz target for manifests (src/coord/manifest_line.c, manifest_heads.c): the input is read as a
 * whole manifest twice — as it is, and with every line that parses re-hashed for the target's model
 * seed, so mutations get past the stale check into the chaining. The reader must keep what
 * manifest_heads.h promises (every line counted once as valid or skipped, repeats and unchained
 * lines among the valid ones, each head non-empty, tokens inside the vocabulary). The first line
 * alone must parse, format and parse back equal, or be refused with a reason. Any broken promise
 * calls abort(). Replayed over corpus_manifest/ plus mutations in every CI run.
 */
#define _GNU_SOURCE /* fmemopen, open_memstream */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coord/manifest_heads.h"
#include "coord/manifest_line.h"

#define FUZZ_VOCAB 50000
#define FUZZ_SEED 0x5eed5eedull

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_heads(const ManifestHeads *h) {
    if (h->valid + h->skipped != h->lines) abort();
    if (h->duplicates + h->unchained > h->valid || h->n_heads > h->valid) abort();
    for (int i = 0; i < h->n_heads; i++) {
        const ManifestHead *head = &h->heads[i];
        if (head->n_tokens < 1 || !head->tokens || head->n_chunks < 1 || head->n_chunks > h->valid) abort();
        for (int k = 0; k < head->n_tokens; k++)
            if (head->tokens[k] < 0 || head->tokens[k] >= FUZZ_VOCAB) abort();
    }
}

static void read_manifest(const char *text, size_t len) {
    if (len == 0) return;
    FILE *f = fmemopen((void *)text, len, "r");
    if (!f) return;
    ManifestHeads h;
    BraidError err;
    if (manifest_heads_read(f, FUZZ_VOCAB, FUZZ_SEED, &h, &err) == 0) {
        check_heads(&h);
        manifest_heads_free(&h);
    }
    fclose(f);
}

static bool same_line(const ManifestLine *a, const ManifestLine *b) {
    return a->content_hash == b->content_hash && a->n_tokens == b->n_tokens && a->count == b->count && a->position == b->position &&
           a->has_prev == b->has_prev && (!a->has_prev || a->prev_hash == b->prev_hash) &&
           memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof *a->tokens) == 0 && !strcmp(a->tenant ? a->tenant : "", b->tenant ? b->tenant : "") &&
           !strcmp(a->adapter ? a->adapter : "", b->adapter ? b->adapter : "");
}

/* Parses one line: accepted ones must round-trip; *fixed gets it re-hashed for FUZZ_SEED (or the line unchanged). */
static void check_line(const char *line, size_t len, FILE *fixed) {
    ManifestLine l, back;
    char why[256] = "";
    if (manifest_line_parse(line, len, &l, why, sizeof why)) {
        if (!why[0]) abort();
        fwrite(line, 1, len, fixed);
        fputc('\n', fixed);
        return;
    }
    char *text = manifest_line_format(&l);
    if (!text || manifest_line_parse(text, strlen(text), &back, why, sizeof why) || !same_line(&l, &back)) abort();
    manifest_line_free(&back);
    free(text);
    l.content_hash = manifest_chunk_hash(FUZZ_SEED, l.tenant, l.adapter, l.tokens, l.n_tokens);
    if ((text = manifest_line_format(&l))) fprintf(fixed, "%s\n", text);
    free(text);
    manifest_line_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    braid_log_set_level(BRAID_LOG_ERROR); /* skipped lines are expected here, thousands of them */
    read_manifest((const char *)data, size);
    char *fixed_text = NULL;
    size_t fixed_len = 0;
    FILE *fixed = open_memstream(&fixed_text, &fixed_len);
    if (!fixed) return 0;
    for (size_t start = 0; start < size;) {
        size_t end = start;
        while (end < size && data[end] != '\n') end++;
        check_line((const char *)data + start, end - start, fixed);
        start = end + 1;
    }
    fclose(fixed);
    read_manifest(fixed_text, fixed_len);
    free(fixed_text);
    return 0;
}
