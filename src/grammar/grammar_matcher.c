/*
 * grammar_matcher.c — following one output through a grammar, and its token masks.
 *
 * State: a set of heads, each the top of a pushdown stack kept as a persistent linked list of
 * frames (StackNode: grammar state, parent frame). A head's state has byte edges; calls and
 * returns are expanded eagerly by closure(), so a set of heads is exactly the ways the output so
 * far can continue with one more byte. Nodes live in one arena: [0, base) holds the committed
 * stacks; trial work (a token tried, a mask's trie walk) appends after base and is cut back.
 *
 * Masks: for a head in state s, the tokens that can be read entirely inside s's rule (nested calls
 * included, never returning past the rule) do not depend on what lies below it on the stack. They
 * are found once per state by a walk of the vocabulary trie from a lone frame of s over a sentinel
 * parent, and cached (CiInfo): a token set, plus the trie nodes at which the rule can finish
 * ("returns"). At mask time a head costs an OR of its token set, and, for each return node, a walk
 * of that node's subtree from the head's real parent — the only context-dependent part (for a JSON
 * string: the tokens holding its closing quote, checked against what may follow the string).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grammar_nfa.h"
#include "grammar/grammar_vocab.h"

#define SENTINEL (-2)      /* parent of a cache walk's lone frame */
#define SEEN_BITS 15
#define CLOSURE_LIMIT (1 << 13) /* nodes one closure may visit */

typedef struct {
    int32_t state, parent, depth;
} StackNode;

typedef GrammarCiInfo CiInfo;

/* One cached grammar (GrammarCache, at the end of this file). */
typedef struct GrammarCacheEntry {
    char *spec;
    size_t len;
    Grammar *g;
    CiInfo **ci;
    int refs;
    uint64_t last_use;
    struct GrammarCache *cache;
} GrammarCacheEntry;

static void cache_release(GrammarCacheEntry *e);

struct GrammarMatcher {
    const Grammar *g;
    Grammar *owned;
    const GrammarVocab *v;
    StackNode *nodes;
    int n_nodes, cap_nodes, base;
    int32_t *cur;      /* committed heads */
    int n_cur, cap_cur;
    bool complete, ended;
    /* lazy grammar: free text until the trigger */
    bool free_phase;
    int trig_at;       /* trigger bytes matched so far */
    int32_t *kmp;      /* (trigger_len + 1) failure function */
    int32_t *trig_candidates; /* TEXT tokens holding the trigger's last byte (made on first need) */
    int n_trig_candidates;
    bool have_candidates;
    /* scratch */
    int32_t *hbuf;     /* stack of head sets */
    int n_hbuf, cap_hbuf;
    int32_t *work;
    int n_work, cap_work;
    uint64_t *seen_key;
    uint32_t *seen_gen;
    uint32_t gen;
    int32_t *remap;
    int cap_remap;
    StackNode *spare;
    int cap_spare;
    uint32_t *tmp_mask;
    CiInfo **ci;       /* (n_states), made on first use; a cache entry's when entry != NULL */
    struct GrammarCacheEntry *entry;
    int mask_words;
    bool overflow;
    bool oom;
    char error[192];
};

/* ---- arena and scratch ---- */

static bool grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return false;
    *p = q;
    *cap = n;
    return true;
}

static int node_new(GrammarMatcher *m, int32_t state, int32_t parent, int32_t depth) {
    if (!grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes)) {
        m->oom = true;
        return -1;
    }
    m->nodes[m->n_nodes] = (StackNode){state, parent, depth};
    return m->n_nodes++;
}

static void work_push(GrammarMatcher *m, int32_t x) {
    if (x < 0) return;
    if (!grow((void **)&m->work, &m->cap_work, m->n_work + 1, sizeof *m->work)) {
        m->oom = true;
        return;
    }
    m->work[m->n_work++] = x;
}

static void head_push(GrammarMatcher *m, int32_t x) {
    if (!grow((void **)&m->hbuf, &m->cap_hbuf, m->n_hbuf + 1, sizeof *m->hbuf)) {
        m->oom = true;
        return;
    }
    m->hbuf[m->n_hbuf++] = x;
}

/* True when (state, parent) was not seen in this closure yet (and marks it). */
static bool first_visit(GrammarMatcher *m, int32_t state, int32_t parent) {
    uint64_t key = ((uint64_t)(uint32_t)state << 32) | (uint32_t)parent;
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    uint32_t mask = (1u << SEEN_BITS) - 1, i = (uint32_t)(h >> (64 - SEEN_BITS));
    for (;; i = (i + 1) & mask) {
        if (m->seen_gen[i] != m->gen) {
            m->seen_gen[i] = m->gen;
            m->seen_key[i] = key;
            return true;
        }
        if (m->seen_key[i] == key) return false;
    }
}

