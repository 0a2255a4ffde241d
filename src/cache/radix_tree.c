#include "cache/radix_tree.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"

uint64_t radix_namespace(uint32_t tenant, uint32_t adapter) { return ((uint64_t)tenant << 32) | adapter; }

static uint32_t label_hash(const char *s) {
    if (!s || !*s) return 0;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

uint64_t radix_namespace_for(const char *tenant, const char *adapter) {
    return radix_namespace(label_hash(tenant), label_hash(adapter));
}

/* ---- evictable-leaf set ---- */

static int is_root(const RadixNode *n) { return n->parent == NULL; }

static int should_be_evictable(const RadixNode *n) {
    return !is_root(n) && n->n_children == 0 && n->lock_ref == 0 && !n->meta.pinned;
}

static int evictable_add(RadixTree *t, RadixNode *n) {
    if (n->evictable_index >= 0) return 0;
    if (braid_grow((void **)&t->evictable, &t->cap_evictable, t->n_evictable + 1, sizeof *t->evictable)) return -1;
    n->evictable_index = t->n_evictable;
    t->evictable[t->n_evictable++] = n;
    return 0;
}

static void evictable_remove(RadixTree *t, RadixNode *n) {
    int i = n->evictable_index;
    if (i < 0) return;
    RadixNode *last = t->evictable[--t->n_evictable];
    t->evictable[i] = last;
    last->evictable_index = i;
    n->evictable_index = -1;
}

static int evictable_refresh(RadixTree *t, RadixNode *n) {
    if (should_be_evictable(n)) return evictable_add(t, n);
    evictable_remove(t, n);
    return 0;
}

/* ---- nodes ---- */

static RadixNode *node_new(uint64_t ns, int n_blocks, int block_size) {
    RadixNode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->ns = ns;
    n->evictable_index = -1;
    n->n_blocks = n_blocks;
    if (n_blocks > 0) {
        n->tokens = malloc((size_t)n_blocks * block_size * sizeof *n->tokens);
        n->blocks = malloc((size_t)n_blocks * sizeof *n->blocks);
        if (!n->tokens || !n->blocks) {
            free(n->tokens);
            free(n->blocks);
            free(n);
            return NULL;
        }
    }
    return n;
}

static void node_destroy(RadixNode *n) {
    free(n->children);
    free(n->tokens);
    free(n->blocks);
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

/* Splits node after its first k blocks: a new upper node takes them and the node keeps the rest
 * as the upper node's only child. Returns the upper node. */
static RadixNode *split_node(RadixTree *t, RadixNode *node, int k) {
    int bs = t->block_size;
    RadixNode *upper = node_new(node->ns, k, bs);
    if (!upper) return NULL;
    memcpy(upper->tokens, node->tokens, (size_t)k * bs * sizeof *node->tokens);
    memcpy(upper->blocks, node->blocks, (size_t)k * sizeof *node->blocks);
    upper->lock_ref = node->lock_ref;
    upper->meta = node->meta;
    RadixNode *parent = node->parent;
    if (add_child(upper, node)) {
        node_destroy(upper);
        return NULL;
    }
    for (int i = 0; i < parent->n_children; i++)
        if (parent->children[i] == node) parent->children[i] = upper;
    upper->parent = parent;
    node->parent = upper;
    int rest = node->n_blocks - k;
    memmove(node->tokens, node->tokens + (size_t)k * bs, (size_t)rest * bs * sizeof *node->tokens);
    memmove(node->blocks, node->blocks + k, (size_t)rest * sizeof *node->blocks);
    node->n_blocks = rest;
    return upper;
}

static RadixNode *get_root(RadixTree *t, uint64_t ns) {
    for (int i = 0; i < t->n_roots; i++)
        if (t->roots[i].ns == ns) return t->roots[i].root;
    if (braid_grow((void **)&t->roots, &t->cap_roots, t->n_roots + 1, sizeof *t->roots)) return NULL;
    RadixNode *root = node_new(ns, 0, t->block_size);
    if (!root) return NULL;
    t->roots[t->n_roots].ns = ns;
    t->roots[t->n_roots++].root = root;
    return root;
}

static void touch(RadixTree *t, RadixNode *n, int is_hit) {
    n->meta.last_access = ++t->tick;
    if (is_hit) n->meta.hit_count++;
    if (is_hit && t->policy->on_access) t->policy->on_access(t->policy_state, n);
}

/* One step down the tree: the child of node that continues tokens[pos..] (block granularity),
 * split so that it ends where the match ends (at most max_blocks - pos blocks). Returns NULL with
 * *status 0 when no child continues the sequence, or NULL with *status -1 when out of memory;
 * *matched gets the child's block count after the split. */
static RadixNode *descend(RadixTree *t, RadixNode *node, const int32_t *tokens, int pos, int max_blocks, int *matched, int *status) {
    int bs = t->block_size;
    *status = 0;
    RadixNode *child = find_child(node, tokens + (size_t)pos * bs, bs);
    if (!child) return NULL;
    int k = 1;
    while (k < child->n_blocks && pos + k < max_blocks && blocks_equal(child->tokens + (size_t)k * bs, tokens + (size_t)(pos + k) * bs, bs))
        k++;
    if (k < child->n_blocks && !(child = split_node(t, child, k))) {
        *status = -1;
        return NULL;
    }
    *matched = k;
    return child;
}

/* ---- public API ---- */

int radix_init(RadixTree *t, BlockPool *pool, int block_size, const EvictPolicy *policy, void *policy_state, BraidError *err) {
    memset(t, 0, sizeof *t);
    if (block_size < 1) return braid_error_set(err, "radix: block size %d must be positive", block_size);
    t->block_size = block_size;
    t->pool = pool;
    t->policy = policy ? policy : &evict_policy_lru;
    t->policy_state = policy_state;
    return 0;
}

static void destroy_subtree(RadixTree *t, RadixNode *n) {
    for (int i = 0; i < n->n_children; i++) destroy_subtree(t, n->children[i]);
    for (int i = 0; i < n->n_blocks; i++) block_pool_set_in_tree(t->pool, n->blocks[i], false);
    node_destroy(n);
}

void radix_free(RadixTree *t) {
    for (int i = 0; i < t->n_roots; i++) destroy_subtree(t, t->roots[i].root);
    free(t->roots);
    free(t->evictable);
    memset(t, 0, sizeof *t);
}

int radix_match_prefix(RadixTree *t, uint64_t ns, const int32_t *tokens, int n, RadixMatch *out, BraidError *err) {
    int bs = t->block_size, limit = n > 0 ? (n - 1) / bs : 0, matched = 0;
    memset(out, 0, sizeof *out);
    RadixNode *node = get_root(t, ns);
    out->blocks = malloc((size_t)(limit > 0 ? limit : 1) * sizeof *out->blocks);
    if (!node || !out->blocks) {
        free(out->blocks);
        out->blocks = NULL;
        return braid_error_set(err, "radix: out of memory");
    }
    while (matched < limit) {
        int k, status;
        RadixNode *child = descend(t, node, tokens, matched, limit, &k, &status);
        if (status) return braid_error_set(err, "radix: out of memory");
        if (!child) break;
        memcpy(out->blocks + matched, child->blocks, (size_t)k * sizeof *child->blocks);
        matched += k;
        touch(t, child, 1);
        node = child;
    }
    out->node = node;
    out->n_blocks = matched;
    t->counters.matches++;
    t->counters.matched_tokens += (uint64_t)matched * bs;
    return 0;
}

int radix_insert(RadixTree *t, uint64_t ns, const int32_t *tokens, int n_blocks, const int32_t *blocks, int *cached_blocks,
                 RadixNode **end_node, BraidError *err) {
    int bs = t->block_size, pos = 0;
    RadixNode *node = get_root(t, ns);
    if (!node) return braid_error_set(err, "radix: out of memory");
    while (pos < n_blocks) {
        int k, status;
        RadixNode *child = descend(t, node, tokens, pos, n_blocks, &k, &status);
        if (status) return braid_error_set(err, "radix: out of memory");
        if (!child) break;
        touch(t, child, 0);
        pos += k;
        node = child;
    }
    *cached_blocks = pos;
    if (pos < n_blocks) {
        RadixNode *leaf = node_new(ns, n_blocks - pos, bs);
        if (!leaf || add_child(node, leaf)) {
            if (leaf) node_destroy(leaf);
            return braid_error_set(err, "radix: out of memory");
        }
        memcpy(leaf->tokens, tokens + (size_t)pos * bs, (size_t)(n_blocks - pos) * bs * sizeof *tokens);
        memcpy(leaf->blocks, blocks + pos, (size_t)(n_blocks - pos) * sizeof *blocks);
        for (int i = 0; i < leaf->n_blocks; i++) block_pool_set_in_tree(t->pool, leaf->blocks[i], true);
        t->cached_blocks += leaf->n_blocks;
        t->counters.inserted_blocks += (uint64_t)leaf->n_blocks;
        touch(t, leaf, 0);
        if (t->policy->on_insert) t->policy->on_insert(t->policy_state, leaf);
        evictable_remove(t, node); /* it has a child now */
        if (evictable_refresh(t, leaf)) return braid_error_set(err, "radix: out of memory");
        node = leaf;
    }
    if (end_node) *end_node = node;
    return 0;
}

void radix_lock(RadixTree *t, RadixNode *node) {
    for (RadixNode *n = node; n; n = n->parent)
        if (n->lock_ref++ == 0) evictable_remove(t, n);
}

void radix_unlock(RadixTree *t, RadixNode *node) {
    for (RadixNode *n = node; n; n = n->parent) {
        assert(n->lock_ref > 0);
        if (--n->lock_ref == 0) {
            if (t->policy->on_release) t->policy->on_release(t->policy_state, n);
            /* Adding can only fail on out-of-memory; the node then just stays unevictable. */
            (void)evictable_refresh(t, n);
        }
    }
}

/* Blocks in subtrees with no lock and no pin: evicting leaves repeatedly reaches all of them. */
static int releasable_blocks(const RadixNode *n, int *has_pinned) {
    int total = 0, pinned = n->meta.pinned;
    for (int c = 0; c < n->n_children; c++) {
        int child_pinned = 0;
        total += releasable_blocks(n->children[c], &child_pinned);
        pinned |= child_pinned;
    }
    if (!is_root(n) && n->lock_ref == 0 && !pinned) total += n->n_blocks;
    *has_pinned = pinned;
    return total;
}

int radix_evictable_blocks(const RadixTree *t) {
    int total = 0, pinned;
    for (int i = 0; i < t->n_roots; i++) total += releasable_blocks(t->roots[i].root, &pinned);
    return total;
}

static void evict_node(RadixTree *t, RadixNode *n, int32_t *out, int *count) {
    evictable_remove(t, n);
    for (int i = 0; i < n->n_blocks; i++) {
        if (out) out[*count] = n->blocks[i];
        (*count)++;
        block_pool_set_in_tree(t->pool, n->blocks[i], false);
    }
    t->cached_blocks -= n->n_blocks;
    t->counters.evicted_blocks += (uint64_t)n->n_blocks;
    t->counters.evicted_nodes++;
    RadixNode *parent = n->parent;
    remove_child(parent, n);
    node_destroy(n);
    (void)evictable_refresh(t, parent);
}

typedef struct {
    RadixNode *node;
    double score;
} ScoredNode;

static int compare_scored(const void *a, const void *b) {
    double x = ((const ScoredNode *)a)->score, y = ((const ScoredNode *)b)->score;
    return x < y ? -1 : x > y;
}

/* Default victim choice: ascending policy score. */
static int pick_by_score(RadixTree *t, int need, RadixNode **out) {
    ScoredNode *s = malloc((size_t)t->n_evictable * sizeof *s);
    if (!s) return 0;
    for (int i = 0; i < t->n_evictable; i++) s[i] = (ScoredNode){t->evictable[i], t->policy->score(t->policy_state, t->evictable[i])};
    qsort(s, (size_t)t->n_evictable, sizeof *s, compare_scored);
    int n = 0, blocks = 0;
    while (n < t->n_evictable && blocks < need) {
        out[n] = s[n].node;
        blocks += s[n++].node->n_blocks;
    }
    free(s);
    return n;
}

int radix_evict(RadixTree *t, int need_blocks, int32_t *evicted_out) {
    int evicted = 0;
    while (evicted < need_blocks && t->n_evictable > 0) {
        RadixNode **victims = malloc((size_t)t->n_evictable * sizeof *victims);
        if (!victims) break;
        int n = t->policy->pick_victims
                    ? t->policy->pick_victims(t->policy_state, t->evictable, t->n_evictable, need_blocks - evicted, victims)
                    : pick_by_score(t, need_blocks - evicted, victims);
        for (int i = 0; i < n && evicted < need_blocks; i++) evict_node(t, victims[i], evicted_out, &evicted);
        free(victims);
        if (n == 0) break;
    }
    return evicted;
}

static int check_node(const RadixTree *t, const RadixNode *n, uint8_t *seen, int *blocks, BraidError *err) {
    int child_locks = 0;
    if (!is_root(n) && n->n_blocks < 1) return braid_error_set(err, "radix: empty non-root node");
    for (int i = 0; i < n->n_blocks; i++) {
        int32_t b = n->blocks[i];
        if (b <= 0 || b >= t->pool->n_blocks) return braid_error_set(err, "radix: node holds invalid block %d", b);
        if (seen[b]++) return braid_error_set(err, "radix: block %d appears twice in the tree", b);
        if (!t->pool->in_tree[b]) return braid_error_set(err, "radix: block %d in the tree is not marked as owned", b);
    }
    *blocks += n->n_blocks;
    for (int c = 0; c < n->n_children; c++) {
        const RadixNode *ch = n->children[c];
        if (ch->parent != n) return braid_error_set(err, "radix: broken parent link");
        for (int d = 0; d < c; d++)
            if (blocks_equal(n->children[d]->tokens, ch->tokens, t->block_size)) return braid_error_set(err, "radix: siblings share a first block");
        child_locks += ch->lock_ref;
        if (check_node(t, ch, seen, blocks, err)) return -1;
    }
    if (n->lock_ref < child_locks) return braid_error_set(err, "radix: lock count %d below its children's %d", n->lock_ref, child_locks);
    int in_set = n->evictable_index >= 0;
    if (in_set != should_be_evictable(n)) return braid_error_set(err, "radix: evictable set membership wrong for a node");
    if (in_set && t->evictable[n->evictable_index] != n) return braid_error_set(err, "radix: evictable index mismatch");
    return 0;
}

int radix_check(const RadixTree *t, BraidError *err) {
    uint8_t *seen = calloc((size_t)t->pool->n_blocks, 1);
    int blocks = 0, rc = 0;
    if (!seen) return braid_error_set(err, "radix: out of memory");
    for (int i = 0; i < t->n_roots && rc == 0; i++) rc = check_node(t, t->roots[i].root, seen, &blocks, err);
    if (rc == 0 && blocks != t->cached_blocks) rc = braid_error_set(err, "radix: %d blocks in nodes, counter says %d", blocks, t->cached_blocks);
    for (int b = 1; rc == 0 && b < t->pool->n_blocks; b++)
        if (t->pool->in_tree[b] && !seen[b]) rc = braid_error_set(err, "radix: block %d marked as owned but not in any node", b);
    free(seen);
    return rc == 0 ? block_pool_check(t->pool, err) : rc;
}
