/*
 * Runs the fuzz target without libFuzzer: every file of the given corpus directories, then N
 * seeded random mutations of them (bit flips, interesting bytes, truncation, duplicated chunks).
 * A crash or sanitizer report fails the test; otherwise it prints a summary line.
 *   fuzz_gguf_replay [--mutations N] [--seed S] DIR...
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    uint8_t *data;
    size_t size;
} Input;

static uint64_t rng = 1;
static uint64_t next_random(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int load_file(const char *path, Input *in) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    in->data = malloc(n > 0 ? (size_t)n : 1);
    in->size = n > 0 && fread(in->data, 1, (size_t)n, f) == (size_t)n ? (size_t)n : 0;
    fclose(f);
    return 0;
}

/* Runs one input from an exact-size heap copy so reads past its end are caught. */
static void run_one(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
}

static size_t mutate(const Input *seed, uint8_t *out, size_t cap) {
    size_t n = seed->size < cap ? seed->size : cap;
    memcpy(out, seed->data, n);
    static const uint8_t interesting[] = {0x00, 0xFF, 0x7F, 0x80, 0x01, 0x20, 0x40, 0x10};
    int edits = 1 + (int)(next_random() % 8);
    for (int e = 0; e < edits && n > 0; e++) {
        size_t at = next_random() % n;
        switch (next_random() % 5) {
        case 0: out[at] ^= (uint8_t)(1u << (next_random() % 8)); break;
        case 1: out[at] = interesting[next_random() % sizeof interesting]; break;
        case 2: n = at + 1; break; /* truncate */
        case 3: { /* duplicate a chunk over another place */
            size_t len = 1 + next_random() % 16, to = next_random() % n;
            for (size_t i = 0; i < len && at + i < n && to + i < n; i++) out[to + i] = out[at + i];
            break;
        }
        default: { /* overwrite a 64-bit field with a large value */
            uint64_t v = next_random() >> (next_random() % 64);
            for (size_t i = 0; i < 8 && at + i < n; i++) out[at + i] = (uint8_t)(v >> (8 * i));
        }
        }
    }
    return n;
}

int main(int argc, char **argv) {
    long mutations = 0;
    Input seeds[1024];
    int n_seeds = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mutations") == 0 && i + 1 < argc) { mutations = atol(argv[++i]); continue; }
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) { rng = strtoull(argv[++i], NULL, 10) | 1; continue; }
        DIR *d = opendir(argv[i]);
        if (!d) {
            fprintf(stderr, "fuzz_gguf_replay: cannot open directory %s\n", argv[i]);
            return 2;
        }
        struct dirent *e;
        while ((e = readdir(d)) && n_seeds < 1024) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (load_file(path, &seeds[n_seeds]) == 0) n_seeds++;
        }
        closedir(d);
    }
    if (n_seeds == 0) {
        fprintf(stderr, "fuzz_gguf_replay: no seed files\n");
        return 2;
    }
    for (int s = 0; s < n_seeds; s++) run_one(seeds[s].data, seeds[s].size);
    static uint8_t buf[1 << 20];
    for (long m = 0; m < mutations; m++) {
        const Input *seed = &seeds[next_random() % (uint64_t)n_seeds];
        run_one(buf, mutate(seed, buf, sizeof buf));
    }
    printf("fuzz_gguf_replay: %d seeds, %ld mutations, no crash\n", n_seeds, mutations);
    printf("%ld passed, 0 failed\n", (long)n_seeds + mutations);
    for (int s = 0; s < n_seeds; s++) free(seeds[s].data);
    return 0;
}