typedef struct {
    bool done;   /* the root rule finished (parent -1 reached) */
    bool popped; /* the sentinel was reached (cache walks) */
} StepFlags;

/* Expands the worklist (calls pushed, finished rules returned) into heads appended to hbuf. */
static void closure(GrammarMatcher *m, StepFlags *f) {
    const Grammar *g = m->g;
    if (++m->gen == 0) { /* wrapped: clear the stamps */
        memset(m->seen_gen, 0, sizeof(uint32_t) << SEEN_BITS);
        m->gen = 1;
    }
    int visits = 0;
    while (m->n_work > 0) {
        int32_t x = m->work[--m->n_work];
        StackNode nd = m->nodes[x];
        if (!first_visit(m, nd.state, nd.parent)) continue;
        if (++visits > CLOSURE_LIMIT) {
            m->overflow = true;
            m->n_work = 0;
            return;
        }
        const GrammarState *st = &g->states[nd.state];
        if (st->n_byte) head_push(m, x);
        for (int c = 0; c < st->n_call; c++) {
            const GrammarCallEdge *e = &g->call_edges[st->call_begin + c];
            if (nd.depth >= GRAMMAR_MAX_DEPTH) continue; /* output nesting is bounded: deeper is not allowed */
            int ret = node_new(m, e->to, nd.parent, nd.depth);
            if (ret < 0) return;
            work_push(m, node_new(m, g->rule_start[e->rule], ret, nd.depth + 1));
        }
        if (st->final) {
            if (nd.parent == -1) f->done = true;
            else if (nd.parent == SENTINEL) f->popped = true;
            else work_push(m, nd.parent);
        }
    }
}

/* Advances the heads hbuf[off, off + n) by byte c; the new heads are appended to hbuf. Returns
 * their count. */
static int advance(GrammarMatcher *m, int off, int n, uint8_t c, StepFlags *f) {
    const Grammar *g = m->g;
    m->n_work = 0;
    for (int i = 0; i < n; i++) {
        StackNode nd = m->nodes[m->hbuf[off + i]];
        const GrammarState *st = &g->states[nd.state];
        if (!(st->first[c >> 5] >> (c & 31) & 1)) continue;
        const GrammarByteEdge *e = &g->byte_edges[st->byte_begin];
        for (int k = 0; k < st->n_byte; k++)
            if (e[k].lo <= c && c <= e[k].hi) work_push(m, node_new(m, e[k].to, nd.parent, nd.depth));
    }
    int start = m->n_hbuf;
    if (m->n_work == 1) { /* the common case (inside a string, a literal): one plain successor */
        int32_t x = m->work[0];
        const GrammarState *st = &g->states[m->nodes[x].state];
        if (st->n_call == 0 && !st->final) {
            m->n_work = 0;
            if (st->n_byte) head_push(m, x);
            return m->n_hbuf - start;
        }
    }
    closure(m, f);
    return m->n_hbuf - start;
}

/* ---- cached context-independent tokens per state ---- */

void grammar_ci_free(CiInfo *ci) {
    if (!ci) return;
    free(ci->bits);
    free(ci->list);
    free(ci->returns);
    free(ci);
}

static void set_tokens(const GrammarVocab *v, const GrammarVocabNode *node, uint32_t *mask) {
    for (int i = 0; i < node->n_tok; i++) {
        int32_t t = v->tok_ids[node->tok_begin + i];
        mask[t >> 5] |= 1u << (t & 31);
    }
}

typedef struct {
    int32_t *returns;
    int n, cap;
} ReturnList;

static void ci_walk(GrammarMatcher *m, int trie, int off, int n, ReturnList *rl) {
    const GrammarVocab *v = m->v;
    int end = trie + v->nodes[trie].size;
    for (int c = trie + 1; c < end; c += v->nodes[c].size) {
        int mark_nodes = m->n_nodes, mark_h = m->n_hbuf;
        StepFlags f = {0};
        int k = advance(m, off, n, v->nodes[c].byte, &f);
        if (f.popped) {
            if (!grow((void **)&rl->returns, &rl->cap, rl->n + 1, sizeof *rl->returns)) m->oom = true;
            else rl->returns[rl->n++] = c;
        }
        if (k > 0) {
            set_tokens(v, &v->nodes[c], m->tmp_mask);
            if (v->nodes[c].size > 1) ci_walk(m, c, mark_h, k, rl);
        }
        m->n_nodes = mark_nodes;
        m->n_hbuf = mark_h;
        if (m->oom) return;
    }
}

