/*
 * graph_ladder.h — which decode batch sizes get a captured CUDA graph, and launch-shape choices
 * that must not depend on anything a graph cannot see.
 *
 * A decode step of n sequences replays the graph of the smallest ladder size >= n, with the rows
 * past n padded (they write no KV slot and their outputs are ignored). The ladder is dense where
 * padding would waste most (small batches) and coarser above. Pure functions; the CUDA backend
 * uses them and the unit tests check them without a GPU.
 */
#ifndef BRAID_WORKER_GRAPH_LADDER_H
#define BRAID_WORKER_GRAPH_LADDER_H

#define GRAPH_LADDER_MAX 40

typedef struct {
    int n;
    int sizes[GRAPH_LADDER_MAX]; /* ascending; the last is max_seqs */
} GraphLadder;

/* 1, 2, 4, 8, then steps of 8 to 64, of 16 to 128, of 32 beyond; capped and ended at max_seqs. */
void graph_ladder_build(GraphLadder *ladder, int max_seqs);
/* Index of the smallest size >= batch, or -1 when batch exceeds the ladder. */
int graph_ladder_pick(const GraphLadder *ladder, int batch);

/* How many parts decode attention splits each context into: enough blocks to cover the GPU twice
 * (n_seqs * n_kv_heads * splits >= 2 * n_sms), at most max_splits, and no more than one part per
 * 64 context slots (context_hint = longest context expected; pass the model's for graphs). */
int decode_split_count(int n_seqs, int n_kv_heads, int n_sms, int context_hint, int max_splits);

#endif
