/*
 * log.h — leveled logging to stderr with a component tag: "[gguf] loaded 272 tensors".
 *
 * Contract: stdout is reserved for program output (completions, token ids); all diagnostics go to
 * stderr through these functions. The level threshold is process-wide configuration set once by
 * main() before threads start (braid_log_set_level); reading it afterwards is thread-safe.
 */
#ifndef BRAID_COMMON_LOG_H
#define BRAID_COMMON_LOG_H

typedef enum { BRAID_LOG_DEBUG = 0, BRAID_LOG_INFO = 1, BRAID_LOG_WARN = 2, BRAID_LOG_ERROR = 3 } BraidLogLevel;

void braid_log_set_level(BraidLogLevel level);
void braid_log(BraidLogLevel level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG_DEBUG(comp, ...) braid_log(BRAID_LOG_DEBUG, comp, __VA_ARGS__)
#define LOG_INFO(comp, ...) braid_log(BRAID_LOG_INFO, comp, __VA_ARGS__)
#define LOG_WARN(comp, ...) braid_log(BRAID_LOG_WARN, comp, __VA_ARGS__)
#define LOG_ERROR(comp, ...) braid_log(BRAID_LOG_ERROR, comp, __VA_ARGS__)

#endif
