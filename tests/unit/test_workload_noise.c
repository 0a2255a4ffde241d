/*
 * The noise-free workloads (WorkloadParams.noise_free, `braid-bench gen --noise off`): the noisy and
 * the noise-free twin of a workflow make the same random draws, so they must agree everywhere
 * except where noise fired — and there the noise-free one must do what the state in its prompts
 * says:
 *   - codegen: the twins' difficulty lines differ exactly where the noisy label was wrong (about
 *     15%), the rest of the first prompt is the same bytes; a noise-free "easy" label is never
 *     followed by a report only a harder task can produce, and noise-free labels separate the
 *     first reports of easy and hard tasks more than noisy ones; the twins' agent sequences and test
 *     reports are equal up to a flaky failure (noisy "1 of N" where the noise-free twin reports 0
 *     and ends);
 *   - factcheck: noise-free, a workflow ends after a verdict exactly when the last coverage line says
 *     every fact is supported (or after the round limit) — with noise, double-checks and give-ups
 *     break that rule;
 *   - a value other than 0 or 1 is refused.
 * Outputs are synthetic and seeded by workflow and stage, so both twins receive the same ones.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"
#include "text_gen.h"
#include "workload.h"
#include "wl_rng.h"

enum { MAX_STAGES = 32, N_FLOWS = 600, FACTCHECK_MAX_ROUNDS = 4 };

/* What one workflow did, stage by stage, as its prompts show it. */
typedef struct {
    int stages;
    char agents[MAX_STAGES][32];
    int result[MAX_STAGES];   /* codegen: K of the last "Result: K of N" in the prompt; -1 if none */
    int coverage[MAX_STAGES]; /* factcheck: S of the last "Evidence coverage: S of F"; -1 if none */
    char *first_prompt;
} FlowLog;

static Workload *create(const char *name, int noise_free) {
    WorkloadParams p = {.n_workflows = N_FLOWS, .seed = 29, .scale = 0.03, .noise_free = noise_free};
    BraidError err;
    Workload *w = workload_create(name, &p, &err);
    if (!w) fail_msg("%s: %s", name, err.msg);
    return w;
}

/* The number after the last occurrence of key in text, or -1. */
static int last_number_after(const char *text, const char *key) {
    const char *at = NULL;
    for (const char *s = strstr(text, key); s; s = strstr(s + 1, key)) at = s;
    return at ? atoi(at + strlen(key)) : -1;
}

static char *synthetic_output(const AgentCall *c, int wf, int stage) {
    WlRng r = wl_rng_stream(4321, (uint64_t)wf * 1000 + (uint64_t)stage);
    StrBuf b = {0};
    text_gen(&b, &r, TEXT_PROSE, c->expected_output_tokens);
    char *s = strbuf_take(&b);
    assert_non_null(s);
    return s;
}

static void run_logged(Workload *w, int wf, FlowLog *log) {
    memset(log, 0, sizeof *log);
    for (;;) {
        AgentCall calls[WORKLOAD_MAX_FANOUT];
        BraidError err;
        int n = workload_next_stage(w, wf, calls, WORKLOAD_MAX_FANOUT, &err);
        if (n < 0) fail_msg("workflow %d: %s", wf, err.msg);
        if (n == 0) return;
        assert_int_equal(n, 1);
        assert_true(log->stages < MAX_STAGES);
        int s = log->stages++;
        snprintf(log->agents[s], sizeof log->agents[s], "%s", calls[0].agent);
        log->result[s] = last_number_after(calls[0].prompt, "Result: ");
        log->coverage[s] = last_number_after(calls[0].prompt, "Evidence coverage: ");
        if (s == 0) log->first_prompt = strdup(calls[0].prompt);
        char *out = synthetic_output(&calls[0], wf, s);
        const char *outs[] = {out};
        if (workload_deliver(w, wf, outs, 1, &err)) fail_msg("workflow %d: %s", wf, err.msg);
        free(out);
    }
}

