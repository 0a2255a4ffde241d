/* Filler text from small grammars over constant word lists; every choice comes from the caller's WlRng. */
#include "text_gen.h"

#include "token_estimate.h"

#include <ctype.h>
#include <string.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *const nouns[] = {
    "system",     "report",   "river",    "engine",    "market",   "village",  "signal",    "record",   "pattern",  "budget",
    "window",     "garden",   "network",  "teacher",   "harbor",   "contract", "sample",    "journey",  "surface",  "method",
    "library",    "council",  "channel",  "factor",    "account",  "border",   "capital",   "climate",  "colony",   "compass",
    "culture",    "decision", "device",   "district",  "effort",   "element",  "estimate",  "evidence", "feature",  "fortune",
    "frame",      "harvest",  "history",  "household", "impact",   "income",   "island",    "kitchen",  "ledger",   "machine",
    "measure",    "memory",   "mission",  "model",     "monitor",  "mountain", "notice",    "object",   "office",   "option",
    "outcome",    "package",  "painting", "partner",   "period",   "picture",  "planet",    "policy",   "portion",  "practice",
    "process",    "product",  "program",  "project",   "property", "quarter",  "question",  "reason",   "region",   "request",
    "resource",   "response", "result",   "review",    "schedule", "science",  "season",    "section",  "sequence", "service",
    "session",    "shelter",  "shipment", "source",    "station",  "strategy", "student",   "subject",  "summary",  "supply",
    "surgeon",    "survey",   "table",    "target",    "theory",   "thread",   "ticket",    "timber",   "traffic",  "treaty",
    "valley",     "variable", "vessel",   "version",   "volume",   "voyage",   "warehouse", "weather",  "witness",  "workshop",
    "author",     "bridge",   "cabinet",  "canal",     "castle",   "cluster",  "column",    "company",  "crystal",  "customer",
    "database",   "dialect",  "diagram",  "engineer",  "festival", "formula",  "gallery",   "glacier",  "granite",  "highway",
    "instrument", "journal",  "lantern",  "lecture",   "meadow",   "mineral",  "museum",    "orchard",  "parcel",   "pilot",
};
static const char *const verbs[] = {
    "reads",    "updates",  "describes", "measures", "records",    "supports", "reduces",   "extends",  "connects",  "follows",
    "replaces", "contains", "requires",  "produces", "explains",   "improves", "compares",  "collects", "delivers",  "protects",
    "reviews",  "tracks",   "limits",    "shapes",   "divides",    "links",    "carries",   "reports",  "builds",    "handles",
    "defines",  "covers",   "exposes",   "balances", "captures",   "checks",   "combines",  "confirms", "creates",   "directs",
    "examines", "favors",   "gathers",   "guides",   "includes",   "informs",  "joins",     "lowers",   "maintains", "marks",
    "matches",  "moves",    "opens",     "orders",   "passes",     "prepares", "raises",    "reaches",  "receives",  "reflects",
    "removes",  "repairs",  "returns",   "selects",  "sends",      "serves",   "shows",     "signals",  "sorts",     "stores",
    "studies",  "suggests", "tests",     "touches",  "transforms", "triggers", "validates", "weighs",   "writes",    "yields",
};
static const char *const adjectives[] = {
    "large",    "small",    "recent",   "careful",  "quiet",   "northern", "central",   "early",     "modern",    "formal",
    "local",    "global",   "annual",   "broad",    "narrow",  "steady",   "rapid",     "gradual",   "primary",   "secondary",
    "complex",  "simple",   "stable",   "fragile",  "public",  "private",  "ancient",   "coastal",   "regional",  "digital",
    "manual",   "partial",  "complete", "detailed", "brief",   "careless", "distant",   "familiar",  "hidden",    "internal",
    "external", "minor",    "major",    "natural",  "neutral", "obvious",  "original",  "popular",   "practical", "precise",
    "relevant", "reliable", "remote",   "robust",   "rural",   "scarce",   "seasonal",  "separate",  "severe",    "shared",
    "silent",   "similar",  "spare",    "specific", "strict",  "sudden",   "technical", "temporary", "typical",   "unusual",
    "urban",    "useful",   "valid",    "various",  "visible", "vital",    "western",   "wooden",    "yearly",    "narrative",
};
static const char *const adverbs[] = {
    "quickly", "carefully", "rarely",   "often",    "usually",   "gradually", "clearly", "directly", "largely",    "mostly",
    "partly",  "slowly",    "steadily", "strictly", "typically", "briefly",   "closely", "formally", "frequently", "gently",
};
static const char *const prepositions[] = {"in",     "on",    "across", "through", "near",  "under",  "behind", "beyond",
                                           "within", "along", "around", "during",  "after", "before", "among",  "toward"};
