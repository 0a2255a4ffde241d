#include "cache/radix_tree.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"

uint64_t radix_namespace(uint32_t tenant, uint32_t adapter) { return ((uint64_t)tenant << 32) | adapter; }

/* ---- nodes ---- */

static RadixNode *node_new(uint64_t ns, int n_blocks, int block_size) {
    RadixNode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->ns = ns;
    for (int t = 0; t < CACHE_N_TIERS; t++) n->heap_pos[t] = -1;
    n->pin_pos = -1;
    n->n_blocks = n_blocks;
    if (n_blocks > 0) {
        n->tokens = malloc((size_t)n_blocks * block_size * sizeof *n->tokens);
        n->blocks = malloc((size_t)n_blocks * sizeof *n->blocks);
        n->host_blocks = malloc((size_t)n_blocks * sizeof *n->host_blocks);
        n->hashes = malloc((size_t)n_blocks * sizeof *n->hashes);
        if (!n->tokens || !n->blocks || !n->host_blocks || !n->hashes) {
            free(n->tokens);
            free(n->blocks);
            free(n->host_blocks);
            free(n->hashes);
            free(n);
            return NULL;
        }
    }
    return n;
}

static void node_destroy(RadixNode *n) {
    free(n->meta.uses);
    free(n->children);
    free(n->tokens);
    free(n->blocks);
    free(n->host_blocks);
    free(n->hashes);
    free(n);
}

static int add_child(RadixNode *parent, RadixNode *child) {
    if (braid_grow((void **)&parent->children, &parent->cap_children, parent->n_children + 1, sizeof *parent->children)) return -1;
    parent->children[parent->n_children++] = child;
    child->parent = parent;
    return 0;
}

static void remove_child(RadixNode *parent, RadixNode *child) {
    for (int i = 0; i < parent->n_children; i++)
        if (parent->children[i] == child) {
            parent->children[i] = parent->children[--parent->n_children];
            return;
        }
    assert(!"remove_child: not a child");
}

static int blocks_equal(const int32_t *a, const int32_t *b, int block_size) {
    return memcmp(a, b, (size_t)block_size * sizeof *a) == 0;
}

/* Children never share a first block, so at most one child matches. */
static RadixNode *find_child(const RadixNode *node, const int32_t *tokens, int block_size) {
    for (int i = 0; i < node->n_children; i++)
        if (blocks_equal(node->children[i]->tokens, tokens, block_size)) return node->children[i];
    return NULL;
}

/* Moves the first k entries of each per-block array of node into upper and shifts the rest. */
#define SPLIT_ARRAY(field, per_block)                                                                         \
    do {                                                                                                      \
        memcpy(upper->field, node->field, (size_t)k * (per_block) * sizeof *node->field);                     \
        memmove(node->field, node->field + (size_t)k * (per_block), (size_t)rest * (per_block) * sizeof *node->field); \
    } while (0)

/* Splits node after its first k blocks: a new upper node takes them and the node keeps the rest
 * as the upper node's only child. Returns the upper node. */
static RadixNode *split_node(RadixTree *t, RadixNode *node, int k) {
    int bs = t->block_size, rest = node->n_blocks - k;
    RadixNode *upper = node_new(node->ns, k, bs);
    if (!upper) return NULL;
    RadixNode *parent = node->parent;
    /* The upper half starts with the node's metadata, its own copy of the uses included. */
    CacheNodeUse *uses = NULL;
    if (node->meta.n_uses > 0 && !(uses = malloc((size_t)node->meta.n_uses * sizeof *uses))) {
        node_destroy(upper);
        return NULL;
    }
    if (add_child(upper, node)) {
        free(uses);
        node_destroy(upper);
        return NULL;
    }
    SPLIT_ARRAY(tokens, bs);
    SPLIT_ARRAY(blocks, 1);
    SPLIT_ARRAY(host_blocks, 1);
    SPLIT_ARRAY(hashes, 1);
    upper->lock_ref = node->lock_ref;
    upper->meta = node->meta;
    upper->meta.uses = uses;
    upper->meta.cap_uses = node->meta.n_uses;
    if (uses) memcpy(uses, node->meta.uses, (size_t)node->meta.n_uses * sizeof *uses);
    upper->meta.content_hash = upper->hashes[k - 1];
    for (int i = 0; i < parent->n_children; i++)
        if (parent->children[i] == node) parent->children[i] = upper;
    upper->parent = parent;
    node->parent = upper;
    node->n_blocks = rest;
    if (t->on_split) t->on_split(t->split_ctx, upper, node);
    return upper;
}

