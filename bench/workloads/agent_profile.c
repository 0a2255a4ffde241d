/* System prompt = identity line, role, seeded guideline list, tool schemas. */
#include "agent_profile.h"

#include <ctype.h>
#include <stdlib.h>

#include "strbuf.h"
#include "text_gen.h"
#include "token_estimate.h"
#include "tool_schemas.h"
#include "wl_rng.h"

static int scaled(int tokens, double scale) {
    int n = (int)(tokens * scale + 0.5);
    return n < 1 ? 1 : n;
}

static void append_guidelines(StrBuf *out, WlRng *r, int tokens) {
    strbuf_append(out, "Guidelines:\n");
    size_t start = out->len;
    int i = 1;
    do {
        strbuf_appendf(out, "%d. ", i++);
        text_gen_sentence(out, r);
        if (wl_rng_chance(r, 0.5)) {
            strbuf_append_char(out, ' ');
            text_gen_sentence(out, r);
        }
        strbuf_append_char(out, '\n');
    } while (!strbuf_failed(out) && token_estimate(out->data + start, out->len - start) < tokens);
}

int agent_profile_build(AgentProfile *p, const char *workload, const char *team, const AgentSpec *spec, double scale,
                        BraidError *err) {
    *p = (AgentProfile){.spec = spec};
    WlRng r = wl_rng_named2(workload, spec->name);
    StrBuf b = {0};
    strbuf_appendf(&b, "You are the %c%s agent of %s. %s\n\n", toupper((unsigned char)spec->name[0]), spec->name + 1, team,
                   spec->role);
    append_guidelines(&b, &r, scaled(spec->guideline_tokens, scale));
    if (spec->tools && spec->tools[0]) {
        strbuf_append(&b, "\nYou can call these tools:\n");
        for (int i = 0; spec->tools[i]; i++) tool_schema_append(&b, spec->tools[i], scaled(spec->tool_tokens, scale));
    }
    strbuf_append_char(&b, '\n');
    p->head = strbuf_take(&b);
    if (!p->head) return braid_error_set(err, "workload %s: out of memory building the %s agent's prompt", workload, spec->name);
    p->head_tokens = token_estimate_str(p->head);
    return 0;
}

void agent_profile_free(AgentProfile *p) {
    free(p->head);
    p->head = NULL;
}

int agent_profiles_build(AgentProfile *profiles, const AgentSpec *specs, int n, const char *workload, const char *team,
                         double scale, BraidError *err) {
    for (int i = 0; i < n; i++)
        if (agent_profile_build(&profiles[i], workload, team, &specs[i], scale, err)) {
            agent_profiles_free(profiles, i);
            return -1;
        }
    return 0;
}

void agent_profiles_free(AgentProfile *profiles, int n) {
    for (int i = 0; i < n; i++) agent_profile_free(&profiles[i]);
}