static const char *const determiners[] = {"the",  "the",  "the", "a",   "each",  "every",
                                          "this", "that", "its", "our", "their", "another"};
static const char *const openers[] = {"However",     "In practice", "As a result", "For example", "In most cases", "Meanwhile",
                                      "By contrast", "At first",    "Later",       "In addition", "Even so",       "Over time"};
static const char *const conjunctions[] = {"while", "because", "although", "so that", "whereas", "since", "until", "unless"};
static const char *const places[] = {
    "Ardmore", "Belfort",  "Calder",   "Dunmere", "Eastvale", "Falkirk", "Glenrock",   "Harwick",  "Ilford",     "Jarrow",
    "Kelso",   "Lindford", "Marlow",   "Norwick", "Oakham",   "Pelham",  "Quarry Bay", "Redcliff", "Selby",      "Thornbury",
    "Upton",   "Varna",    "Westport", "Yardley", "Zermatt",  "Ashby",   "Brixham",    "Carrow",   "Dover Hill", "Elmstead",
};
static const char *const surnames[] = {
    "Okafor",  "Lindqvist", "Moreau", "Tanaka", "Alvarez", "Kowalski", "Brennan", "Haddad", "Novak", "Fischer",
    "Delgado", "Ivanova",   "Chen",   "Mbeki",  "Larsen",  "Petrov",   "Romano",  "Sato",   "Walsh", "Quinn",
    "Adeyemi", "Bauer",     "Costa",  "Duarte", "Eriksen", "Farrow",   "Grant",   "Hale",   "Ibsen", "Jensen",
};
static const char *const first_names[] = {
    "Marta", "Jonas",  "Amara", "Felix", "Ines", "Tomas", "Leila", "Hugo",   "Nadia", "Oren",
    "Priya", "Rafael", "Sofia", "Theo",  "Yara", "Bruno", "Clara", "Dmitri", "Elena", "Farid",
};
static const char *const tech_words[] = {
    "cache",   "parser",  "buffer",   "token",    "handler",  "config",   "schema",  "index",  "queue",  "worker",
    "client",  "server",  "router",   "request",  "payload",  "session",  "batch",   "stream", "filter", "loader",
    "encoder", "decoder", "registry", "manifest", "snapshot", "checksum", "timeout", "retry",  "offset", "cursor",
    "bucket",  "shard",   "lease",    "lock",     "socket",   "header",   "field",   "record", "entry",  "node",
};
static const char *const code_types[] = {"int", "str", "float", "bool", "list", "dict", "bytes", "None"};
static const char *const log_levels[] = {"INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"};

const char *text_gen_word(WlRng *r, WordClass cls) {
    switch (cls) {
    case WORD_NOUN: return wl_rng_pick(r, nouns, COUNT(nouns));
    case WORD_VERB: return wl_rng_pick(r, verbs, COUNT(verbs));
    case WORD_ADJECTIVE: return wl_rng_pick(r, adjectives, COUNT(adjectives));
    case WORD_ADVERB: return wl_rng_pick(r, adverbs, COUNT(adverbs));
    case WORD_PLACE: return wl_rng_pick(r, places, COUNT(places));
    case WORD_SURNAME: return wl_rng_pick(r, surnames, COUNT(surnames));
    case WORD_FIRST_NAME: return wl_rng_pick(r, first_names, COUNT(first_names));
    case WORD_TECH: return wl_rng_pick(r, tech_words, COUNT(tech_words));
    }
    return "thing";
}