static void test_noise_free_must_be_0_or_1(void **state) {
    (void)state;
    WorkloadParams p = {.n_workflows = 1, .seed = 1, .noise_free = 2};
    BraidError err;
    assert_null(workload_create("codegen", &p, &err));
    assert_non_null(strstr(err.msg, "noise_free"));
}

/* The "Difficulty: …" line of a codegen prompt into label; returns where the line ends. */
static const char *difficulty_line(const char *prompt, char *label, size_t cap) {
    const char *at = strstr(prompt, "Difficulty: ");
    assert_non_null(at);
    const char *end = strchr(at, '\n');
    assert_non_null(end);
    snprintf(label, cap, "%.*s", (int)(end - at), at);
    return end;
}

/* The first prompts of two twins must be equal except their difficulty lines. Returns whether the
 * labels differ; the noise-free twin's label goes to clean_label. */
static int labels_differ(const char *noisy, const char *clean, char *clean_label, size_t cap) {
    char noisy_label[64];
    const char *a_end = difficulty_line(noisy, noisy_label, sizeof noisy_label);
    const char *b_end = difficulty_line(clean, clean_label, cap);
    size_t head = (size_t)(strstr(noisy, "Difficulty: ") - noisy);
    assert_int_equal(head, (size_t)(strstr(clean, "Difficulty: ") - clean));
    assert_memory_equal(noisy, clean, head);
    assert_string_equal(a_end, b_end);
    return strcmp(noisy_label, clean_label) != 0;
}

/* The first stage whose agent or report differs, or -1 when the two logs are the same. */
static int first_divergence(const FlowLog *x, const FlowLog *y) {
    int n = x->stages < y->stages ? x->stages : y->stages;
    for (int s = 0; s < n; s++)
        if (strcmp(x->agents[s], y->agents[s]) != 0 || x->result[s] != y->result[s]) return s;
    return x->stages == y->stages ? -1 : n;
}

/* The first report of a workflow (the Tester's summary prompt carries it). */
static int first_result(const FlowLog *log) {
    for (int s = 0; s < log->stages; s++)
        if (log->result[s] >= 0) return log->result[s];
    return -1;
}

/* Per label (easy, medium, hard): the summed first report and the count, to compare how much the
 * label tells about the task. */
typedef struct {
    double sum[3];
    int count[3];
} LabelReports;

static void add_label_report(LabelReports *r, const char *label, int first) {
    static const char *const names[] = {"Difficulty: easy", "Difficulty: medium", "Difficulty: hard"};
    for (int k = 0; k < 3; k++)
        if (strcmp(label, names[k]) == 0 && first >= 0) {
            r->sum[k] += first;
            r->count[k]++;
        }
}

/* Mean first report of "hard" tasks minus that of "easy" ones. */
static double hard_minus_easy(const LabelReports *r) {
    assert_true(r->count[0] > 0 && r->count[2] > 0);
    return r->sum[2] / r->count[2] - r->sum[0] / r->count[0];
}

