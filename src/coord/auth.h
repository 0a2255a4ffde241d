/*
 * auth.h — API keys: which tenant a bearer key speaks for, which adapters it may name and which
 * other tenants' cache namespaces it may share (`braid serve --api-keys FILE`).
 *
 * The file holds one key per line, fields separated by blanks:
 *
 *     # comment lines and blank lines are skipped
 *     KEY tenant=NAME [adapters=A,B,...|*] [shares=NS,NS,...] [segment_reuse=off|exact|approx]
 *         [auto_splice=amortize|forget|off]
 *         [weight=W] [max_concurrent=N] [rate=R] [admin]
 *
 * KEY is 16 to AUTH_MAX_KEY_BYTES characters of RFC 6750's b64token alphabet (A-Z a-z 0-9 - . _ ~
 * + / and trailing =), what `Authorization: Bearer KEY` carries. tenant= is required: every request
 * made with the key runs in that tenant's cache namespace. adapters= lists the adapters a request
 * may name (`*`: any); without it the key may name none. shares= lists other tenant names whose
 * namespace a request may ask for explicitly (a shared `public` prefix pool, say). segment_reuse=
 * is the tenant's segment-reuse opt-in (auth_key_segment_reuse). weight= is the key's tenant's share
 * in the instances' fair scheduling (default 1; the first key of a tenant decides); max_concurrent=
 * and rate= (requests per second) limit the key's own requests: past them the key gets 429 with
 * Retry-After (key_limiter.h), never another key. The bare word admin lets the key load and unload
 * LoRA adapters at run time (POST /v1/load_lora_adapter, /v1/unload_lora_adapter). A malformed line
 * is an error naming the file and line, never quoting the key.
 *
 * Lookup compares the presented key with every configured key, each over AUTH_MAX_KEY_BYTES bytes,
 * with no early exit: the time taken depends on the number of keys, not on how much of a guess was
 * right. Keys are never logged or put into error messages.
 *
 * Callers: braid serve loads the file on rank 0 (auth_keys_load); the HTTP threads look keys up
 * (auth_keys_authenticate) and check what a request asks for against its key.
 * Thread-safety: read-only after loading, so any thread may call the lookup functions at once.
 * Memory: AuthKeys owns everything; the AuthKey pointers it returns live as long as it does.
 */
#ifndef BRAID_COORD_AUTH_H
#define BRAID_COORD_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

#define AUTH_MIN_KEY_BYTES 16
#define AUTH_MAX_KEY_BYTES 128

typedef struct AuthKeys AuthKeys; /* the whole key file */
typedef struct AuthKey AuthKey;   /* one line of it */

/* Reads and parses an --api-keys file. NULL with err ("api-keys FILE line N: ...") when the file
 * cannot be read, a line is malformed, a key repeats, or the file holds no key at all. */
AuthKeys *auth_keys_load(const char *path, BraidError *err);
/* The same from text in memory; `source` names it in error messages. */
AuthKeys *auth_keys_parse(const char *text, size_t len, const char *source, BraidError *err);
void auth_keys_free(AuthKeys *keys);
int auth_keys_count(const AuthKeys *keys);

/* The key an Authorization header value ("Bearer KEY"; the scheme is case-insensitive) presents,
 * or NULL when the header is missing (NULL), not a bearer credential, or no key matches. */
const AuthKey *auth_keys_authenticate(const AuthKeys *keys, const char *authorization);
/* The key a bare key value presents (an x-api-key header, as Anthropic's clients send it; blanks
 * around it ignored), compared as auth_keys_authenticate compares; NULL when none matches. */
const AuthKey *auth_keys_lookup(const AuthKeys *keys, const char *key);

const char *auth_key_tenant(const AuthKey *key);
/* Whether a request made with `key` may run in tenant's namespace: its own, or one it shares. */
bool auth_key_allows_tenant(const AuthKey *key, const char *tenant);
/* The key's position in the file (0-based; a stable index for per-key state), max_concurrent= (0:
 * no limit), rate= in requests per second (0: no limit) and weight= (1 when not given). */
int auth_key_index(const AuthKey *key);
int auth_key_max_concurrent(const AuthKey *key);
double auth_key_rate(const AuthKey *key);
double auth_key_weight(const AuthKey *key);
/* The weight= of the first key whose tenant is `tenant`; 1 when none (or keys NULL). */
double auth_keys_tenant_weight(const AuthKeys *keys, const char *tenant);
/* Whether some key's requests may run in tenant's namespace (its own tenant or one it shares);
 * false for NULL. A warm start refuses manifest lines of any other tenant. */
bool auth_keys_knows_tenant(const AuthKeys *keys, const char *tenant);
/* Whether the key's line says admin (adapters at run time); false for NULL. */
bool auth_key_admin(const AuthKey *key);
/* Whether a request made with `key` may name this adapter. */
bool auth_key_allows_adapter(const AuthKey *key, const char *adapter);
/* The key's segment_reuse= (0 off, 1 exact, 2 approx: kv_cache.h SegmentReuseMode), -1 when the
 * line has none. It is the tenant's opt-in: its requests without "segment_reuse" get it (as far as
 * the server allows), and none may ask for more. */
int auth_key_segment_reuse(const AuthKey *key);
/* The key's auto_splice= (a CacheSpliceMode: 0 off, 1 amortize, 2 forget), -1 when the line has
 * none: the default of its requests without "auto_splice" (coord/auto_splice.h). */
int auth_key_auto_splice(const AuthKey *key);

#endif
