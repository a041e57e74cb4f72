/*
 * throttle.h - the duty cycle of `--power N` (1..100): after each stretch
 * of compute the caller sleeps (100 - N) / N times as long as the stretch
 * took, so the machine computes N% of the wall time (less heat and fan
 * noise, proportionally lower speed). Results are unchanged: only sleeps
 * are added between steps.
 */
#ifndef DS4_UTIL_THROTTLE_H
#define DS4_UTIL_THROTTLE_H

#include <stdint.h>

typedef struct ds4_throttle {
    int percent;     /* 1..100; 100: never sleeps */
    double mark;     /* monotonic seconds at the start of the current stretch */
    uint64_t sleeps; /* sleeps taken (counters: tests and --verbose) */
    double slept_s;  /* seconds asked to sleep */
    double busy_s;   /* seconds of compute measured */
    /* the sleep itself (NULL: nanosleep); a test may count instead */
    void (*sleep_fn)(double seconds, void *ctx);
    void *sleep_ctx;
} ds4_throttle;

/* Monotonic clock in seconds. */
double ds4_throttle_now(void);
/* A stretch of compute starts now (time before it is not compute). */
void ds4_throttle_start(ds4_throttle *t);
/* A stretch ended: sleep in proportion to it, then start the next. */
void ds4_throttle_point(ds4_throttle *t);

#endif
