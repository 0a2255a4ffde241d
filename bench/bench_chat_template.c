/*
 * Render cost of a chat template: a 20-turn agent conversation (system, user turns, assistant tool
 * calls, tool results, assistant answers) with two tools, rendered through chat_template_render_json
 * on the Hermes/Qwen-style golden template, repeated; prints µs per render (median of 5 rounds), wall
 * clock and this process's CPU time (the steadier figure on a shared machine).
 *   bench_chat_template [TEMPLATE.jinja] [RENDERS_PER_ROUND]
 * (default tests/golden/templates/hermes_tools.jinja, 2000, run from the repository root)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/timeutil.h"
#include "model/chat_template.h"

static json_t *conversation(void) {
    json_t *msgs = json_array();
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", "You are a coding agent. Use the tools to inspect and fix the repository; answer briefly."));
    for (int turn = 0; json_array_size(msgs) < 20; turn++) {
        char text[256], args_path[64], result[512];
        snprintf(text, sizeof text, "Step %d: the build fails in src/module_%d.c with 'undefined reference to helper_%d'. Please look into it.", turn, turn, turn);
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", text));
        snprintf(args_path, sizeof args_path, "src/module_%d.c", turn);
        char id[16];
        snprintf(id, sizeof id, "call%05d", turn);
        json_array_append_new(msgs, json_pack("{s:s, s:n, s:[{s:s, s:s, s:{s:s, s:{s:s, s:i, s:i}}}]}", "role", "assistant", "content",
                                              "tool_calls", "id", id, "type", "function", "function", "name", "read_file", "arguments",
                                              "path", args_path, "start_line", 1, "end_line", 120));
        snprintf(result, sizeof result, "#include \"module_%d.h\"\\nint helper_%d(int x) {\\n    return x * %d;\\n}\\n/* 117 more lines */", turn, turn, turn);
        json_array_append_new(msgs, json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", id, "content", result));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", "The helper is defined but its header is not included by the caller; I added the include."));
    }
    return msgs;
}

static json_t *tools(void) {
    json_error_t je;
    return json_loads(
        "[{\"type\": \"function\", \"function\": {\"name\": \"read_file\", \"description\": \"Read a range of lines of a file in the repository.\","
        " \"parameters\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\", \"description\": \"Path relative to the repository root\"},"
        " \"start_line\": {\"type\": \"integer\"}, \"end_line\": {\"type\": \"integer\"}}, \"required\": [\"path\"]}}},"
        " {\"type\": \"function\", \"function\": {\"name\": \"run_command\", \"description\": \"Run a shell command in the sandbox and return its output.\","
        " \"parameters\": {\"type\": \"object\", \"properties\": {\"command\": {\"type\": \"string\"}, \"timeout_s\": {\"type\": \"number\", \"default\": 30}},"
        " \"required\": [\"command\"]}}}]",
        0, &je);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "tests/golden/templates/hermes_tools.jinja";
    int n = argc > 2 ? atoi(argv[2]) : 2000;
    if (n <= 0) n = 2000;
    ChatTemplate t = {0};
    BraidError err;
    if (chat_template_load_file(&t, path, "", "<|im_end|>", &err)) {
        fprintf(stderr, "bench_chat_template: %s\n", err.msg);
        return 1;
    }
    json_t *msgs = conversation(), *tl = tools();
    char *text = chat_template_render_json(&t, msgs, tl, true, &err);
    if (!text) {
        fprintf(stderr, "bench_chat_template: %s\n", err.msg);
        return 1;
    }
    size_t bytes = strlen(text);
    free(text);
    double rounds[5], cpu[5];
    for (int r = 0; r < 5; r++) {
        struct timespec c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        double t0 = braid_now_seconds();
        for (int i = 0; i < n; i++) free(chat_template_render_json(&t, msgs, tl, true, &err));
        rounds[r] = (braid_now_seconds() - t0) / n * 1e6;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        cpu[r] = ((double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9) / n * 1e6;
    }
    qsort(rounds, 5, sizeof rounds[0], cmp_double);
    qsort(cpu, 5, sizeof cpu[0], cmp_double);
    printf("chat template %s: %zu messages, %zu tools, %zu bytes rendered: %.1f us per render wall, %.1f us CPU "
           "(medians of 5 x %d; wall min %.1f, max %.1f)\n",
           path, json_array_size(msgs), json_array_size(tl), bytes, rounds[2], cpu[2], n, rounds[0], rounds[4]);
    json_decref(msgs);
    json_decref(tl);
    chat_template_free(&t);
    return 0;
}
