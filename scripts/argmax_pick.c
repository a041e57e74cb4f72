/*
 * argmax_pick.c - the greedy pick's cost: ds4_argmax over 129,280 logits
 * (Flash's vocabulary) against one compare chain through them (the form
 * it had before 2026-12-03), the same pick checked. Not part of `make`:
 *
 *   make build/engine/sampler.o build/util/error.o
 *   cc -std=c11 -D_GNU_SOURCE -O2 -I. scripts/argmax_pick.c build/engine/sampler.o \
 *       build/util/error.o -lm -o /tmp/argmax_pick && /tmp/argmax_pick
 */
#include "include/ds4_sampler.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int32_t one_chain(const float *l, int n)
{
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (best < 0 || l[i] > l[best]) best = i;
    return best;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void)
{
    enum { V = 129280, R = 400 };
    float *l = malloc(sizeof(float) * V);
    if (!l) return 1;
    uint64_t x = 1;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)(x >> 40) / (float)(1 << 24);
    }
    volatile int32_t sink = 0;
    const double t0 = now_s();
    for (int r = 0; r < R; r++) sink += ds4_argmax(l, V);
    const double t1 = now_s();
    for (int r = 0; r < R; r++) sink += one_chain(l, V);
    const double t2 = now_s();
    printf("ds4_argmax %.1f us, one compare chain %.1f us a pick (same pick: %s)\n", (t1 - t0) / R * 1e6,
           (t2 - t1) / R * 1e6, ds4_argmax(l, V) == one_chain(l, V) ? "yes" : "NO");
    free(l);
    return 0;
}