/* Appends word with its first letter upper-cased. */
static void append_capitalized(StrBuf *out, const char *word) {
    strbuf_append_char(out, (char)toupper((unsigned char)word[0]));
    strbuf_append(out, word + 1);
}

static void plural(StrBuf *out, const char *noun) {
    size_t n = strlen(noun);
    if (n > 1 && noun[n - 1] == 'y' && !strchr("aeiou", noun[n - 2])) {
        strbuf_append_n(out, noun, n - 1);
        strbuf_append(out, "ies");
    } else if (noun[n - 1] == 's' || noun[n - 1] == 'x' || (n > 1 && noun[n - 1] == 'h' && strchr("cs", noun[n - 2]))) {
        strbuf_append(out, noun);
        strbuf_append(out, "es");
    } else {
        strbuf_append(out, noun);
        strbuf_append_char(out, 's');
    }
}

/* "the careful report" / "a river" / "ledgers" — a noun phrase, without leading space. Returns 1
 * when it is plural, so the verb can agree; allow_plural 0 keeps it singular. */
static int noun_phrase_of(StrBuf *out, WlRng *r, int allow_plural) {
    if (allow_plural && wl_rng_chance(r, 0.2)) {
        if (wl_rng_chance(r, 0.5)) strbuf_appendf(out, "%s ", text_gen_word(r, WORD_ADJECTIVE));
        plural(out, text_gen_word(r, WORD_NOUN));
        return 1;
    }
    const char *det = wl_rng_pick(r, determiners, COUNT(determiners));
    const char *adj = wl_rng_chance(r, 0.45) ? text_gen_word(r, WORD_ADJECTIVE) : NULL;
    const char *first = adj ? adj : "x";
    if (strcmp(det, "a") == 0 && strchr("aeiou", first[0]) && adj) det = "an";
    if (strcmp(det, "a") == 0 && !adj) {
        const char *noun = text_gen_word(r, WORD_NOUN);
        strbuf_appendf(out, "%s %s", strchr("aeiou", noun[0]) ? "an" : "a", noun);
        return 0;
    }
    strbuf_append(out, det);
    if (adj) strbuf_appendf(out, " %s", adj);
    strbuf_appendf(out, " %s", text_gen_word(r, WORD_NOUN));
    return 0;
}

static int noun_phrase(StrBuf *out, WlRng *r) { return noun_phrase_of(out, r, 1); }

/* The base form of a third-person verb from the list: "studies" → "study", "reaches" → "reach". */
static void verb_base(StrBuf *out, const char *verb) {
    size_t n = strlen(verb);
    if (n > 3 && strcmp(verb + n - 3, "ies") == 0) {
        strbuf_append_n(out, verb, n - 3);
        strbuf_append_char(out, 'y');
    } else if (n > 4 && (strcmp(verb + n - 4, "shes") == 0 || strcmp(verb + n - 4, "ches") == 0 ||
                         strcmp(verb + n - 3, "xes") == 0 || strcmp(verb + n - 4, "sses") == 0)) {
        strbuf_append_n(out, verb, n - 2);
    } else {
        strbuf_append_n(out, verb, n - 1);
    }
}

/* subject verb object [prep phrase] — a clause without capitalization or final period. */
static void clause(StrBuf *out, WlRng *r) {
    int plural_subject = 0;
    if (wl_rng_chance(r, 0.12))
        strbuf_appendf(out, "%s %s", text_gen_word(r, WORD_FIRST_NAME), text_gen_word(r, WORD_SURNAME));
    else
        plural_subject = noun_phrase(out, r);
    if (wl_rng_chance(r, 0.15)) strbuf_appendf(out, " %s", text_gen_word(r, WORD_ADVERB));
    strbuf_append_char(out, ' ');
    if (plural_subject)
        verb_base(out, text_gen_word(r, WORD_VERB));
    else
        strbuf_append(out, text_gen_word(r, WORD_VERB));
    strbuf_append_char(out, ' ');
    noun_phrase(out, r);
    if (wl_rng_chance(r, 0.5)) {
        strbuf_appendf(out, " %s ", wl_rng_pick(r, prepositions, COUNT(prepositions)));
        if (wl_rng_chance(r, 0.15))
            strbuf_append(out, text_gen_word(r, WORD_PLACE));
        else
            noun_phrase(out, r);
    }
    if (wl_rng_chance(r, 0.08)) strbuf_appendf(out, " by %d percent", wl_rng_range(r, 2, 95));
}

