/*
 * test_grammar — structured outputs (src/grammar): spec compiler (accepts, refusals naming the
 * keyword), matcher (valid texts accepted, invalid rejected), masks (exactly the tokens that keep
 * the output a valid prefix, on a small vocabulary for every token and on the real 49K vocabulary
 * for samples), and a property test: random schemas x seeds x random-logit sampling through the
 * real mask — every finished output parses and validates against its schema (schema_validate.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "grammar/grammar.h"
#include "model/model.h"
#include "schema_validate.h"
#include "test_paths.h"
#include "worker/grammar_tokens.h"

/* ---- compiler ---- */

static void test_refusals(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"{\"schema\":{\"type\":\"object\",\"patternProperties\":{}}}", "schema: keyword 'patternProperties' is not supported"},
        {"{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":3}}}}",
         "schema.properties.a: keyword 'minimum' is not supported"},
        {"{\"schema\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"uniqueItems\":true}}}", "schema.items: keyword 'uniqueItems'"},
        {"{\"schema\":{\"allOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}}", "allOf' with more than one"},
        {"{\"schema\":{\"$ref\":\"#/$defs/missing\"}}", "does not resolve"},
        {"{\"schema\":{\"$ref\":\"http://example.com/s.json\"}}", "only local references"},
        {"{\"schema\":{\"type\":\"string\",\"pattern\":\"(?=a)b\"}}", "lookaround"},
        {"{\"schema\":{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}}", "escape \\1 is not supported"},
        {"{\"schema\":{\"type\":\"string\",\"maxLength\":100000}}", "maxLength' above 2000"},
        {"{\"schema\":{\"type\":\"strnig\"}}", "unknown type strnig"},
        {"{\"schema\":{\"type\":\"object\"},\"max_items\":100}", "max_items: must be an integer in [0, 64]"},
        {"{\"schema\":{\"type\":\"object\"},\"colour\":1}", "field 'colour' is not supported"},
        {"{\"prefix\":\"x\"}", "field 'schema' is required"},
        {"{\"schema\":", "invalid JSON"},
        {"[1]", "must be a JSON object"},
        {"{\"schema\":false}", "never be satisfied"},
        {"{\"schema\":{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},\"$ref\":\"#/$defs/a\"}}", "left-recursive"},
        {"{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"b\"]}}", "required property 'b'"},
        {"{\"schema\":{\"type\":\"string\",\"pattern\":\"[a-z]+\",\"maxLength\":3}}", "together with 'pattern'"},
        {"{\"schema\":{\"type\":\"integer\",\"anyOf\":[{\"type\":\"integer\"}]}}", "'anyOf' next to 'type'"},
        {"{\"schema\":{\"type\":\"string\",\"pattern\":\"[\"}}", "unterminated character class"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char why[512] = "";
        int rc = grammar_spec_check(cases[i][0], strlen(cases[i][0]), why, sizeof why);
        if (rc == 0 || !strstr(why, cases[i][1])) fail_msg("spec %s: rc %d, why '%s', want '%s'", cases[i][0], rc, why, cases[i][1]);
    }
    /* Sizes: a hostile schema is refused, not compiled without bound. */
    size_t cap = 1 << 20;
    char *big = malloc(cap);
    size_t n = (size_t)snprintf(big, cap, "{\"schema\":{\"type\":\"array\",\"minItems\":2000,\"items\":");
    for (int d = 0; d < 6; d++) n += (size_t)snprintf(big + n, cap - n, "{\"type\":\"array\",\"minItems\":2000,\"items\":");
    n += (size_t)snprintf(big + n, cap - n, "{\"type\":\"string\",\"minLength\":2000,\"maxLength\":2000}");
    for (int d = 0; d < 7; d++) big[n++] = '}';
    n += (size_t)snprintf(big + n, cap - n, "}");
    char why[512] = "";
    assert_int_equal(grammar_spec_check(big, n, why, sizeof why), -1);
    assert_non_null(strstr(why, "too large"));
    free(big);
}

static bool matches(const char *spec, const char *text);

/* A schema of n string values "v0".."v{n-1}", as an enum, or (groups > 0) as an anyOf of groups
 * $refs to one shared enum of n values: the alternatives one value position opens. */
