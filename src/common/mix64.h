/*
 * mix64.h — splitmix64's finaliser: a bijection on 64-bit values that spreads every input bit over
 * the output. mix64(i) for i = 0, 1, ... gives distinct, well-mixed stand-ins for content hashes
 * (tests and benchmarks of hash-keyed structures). Pure; thread-safe.
 */
#ifndef BRAID_COMMON_MIX64_H
#define BRAID_COMMON_MIX64_H

#include <stdint.h>

/* The finaliser alone (mix64_finalize(0) = 0): for mixing values that are already spread. */
static inline uint64_t mix64_finalize(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t mix64(uint64_t x) { return mix64_finalize(x + 0x9E3779B97F4A7C15ull); }

#endif