/* Capitalizes the first letter appended since `start`. */
static void capitalize_from(StrBuf *out, size_t start) {
    if (!strbuf_failed(out) && start < out->len) out->data[start] = (char)toupper((unsigned char)out->data[start]);
}

void text_gen_sentence(StrBuf *out, WlRng *r) {
    size_t start = out->len;
    if (wl_rng_chance(r, 0.15)) strbuf_appendf(out, "%s, ", wl_rng_pick(r, openers, COUNT(openers)));
    clause(out, r);
    if (wl_rng_chance(r, 0.3)) {
        strbuf_appendf(out, ", %s ", wl_rng_pick(r, conjunctions, COUNT(conjunctions)));
        clause(out, r);
    }
    strbuf_append_char(out, '.');
    capitalize_from(out, start);
}

void text_gen_question(StrBuf *out, WlRng *r) {
    static const char *const starts[] = {"How does", "Why does", "When does", "Does", "Where does", "How often does"};
    const char *s = wl_rng_pick(r, starts, COUNT(starts));
    strbuf_appendf(out, "%s ", s);
    noun_phrase_of(out, r, 0); /* "does" needs a singular subject */
    const char *verb = text_gen_word(r, WORD_VERB);
    strbuf_append_char(out, ' ');
    verb_base(out, verb); /* "does" takes the base form */
    strbuf_append_char(out, ' ');
    noun_phrase(out, r);
    if (wl_rng_chance(r, 0.5)) {
        strbuf_appendf(out, " %s ", wl_rng_pick(r, prepositions, COUNT(prepositions)));
        noun_phrase(out, r);
    }
    strbuf_append_char(out, '?');
}

void text_gen_title(StrBuf *out, WlRng *r, int words) {
    for (int i = 0; i < words; i++) {
        if (i) strbuf_append_char(out, ' ');
        append_capitalized(out, text_gen_word(r, i + 1 < words && wl_rng_chance(r, 0.5) ? WORD_ADJECTIVE : WORD_NOUN));
    }
}

void text_gen_identifier(StrBuf *out, WlRng *r) {
    int words = wl_rng_range(r, 1, 3);
    for (int i = 0; i < words; i++) {
        if (i) strbuf_append_char(out, '_');
        strbuf_append(out, text_gen_word(r, i == 0 && words > 1 && wl_rng_chance(r, 0.4) ? WORD_TECH : WORD_NOUN));
    }
}

void text_gen_person(StrBuf *out, WlRng *r) {
    strbuf_appendf(out, "%s %s", text_gen_word(r, WORD_FIRST_NAME), text_gen_word(r, WORD_SURNAME));
}

/* ---- styles: each appends one unit (paragraph, function, table, log line) ---- */

static void prose_paragraph(StrBuf *out, WlRng *r) {
    int n = wl_rng_range(r, 3, 6);
    for (int i = 0; i < n; i++) {
        if (i) strbuf_append_char(out, ' ');
        text_gen_sentence(out, r);
    }
    strbuf_append(out, "\n\n");
}