RadixNode *radix_root(RadixTree *t, uint64_t ns) {
    for (int i = 0; i < t->n_roots; i++)
        if (t->roots[i].ns == ns) return t->roots[i].root;
    if (braid_grow((void **)&t->roots, &t->cap_roots, t->n_roots + 1, sizeof *t->roots)) return NULL;
    RadixNode *root = node_new(ns, 0, t->block_size);
    if (!root) return NULL;
    t->roots[t->n_roots].ns = ns;
    t->roots[t->n_roots++].root = root;
    return root;
}

int radix_init(RadixTree *t, int block_size, BraidError *err) {
    memset(t, 0, sizeof *t);
    if (block_size < 1) return braid_error_set(err, "radix: block size %d must be positive", block_size);
    t->block_size = block_size;
    return 0;
}

static void destroy_subtree(RadixNode *n, void (*visit)(void *, RadixNode *), void *ctx) {
    for (int i = 0; i < n->n_children; i++) destroy_subtree(n->children[i], visit, ctx);
    if (visit && !radix_is_root(n)) visit(ctx, n);
    node_destroy(n);
}

void radix_free(RadixTree *t, void (*visit)(void *ctx, RadixNode *node), void *ctx) {
    for (int i = 0; i < t->n_roots; i++) destroy_subtree(t->roots[i].root, visit, ctx);
    free(t->roots);
    memset(t, 0, sizeof *t);
}

int radix_walk(RadixTree *t, RadixNode *root, const int32_t *tokens, int max_blocks, RadixNode **end,
               void (*step)(void *ctx, RadixNode *node), void *ctx) {
    return radix_walk_while(t, root, tokens, max_blocks, end, NULL, step, ctx);
}

int radix_walk_while(RadixTree *t, RadixNode *root, const int32_t *tokens, int max_blocks, RadixNode **end,
                     bool (*enter)(void *ctx, const RadixNode *child, int pos), void (*step)(void *ctx, RadixNode *node), void *ctx) {
    int bs = t->block_size, pos = 0;
    RadixNode *node = root;
    while (pos < max_blocks) {
        RadixNode *child = find_child(node, tokens + (size_t)pos * bs, bs);
        if (!child || (enter && !enter(ctx, child, pos))) break;
        int k = 1;
        while (k < child->n_blocks && pos + k < max_blocks && blocks_equal(child->tokens + (size_t)k * bs, tokens + (size_t)(pos + k) * bs, bs))
            k++;
        if (k < child->n_blocks && !(child = split_node(t, child, k))) return -1;
        pos += k;
        node = child;
        if (step) step(ctx, node);
    }
    *end = node;
    return pos;
}

int radix_peek(const RadixNode *root, int bs, const int32_t *tokens, int max_blocks,
               bool (*enter)(const void *ctx, const RadixNode *child), const void *ctx) {
    int pos = 0;
    const RadixNode *node = root;
    while (node && pos < max_blocks) {
        const RadixNode *child = find_child(node, tokens + (size_t)pos * bs, bs);
        if (!child || (enter && !enter(ctx, child))) break;
        int k = 1;
        while (k < child->n_blocks && pos + k < max_blocks && blocks_equal(child->tokens + (size_t)k * bs, tokens + (size_t)(pos + k) * bs, bs))
            k++;
        pos += k;
        if (k < child->n_blocks) break;
        node = child;
    }
    return pos;
}

int radix_shared_blocks(const int32_t *a, int n_a, const int32_t *b, int n_b, int block_size) {
    if (block_size <= 0) return 0;
    int n = n_a < n_b ? n_a : n_b, blocks = 0;
    while ((blocks + 1) * block_size <= n && blocks_equal(a + (size_t)blocks * block_size, b + (size_t)blocks * block_size, block_size))
        blocks++;
    return blocks;
}

RadixNode *radix_add_leaf(RadixTree *t, RadixNode *parent, const int32_t *tokens, int n_blocks) {
    RadixNode *leaf = node_new(parent->ns, n_blocks, t->block_size);
    if (!leaf) return NULL;
    if (add_child(parent, leaf)) {
        node_destroy(leaf);
        return NULL;
    }
    memcpy(leaf->tokens, tokens, (size_t)n_blocks * t->block_size * sizeof *tokens);
    return leaf;
}

RadixNode *radix_split(RadixTree *t, RadixNode *node, int k) {
    assert(!radix_is_root(node) && k > 0 && k < node->n_blocks);
    return split_node(t, node, k);
}

void radix_remove_leaf(RadixTree *t, RadixNode *n) {
    (void)t;
    assert(!radix_is_root(n) && n->n_children == 0);
    remove_child(n->parent, n);
    node_destroy(n);
}
