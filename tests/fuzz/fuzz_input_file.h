/*
 * fuzz_input_file.h — hands a fuzz input to a loader that only takes a path.
 *
 * The bytes go into an anonymous in-memory file (memfd_create) and the loader reads it back
 * through /proc/self/fd/N, so no fuzz iteration touches the disk. Header-only: each fuzz target
 * is one translation unit plus replay_main.c.
 */
#ifndef BRAID_TESTS_FUZZ_INPUT_FILE_H
#define BRAID_TESTS_FUZZ_INPUT_FILE_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data into a new memfd; path gets its /proc name. Returns the fd (close it when done); a
 * failure here is the harness's, not the target's, so it aborts loudly. */
static int fuzz_input_file(const uint8_t *data, size_t size, char *path, size_t cap) {
    int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd < 0) {
        perror("memfd_create");
        abort();
    }
    for (size_t off = 0; off < size;) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0) {
            perror("write to memfd");
            abort();
        }
        off += (size_t)n;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
