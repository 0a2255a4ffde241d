/*
 * directive_wire.h — a request's cache directives (cache/cache_directive.h) on the wire, inside
 * MSG_SUBMIT: u8 splice mode, i32 first edit, the context's token ids, i32 n runs x (dst, src,
 * len, index), i32 n hints x (u8 op, i32 index, start, end, f32 ttl, u8 share_all, i32 n, n strings),
 * u64 conversation scope, u8 auto_splice (the server planned the splice).
 * Decoding checks the counts against CACHE_DIRECTIVE_MAX / CACHE_SHARE_MAX_TENANTS and the ops.
 */
#ifndef BRAID_TRANSPORT_DIRECTIVE_WIRE_H
#define BRAID_TRANSPORT_DIRECTIVE_WIRE_H

#include "cache/cache_directive.h"
#include "transport/wire.h"

void wire_put_directives(WireBuf *b, const CacheDirectives *d);
/* 0, or -1 (d left empty) when the reader fails or a count or op is out of range. */
int wire_get_directives(WireReader *r, CacheDirectives *d);

#endif