static CiInfo *ci_get(GrammarMatcher *m, int32_t state) {
    if (m->ci[state]) return m->ci[state];
    const Grammar *g = m->g;
    int k = state - g->plain_first;
    if (g->plain_n > 0 && k >= 0 && k < g->plain_n && k < m->v->n_plain && m->v->plain_ci[k]) return m->v->plain_ci[k];
    CiInfo *ci = calloc(1, sizeof *ci);
    if (!ci) {
        m->oom = true;
        return NULL;
    }
    memset(m->tmp_mask, 0, (size_t)m->mask_words * sizeof *m->tmp_mask);
    int mark_nodes = m->n_nodes, mark_h = m->n_hbuf;
    int x = node_new(m, state, SENTINEL, 1);
    ReturnList rl = {0};
    if (x >= 0) {
        head_push(m, x);
        ci_walk(m, 0, mark_h, 1, &rl);
    }
    m->n_nodes = mark_nodes;
    m->n_hbuf = mark_h;
    ci->returns = rl.returns;
    ci->n_returns = rl.n;
    int count = 0;
    for (int w = 0; w < m->mask_words; w++) count += __builtin_popcount(m->tmp_mask[w]);
    if ((size_t)count * 32 < (size_t)m->v->n_vocab) {
        ci->list = malloc((size_t)(count ? count : 1) * sizeof *ci->list);
        if (ci->list)
            for (int w = 0; w < m->mask_words; w++)
                for (uint32_t bits = m->tmp_mask[w]; bits; bits &= bits - 1) ci->list[ci->n_list++] = w * 32 + __builtin_ctz(bits);
    } else if ((ci->bits = malloc((size_t)m->mask_words * sizeof *ci->bits))) {
        memcpy(ci->bits, m->tmp_mask, (size_t)m->mask_words * sizeof *ci->bits);
    }
    if (m->oom || (!ci->list && !ci->bits)) {
        m->oom = true;
        grammar_ci_free(ci);
        return NULL;
    }
    m->ci[state] = ci;
    return ci;
}

/* ---- commit ---- */

static int32_t copy_chain(GrammarMatcher *m, int32_t x, int *n_spare) {
    if (x < 0) return x;
    if (m->remap[x] >= 0) return m->remap[x];
    int32_t parent = copy_chain(m, m->nodes[x].parent, n_spare);
    StackNode nd = m->nodes[x];
    nd.parent = parent;
    m->spare[*n_spare] = nd;
    return m->remap[x] = (*n_spare)++;
}

/* Makes hbuf[off, off + n) the committed heads, keeping only the nodes they reach. */
static int commit(GrammarMatcher *m, int off, int n, bool complete) {
    if (!grow((void **)&m->remap, &m->cap_remap, m->n_nodes, sizeof *m->remap) ||
        !grow((void **)&m->spare, &m->cap_spare, m->n_nodes, sizeof *m->spare) ||
        !grow((void **)&m->cur, &m->cap_cur, n, sizeof *m->cur)) {
        m->oom = true;
        return -1;
    }
    memset(m->remap, 0xff, (size_t)m->n_nodes * sizeof *m->remap);
    int n_spare = 0;
    for (int i = 0; i < n; i++) m->cur[i] = copy_chain(m, m->hbuf[off + i], &n_spare);
    m->n_cur = n;
    StackNode *t = m->nodes;
    int cap = m->cap_nodes;
    m->nodes = m->spare;
    m->cap_nodes = m->cap_spare;
    m->spare = t;
    m->cap_spare = cap;
    m->n_nodes = m->base = n_spare;
    m->n_hbuf = 0;
    m->complete = complete;
    return 0;
}

/* The committed heads copied to the top of hbuf; returns their offset. */
static int load_cur(GrammarMatcher *m) {
    int off = m->n_hbuf;
    for (int i = 0; i < m->n_cur; i++) head_push(m, m->cur[i]);
    return off;
}

/* Runs bytes from the committed state; on success commits (unless dry) and returns 0, else
 * restores. */
static int run_bytes_dry(GrammarMatcher *m, const uint8_t *p, size_t len, bool dry);
static int run_bytes(GrammarMatcher *m, const uint8_t *p, size_t len) { return run_bytes_dry(m, p, len, false); }

