/* Manifest lines -> checked chunks -> prompt heads (contract in manifest_heads.h). */
#include "coord/manifest_heads.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/log.h"
#include "coord/manifest_line.h"

typedef struct {
    uint64_t key;
    int line;
} SortKey;

typedef struct {
    ManifestLine *lines; /* valid lines, file order */
    int n, cap;
    SortKey *by_hash;    /* (n) lines by content_hash, then file order */
    SortKey *by_position; /* (n) lines by position, then file order */
    int *parent;         /* (n) the line each extends; -1 at position 0 or when unchained */
    bool *chained, *extended, *dead; /* reaches position 0 / a chained line extends it / a repeat */
} Chains;

static bool same_name(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

/* Why a parsed line cannot be warmed for this model (into why), or -1 when it can. */
static int check_line(const ManifestLine *l, int vocab_size, uint64_t model_seed, const ManifestTenantFilter *filter, char *why,
                      size_t cap) {
    for (int i = 0; i < l->n_tokens; i++)
        if (l->tokens[i] >= vocab_size) {
            snprintf(why, cap, "token id %d at chunk_tokens[%d] is outside the vocabulary [0, %d)", l->tokens[i], i, vocab_size);
            return MANIFEST_SKIP_VOCAB;
        }
    uint64_t expected = manifest_chunk_hash(model_seed, l->tenant, l->adapter, l->tokens, l->n_tokens);
    if (expected != l->content_hash) {
        snprintf(why, cap, "stale: content_hash %016" PRIx64 " is not this model's hash of its tokens (%016" PRIx64 ")", l->content_hash,
                 expected);
        return MANIFEST_SKIP_STALE;
    }
    if (filter && filter->allows && !filter->allows(filter->ctx, l->tenant)) {
        snprintf(why, cap, "tenant '%.64s' is not one any API key runs in", l->tenant ? l->tenant : "");
        return MANIFEST_SKIP_TENANT;
    }
    return -1;
}

static void count_skip(ManifestHeads *out, int reason, int line_no, const char *why) {
    ManifestSkips *s = &out->skips[reason];
    if (s->count++ == 0) {
        s->first_line = line_no;
        snprintf(s->first_why, sizeof s->first_why, "%.*s", (int)sizeof s->first_why - 1, why);
    }
    out->skipped++;
}

void manifest_heads_skip_summary(const ManifestHeads *h, char *buf, size_t cap) {
    static const char *const names[MANIFEST_SKIP_REASONS] = {"invalid", "outside the vocabulary", "stale", "of an unknown tenant"};
    size_t at = 0;
    if (cap) buf[0] = '\0';
    for (int r = 0; r < MANIFEST_SKIP_REASONS && at < cap; r++) {
        const ManifestSkips *s = &h->skips[r];
        if (s->count == 0) continue;
        int n = snprintf(buf + at, cap - at, "%s%d %s (first: line %d, %s)", at ? "; " : "", s->count, names[r], s->first_line,
                         s->first_why);
        if (n < 0) break;
        at += (size_t)n;
    }
}

/* Reads and checks every line; the valid ones go into ch->lines. */
static int read_lines(FILE *f, int vocab_size, uint64_t model_seed, const ManifestTenantFilter *filter, Chains *ch, ManifestHeads *out,
                      BraidError *err) {
    char *text = NULL, why[256];
    size_t text_cap = 0;
    ssize_t len;
    int line_no = 0, rc = 0;
    while (rc == 0 && (len = getline(&text, &text_cap, f)) >= 0) {
        line_no++;
        if (strspn(text, " \t\r\n") == (size_t)len) continue;
        out->lines++;
        ManifestLine l;
        int reason = manifest_line_parse(text, (size_t)len, &l, why, sizeof why) ? MANIFEST_SKIP_INVALID
                                                                                : check_line(&l, vocab_size, model_seed, filter, why, sizeof why);
        if (reason >= 0) {
            count_skip(out, reason, line_no, why);
            manifest_line_free(&l);
        } else if (braid_grow((void **)&ch->lines, &ch->cap, ch->n + 1, sizeof *ch->lines)) {
            manifest_line_free(&l);
            rc = braid_error_set(err, "warm start: out of memory at manifest line %d", line_no);
        } else {
            ch->lines[ch->n++] = l;
        }
    }
    if (rc == 0 && ferror(f)) rc = braid_error_set(err, "warm start: reading the manifest failed after line %d", line_no);
    free(text);
    out->valid = ch->n;
    return rc;
}

static int compare_keys(const void *a, const void *b) {
    const SortKey *x = a, *y = b;
    return x->key != y->key ? (x->key < y->key ? -1 : 1) : (x->line > y->line) - (x->line < y->line);
}

/* The live line with this hash and namespace, or -1. */
static int find_line(const Chains *ch, uint64_t hash, const char *tenant, const char *adapter) {
    int lo = 0, hi = ch->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (ch->by_hash[mid].key < hash) lo = mid + 1;
        else hi = mid;
    }
    for (int k = lo; k < ch->n && ch->by_hash[k].key == hash; k++) {
        int i = ch->by_hash[k].line;
        if (!ch->dead[i] && same_name(ch->lines[i].tenant, tenant) && same_name(ch->lines[i].adapter, adapter)) return i;
    }
    return -1;
}