static void test_codegen_noise_free_twin(void **state) {
    (void)state;
    Workload *noisy = create("codegen", 0), *clean = create("codegen", 1);
    int wrong_labels = 0, flaky = 0, same = 0, easy_but_hard_report = 0;
    LabelReports by_label[2] = {0};
    for (int i = 0; i < N_FLOWS; i++) {
        FlowLog a, b;
        run_logged(noisy, i, &a);
        run_logged(clean, i, &b);
        char label[64], noisy_label[64];
        wrong_labels += labels_differ(a.first_prompt, b.first_prompt, label, sizeof label);
        difficulty_line(a.first_prompt, noisy_label, sizeof noisy_label);
        add_label_report(&by_label[0], noisy_label, first_result(&a));
        add_label_report(&by_label[1], label, first_result(&b));
        /* An easy task starts with one bug, so its first run fails at most 2 + 2 + 1 tests (the bug
         * left, a regression, each doubled, one more); a true "easy" label never shows more. */
        easy_but_hard_report += strcmp(label, "Difficulty: easy") == 0 && first_result(&b) > 5;
        int d = first_divergence(&a, &b);
        if (d < 0) {
            same++;
        } else {
            /* Only a flaky failure may part them: the noisy twin reads "1 of N" where the noise-free
             * one reads 0 and ends after the Tester's summary; the noisy one goes on to the Analyzer
             * (unless that was its last attempt). */
            assert_true(d > 0);
            assert_string_equal(a.agents[d], "tester");
            assert_int_equal(a.result[d], 1);
            assert_int_equal(b.result[d], 0);
            assert_int_equal(b.stages, d + 1);
            if (a.stages > d + 1) assert_string_equal(a.agents[d + 1], "analyzer");
            flaky++;
        }
        free(a.first_prompt);
        free(b.first_prompt);
    }
    double spread_noisy = hard_minus_easy(&by_label[0]), spread_clean = hard_minus_easy(&by_label[1]);
    fprintf(stderr, "codegen noise-free twins of %d: %d labels corrected, %d flaky retries removed, %d identical; "
                    "first report hard - easy: %.2f noisy, %.2f noise-free\n",
            N_FLOWS, wrong_labels, flaky, same, spread_noisy, spread_clean);
    assert_true(wrong_labels > N_FLOWS * 8 / 100 && wrong_labels < N_FLOWS * 22 / 100); /* 15% wrong */
    assert_true(flaky > 0);
    assert_int_equal(easy_but_hard_report, 0);
    assert_true(spread_clean > spread_noisy + 0.3); /* true labels tell more about the task */
    workload_free(noisy);
    workload_free(clean);
}

/* Verdicts whose next step breaks "end exactly when every fact is supported or the rounds are
 * spent": [0] a supported claim checked again, [1] an unsupported one given up. */
static void count_factcheck_rule_breaks(Workload *w, int *breaks) {
    for (int i = 0; i < N_FLOWS; i++) {
        FlowLog log;
        run_logged(w, i, &log);
        int facts = last_number_after(log.first_prompt, "The claim links ");
        assert_true(facts >= 2 && facts <= 4);
        int rounds = 0;
        for (int s = 0; s < log.stages; s++) {
            if (strcmp(log.agents[s], "verifier") != 0) continue;
            rounds++;
            int supported = log.coverage[s];
            assert_true(supported >= 0 && supported <= facts);
            int ended = s + 1 == log.stages;
            int should_end = supported == facts || rounds >= FACTCHECK_MAX_ROUNDS;
            breaks[0] += !ended && should_end;
            breaks[1] += ended && !should_end;
        }
        free(log.first_prompt);
    }
}

static void test_factcheck_noise_free_follows_the_coverage(void **state) {
    (void)state;
    Workload *noisy = create("factcheck", 0), *clean = create("factcheck", 1);
    int noisy_breaks[2] = {0, 0}, clean_breaks[2] = {0, 0};
    count_factcheck_rule_breaks(noisy, noisy_breaks);
    count_factcheck_rule_breaks(clean, clean_breaks);
    fprintf(stderr, "factcheck over %d workflows: double-checks %d noisy / %d noise-free, give-ups %d / %d\n", N_FLOWS,
            noisy_breaks[0], clean_breaks[0], noisy_breaks[1], clean_breaks[1]);
    assert_true(noisy_breaks[0] > 0);
    assert_true(noisy_breaks[1] > 0);
    assert_int_equal(clean_breaks[0], 0);
    assert_int_equal(clean_breaks[1], 0);
    workload_free(noisy);
    workload_free(clean);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_noise_free_must_be_0_or_1),
        cmocka_unit_test(test_codegen_noise_free_twin),
        cmocka_unit_test(test_factcheck_noise_free_follows_the_coverage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