static int run_bytes_dry(GrammarMatcher *m, const uint8_t *p, size_t len, bool dry) {
    m->overflow = false;
    int off = load_cur(m), n = m->n_cur;
    bool done = m->complete;
    for (size_t i = 0; i < len; i++) {
        StepFlags f = {0};
        int mark = m->n_hbuf;
        n = advance(m, off, n, p[i], &f);
        off = mark;
        done = f.done;
        if (m->oom || m->overflow || (n == 0 && !(done && i == len - 1))) {
            m->n_nodes = m->base;
            m->n_hbuf = 0;
            return -1;
        }
    }
    if (dry) {
        m->n_nodes = m->base;
        m->n_hbuf = 0;
        return 0;
    }
    return commit(m, off, n, done);
}

/* ---- lazy grammars ---- */

static int kmp_step(const GrammarMatcher *m, int j, uint8_t c) {
    const char *t = m->g->trigger;
    int len = (int)m->g->trigger_len;
    if (j == len) j = m->kmp[j];
    while (j > 0 && (uint8_t)t[j] != c) j = m->kmp[j];
    if ((uint8_t)t[j] == c) j++;
    return j;
}

/* Bytes in the free phase: watches for the trigger; the bytes after it go to the grammar. */
static int accept_free(GrammarMatcher *m, const uint8_t *p, size_t len) {
    int j = m->trig_at;
    for (size_t i = 0; i < len; i++) {
        j = kmp_step(m, j, p[i]);
        if (j == (int)m->g->trigger_len) {
            if (run_bytes(m, p + i + 1, len - i - 1)) return -1;
            m->free_phase = false;
            return 0;
        }
    }
    m->trig_at = j;
    return 0;
}

static int make_candidates(GrammarMatcher *m) {
    const GrammarVocab *v = m->v;
    uint8_t last = (uint8_t)m->g->trigger[m->g->trigger_len - 1];
    m->trig_candidates = malloc((size_t)v->n_vocab * sizeof *m->trig_candidates);
    if (!m->trig_candidates) return -1;
    for (int t = 0; t < v->n_vocab; t++) {
        if (v->kinds[t] != GRAMMAR_TOKEN_TEXT) continue;
        if (memchr(v->text + v->offset[t], last, v->offset[t + 1] - v->offset[t])) m->trig_candidates[m->n_trig_candidates++] = t;
    }
    m->have_candidates = true;
    return 0;
}

/* Free phase: every TEXT and END token, but a token that completes the trigger only when the
 * grammar takes the rest of it. */
static int fill_free(GrammarMatcher *m, uint32_t *mask) {
    const GrammarVocab *v = m->v;
    if (!m->have_candidates && make_candidates(m)) {
        snprintf(m->error, sizeof m->error, "grammar: out of memory");
        return -1;
    }
    memcpy(mask, v->text_mask, (size_t)m->mask_words * sizeof *mask);
    for (int i = 0; i < v->n_end; i++) mask[v->end_ids[i] >> 5] |= 1u << (v->end_ids[i] & 31);
    for (int c = 0; c < m->n_trig_candidates; c++) {
        int32_t t = m->trig_candidates[c];
        const uint8_t *p = v->text + v->offset[t];
        size_t len = v->offset[t + 1] - v->offset[t];
        int j = m->trig_at;
        for (size_t i = 0; i < len; i++) {
            j = kmp_step(m, j, p[i]);
            if (j != (int)m->g->trigger_len) continue;
            /* Trial run of the rest, then back to the committed state. */
            int off = load_cur(m), n = m->n_cur;
            bool ok = true;
            for (size_t r = i + 1; r < len && ok; r++) {
                StepFlags f = {0};
                int mark = m->n_hbuf;
                n = advance(m, off, n, p[r], &f);
                off = mark;
                ok = n > 0 || (f.done && r == len - 1);
            }
            m->n_nodes = m->base;
            m->n_hbuf = 0;
            if (!ok) mask[t >> 5] &= ~(1u << (t & 31));
            break;
        }
    }
    int count = 0;
    for (int w = 0; w < m->mask_words; w++) count += __builtin_popcount(mask[w]);
    return count;
}

/* ---- public ---- */

