/* test_paths.h — where the tests find the default model and the golden reference files. */
#ifndef BRAID_TEST_PATHS_H
#define BRAID_TEST_PATHS_H

/* $BRAID_TEST_MODEL if set, else the model configured at build time. */
const char *test_model_path(void);
/* Absolute path of a file under tests/golden; returns a static buffer. */
const char *test_golden_path(const char *name);
/* The committed LoRA adapter `role` (adapters/<role>.gguf; $BRAID_TEST_ADAPTER_DIR overrides
 * the folder); returns a static buffer. */
const char *test_adapter_path(const char *role);

/* The committed adapters, in the id order the LoRA tests use: planner = 1 ... summarizer = 4. */
#define TEST_ADAPTER_ROLES {"planner", "coder", "tester", "summarizer"}
#define TEST_N_ADAPTERS 4

#endif
