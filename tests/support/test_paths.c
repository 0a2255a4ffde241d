#include "test_paths.h"

#include <stdio.h>
#include <stdlib.h>

const char *test_model_path(void) {
    const char *env = getenv("BRAID_TEST_MODEL");
    return env && *env ? env : BRAID_TEST_MODEL_PATH;
}

const char *test_golden_path(const char *name) {
    static char path[4096];
    const char *env = getenv("BRAID_TEST_GOLDEN_DIR"); /* set when the tree moved (GPU machine runs) */
    snprintf(path, sizeof path, "%s/%s", env && *env ? env : BRAID_TEST_GOLDEN_DIR, name);
    return path;
}

const char *test_adapter_path(const char *role) {
    static char path[4096];
    const char *env = getenv("BRAID_TEST_ADAPTER_DIR");
    snprintf(path, sizeof path, "%s/%s.gguf", env && *env ? env : BRAID_TEST_ADAPTER_DIR, role);
    return path;
}