GrammarMatcher *grammar_matcher_create(const Grammar *g, const GrammarVocab *vocab, char *why, size_t why_len) {
    GrammarMatcher *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->g = g;
    m->v = vocab;
    m->mask_words = vocab ? grammar_mask_words(vocab->n_vocab) : 0;
    m->seen_key = malloc(sizeof(uint64_t) << SEEN_BITS);
    m->seen_gen = calloc((size_t)1 << SEEN_BITS, sizeof(uint32_t));
    m->ci = calloc((size_t)g->n_states, sizeof *m->ci);
    m->tmp_mask = malloc((size_t)(m->mask_words ? m->mask_words : 1) * sizeof *m->tmp_mask);
    if (!m->seen_key || !m->seen_gen || !m->ci || !m->tmp_mask) goto oom;
    /* The start: the root rule's first state, or (lazy grammars) the state the trigger leads to. */
    int32_t start = g->trigger && !g->feed_trigger ? g->after_prefix_state : g->rule_start[g->root];
    int x = node_new(m, start, -1, 1);
    StepFlags f = {0};
    m->n_work = 0;
    work_push(m, x);
    closure(m, &f);
    if (m->oom || commit(m, 0, m->n_hbuf, f.done)) goto oom;
    if (g->trigger) {
        m->kmp = malloc((g->trigger_len + 1) * sizeof *m->kmp);
        if (!m->kmp) goto oom;
        /* kmp[j]: the longest proper border of trigger[0, j). */
        m->kmp[0] = 0;
        if (g->trigger_len > 0) m->kmp[1] = 0;
        for (size_t j = 1, k = 0; j < g->trigger_len; j++) {
            while (k > 0 && g->trigger[j] != g->trigger[k]) k = (size_t)m->kmp[k];
            if (g->trigger[j] == g->trigger[k]) k++;
            m->kmp[j + 1] = (int32_t)k;
        }
        if (g->feed_trigger && run_bytes(m, (const uint8_t *)g->trigger, g->trigger_len)) {
            snprintf(why, why_len, "grammar: the trigger is not a valid start of the output");
            grammar_matcher_free(m);
            return NULL;
        }
        m->free_phase = true;
    }
    return m;
oom:
    snprintf(why, why_len, "grammar: out of memory making a matcher");
    grammar_matcher_free(m);
    return NULL;
}

GrammarMatcher *grammar_matcher_create_from_spec(const char *spec_json, size_t len, const GrammarVocab *vocab, char *why,
                                                 size_t why_len) {
    Grammar *g = grammar_compile(spec_json, len, why, why_len);
    if (!g) return NULL;
    GrammarMatcher *m = grammar_matcher_create(g, vocab, why, why_len);
    if (!m) {
        grammar_free(g);
        return NULL;
    }
    m->owned = g;
    return m;
}

void grammar_matcher_free(GrammarMatcher *m) {
    if (!m) return;
    if (m->entry) {
        cache_release(m->entry);
    } else if (m->ci) {
        for (int s = 0; s < m->g->n_states; s++) grammar_ci_free(m->ci[s]);
        free(m->ci);
    }
    free(m->nodes);
    free(m->cur);
    free(m->kmp);
    free(m->trig_candidates);
    free(m->hbuf);
    free(m->work);
    free(m->seen_key);
    free(m->seen_gen);
    free(m->remap);
    free(m->spare);
    free(m->tmp_mask);
    grammar_free(m->owned);
    free(m);
}

bool grammar_matcher_is_complete(const GrammarMatcher *m) { return !m->ended && (m->free_phase || m->complete); }

bool grammar_matcher_is_terminated(const GrammarMatcher *m) {
    return m->ended || (!m->free_phase && m->complete && m->n_cur == 0);
}

const char *grammar_matcher_error(const GrammarMatcher *m) { return m->error; }

int grammar_matcher_accept_bytes(GrammarMatcher *m, const char *bytes, size_t len) {
    if (m->ended) return -1;
    m->overflow = false;
    int rc = m->free_phase ? accept_free(m, (const uint8_t *)bytes, len) : run_bytes(m, (const uint8_t *)bytes, len);
    if (rc && m->overflow)
        snprintf(m->error, sizeof m->error, "grammar: too many parse alternatives at once (more than %d)", CLOSURE_LIMIT);
    return rc;
}

bool grammar_matcher_would_accept(GrammarMatcher *m, const char *bytes, size_t len) {
    if (m->ended) return false;
    if (!m->free_phase) return run_bytes_dry(m, (const uint8_t *)bytes, len, true) == 0;
    const uint8_t *p = (const uint8_t *)bytes;
    int j = m->trig_at;
    for (size_t i = 0; i < len; i++) {
        j = kmp_step(m, j, p[i]);
        if (j == (int)m->g->trigger_len) return run_bytes_dry(m, p + i + 1, len - i - 1, true) == 0;
    }
    return true;
}

int grammar_matcher_accept_token(GrammarMatcher *m, int32_t token) {
    const GrammarVocab *v = m->v;
    if (!v || token < 0 || token >= v->n_vocab || m->ended) return -1;
    if (v->kinds[token] == GRAMMAR_TOKEN_END) {
        if (!grammar_matcher_is_complete(m)) return -1;
        m->ended = true;
        return 0;
    }
    if (v->kinds[token] != GRAMMAR_TOKEN_TEXT) return -1;
    return grammar_matcher_accept_bytes(m, (const char *)v->text + v->offset[token], v->offset[token + 1] - v->offset[token]);
}