static void code_statement(StrBuf *out, WlRng *r, const char *indent) {
    strbuf_append(out, indent);
    switch (wl_rng_range(r, 0, 5)) {
    case 0:
        text_gen_identifier(out, r);
        strbuf_append(out, " = ");
        text_gen_identifier(out, r);
        strbuf_appendf(out, ".get(\"%s\", %d)\n", text_gen_word(r, WORD_TECH), wl_rng_range(r, 0, 512));
        break;
    case 1:
        strbuf_appendf(out, "if %s is None:\n%s    raise ValueError(\"%s %s is missing\")\n", text_gen_word(r, WORD_NOUN), indent,
                       text_gen_word(r, WORD_TECH), text_gen_word(r, WORD_NOUN));
        break;
    case 2:
        strbuf_appendf(out, "for %s in %s.%s:\n%s    total += %s.%s\n", text_gen_word(r, WORD_NOUN), text_gen_word(r, WORD_TECH),
                       text_gen_word(r, WORD_NOUN), indent, text_gen_word(r, WORD_NOUN), text_gen_word(r, WORD_TECH));
        break;
    case 3:
        strbuf_appendf(out, "self.%s = %s(", text_gen_word(r, WORD_TECH), text_gen_word(r, WORD_TECH));
        text_gen_identifier(out, r);
        strbuf_append(out, ")\n");
        break;
    case 4:
        strbuf_append(out, "# ");
        text_gen_sentence(out, r);
        strbuf_append_char(out, '\n');
        break;
    default:
        strbuf_appendf(out, "result.append(%s.%s(%s=%d))\n", text_gen_word(r, WORD_NOUN), text_gen_word(r, WORD_VERB),
                       text_gen_word(r, WORD_TECH), wl_rng_range(r, 1, 64));
        break;
    }
}

static void code_function(StrBuf *out, WlRng *r) {
    strbuf_append(out, "def ");
    text_gen_identifier(out, r);
    strbuf_appendf(out, "(self, %s: %s, %s=None):\n    \"\"\"", text_gen_word(r, WORD_NOUN),
                   wl_rng_pick(r, code_types, COUNT(code_types)), text_gen_word(r, WORD_TECH));
    text_gen_sentence(out, r);
    strbuf_append(out, "\"\"\"\n    total = 0\n");
    int n = wl_rng_range(r, 2, 5);
    for (int i = 0; i < n; i++) code_statement(out, r, "    ");
    strbuf_appendf(out, "    return %s\n\n", wl_rng_chance(r, 0.5) ? "total" : "result");
}

static void finance_table(StrBuf *out, WlRng *r) {
    static const char *const items[] = {"Revenue",          "Cost of revenue",     "Gross profit",         "Operating expenses",
                                        "Operating income", "Net income",          "Capital expenditures", "Free cash flow",
                                        "Total debt",       "Cash and equivalents"};
    int year = wl_rng_range(r, 2018, 2023);
    strbuf_appendf(out, "| (in millions) | FY%d | FY%d | Change |\n|---|---|---|---|\n", year, year - 1);
    int rows = wl_rng_range(r, 3, 6), first = wl_rng_range(r, 0, COUNT(items) - rows);
    for (int i = 0; i < rows; i++) {
        int a = wl_rng_range(r, 120, 98000), b = wl_rng_range(r, 100, 98000);
        strbuf_appendf(out, "| %s | %d.%d | %d.%d | %+.1f%% |\n", items[first + i], a, wl_rng_range(r, 0, 9), b,
                       wl_rng_range(r, 0, 9), 100.0 * (a - b) / b);
    }
    strbuf_append_char(out, '\n');
}

static void finance_paragraph(StrBuf *out, WlRng *r) {
    if (wl_rng_chance(r, 0.3)) {
        finance_table(out, r);
        return;
    }
    int n = wl_rng_range(r, 2, 4);
    for (int i = 0; i < n; i++) {
        if (i) strbuf_append_char(out, ' ');
        if (wl_rng_chance(r, 0.4))
            strbuf_appendf(out, "%s %s increased to $%d.%d million in fiscal %d, compared with $%d.%d million a year earlier.",
                           i ? "Its" : "The company's", text_gen_word(r, WORD_NOUN), wl_rng_range(r, 10, 9999),
                           wl_rng_range(r, 0, 9), wl_rng_range(r, 2018, 2023), wl_rng_range(r, 10, 9999), wl_rng_range(r, 0, 9));
        else
            text_gen_sentence(out, r);
    }
    strbuf_append(out, "\n\n");
}

