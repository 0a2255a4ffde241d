/* sleep_util.h — sleeping for a fractional number of seconds, resumed after signals. Any thread. */
#ifndef BRAID_BENCH_DRIVER_SLEEP_UTIL_H
#define BRAID_BENCH_DRIVER_SLEEP_UTIL_H

/* Returns after s seconds (at once for s <= 0). */
void sleep_seconds(double s);

#endif
