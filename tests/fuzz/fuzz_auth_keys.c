/*
 * Fuzz target for the --api-keys file parser (src/coord/auth.c): the input is parsed as a key file
 * from a buffer of exactly its size (no terminator, so a read past the end is a sanitizer report).
 * An accepted file must hold at least one key, each with a non-empty tenant; a refused one must
 * say why. The input's first line also goes in as an Authorization header value. Any broken
 * promise calls abort(). Replayed over corpus_auth_keys/ plus mutations in every CI run.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coord/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input's first line (at most 300 bytes) as a NUL-terminated header value. */
static void authenticate_first_line(const AuthKeys *keys, const uint8_t *data, size_t size) {
    char header[301];
    size_t n = 0;
    while (n < size && n < sizeof header - 1 && data[n] != '\n' && data[n] != '\0') n++;
    memcpy(header, data, n);
    header[n] = '\0';
    const AuthKey *k = auth_keys_authenticate(keys, header);
    if (k && (!auth_key_tenant(k) || auth_key_tenant(k)[0] == '\0')) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    BraidError err;
    err.msg[0] = '\0';
    AuthKeys *keys = auth_keys_parse(text, size, "fuzz", &err);
    if (!keys && err.msg[0] == '\0') abort();
    if (keys) {
        if (auth_keys_count(keys) < 1) abort();
        authenticate_first_line(keys, data, size);
        /* "Bearer " + the first token: the first key when the file starts with one. */
        char header[7 + AUTH_MAX_KEY_BYTES + 1] = "Bearer ";
        size_t n = 0, at = 0;
        while (at < size && (data[at] == ' ' || data[at] == '\t')) at++;
        while (at + n < size && n < AUTH_MAX_KEY_BYTES && data[at + n] > ' ' && data[at + n] != '#') n++;
        memcpy(header + 7, data + at, n);
        header[7 + n] = '\0';
        (void)auth_keys_authenticate(keys, header);
    }
    auth_keys_free(keys);
    free(text);
    return 0;
}
