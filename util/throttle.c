/* throttle.c - duty-cycle sleeps of --power (util/throttle.h). */
#define _POSIX_C_SOURCE 200809L
#include "util/throttle.h"

#include <errno.h>
#include <time.h>

double ds4_throttle_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ds4_throttle_start(ds4_throttle *t) { t->mark = ds4_throttle_now(); }

static void sleep_for(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void ds4_throttle_point(ds4_throttle *t)
{
    if (t->percent <= 0 || t->percent >= 100) return;
    double now = ds4_throttle_now(), busy = now - t->mark;
    if (busy < 0) busy = 0;
    /* compute busy, sleep busy * (100 - N) / N: busy is N% of the period */
    double nap = busy * (double)(100 - t->percent) / (double)t->percent;
    t->busy_s += busy;
    t->sleeps++;
    t->slept_s += nap;
    if (t->sleep_fn) t->sleep_fn(nap, t->sleep_ctx);
    else sleep_for(nap);
    t->mark = ds4_throttle_now();
}