static char *enum_spec(int n, int groups) {
    size_t cap = (size_t)n * 16 + (size_t)groups * 32 + 256, len = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    len += (size_t)snprintf(s + len, cap - len, groups ? "{\"schema\":{\"$defs\":{\"e\":{\"enum\":[" : "{\"schema\":{\"enum\":[");
    for (int i = 0; i < n; i++) len += (size_t)snprintf(s + len, cap - len, "%s\"v%d\"", i ? "," : "", i);
    if (!groups) {
        snprintf(s + len, cap - len, "]}}");
        return s;
    }
    len += (size_t)snprintf(s + len, cap - len, "]}},\"anyOf\":[");
    for (int g = 0; g < groups; g++) len += (size_t)snprintf(s + len, cap - len, "%s{\"$ref\":\"#/$defs/e\"}", g ? "," : "");
    snprintf(s + len, cap - len, "]}}");
    return s;
}

/* Hostile requests: an enum of 8200 values compiled, then failed mid-generation ("too many parse
 * alternatives", a 500 after the prefill). The compiler now refuses what the matcher cannot follow,
 * counting an enum's values, anyOf branches and $ref reuse; GRAMMAR_MAX_ALTERNATIVES itself works. */
static void test_alternatives_bound(void **state) {
    (void)state;
    struct {
        int n, groups;
        bool ok;
    } cases[] = {
        {GRAMMAR_MAX_ALTERNATIVES, 0, true},  {GRAMMAR_MAX_ALTERNATIVES + 1, 0, false}, {9000, 0, false},
        {64, 64, true},                       {64, 65, false},                          {GRAMMAR_MAX_ALTERNATIVES, 2, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *spec = enum_spec(cases[i].n, cases[i].groups), why[512] = "";
        int rc = grammar_spec_check(spec, strlen(spec), why, sizeof why);
        if (cases[i].ok && rc) fail_msg("%d values x %d: refused: %s", cases[i].n, cases[i].groups, why);
        if (!cases[i].ok && (rc == 0 || !strstr(why, "alternatives at one position")))
            fail_msg("%d values x %d: rc %d, why '%s'", cases[i].n, cases[i].groups, rc, why);
        if (cases[i].ok) { /* what is accepted, the matcher follows: the last value matches, no overflow */
            char last[32];
            snprintf(last, sizeof last, "\"v%d\"", cases[i].n - 1);
            if (!matches(spec, last)) fail_msg("%d values x %d: '%s' does not match", cases[i].n, cases[i].groups, last);
        }
        free(spec);
    }
    /* Nested positions are their own: an object of two properties, each an enum at the bound. */
    char *e = enum_spec(GRAMMAR_MAX_ALTERNATIVES, 0);
    e[strlen(e) - 2] = '\0'; /* {"schema":{"enum":[...]  without the closing }} */
    size_t cap = strlen(e) * 2 + 256;
    char *two = malloc(cap), why[512] = "";
    const char *values = strchr(e + 1, '{'); /* {"enum":[...] */
    snprintf(two, cap, "{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":%s},\"b\":%s}},\"required\":[\"a\",\"b\"]}}", values,
             values);
    if (grammar_spec_check(two, strlen(two), why, sizeof why)) fail_msg("two enums at the bound in two properties: %s", why);
    free(two);
    free(e);
}

static const char *const VALID_SPECS[] = {
    "{\"schema\":{\"type\":\"object\"}}",
    "{\"schema\":true}",
    "{\"schema\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"description\":\"d\",\"title\":\"N\"},"
    "\"age\":{\"type\":\"integer\",\"default\":3},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,\"maxItems\":3},"
    "\"kind\":{\"enum\":[\"a\",\"b\"]},\"opt\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}],\"default\":null},"
    "\"pt\":{\"$ref\":\"#/$defs/Point\"},\"when\":{\"type\":\"string\",\"format\":\"date\"},\"mail\":{\"type\":\"string\",\"format\":\"email\"}},"
    "\"required\":[\"name\",\"age\",\"pt\"],\"additionalProperties\":false,"
    "\"$defs\":{\"Point\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"type\":\"number\"}},\"required\":[\"x\",\"y\"],\"title\":\"Point\"}}}}",
    "{\"schema\":{\"definitions\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/definitions/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/definitions/node\"}}",
    "{\"prefix\":\"<tool_call>\\n\",\"suffix\":\"\\n</tool_call>\",\"max_items\":4,\"separator\":\"\\n\",\"schema\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}},\"required\":[\"name\",\"arguments\"]}]}}",
    "{\"schema\":{\"type\":[\"string\",\"null\"],\"maxLength\":4}}",
    "{\"schema\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":false}}",
    "{\"schema\":{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+ \\\\d{2,3}(-x)?$\"}}",
    "{\"schema\":{\"allOf\":[{\"type\":\"boolean\"}]}}",
    "{\"schema\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}}",
    "{\"trigger\":\"<tool_call>\",\"prefix\":\"<tool_call>\\n\",\"schema\":{\"type\":\"object\"},\"suffix\":\"\\n</tool_call>\"}",
    "{\"schema\":{\"type\":\"object\"},\"min_items\":0}",
};

