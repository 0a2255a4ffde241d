#include "model/bpe.h"

#include <stdlib.h>

typedef struct {
    double priority;
    int left;       /* index of the left symbol */
    size_t merged;  /* left.len + right.len when queued; a mismatch later means the entry is stale */
} BpeCandidate;

typedef struct {
    BpeCandidate *items;
    int n, cap;
} CandidateHeap;

static int candidate_before(const BpeCandidate *a, const BpeCandidate *b) {
    return a->priority < b->priority || (a->priority == b->priority && a->left < b->left);
}

static int heap_push(CandidateHeap *h, BpeCandidate c) {
    if (h->n == h->cap) {
        int cap = h->cap ? h->cap * 2 : 16;
        BpeCandidate *items = realloc(h->items, (size_t)cap * sizeof *items);
        if (!items) return -1;
        h->items = items;
        h->cap = cap;
    }
    int i = h->n++;
    while (i > 0 && candidate_before(&c, &h->items[(i - 1) / 2])) {
        h->items[i] = h->items[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->items[i] = c;
    return 0;
}

static BpeCandidate heap_pop(CandidateHeap *h) {
    BpeCandidate top = h->items[0], last = h->items[--h->n];
    int i = 0;
    for (;;) {
        int child = 2 * i + 1;
        if (child >= h->n) break;
        if (child + 1 < h->n && candidate_before(&h->items[child + 1], &h->items[child])) child++;
        if (!candidate_before(&h->items[child], &last)) break;
        h->items[i] = h->items[child];
        i = child;
    }
    if (h->n > 0) h->items[i] = last;
    return top;
}

static int queue_pair(CandidateHeap *h, const char *text, const BpeSymbol *s, int left, BpeRankFn rank, void *user) {
    if (left < 0) return 0;
    int right = s[left].next;
    if (right < 0) return 0;
    double priority;
    if (!rank(user, text, s[left].start, s[left].len, s[right].len, &priority)) return 0;
    BpeCandidate c = {.priority = priority, .left = left, .merged = s[left].len + s[right].len};
    return heap_push(h, c);
}

int bpe_merge(const char *text, const size_t *bounds, int n, BpeRankFn rank, void *user, BpeSymbol **out) {
    BpeSymbol *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
    CandidateHeap heap = {0};
    if (!s) return -1;
    for (int i = 0; i < n; i++) {
        s[i].start = bounds[i];
        s[i].len = bounds[i + 1] - bounds[i];
        s[i].prev = i - 1;
        s[i].next = i + 1 < n ? i + 1 : -1;
    }
    for (int i = 0; i + 1 < n; i++)
        if (queue_pair(&heap, text, s, i, rank, user)) goto oom;
    while (heap.n > 0) {
        BpeCandidate c = heap_pop(&heap);
        int left = c.left, right = s[left].next;
        if (s[left].len == 0 || right < 0 || s[left].len + s[right].len != c.merged) continue; /* stale */
        s[left].len += s[right].len;
        s[right].len = 0;
        s[left].next = s[right].next;
        if (s[right].next >= 0) s[s[right].next].prev = left;
        if (queue_pair(&heap, text, s, s[left].prev, rank, user) || queue_pair(&heap, text, s, left, rank, user)) goto oom;
    }
    free(heap.items);
    *out = s;
    return 0;
oom:
    free(heap.items);
    free(s);
    return -1;
}
