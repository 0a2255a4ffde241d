/* Fractional sleeps; the contract is in sleep_util.h. */
#include "sleep_util.h"

#include <errno.h>
#include <time.h>

void sleep_seconds(double s) {
    if (!(s > 0)) return;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