static void test_valid_specs(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof VALID_SPECS / sizeof VALID_SPECS[0]; i++) {
        char why[512] = "";
        if (grammar_spec_check(VALID_SPECS[i], strlen(VALID_SPECS[i]), why, sizeof why)) fail_msg("spec %zu refused: %s", i, why);
    }
    char why[256];
    char *s = grammar_spec_from_response_format("{\"type\":\"json_object\"}", 22, why, sizeof why);
    assert_string_equal(s, "{\"schema\":{\"type\":\"object\"}}");
    free(s);
    const char *rf = "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"strict\":true,\"schema\":{\"type\":\"integer\"}}}";
    s = grammar_spec_from_response_format(rf, strlen(rf), why, sizeof why);
    assert_string_equal(s, "{\"schema\":{\"type\":\"integer\"}}");
    free(s);
    assert_null(grammar_spec_from_response_format("{\"type\":\"text\"}", 15, why, sizeof why));
    assert_string_equal(why, "");
    assert_null(grammar_spec_from_response_format("{\"type\":\"yaml\"}", 15, why, sizeof why));
    assert_non_null(strstr(why, "not supported"));
}

/* ---- matcher over bytes ---- */

static bool matches(const char *spec, const char *text) {
    char why[512];
    GrammarMatcher *m = grammar_matcher_create_from_spec(spec, strlen(spec), NULL, why, sizeof why);
    if (!m) fail_msg("spec refused: %s", why);
    bool ok = grammar_matcher_accept_bytes(m, text, strlen(text)) == 0 && grammar_matcher_is_complete(m);
    grammar_matcher_free(m);
    return ok;
}

