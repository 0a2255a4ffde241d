/* Sizes, call filling and prompt assembly shared by the workload files. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#include "strbuf.h"
#include "token_estimate.h"
#include "workload_kind.h"

void *wl_alloc_state(size_t size, BraidError *err) {
    void *state = calloc(1, size);
    if (!state) braid_error_set(err, "out of memory");
    return state;
}

int wl_scaled(const WorkloadParams *p, int tokens) {
    int n = (int)(tokens * p->scale + 0.5);
    return n < 1 ? 1 : n;
}

int wl_prompt_cap(const WorkloadParams *p) {
    int cap = wl_scaled(p, WL_PROMPT_CAP_TOKENS);
    return cap > WL_PROMPT_CAP_FLOOR ? cap : WL_PROMPT_CAP_FLOOR;
}

int wl_scaled_output(const WorkloadParams *p, int tokens) {
    int n = (int)(tokens * p->scale + 0.5);
    return n < 4 ? 4 : n;
}

int wl_draw_output_tokens(WlRng *r, int mean, int max_tokens) {
    int n = (int)(mean * (0.6 + 0.8 * wl_rng_uniform(r)) + 0.5);
    if (n > max_tokens) n = max_tokens;
    return n < 1 ? 1 : n;
}

void wl_call_fill(AgentCall *c, const char *agent, const char *tenant, const char *adapter, char *prompt, int max_tokens,
                  double delay_s, int expected_output_tokens) {
    *c = (AgentCall){
        .prompt = prompt, .max_tokens = max_tokens, .delay_s = delay_s, .expected_output_tokens = expected_output_tokens};
    snprintf(c->agent, sizeof c->agent, "%s", agent);
    snprintf(c->tenant, sizeof c->tenant, "%s", tenant ? tenant : "");
    snprintf(c->adapter, sizeof c->adapter, "%s", adapter ? adapter : "");
}

void wl_calls_release(AgentCall *calls, int n) {
    for (int i = 0; i < n; i++) {
        free(calls[i].prompt);
        calls[i].prompt = NULL;
    }
}

const char *wl_output(const char *const *outputs, int i) { return outputs && outputs[i] ? outputs[i] : ""; }

int wl_check_outputs(const char *workload, int expected, int n, BraidError *err) {
    if (n == expected) return 0;
    return braid_error_set(err, "workload %s: the stage had %d calls but %d outputs were delivered", workload, expected, n);
}

WlLabel wl_label(const char *agent) {
    WlLabel l;
    snprintf(l.text, sizeof l.text, "%s", agent);
    l.text[0] = (char)toupper((unsigned char)l.text[0]);
    return l;
}

void wl_append_instruction(StrBuf *b, const char *agent, const char *text) {
    strbuf_appendf(b, "### Instruction\n%s\n\n### %s\n", text, wl_label(agent).text);
}

char *wl_prompt_build(const char *const *head, int n_head, const History *h, const char *tail, int cap_tokens, BraidError *err) {
    StrBuf b = {0};
    int used = token_estimate_str(tail);
    for (int i = 0; i < n_head; i++) {
        strbuf_append(&b, head[i]);
        used += token_estimate_str(head[i]);
    }
    if (h) history_render(h, &b, cap_tokens - used);
    strbuf_append(&b, tail);
    char *prompt = strbuf_take(&b);
    if (!prompt) braid_error_set(err, "workload: out of memory building a prompt");
    return prompt;
}

/* Head parts, history within the cap, tail; output length and max_tokens drawn as for every call. */
static int agent_call(const AgentProfile *agent, const char *task, const History *h, const char *tail, const WorkloadParams *p,
                      WlRng *rng, int output_mean, int output_max, AgentCall *call, BraidError *err) {
    const char *head[] = {agent->head, task};
    char *prompt = wl_prompt_build(head, task ? 2 : 1, h, tail, wl_prompt_cap(p), err);
    if (!prompt) return -1;
    int max_tokens = wl_scaled_output(p, output_max);
    int expected = wl_draw_output_tokens(rng, wl_scaled(p, output_mean), max_tokens);
    wl_call_fill(call, agent->spec->name, NULL, agent->spec->adapter, prompt, max_tokens, 0.0, expected);
    return 1;
}

int wl_agent_stage(const AgentProfile *agent, const History *h, const char *instruction, const WorkloadParams *p, WlRng *rng,
                   int output_mean, int output_max, AgentCall *call, BraidError *err) {
    StrBuf tail = {0};
    wl_append_instruction(&tail, agent->spec->name, instruction);
    if (strbuf_failed(&tail)) return braid_error_set(err, "out of memory");
    int rc = agent_call(agent, NULL, h, tail.data, p, rng, output_mean, output_max, call, err);
    strbuf_free(&tail);
    return rc;
}

int wl_agent_turn(const AgentProfile *agent, const char *task, const History *h, const char *scratch, const WorkloadParams *p,
                  WlRng *rng, int output_mean, int output_max, AgentCall *call, BraidError *err) {
    StrBuf tail = {0};
    strbuf_appendf(&tail, "%s### %s\n", scratch ? scratch : "", wl_label(agent->spec->name).text);
    if (strbuf_failed(&tail)) return braid_error_set(err, "out of memory");
    int rc = agent_call(agent, task, h, tail.data, p, rng, output_mean, output_max, call, err);
    strbuf_free(&tail);
    return rc;
}

int wl_add_output(History *h, const AgentProfile *agent, const char *output, const WorkloadParams *p, int output_max,
                  BraidError *err) {
    return history_add(h, wl_label(agent->spec->name).text, output, wl_scaled_output(p, output_max), 0, err);
}