/* Runtime walk of a return node's subtree from the heads hbuf[off, off + n). */
static void walk_returns(GrammarMatcher *m, int trie, int off, int n, uint32_t *mask) {
    const GrammarVocab *v = m->v;
    int end = trie + v->nodes[trie].size;
    for (int c = trie + 1; c < end; c += v->nodes[c].size) {
        int mark_nodes = m->n_nodes, mark_h = m->n_hbuf;
        StepFlags f = {0};
        int k = advance(m, off, n, v->nodes[c].byte, &f);
        if (k > 0 || f.done) set_tokens(v, &v->nodes[c], mask);
        if (k > 0 && v->nodes[c].size > 1) walk_returns(m, c, mark_h, k, mask);
        m->n_nodes = mark_nodes;
        m->n_hbuf = mark_h;
    }
}

/* A bounded string's character boundary: the plain-string content state's tokens that start at
 * most the characters left, and its return nodes whose closing quote lands inside [min, max]. */
static void fill_bounded(GrammarMatcher *m, StackNode head, const GrammarBoundedPos *bp, uint32_t *mask) {
    const GrammarVocab *v = m->v;
    const CiInfo *ci = v->plain_ci[v->plain_content];
    int64_t room = bp->max == INT32_MAX ? INT64_MAX : (int64_t)bp->max - bp->pos;
    int cap = room < v->chars_cap ? (int)room : v->chars_cap;
    if (cap >= 0)
        for (int w = 0; w < m->mask_words; w++) mask[w] |= v->upto[cap][w];
    for (int i = 0; i < v->n_over; i++)
        if (v->over_chars[i] <= room) mask[v->over_tokens[i] >> 5] |= 1u << (v->over_tokens[i] & 31);
    m->n_hbuf = 0;
    m->n_work = 0;
    work_push(m, head.parent);
    StepFlags f = {0};
    closure(m, &f);
    int n = m->n_hbuf;
    for (int r = 0; r < ci->n_returns; r++) {
        int64_t at = (int64_t)bp->pos + v->return_chars[r];
        if (at < bp->min || at > bp->max) continue;
        const GrammarVocabNode *node = &v->nodes[ci->returns[r]];
        if (n > 0 || f.done) set_tokens(v, node, mask);
        if (n > 0 && node->size > 1) walk_returns(m, ci->returns[r], 0, n, mask);
    }
    m->n_nodes = m->base;
    m->n_hbuf = 0;
}

int grammar_matcher_fill_mask(GrammarMatcher *m, uint32_t *mask) {
    const GrammarVocab *v = m->v;
    if (!v) {
        snprintf(m->error, sizeof m->error, "grammar: matcher has no vocabulary");
        return -1;
    }
    memset(mask, 0, (size_t)m->mask_words * sizeof *mask);
    if (m->ended) return 0;
    if (m->free_phase) return fill_free(m, mask);
    m->overflow = false;
    for (int h = 0; h < m->n_cur; h++) {
        StackNode head = m->nodes[m->cur[h]];
        const GrammarBoundedPos *bp = m->g->bounded && m->g->bounded[head.state].pos >= 0 ? &m->g->bounded[head.state] : NULL;
        if (bp && head.parent >= 0 && v->upto) {
            fill_bounded(m, head, bp, mask);
            continue;
        }
        CiInfo *ci = ci_get(m, head.state);
        if (!ci) break;
        if (ci->bits)
            for (int w = 0; w < m->mask_words; w++) mask[w] |= ci->bits[w];
        for (int i = 0; i < ci->n_list; i++) mask[ci->list[i] >> 5] |= 1u << (ci->list[i] & 31);
        if (ci->n_returns == 0) continue;
        if (head.parent < 0) { /* the root rule itself: finishing it ends the output */
            for (int r = 0; r < ci->n_returns; r++) set_tokens(v, &v->nodes[ci->returns[r]], mask);
            continue;
        }
        /* What follows the rule: the parent frame's closure, shared by every return node. */
        m->n_hbuf = 0;
        m->n_work = 0;
        work_push(m, head.parent);
        StepFlags f = {0};
        closure(m, &f);
        int n = m->n_hbuf;
        for (int r = 0; r < ci->n_returns; r++) {
            const GrammarVocabNode *node = &v->nodes[ci->returns[r]];
            if (n > 0 || f.done) set_tokens(v, node, mask);
            if (n > 0 && node->size > 1) walk_returns(m, ci->returns[r], 0, n, mask);
        }
        m->n_nodes = m->base;
        m->n_hbuf = 0;
    }
    m->n_nodes = m->base;
    m->n_hbuf = 0;
    if (m->oom) {
        snprintf(m->error, sizeof m->error, "grammar: out of memory computing a token mask");
        return -1;
    }
    if (m->complete)
        for (int i = 0; i < v->n_end; i++) mask[v->end_ids[i] >> 5] |= 1u << (v->end_ids[i] & 31);
    int count = 0;
    for (int w = 0; w < m->mask_words; w++) count += __builtin_popcount(mask[w]);
    if (m->overflow) {
        snprintf(m->error, sizeof m->error, "grammar: too many parse alternatives at once (more than %d)", CLOSURE_LIMIT);
        return -1;
    }
    return count;
}