static void encyclopedia_paragraph(StrBuf *out, WlRng *r) {
    int n = wl_rng_range(r, 2, 5);
    for (int i = 0; i < n; i++) {
        if (i) strbuf_append_char(out, ' ');
        switch (wl_rng_range(r, 0, 3)) {
        case 0:
            strbuf_appendf(out, "In %d, %s %s moved to %s, where the %s %s was founded.", wl_rng_range(r, 1780, 2015),
                           text_gen_word(r, WORD_FIRST_NAME), text_gen_word(r, WORD_SURNAME), text_gen_word(r, WORD_PLACE),
                           text_gen_word(r, WORD_ADJECTIVE), text_gen_word(r, WORD_NOUN));
            break;
        case 1:
            strbuf_appendf(out, "%s lies %d kilometres from %s.", text_gen_word(r, WORD_PLACE), wl_rng_range(r, 3, 900),
                           text_gen_word(r, WORD_PLACE));
            break;
        default: text_gen_sentence(out, r); break;
        }
    }
    strbuf_append(out, "\n\n");
}

static void log_line(StrBuf *out, WlRng *r) {
    strbuf_appendf(out, "%02d:%02d:%02d %s [%s] ", wl_rng_range(r, 0, 23), wl_rng_range(r, 0, 59), wl_rng_range(r, 0, 59),
                   wl_rng_pick(r, log_levels, COUNT(log_levels)), text_gen_word(r, WORD_TECH));
    text_gen_sentence(out, r);
    strbuf_append_char(out, '\n');
}

/* Appends one unit of the style: a paragraph, a function, a table or a log line. */
static void append_unit(StrBuf *out, WlRng *r, TextStyle style) {
    switch (style) {
    case TEXT_PROSE: prose_paragraph(out, r); break;
    case TEXT_CODE: code_function(out, r); break;
    case TEXT_FINANCE: finance_paragraph(out, r); break;
    case TEXT_ENCYCLOPEDIA: encyclopedia_paragraph(out, r); break;
    case TEXT_LOG: log_line(out, r); break;
    }
}

/* A sentence or line ends at i: '.', '?' or a newline, followed by a space, a newline or the end. */
static int sentence_end_at(const StrBuf *out, size_t i) {
    char c = out->data[i];
    return (c == '.' || c == '?' || c == '\n') && (i + 1 == out->len || out->data[i + 1] == ' ' || out->data[i + 1] == '\n');
}

/* Cuts the unit that starts at `from` at its last sentence or line end that keeps it within
 * `budget` estimated tokens. Returns 1 when it found such a cut. */
static int trim_unit(StrBuf *out, size_t from, int budget) {
    size_t cut = 0;
    for (size_t i = from; i < out->len; i++) {
        if (!sentence_end_at(out, i)) continue;
        if (token_estimate(out->data + from, i + 1 - from) > budget) break;
        cut = i + 1;
    }
    if (!cut) return 0;
    strbuf_truncate(out, cut);
    strbuf_append_char(out, '\n');
    return 1;
}

/* Estimated tokens of the unit at `from` up to its first sentence or line end. */
static int first_sentence_tokens(const StrBuf *out, size_t from) {
    size_t i = from;
    while (i < out->len && !sentence_end_at(out, i)) i++;
    return token_estimate(out->data + from, (i < out->len ? i + 1 : i) - from);
}

void text_gen(StrBuf *out, WlRng *r, TextStyle style, int tokens) {
    int have = 0;
    while (have < tokens && !strbuf_failed(out)) {
        size_t before = out->len;
        append_unit(out, r, style);
        if (strbuf_failed(out)) return;
        int unit = token_estimate(out->data + before, out->len - before);
        /* Overshooting a small budget by a whole paragraph would distort sizes: cut the last unit
         * short, unless that would leave nothing at all. */
        if (have + unit > tokens + tokens / 8 + 8) {
            if (trim_unit(out, before, tokens - have)) return;
            /* No sentence of it fits: the first text gets one sentence anyway; later, keep or drop
             * the whole unit, whichever lands nearer. */
            if (have == 0)
                trim_unit(out, before, first_sentence_tokens(out, before));
            else if (tokens - have < have + unit - tokens)
                strbuf_truncate(out, before);
            return;
        }
        have += unit;
    }
}
