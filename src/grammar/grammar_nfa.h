/*
 * grammar_nfa.h — internal: the compiled form of a grammar, a recursive transition network.
 *
 * A grammar is a set of rules; each rule is an NFA over bytes whose edges are byte ranges, epsilon
 * moves, or calls of another rule (push the callee, continue at the edge's target when it
 * finishes). A rule finishes in any of its final states. The builder (GrammarBuilder) makes
 * states and edges; grammar_builder_finish() removes epsilon moves (each state gets the byte
 * edges, calls and finality of its epsilon closure) and lays the edges out per state, so the
 * matcher (grammar_matcher.c) only ever steps over bytes, calls and returns.
 * Size is bounded (GRAMMAR_MAX_STATES, GRAMMAR_MAX_EDGES): builders fail with a message instead
 * of growing without limit on a hostile schema.
 * Owns: its arrays. Not thread-safe while building; a finished Grammar is read-only and may be
 * shared by any number of matchers on any threads.
 * Used by: schema_compile.c, regex_compile.c (build), grammar_matcher.c (read).
 */
#ifndef BRAID_GRAMMAR_NFA_H
#define BRAID_GRAMMAR_NFA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_MAX_STATES 200000
#define GRAMMAR_MAX_EDGES 2000000
#define GRAMMAR_MAX_RULES 20000

enum { GEDGE_BYTE = 0, GEDGE_EPS = 1, GEDGE_CALL = 2 };

typedef struct {
    int32_t from, to;
    int32_t rule;   /* GEDGE_CALL: the callee */
    uint8_t kind, lo, hi;
} GrammarEdgeIn;

typedef struct {
    uint8_t lo, hi;
    int32_t to;
} GrammarByteEdge;

/* A character boundary of a length-bounded string (minLength / maxLength): pos characters read so
 * far, of at least min and at most max (INT32_MAX: no maximum). Its mask comes from the
 * vocabulary's plain-string cache filtered by character counts instead of a walk of its own. */
typedef struct {
    int32_t state, pos, min, max;
} GrammarBoundedPos;

typedef struct {
    int32_t rule, to; /* push rule; continue at `to` when it finishes */
} GrammarCallEdge;

typedef struct {
    int32_t rule;
    bool final;
    int32_t byte_begin, n_byte; /* into Grammar.byte_edges */
    int32_t call_begin, n_call; /* into Grammar.call_edges */
    uint32_t first[8];          /* bytes some byte edge accepts (256-bit set) */
} GrammarState;

struct Grammar {
    GrammarState *states;
    int n_states;
    GrammarByteEdge *byte_edges;
    GrammarCallEdge *call_edges;
    int32_t *rule_start; /* (n_rules) start state of each rule */
    int n_rules;
    int32_t root;        /* the rule the whole output matches */
    /* Lazy grammars (spec "trigger"): free text until the trigger appears; then the grammar runs
     * from after_trigger_state (a state of the root rule) with the trigger's bytes fed first when
     * feed_trigger. */
    char *trigger;
    size_t trigger_len;
    int32_t after_prefix_state; /* root state right after the first prefix */
    bool feed_trigger;
    /* The shared plain-string rule's states [plain_first, plain_first + plain_n), laid out as
     * grammar_build_plain_string lays them out everywhere: their mask caches come precomputed
     * with the vocabulary (plain_n 0 when the grammar has no such rule). */
    int32_t plain_first, plain_n;
    GrammarBoundedPos *bounded; /* (n_states) pos -1 for other states; NULL when none */
};

typedef struct {
    GrammarEdgeIn *edges;
    int n_edges, cap_edges;
    int32_t *state_rule;
    uint8_t *state_final;
    int n_states, cap_states;
    int32_t *rule_start;
    int n_rules, cap_rules;
    GrammarBoundedPos *bounded;
    int n_bounded, cap_bounded;
    bool failed;     /* a limit was hit or memory ran out; why says which */
    char why[160];
} GrammarBuilder;

void grammar_builder_init(GrammarBuilder *b);
void grammar_builder_free(GrammarBuilder *b);
/* A new rule (its start state is made too); -1 when a limit is hit. */
int grammar_rule_new(GrammarBuilder *b);
int grammar_state_new(GrammarBuilder *b, int rule);
void grammar_edge_byte(GrammarBuilder *b, int from, uint8_t lo, uint8_t hi, int to);
void grammar_edge_eps(GrammarBuilder *b, int from, int to);
void grammar_edge_call(GrammarBuilder *b, int from, int rule, int to);
void grammar_state_final(GrammarBuilder *b, int state);
/* Marks state as a bounded string's character boundary (see GrammarBoundedPos). */
void grammar_state_bounded(GrammarBuilder *b, int state, int pos, int min, int max);

/* Fragment helpers: each emits its text starting at state `from` of `rule` and returns the state
 * after it (-1 once the builder failed). */
int grammar_frag_literal(GrammarBuilder *b, int rule, int from, const char *text, size_t len);
int grammar_frag_call(GrammarBuilder *b, int rule, int from, int callee);
/* The character fragments lead from `from` to `to` (a new state when to < 0) and return `to`. */
/* One UTF-8 character other than '"', '\\' and control characters below 0x20 (no escapes). */
int grammar_frag_plain_char(GrammarBuilder *b, int rule, int from, int to);
/* One JSON string character: a plain character or an escape sequence. */
int grammar_frag_json_char(GrammarBuilder *b, int rule, int from, int to);
/* One UTF-8 character of 2-4 bytes (any lead byte C2-F4 with its continuation bytes). */
int grammar_frag_multibyte_char(GrammarBuilder *b, int rule, int from, int to);

/* The rule of a JSON string without constraints ('"' json_char* '"'). Built the same way by every
 * grammar, so state k of it means the same in all of them. Returns the rule, -1 on failure;
 * *first / *n receive its state range. */
int grammar_build_plain_string(GrammarBuilder *b, int32_t *first, int32_t *n);

/* Finishes: epsilon elimination, per-state edge layout. Returns NULL with why set on failure.
 * The builder is left empty either way. */
struct Grammar *grammar_builder_finish(GrammarBuilder *b, int root, char *why, size_t why_len);

#endif