/* String characters a token starts when read from a character boundary of a plain string (a
 * character the token only begins counts). */
static int string_chars(const uint8_t *p, size_t n) {
    int chars = 0;
    for (size_t i = 0; i < n; chars++) {
        uint8_t c = p[i];
        i += c == '\\' ? (i + 1 < n && p[i + 1] == 'u' ? 6 : 2) : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    }
    return chars;
}

#define CHARS_CAP_LIMIT 128

/* The content state's tokens by character count, and its return nodes' counts (GrammarVocab). */
static int precompute_bounded(GrammarVocab *v) {
    const CiInfo *ci = v->plain_ci[v->plain_content];
    int words = grammar_mask_words(v->n_vocab), cap = 0;
    int32_t *ids = malloc((size_t)v->n_vocab * sizeof *ids), *chars = malloc((size_t)v->n_vocab * sizeof *chars);
    int n = 0;
    if (!ids || !chars) goto oom;
    for (int w = 0; ci->bits && w < words; w++)
        for (uint32_t bits = ci->bits[w]; bits; bits &= bits - 1) ids[n++] = w * 32 + __builtin_ctz(bits);
    for (int i = 0; i < ci->n_list; i++) ids[n++] = ci->list[i];
    for (int i = 0; i < n; i++) {
        chars[i] = string_chars(v->text + v->offset[ids[i]], v->offset[ids[i] + 1] - v->offset[ids[i]]);
        if (chars[i] > cap) cap = chars[i];
    }
    v->chars_cap = cap < CHARS_CAP_LIMIT ? cap : CHARS_CAP_LIMIT;
    v->upto = calloc((size_t)v->chars_cap + 1, sizeof *v->upto);
    v->over_tokens = malloc((size_t)(n ? n : 1) * sizeof *v->over_tokens);
    v->over_chars = malloc((size_t)(n ? n : 1) * sizeof *v->over_chars);
    v->return_chars = malloc((size_t)(ci->n_returns ? ci->n_returns : 1) * sizeof *v->return_chars);
    if (!v->upto || !v->over_tokens || !v->over_chars || !v->return_chars) goto oom;
    for (int c = 0; c <= v->chars_cap; c++)
        if (!(v->upto[c] = calloc((size_t)words, sizeof *v->upto[c]))) goto oom;
    for (int i = 0; i < n; i++) {
        int32_t t = ids[i];
        if (chars[i] > v->chars_cap) {
            v->over_tokens[v->n_over] = t;
            v->over_chars[v->n_over++] = chars[i];
            continue;
        }
        v->upto[chars[i]][t >> 5] |= 1u << (t & 31);
    }
    for (int c = 1; c <= v->chars_cap; c++)
        for (int w = 0; w < words; w++) v->upto[c][w] |= v->upto[c - 1][w];
    for (int r = 0; r < ci->n_returns; r++) {
        int node = ci->returns[r];
        int k = node;
        while (v->nodes[k].n_tok == 0) k++; /* a token of its subtree: every node has one */
        int32_t t = v->tok_ids[v->nodes[k].tok_begin];
        v->return_chars[r] = string_chars(v->text + v->offset[t], (size_t)v->nodes[node].depth - 1);
    }
    free(ids);
    free(chars);
    return 0;
oom:
    free(ids);
    free(chars);
    return -1;
}

