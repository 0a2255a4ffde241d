/*
 * agent_profile.h — an agent's shared prompt head: its system prompt (role and guidelines) and the
 * descriptions of the tools it may call. Built once per Workload and shared by every workflow, so
 * every call of the agent starts with the same bytes.
 *
 * The text depends on the workload name, the agent spec and the scale, never on the run seed (an
 * agent framework's prompts do not change between runs). Owns its strings.
 */
#ifndef BRAID_BENCH_WORKLOADS_AGENT_PROFILE_H
#define BRAID_BENCH_WORKLOADS_AGENT_PROFILE_H

#include "common/error.h"

typedef struct {
    const char *name;         /* "coder": the agent label in calls and traces */
    const char *adapter;      /* LoRA adapter name, or NULL for the base model */
    const char *role;         /* one or two sentences stating what the agent does */
    int guideline_tokens;     /* size of its guideline list at scale 1 */
    const char *const *tools; /* NULL-terminated tool names, or NULL */
    int tool_tokens;          /* size of each tool schema at scale 1 */
} AgentSpec;

typedef struct {
    const AgentSpec *spec;
    char *head;      /* system prompt + tool descriptions */
    int head_tokens; /* estimated */
} AgentProfile;

/* Returns 0, or -1 with err set when out of memory. */
int agent_profile_build(AgentProfile *p, const char *workload, const char *team, const AgentSpec *spec, double scale,
                        BraidError *err);
void agent_profile_free(AgentProfile *p);

/* The profiles of a team of n agents (specs[i] into profiles[i]), all or none: on failure the ones
 * already built are freed. Returns 0, or -1 with err set when out of memory. */
int agent_profiles_build(AgentProfile *profiles, const AgentSpec *specs, int n, const char *workload, const char *team,
                         double scale, BraidError *err);
void agent_profiles_free(AgentProfile *profiles, int n);

#endif
