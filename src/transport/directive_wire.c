/* Cache directives on the wire; the layout is in directive_wire.h. */
#include "transport/directive_wire.h"

#include <stdlib.h>
#include <string.h>

void wire_put_directives(WireBuf *b, const CacheDirectives *d) {
    wire_put_u8(b, d->splice_mode);
    wire_put_i32(b, d->first_edit);
    wire_put_i32s(b, d->context, d->n_context);
    wire_put_i32(b, d->n_runs);
    for (int i = 0; i < d->n_runs; i++) {
        wire_put_i32(b, d->runs[i].dst);
        wire_put_i32(b, d->runs[i].src);
        wire_put_i32(b, d->runs[i].len);
        wire_put_i32(b, d->runs[i].index);
    }
    wire_put_i32(b, d->n_hints);
    for (int i = 0; i < d->n_hints; i++) {
        const CacheHint *h = &d->hints[i];
        wire_put_u8(b, h->op);
        wire_put_i32(b, h->index);
        wire_put_i32(b, h->start);
        wire_put_i32(b, h->end);
        wire_put_f32(b, h->ttl_s);
        wire_put_u8(b, h->share_all);
        wire_put_i32(b, h->n_with);
        for (int j = 0; j < h->n_with; j++) wire_put_str(b, h->with[j]);
    }
    wire_put_u64(b, d->conversation);
    wire_put_u8(b, d->auto_splice);
}

static int get_hint(WireReader *r, CacheHint *h) {
    h->op = wire_get_u8(r);
    h->index = wire_get_i32(r);
    h->start = wire_get_i32(r);
    h->end = wire_get_i32(r);
    h->ttl_s = wire_get_f32(r);
    h->share_all = wire_get_u8(r);
    int n = wire_get_i32(r);
    if (r->failed || h->op < CACHE_HINT_PIN || h->op > CACHE_HINT_UNPIN || n < 0 || n > CACHE_SHARE_MAX_TENANTS) return -1;
    if (n > 0 && !(h->with = calloc((size_t)n, sizeof *h->with))) return -1;
    for (; h->n_with < n; h->n_with++)
        if (!(h->with[h->n_with] = wire_get_str(r))) return -1;
    return 0;
}

int wire_get_directives(WireReader *r, CacheDirectives *d) {
    memset(d, 0, sizeof *d);
    d->splice_mode = wire_get_u8(r);
    d->first_edit = wire_get_i32(r);
    d->context = wire_get_i32s(r, &d->n_context);
    int n_runs = wire_get_i32(r);
    bool ok = !r->failed && d->splice_mode <= CACHE_SPLICE_FORGET && n_runs >= 0 && n_runs <= 2 * CACHE_DIRECTIVE_MAX + 1;
    if (ok && n_runs > 0 && !(d->runs = calloc((size_t)n_runs, sizeof *d->runs))) ok = false;
    for (; ok && d->n_runs < n_runs; d->n_runs++) {
        CacheSpliceRun *run = &d->runs[d->n_runs];
        run->dst = wire_get_i32(r);
        run->src = wire_get_i32(r);
        run->len = wire_get_i32(r);
        run->index = wire_get_i32(r);
        if (r->failed || run->dst < 0 || run->src < 0 || run->len < 0) ok = false;
    }
    int n_hints = ok ? wire_get_i32(r) : -1;
    ok = ok && !r->failed && n_hints >= 0 && n_hints <= CACHE_DIRECTIVE_MAX;
    if (ok && n_hints > 0 && !(d->hints = calloc((size_t)n_hints, sizeof *d->hints))) ok = false;
    for (; ok && d->n_hints < n_hints; d->n_hints++)
        if (get_hint(r, &d->hints[d->n_hints])) ok = false; /* the loop still counts it, so it is freed */
    if (ok) d->conversation = wire_get_u64(r);
    if (ok) d->auto_splice = wire_get_u8(r);
    ok = ok && !r->failed;
    if (ok) return 0;
    cache_directives_free(d);
    return -1;
}