/* Marks repeats dead, links each line to the one it extends, and finds which chains reach 0. */
static void link_chains(Chains *ch, ManifestHeads *out) {
    for (int k = 0; k < ch->n; k++) {
        int i = ch->by_hash[k].line;
        int first = find_line(ch, ch->lines[i].content_hash, ch->lines[i].tenant, ch->lines[i].adapter);
        if (first != i) ch->dead[i] = true, out->duplicates++;
    }
    for (int i = 0; i < ch->n; i++) {
        const ManifestLine *l = &ch->lines[i];
        ch->parent[i] = -1;
        if (ch->dead[i] || !l->has_prev) continue;
        int p = find_line(ch, l->prev_hash, l->tenant, l->adapter);
        if (p >= 0 && (long long)ch->lines[p].position + ch->lines[p].n_tokens == l->position) ch->parent[i] = p;
    }
    /* A parent starts strictly before its child, so position order settles every parent first. */
    for (int k = 0; k < ch->n; k++) {
        int i = ch->by_position[k].line;
        ch->chained[i] = !ch->dead[i] && (!ch->lines[i].has_prev || (ch->parent[i] >= 0 && ch->chained[ch->parent[i]]));
    }
    for (int i = 0; i < ch->n; i++) {
        if (ch->chained[i] && ch->parent[i] >= 0) ch->extended[ch->parent[i]] = true;
        if (!ch->dead[i] && !ch->chained[i]) out->unchained++;
    }
}

/* The head that ends at line `end`: every chunk back to position 0, in place. */
static int build_head(const Chains *ch, int end, ManifestHead *h) {
    const ManifestLine *last = &ch->lines[end];
    memset(h, 0, sizeof *h);
    h->n_tokens = last->position + last->n_tokens;
    h->tokens = malloc((size_t)h->n_tokens * sizeof *h->tokens);
    if (!h->tokens || (last->tenant && !(h->tenant = strdup(last->tenant))) || (last->adapter && !(h->adapter = strdup(last->adapter))))
        return -1;
    h->count = last->count;
    for (int i = end; i >= 0; i = ch->parent[i], h->n_chunks++)
        memcpy(h->tokens + ch->lines[i].position, ch->lines[i].tokens, (size_t)ch->lines[i].n_tokens * sizeof *h->tokens);
    return 0;
}

static void free_head(ManifestHead *h) {
    free(h->tokens);
    free(h->tenant);
    free(h->adapter);
}

static int collect_heads(const Chains *ch, ManifestHeads *out, BraidError *err) {
    int n = 0;
    for (int i = 0; i < ch->n; i++) n += ch->chained[i] && !ch->extended[i];
    if (n > 0 && !(out->heads = calloc((size_t)n, sizeof *out->heads))) return braid_error_set(err, "warm start: out of memory for %d heads", n);
    for (int i = 0; i < ch->n; i++) {
        if (!ch->chained[i] || ch->extended[i]) continue;
        if (build_head(ch, i, &out->heads[out->n_heads])) {
            free_head(&out->heads[out->n_heads]);
            return braid_error_set(err, "warm start: out of memory assembling a prompt head");
        }
        out->n_heads++;
    }
    return 0;
}

int manifest_heads_read(FILE *f, int vocab_size, uint64_t model_seed, ManifestHeads *out, BraidError *err) {
    return manifest_heads_read_filtered(f, vocab_size, model_seed, NULL, out, err);
}

int manifest_heads_read_filtered(FILE *f, int vocab_size, uint64_t model_seed, const ManifestTenantFilter *filter, ManifestHeads *out,
                                 BraidError *err) {
    memset(out, 0, sizeof *out);
    Chains ch = {0};
    int rc = read_lines(f, vocab_size, model_seed, filter, &ch, out, err);
    if (rc == 0 && out->skipped > 0) {
        char summary[1024];
        manifest_heads_skip_summary(out, summary, sizeof summary);
        LOG_WARN("warm-start", "manifest: %d of %d lines skipped: %s", out->skipped, out->lines, summary);
    }
    size_t n = (size_t)ch.n + 1;
    if (rc == 0 && (!(ch.by_hash = malloc(n * sizeof *ch.by_hash)) || !(ch.by_position = malloc(n * sizeof *ch.by_position)) || !(ch.parent = malloc(n * sizeof *ch.parent)) ||
                    !(ch.chained = calloc(n, 1)) || !(ch.extended = calloc(n, 1)) || !(ch.dead = calloc(n, 1))))
        rc = braid_error_set(err, "warm start: out of memory for %d manifest lines", ch.n);
    if (rc == 0) {
        for (int i = 0; i < ch.n; i++) {
            ch.by_hash[i] = (SortKey){.key = ch.lines[i].content_hash, .line = i};
            ch.by_position[i] = (SortKey){.key = (uint64_t)ch.lines[i].position, .line = i};
        }
        qsort(ch.by_hash, (size_t)ch.n, sizeof *ch.by_hash, compare_keys);
        qsort(ch.by_position, (size_t)ch.n, sizeof *ch.by_position, compare_keys);
        link_chains(&ch, out);
        rc = collect_heads(&ch, out, err);
    }
    for (int i = 0; i < ch.n; i++) manifest_line_free(&ch.lines[i]);
    free(ch.lines);
    free(ch.by_hash);
    free(ch.by_position);
    free(ch.parent);
    free(ch.chained);
    free(ch.extended);
    free(ch.dead);
    if (rc) manifest_heads_free(out);
    return rc;
}

void manifest_heads_free(ManifestHeads *h) {
    for (int i = 0; i < h->n_heads; i++) free_head(&h->heads[i]);
    free(h->heads);
    memset(h, 0, sizeof *h);
}
