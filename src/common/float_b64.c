#include "common/float_b64.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *float_b64_encode(const float *v, int n) {
    size_t bytes = (size_t)(n > 0 ? n : 0) * 4;
    unsigned char *raw = malloc(bytes ? bytes : 1);
    char *out = malloc((bytes + 2) / 3 * 4 + 1);
    if (!raw || !out) {
        free(raw);
        free(out);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int b = 0; b < 4; b++) raw[(size_t)i * 4 + b] = (unsigned char)(u >> (8 * b));
    }
    size_t o = 0;
    for (size_t i = 0; i < bytes; i += 3) {
        uint32_t w = (uint32_t)raw[i] << 16 | (i + 1 < bytes ? (uint32_t)raw[i + 1] << 8 : 0) | (i + 2 < bytes ? raw[i + 2] : 0);
        out[o++] = ALPHABET[w >> 18 & 63];
        out[o++] = ALPHABET[w >> 12 & 63];
        out[o++] = i + 1 < bytes ? ALPHABET[w >> 6 & 63] : '=';
        out[o++] = i + 2 < bytes ? ALPHABET[w & 63] : '=';
    }
    out[o] = '\0';
    free(raw);
    return out;
}

static int sextet(char c) {
    const char *p = c ? strchr(ALPHABET, c) : NULL;
    return p ? (int)(p - ALPHABET) : -1;
}

float *float_b64_decode(const char *text, int max_n, int *n) {
    *n = 0;
    size_t len = strlen(text);
    if (len % 4) return NULL;
    size_t pad = len && text[len - 1] == '=' ? (len > 1 && text[len - 2] == '=' ? 2 : 1) : 0;
    size_t bytes = len / 4 * 3 - pad;
    if (bytes % 4 || bytes / 4 > (size_t)max_n) return NULL;
    unsigned char *raw = malloc(bytes ? bytes : 1);
    float *v = malloc(bytes ? bytes : 1);
    if (!raw || !v) goto bad;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int s[4];
        for (int j = 0; j < 4; j++) {
            s[j] = text[i + j] == '=' && i + 4 == len && j >= 4 - (int)pad ? 0 : sextet(text[i + j]);
            if (s[j] < 0) goto bad;
        }
        uint32_t w = (uint32_t)s[0] << 18 | (uint32_t)s[1] << 12 | (uint32_t)s[2] << 6 | (uint32_t)s[3];
        for (int j = 0; j < 3 && o < bytes; j++) raw[o++] = (unsigned char)(w >> (16 - 8 * j));
    }
    for (size_t i = 0; i < bytes / 4; i++) {
        uint32_t u = (uint32_t)raw[i * 4] | (uint32_t)raw[i * 4 + 1] << 8 | (uint32_t)raw[i * 4 + 2] << 16 | (uint32_t)raw[i * 4 + 3] << 24;
        memcpy(&v[i], &u, 4);
        if (!isfinite(v[i])) goto bad;
    }
    free(raw);
    *n = (int)(bytes / 4);
    return v;
bad:
    free(raw);
    free(v);
    return NULL;
}
