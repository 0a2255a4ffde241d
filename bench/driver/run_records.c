/* Growable record arrays; the contract is in run_records.h. */
#include "run_records.h"

#include <stdlib.h>

/* items with room for need elements (the same or a moved array), or NULL when out of memory
 * (items is then untouched). */
static void *grow(void *items, int *cap, int need, size_t size) {
    if (need <= *cap) return items;
    int next = *cap ? *cap * 2 : 64;
    void *grown = realloc(items, (size_t)next * size);
    if (grown) *cap = next;
    return grown;
}

int run_records_add_request(RunRecords *r, const RequestRecord *rec) {
    RequestRecord *grown = grow(r->requests, &r->cap_requests, r->n_requests + 1, sizeof *rec);
    if (!grown) {
        free(rec->timing.itls_s);
        return -1;
    }
    r->requests = grown;
    r->requests[r->n_requests++] = *rec;
    if (rec->error[0]) {
        r->errors++;
    } else {
        r->prompt_tokens += rec->prompt_tokens;
        r->cached_tokens += rec->cached_tokens;
    }
    return 0;
}

int run_records_add_workflow(RunRecords *r, const WorkflowRecord *rec) {
    WorkflowRecord *grown = grow(r->workflows, &r->cap_workflows, r->n_workflows + 1, sizeof *rec);
    if (!grown) return -1;
    r->workflows = grown;
    r->workflows[r->n_workflows++] = *rec;
    return 0;
}

void run_records_free(RunRecords *r) {
    for (int i = 0; i < r->n_requests; i++) bench_sample_free(&r->requests[i].timing);
    free(r->requests);
    free(r->workflows);
    *r = (RunRecords){0};
}
