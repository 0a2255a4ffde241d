#include "worker/graph_ladder.h"

static int next_size(int s) {
    if (s < 8) return s * 2;
    if (s < 64) return s + 8;
    if (s < 128) return s + 16;
    return s + 32;
}

void graph_ladder_build(GraphLadder *ladder, int max_seqs) {
    ladder->n = 0;
    for (int s = 1; s < max_seqs && ladder->n < GRAPH_LADDER_MAX - 1; s = next_size(s)) ladder->sizes[ladder->n++] = s;
    if (max_seqs >= 1) ladder->sizes[ladder->n++] = max_seqs;
}

int graph_ladder_pick(const GraphLadder *ladder, int batch) {
    for (int i = 0; i < ladder->n; i++)
        if (ladder->sizes[i] >= batch) return i;
    return -1;
}

int decode_split_count(int n_seqs, int n_kv_heads, int n_sms, int context_hint, int max_splits) {
    int blocks = n_seqs * n_kv_heads;
    int splits = blocks > 0 ? (2 * n_sms + blocks - 1) / blocks : 1;
    int by_context = (context_hint + 63) / 64;
    if (splits > by_context) splits = by_context;
    if (splits > max_splits) splits = max_splits;
    return splits < 1 ? 1 : splits;
}
