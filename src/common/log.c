#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>

/* The threshold is written once by main() before any thread starts, so a plain static is safe;
 * it is the one piece of process-wide configuration the logger needs. */
static BraidLogLevel log_threshold = BRAID_LOG_INFO;

void braid_log_set_level(BraidLogLevel level) { log_threshold = level; }

void braid_log(BraidLogLevel level, const char *component, const char *fmt, ...) {
    if (level < log_threshold) return;
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line keeps lines from different threads whole. */
    if (level >= BRAID_LOG_WARN)
        fprintf(stderr, "[%s] %s: %s\n", component, names[level], line);
    else
        fprintf(stderr, "[%s] %s\n", component, line);
}