int grammar_vocab_precompute(GrammarVocab *v, char *why, size_t why_len) {
    GrammarBuilder b;
    grammar_builder_init(&b);
    int32_t first = 0, n = 0;
    int r = grammar_build_plain_string(&b, &first, &n);
    Grammar *g = r >= 0 ? grammar_builder_finish(&b, r, why, why_len) : NULL;
    grammar_builder_free(&b);
    if (!g) {
        snprintf(why, why_len, "grammar: out of memory precomputing the vocabulary's masks");
        return -1;
    }
    /* A matcher over this vocabulary before it has precomputed caches (n_plain is still 0). */
    GrammarMatcher *m = grammar_matcher_create(g, v, why, why_len);
    v->plain_ci = calloc((size_t)n, sizeof *v->plain_ci);
    int rc = m && v->plain_ci ? 0 : -1;
    for (int k = 0; rc == 0 && k < n; k++) {
        if (g->states[first + k].n_byte == 0) continue;
        if (!(v->plain_ci[k] = ci_get(m, first + k))) rc = -1;
        m->ci[first + k] = NULL; /* the vocabulary keeps it */
    }
    v->n_plain = n;
    if (rc == 0) {
        const GrammarState *start = &g->states[first];
        v->plain_content = start->n_byte == 1 ? g->byte_edges[start->byte_begin].to - first : -1;
        if (v->plain_content < 0 || v->plain_content >= n || !v->plain_ci[v->plain_content] || precompute_bounded(v)) rc = -1;
    }
    if (rc) snprintf(why, why_len, "grammar: out of memory precomputing the vocabulary's masks");
    grammar_matcher_free(m);
    grammar_free(g);
    return rc;
}

/* ---- a per-thread cache of compiled grammars and their mask caches ---- */


struct GrammarCache {
    const GrammarVocab *v;
    GrammarCacheEntry *entries;
    int n, cap;
    uint64_t clock;
    int held;    /* matchers alive on its entries */
    bool closed; /* grammar_cache_free was called: the last matcher out frees it */
};

GrammarCache *grammar_cache_create(const GrammarVocab *vocab, int capacity) {
    GrammarCache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->v = vocab;
    c->cap = capacity > 0 ? capacity : 1;
    if (!(c->entries = calloc((size_t)c->cap, sizeof *c->entries))) {
        free(c);
        return NULL;
    }
    return c;
}

static void entry_free(GrammarCacheEntry *e) {
    for (int s = 0; e->ci && e->g && s < e->g->n_states; s++) grammar_ci_free(e->ci[s]);
    free(e->ci);
    grammar_free(e->g);
    free(e->spec);
    memset(e, 0, sizeof *e);
}

void grammar_cache_free(GrammarCache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++)
        if (c->entries[i].refs == 0) entry_free(&c->entries[i]);
    c->closed = true;
    if (c->held > 0) return; /* matchers outlive it: the last one frees the rest */
    free(c->entries);
    free(c);
}

static void cache_release(GrammarCacheEntry *e) {
    GrammarCache *c = e->cache;
    e->refs--;
    c->held--;
    if (!c->closed) return;
    if (e->refs == 0) entry_free(e);
    if (c->held == 0) {
        free(c->entries);
        free(c);
    }
}

GrammarMatcher *grammar_cache_matcher(GrammarCache *c, const char *spec_json, size_t len, char *why, size_t why_len) {
    GrammarCacheEntry *e = NULL;
    for (int i = 0; i < c->n && !e; i++)
        if (c->entries[i].g && c->entries[i].len == len && memcmp(c->entries[i].spec, spec_json, len) == 0) e = &c->entries[i];
    if (!e) {
        Grammar *g = grammar_compile(spec_json, len, why, why_len);
        if (!g) return NULL;
        if (c->n == c->cap) { /* evict the least recently used entry no matcher holds */
            GrammarCacheEntry *victim = NULL;
            for (int i = 0; i < c->n; i++)
                if (c->entries[i].refs == 0 && (!victim || !c->entries[i].g || c->entries[i].last_use < victim->last_use)) victim = &c->entries[i];
            if (!victim) { /* all in use: this one goes uncached */
                GrammarMatcher *m = grammar_matcher_create(g, c->v, why, why_len);
                if (m) m->owned = g;
                else grammar_free(g);
                return m;
            }
            entry_free(victim); /* its slot is reused in place: held entries never move */
            e = victim;
        } else {
            e = &c->entries[c->n++];
        }
        e->g = g;
        e->spec = malloc(len ? len : 1);
        e->ci = calloc((size_t)g->n_states, sizeof *e->ci);
        if (!e->spec || !e->ci) { /* the slot stays, empty (len 0, no spec: never matches) */
            free(e->spec);
            free(e->ci);
            grammar_free(g);
            memset(e, 0, sizeof *e);
            snprintf(why, why_len, "grammar: out of memory");
            return NULL;
        }
        memcpy(e->spec, spec_json, len);
        e->len = len;
    }
    GrammarMatcher *m = grammar_matcher_create(e->g, c->v, why, why_len);
    if (!m) return NULL;
    free(m->ci);
    m->ci = e->ci;
    m->entry = e;
    e->cache = c;
    e->refs++;
    c->held++;
    e->last_use = ++c->clock;
    return m;
}
