/*
 * tool_schemas.h — the text of a tool's description as agent frameworks put it in prompts: a
 * JSON function schema with a description and typed parameters.
 *
 * The text depends only on the tool's name and size, never on the run seed, so the same tool is
 * described byte-for-byte identically in every agent, workflow and run — the repeated segments
 * that prefix caching and cross-query reuse feed on. Stateless.
 */
#ifndef BRAID_BENCH_WORKLOADS_TOOL_SCHEMAS_H
#define BRAID_BENCH_WORKLOADS_TOOL_SCHEMAS_H

#include "strbuf.h"

/* Appends the schema of tool `name` (snake_case), about `tokens` estimated tokens, ending in "\n". */
void tool_schema_append(StrBuf *out, const char *name, int tokens);

#endif
