/* timeutil.h — monotonic wall-clock seconds for timing and statistics. Thread-safe. */
#ifndef BRAID_COMMON_TIMEUTIL_H
#define BRAID_COMMON_TIMEUTIL_H

double braid_now_seconds(void);

#endif