static void test_matcher(void **state) {
    (void)state;
    static const struct {
        int spec; /* index into VALID_SPECS */
        const char *text;
        bool ok;
    } cases[] = {
        {0, "{}", true},
        {0, "{\"a\": [1, 2.5e-3, true, null, {\"b\": \"\\u00e9\\n\"}]}", true},
        {0, "{\n  \"a\": 1,\n  \"b\": \"x\"\n}", true},
        {0, "{\"a\":1,}", false},
        {0, "{\"a\" : 1}", false},            /* no whitespace before ':' */
        {0, "{\"a\":  1}", false},            /* at most one space */
        {0, "{\"a\": 01}", false},
        {0, "[1]", false},
        {0, "{\"a\": \"\x01\"}", false},
        {0, "{\"a\": \"caf\xc3\xa9\"}", true},
        {0, "{\"a\": \"\xc3\"}", false},
        {1, "\"just a string\"", true},
        {1, "123", true},
        {2, "{\"name\": \"Al\", \"age\": 3, \"pt\": {\"x\": 1, \"y\": -2.5}}", true},
        {2, "{\"name\": \"Al\", \"age\": 3, \"tags\": [\"a\"], \"kind\": \"b\", \"opt\": null, \"pt\": {\"x\": 1, \"y\": 2}, \"when\": \"2024-02-29\"}", true},
        {2, "{\"name\": \"Al\", \"age\": 3, \"tags\": [], \"pt\": {\"x\": 1, \"y\": 2}}", false}, /* minItems 1 */
        {2, "{\"name\": \"Al\", \"age\": 3.5, \"pt\": {\"x\": 1, \"y\": 2}}", false},
        {2, "{\"age\": 3, \"name\": \"Al\", \"pt\": {\"x\": 1, \"y\": 2}}", false}, /* schema order */
        {2, "{\"name\": \"Al\", \"age\": 3, \"pt\": {\"x\": 1, \"y\": 2}, \"extra\": 1}", false},
        {2, "{\"name\": \"Al\", \"age\": 3, \"kind\": \"c\", \"pt\": {\"x\": 1, \"y\": 2}}", false},
        {2, "{\"name\": \"Al\", \"age\": 3, \"pt\": {\"x\": 1, \"y\": 2}, \"when\": \"2024-13-01\"}", false},
        {3, "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}", true},
        {3, "{\"v\": 1, \"next\": {\"v\": 2}}", false},
        {4, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", true},
        {4, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n"
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>", true},
        {4, "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>", false},
        {5, "\"abcd\"", true},
        {5, "\"abcde\"", false},
        {5, "null", true},
        {6, "[1, \"x\"]", true},
        {6, "[1, \"x\", 2]", false},
        {6, "[1]", true},
        {7, "\"Abc 12\"", true},
        {7, "\"Abc 1234\"", false},
        {7, "\"Abc 123-x\"", true},
        {8, "true", true},
        {9, "{\"a\": 1, \"b\": 2}", true},
        {9, "{\"a\": \"x\"}", false},
        {11, "", true},
        {11, "{}", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (matches(VALID_SPECS[cases[i].spec], cases[i].text) != cases[i].ok)
            fail_msg("case %zu: spec %d text '%s' should %s", i, cases[i].spec, cases[i].text, cases[i].ok ? "match" : "not match");
}

static void test_lazy_trigger(void **state) {
    (void)state;
    const char *spec = VALID_SPECS[10];
    char why[256];
    GrammarMatcher *m = grammar_matcher_create_from_spec(spec, strlen(spec), NULL, why, sizeof why);
    assert_non_null(m);
    assert_true(grammar_matcher_is_complete(m)); /* free text may end any time */
    assert_int_equal(grammar_matcher_accept_bytes(m, "Let me check. <tool", 19), 0);
    assert_false(grammar_matcher_would_accept(m, "_call>oops", 10));
    assert_int_equal(grammar_matcher_accept_bytes(m, "_call>\n{\"a\": 1}", 15), 0);
    assert_false(grammar_matcher_is_complete(m));
    assert_int_equal(grammar_matcher_accept_bytes(m, "\n</tool_call>", 13), 0);
    assert_true(grammar_matcher_is_terminated(m));
    grammar_matcher_free(m);
}

/* ---- masks on a small vocabulary: every token checked ---- */

static const char *const SMALL_VOCAB[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "\n  ", "a", "b", "ab", "x\"", "\":",
                                          "\",", "\"}", "{\"", "\": ", "1", "12", "-", ".", "5", "e", "true", "null", "fal", "se",
                                          "\\", "n", "u", "00", "e9", "<tool_call>", "\n</", "tool_call>", "\xc3", "\xa9", "\xc3\xa9",
                                          "Al", "\"a", "age", "name", "pt", "x", "y", "\": {\"", "}}", "2024", "-02", "-29"};

static GrammarVocab *small_vocab(void) {
    int n = (int)(sizeof SMALL_VOCAB / sizeof SMALL_VOCAB[0]) + 2;
    const char *bytes[64];
    uint32_t lens[64];
    uint8_t kinds[64];
    for (int i = 0; i < n - 2; i++) {
        bytes[i] = SMALL_VOCAB[i];
        lens[i] = (uint32_t)strlen(SMALL_VOCAB[i]);
        kinds[i] = GRAMMAR_TOKEN_TEXT;
    }
    bytes[n - 2] = "<|eos|>", lens[n - 2] = 7, kinds[n - 2] = GRAMMAR_TOKEN_END;
    bytes[n - 1] = "<|ctl|>", lens[n - 1] = 7, kinds[n - 1] = GRAMMAR_TOKEN_NEVER;
    char why[128];
    GrammarVocab *v = grammar_vocab_create(n, bytes, lens, kinds, why, sizeof why);
    if (!v) fail_msg("%s", why);
    return v;
}

static uint64_t rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The mask is exactly the tokens that keep the output a valid prefix (END: when complete). */
static void check_mask_exact(GrammarMatcher *m, const GrammarVocab *v, const char *const *bytes, const uint32_t *lens,
                             const uint8_t *kinds, const uint32_t *mask, const int32_t *only, int n_only) {
    int n = grammar_vocab_size(v);
    for (int k = 0; k < (only ? n_only : n); k++) {
        int t = only ? only[k] : k;
        bool bit = mask[t >> 5] >> (t & 31) & 1;
        bool want = kinds[t] == GRAMMAR_TOKEN_TEXT ? grammar_matcher_would_accept(m, bytes[t], lens[t])
                    : kinds[t] == GRAMMAR_TOKEN_END ? grammar_matcher_is_complete(m)
                                                    : false;
        if (bit != want) fail_msg("token %d ('%.*s'): mask says %d, matcher says %d", t, (int)lens[t], bytes[t], bit, want);
    }
}

static void test_small_vocab_masks(void **state) {
    (void)state;
    GrammarVocab *v = small_vocab();
    int n = grammar_vocab_size(v);
    const char *bytes[64];
    uint32_t lens[64];
    uint8_t kinds[64];
    for (int i = 0; i < n - 2; i++) bytes[i] = SMALL_VOCAB[i], lens[i] = (uint32_t)strlen(SMALL_VOCAB[i]), kinds[i] = GRAMMAR_TOKEN_TEXT;
    bytes[n - 2] = "<|eos|>", lens[n - 2] = 7, kinds[n - 2] = GRAMMAR_TOKEN_END;
    bytes[n - 1] = "<|ctl|>", lens[n - 1] = 7, kinds[n - 1] = GRAMMAR_TOKEN_NEVER;
    uint32_t mask[4];
    uint64_t seed = 42;
    for (size_t s = 0; s < sizeof VALID_SPECS / sizeof VALID_SPECS[0]; s++) {
        for (int run = 0; run < 20; run++) {
            char why[256];
            GrammarMatcher *m = grammar_matcher_create_from_spec(VALID_SPECS[s], strlen(VALID_SPECS[s]), v, why, sizeof why);
            assert_non_null(m);
            for (int step = 0; step < 60; step++) {
                int allowed = grammar_matcher_fill_mask(m, mask);
                assert_true(allowed >= 0);
                check_mask_exact(m, v, bytes, lens, kinds, mask, NULL, 0);
                if (allowed == 0) break; /* this tiny vocabulary cannot always go on */
                int pick = (int)(rng(&seed) % (uint64_t)allowed), seen = 0, token = -1;
                for (int t = 0; t < n && token < 0; t++)
                    if ((mask[t >> 5] >> (t & 31) & 1) && seen++ == pick) token = t;
                assert_int_equal(grammar_matcher_accept_token(m, token), 0);
                if (kinds[token] == GRAMMAR_TOKEN_END || grammar_matcher_is_terminated(m)) break;
            }
            grammar_matcher_free(m);
        }
    }
    grammar_vocab_free(v);
}

/* The engine's grammar cache: same spec -> shared compile and mask cache, masks identical to an
 * uncached matcher's; eviction of unheld entries; matchers that outlive the cache. */
static void test_grammar_cache(void **state) {
    (void)state;
    GrammarVocab *v = small_vocab();
    char why[256];
    GrammarCache *c = grammar_cache_create(v, 1);
    assert_non_null(c);
    const char *a = VALID_SPECS[2], *b = VALID_SPECS[0];
    GrammarMatcher *m1 = grammar_cache_matcher(c, a, strlen(a), why, sizeof why);
    GrammarMatcher *m2 = grammar_cache_matcher(c, a, strlen(a), why, sizeof why);
    GrammarMatcher *m3 = grammar_cache_matcher(c, b, strlen(b), why, sizeof why); /* all held: uncached */
    GrammarMatcher *ref = grammar_matcher_create_from_spec(a, strlen(a), v, why, sizeof why);
    assert_non_null(m1);
    assert_non_null(m2);
    assert_non_null(m3);
    const char *bad = "{\"schema\":{\"nope\":1}}";
    assert_null(grammar_cache_matcher(c, bad, strlen(bad), why, sizeof why));
    assert_non_null(strstr(why, "nope"));
    const char *text = "{\"name\": \"Al\", \"age\": 3, ";
    uint32_t k1[4] = {0}, k2[4] = {0}, kr[4] = {0};
    for (size_t i = 0; i < strlen(text); i++) {
        assert_int_equal(grammar_matcher_accept_bytes(m1, text + i, 1), 0);
        assert_int_equal(grammar_matcher_accept_bytes(ref, text + i, 1), 0);
        assert_true(grammar_matcher_fill_mask(m1, k1) >= 0);
        assert_true(grammar_matcher_fill_mask(m2, k2) >= 0); /* m2 stays at the start, sharing m1's cache */
        assert_true(grammar_matcher_fill_mask(ref, kr) >= 0);
        assert_memory_equal(k1, kr, sizeof k1);
    }
    grammar_matcher_free(m1);
    grammar_matcher_free(m2);
    GrammarMatcher *m4 = grammar_cache_matcher(c, b, strlen(b), why, sizeof why); /* evicts a */
    assert_non_null(m4);
    grammar_cache_free(c); /* m3 (uncached) and m4 outlive it */
    assert_true(grammar_matcher_fill_mask(m4, k1) > 0);
    grammar_matcher_free(m4);
    grammar_matcher_free(m3);
    grammar_matcher_free(ref);
    grammar_vocab_free(v);
}

/* ---- real vocabulary: random schemas, sampled through the mask, validated ---- */

static json_t *random_schema(uint64_t *s, int depth) {
    int r = (int)(rng(s) % (depth >= 3 ? 5 : 11));
    switch (r) {
    case 0: {
        json_t *o = json_pack("{ss}", "type", "string");
        if (rng(s) % 3 == 0) json_object_set_new(o, "maxLength", json_integer((json_int_t)(rng(s) % 6)));
        if (rng(s) % 4 == 0) json_object_set_new(o, "minLength", json_integer(1));
        return o;
    }
    case 1: return json_pack("{ss}", "type", "integer");
    case 2: return json_pack("{ss}", "type", "number");
    case 3: return json_pack("{ss}", "type", "boolean");
    case 4: return json_pack("{s[ss i n]}", "enum", "red", "dark blue", 7);
    case 5: {
        json_t *o = json_pack("{ss so si}", "type", "array", "items", random_schema(s, depth + 1), "maxItems", (int)(rng(s) % 4));
        if (rng(s) % 2) json_object_set_new(o, "minItems", json_integer(json_integer_value(json_object_get(o, "maxItems")) > 0));
        return o;
    }
    case 6:
    case 7: {
        json_t *props = json_object(), *req = json_array();
        int n = 1 + (int)(rng(s) % 3);
        static const char *const names[] = {"id", "name", "value", "items"};
        for (int i = 0; i < n; i++) {
            json_object_set_new(props, names[i], random_schema(s, depth + 1));
            if (rng(s) % 2) json_array_append_new(req, json_string(names[i]));
        }
        return json_pack("{ss so so}", "type", "object", "properties", props, "required", req);
    }
    case 8: return json_pack("{s[o{ss}]}", "anyOf", random_schema(s, depth + 1), "type", "null");
    case 9: return rng(s) % 2 ? json_pack("{ss}", "const", "fixed") : json_pack("{ss ss}", "type", "string", "pattern", "^[a-z]{2,4}$");
    default: return json_pack("{s[ss]}", "type", "string", "null");
    }
}

typedef struct {
    BraidModel model;
    GrammarVocab *vocab;
    char **bytes;
    uint32_t *lens;
    uint8_t *kinds;
    int n;
} RealVocab;

static int real_setup(void **state) {
    const char *path = test_model_path();
    if (!path || access(path, R_OK) != 0) {
        *state = NULL;
        return 0;
    }
    RealVocab *rv = calloc(1, sizeof *rv);
    BraidError err;
    if (braid_model_load(path, &rv->model, &err)) fail_msg("%s", err.msg);
    if (!(rv->vocab = grammar_vocab_from_tokenizer(&rv->model.tokenizer, &err))) fail_msg("%s", err.msg);
    rv->n = rv->model.tokenizer.n_vocab;
    rv->bytes = calloc((size_t)rv->n, sizeof *rv->bytes);
    rv->lens = calloc((size_t)rv->n, sizeof *rv->lens);
    rv->kinds = calloc((size_t)rv->n, 1);
    const Tokenizer *tok = &rv->model.tokenizer;
    for (int t = 0; t < rv->n; t++) {
        size_t len = tokenizer_token_bytes(tok, t, NULL, 0);
        rv->bytes[t] = malloc(len + 1);
        rv->lens[t] = (uint32_t)tokenizer_token_bytes(tok, t, rv->bytes[t], len);
        int type = tok->types[t];
        rv->kinds[t] = tokenizer_is_stop(tok, t) ? GRAMMAR_TOKEN_END
                       : type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNUSED || type == TOKEN_TYPE_UNKNOWN || len == 0
                           ? GRAMMAR_TOKEN_NEVER
                           : GRAMMAR_TOKEN_TEXT;
    }
    *state = rv;
    return 0;
}

static int real_teardown(void **state) {
    RealVocab *rv = *state;
    if (!rv) return 0;
    for (int t = 0; t < rv->n; t++) free(rv->bytes[t]);
    free(rv->bytes);
    free(rv->lens);
    free(rv->kinds);
    grammar_vocab_free(rv->vocab);
    braid_model_free(&rv->model);
    free(rv);
    return 0;
}

static bool structural(const RealVocab *rv, int t) {
    for (uint32_t i = 0; i < rv->lens[t]; i++)
        if (strchr("\"}],", rv->bytes[t][i])) return true;
    return false;
}

static void test_real_vocab_property(void **state) {
    RealVocab *rv = *state;
    if (!rv) skip();
    int words = grammar_mask_words(rv->n);
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    int32_t *cand = malloc((size_t)rv->n * sizeof *cand);
    int32_t *sample = malloc(256 * sizeof *sample);
    int finished = 0, runs = 0;
    for (uint64_t schema_seed = 1; schema_seed <= 24; schema_seed++) {
        uint64_t ss = schema_seed * 1000003;
        json_t *schema = rng(&ss) % 4 ? json_pack("{ss so s[s]}", "type", "object", "properties",
                                                  json_pack("{so so}", "a", random_schema(&ss, 1), "b", random_schema(&ss, 1)),
                                                  "required", "a")
                                      : random_schema(&ss, 0);
        json_t *spec_obj = json_pack("{sO}", "schema", schema);
        char *spec = json_dumps(spec_obj, JSON_COMPACT);
        for (uint64_t seed = 1; seed <= 3; seed++) {
            uint64_t s = schema_seed * 7919 + seed;
            char why[512];
            GrammarMatcher *m = grammar_matcher_create_from_spec(spec, strlen(spec), rv->vocab, why, sizeof why);
            if (!m) fail_msg("spec %s refused: %s", spec, why);
            char out[8192];
            size_t out_len = 0;
            bool done = false;
            runs++;
            for (int step = 0; step < 300 && !done; step++) {
                int allowed = grammar_matcher_fill_mask(m, mask);
                if (allowed <= 0) fail_msg("spec %s: stuck after '%.*s' (%s)", spec, (int)out_len, out, grammar_matcher_error(m));
                /* Sampled checks of the mask against the matcher: allowed and disallowed tokens. */
                int n_sample = 0;
                for (int k = 0; k < 128; k++) sample[n_sample++] = (int32_t)(rng(&s) % (uint64_t)rv->n);
                int n_cand = 0, n_struct = 0;
                for (int w = 0; w < words; w++)
                    for (uint32_t bits = mask[w]; bits; bits &= bits - 1) cand[n_cand++] = w * 32 + __builtin_ctz(bits);
                for (int k = 0; k < 64; k++) sample[n_sample++] = cand[rng(&s) % (uint64_t)n_cand];
                check_mask_exact(m, rv->vocab, (const char *const *)rv->bytes, rv->lens, rv->kinds, mask, sample, n_sample);
                for (int i = 0; i < n_cand; i++) {
                    assert_true(rv->kinds[cand[i]] != GRAMMAR_TOKEN_NEVER);
                    if (structural(rv, cand[i])) cand[n_struct++] = cand[i];
                }
                /* "Random logits": structural tokens favoured, so outputs finish in few steps. */
                int token;
                if (grammar_matcher_is_complete(m) && rng(&s) % 2 == 0) {
                    token = rv->model.tokenizer.eos_id;
                    if (!(mask[token >> 5] >> (token & 31) & 1)) fail_msg("complete but EOS not allowed");
                } else if (n_struct > 0 && rng(&s) % 3 != 0) {
                    token = cand[rng(&s) % (uint64_t)n_struct];
                } else {
                    n_cand = 0;
                    for (int w = 0; w < words; w++)
                        for (uint32_t bits = mask[w]; bits; bits &= bits - 1) cand[n_cand++] = w * 32 + __builtin_ctz(bits);
                    token = cand[rng(&s) % (uint64_t)n_cand];
                }
                assert_int_equal(grammar_matcher_accept_token(m, token), 0);
                if (rv->kinds[token] == GRAMMAR_TOKEN_END) {
                    done = true;
                } else {
                    if (out_len + rv->lens[token] >= sizeof out) break;
                    memcpy(out + out_len, rv->bytes[token], rv->lens[token]);
                    out_len += rv->lens[token];
                    done = grammar_matcher_is_terminated(m);
                }
            }
            if (done) {
                finished++;
                json_error_t jerr;
                json_t *value = json_loadb(out, out_len, JSON_DECODE_ANY, &jerr);
                if (!value) fail_msg("spec %s: output '%.*s' is not JSON: %s", spec, (int)out_len, out, jerr.text);
                if (!schema_validate(value, schema, schema, why, sizeof why))
                    fail_msg("spec %s: output '%.*s' does not validate: %s", spec, (int)out_len, out, why);
                json_decref(value);
            }
            grammar_matcher_free(m);
        }
        free(spec);
        json_decref(spec_obj);
        json_decref(schema);
    }
    print_message("real vocabulary: %d of %d sampled outputs finished, all parsed and validated\n", finished, runs);
    assert_true(finished * 2 >= runs);
    free(mask);
    free(cand);
    free(sample);
}

/* Control tokens never come inside a constrained output; END only when complete. */
static void test_real_vocab_special_tokens(void **state) {
    RealVocab *rv = *state;
    if (!rv) skip();
    const char *spec = VALID_SPECS[4];
    char why[256];
    GrammarMatcher *m = grammar_matcher_create_from_spec(spec, strlen(spec), rv->vocab, why, sizeof why);
    assert_non_null(m);
    int words = grammar_mask_words(rv->n);
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    const char *text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    TokenList tl = {0};
    BraidError err;
    assert_int_equal(tokenizer_encode(&rv->model.tokenizer, text, strlen(text), true, false, &tl, &err), 0);
    for (int i = 0; i <= tl.n; i++) {
        assert_true(grammar_matcher_fill_mask(m, mask) > 0);
        for (int t = 0; t < rv->n; t++) {
            bool bit = mask[t >> 5] >> (t & 31) & 1;
            if (rv->kinds[t] == GRAMMAR_TOKEN_NEVER) assert_false(bit);
            if (rv->kinds[t] == GRAMMAR_TOKEN_END) assert_int_equal(bit, i == tl.n);
        }
        if (i < tl.n) {
            assert_true(mask[tl.ids[i] >> 5] >> (tl.ids[i] & 31) & 1);
            assert_int_equal(grammar_matcher_accept_token(m, tl.ids[i]), 0);
        }
    }
    assert_true(grammar_matcher_is_complete(m));
    free(tl.ids);
    free(mask);
    grammar_matcher_free(m);
}

/* Bounded strings take their masks from the vocabulary's plain-string cache filtered by character
 * counts: every token checked at positions before, at and past minLength and at maxLength. */
static void test_real_vocab_bounded_exact(void **state) {
    RealVocab *rv = *state;
    if (!rv) skip();
    const char *spec = "{\"schema\":{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"string\",\"minLength\":2,"
                       "\"maxLength\":6},\"u\":{\"type\":\"string\",\"minLength\":3}},\"required\":[\"t\",\"u\"]}}";
    static const char *const steps[] = {"{\"t\": \"", "a", "\\n", "\xc3\xa9", "xy", "\", \"u\": \"", "ab", "c", "\""};
    char why[256];
    GrammarMatcher *m = grammar_matcher_create_from_spec(spec, strlen(spec), rv->vocab, why, sizeof why);
    assert_non_null(m);
    uint32_t *mask = malloc((size_t)grammar_mask_words(rv->n) * sizeof *mask);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        assert_int_equal(grammar_matcher_accept_bytes(m, steps[i], strlen(steps[i])), 0);
        assert_true(grammar_matcher_fill_mask(m, mask) > 0);
        check_mask_exact(m, rv->vocab, (const char *const *)rv->bytes, rv->lens, rv->kinds, mask, NULL, 0);
    }
    free(mask);
    grammar_matcher_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_alternatives_bound),
        cmocka_unit_test(test_valid_specs),
        cmocka_unit_test(test_matcher),
        cmocka_unit_test(test_lazy_trigger),
        cmocka_unit_test(test_small_vocab_masks),
        cmocka_unit_test(test_grammar_cache),
        cmocka_unit_test(test_real_vocab_special_tokens),
        cmocka_unit_test(test_real_vocab_bounded_exact),
        cmocka_unit_test(test_real_vocab_property),
    };
    return cmocka_run_group_tests(tests, real_setup, real_teardown);
}
