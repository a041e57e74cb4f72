/*
 * cli_progress.c - the front ends' clock and prefill progress bar (see
 * cli_progress.h).
 */
#include "cli/cli_progress.h"

#include <stdio.h>
#include <time.h>

double ds4_cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void ds4_cli_draw_progress(size_t done, size_t total)
{
    int width = 30, fill = total ? (int)((double)done / total * width) : width;
    fprintf(stderr, "\rprefill [%.*s%*s] %3d%% %zu/%zu", fill, "##############################", width - fill, "",
            total ? (int)(100.0 * done / total) : 100, done, total);
    if (done >= total) fputs("\r\x1b[K", stderr);
    fflush(stderr);
}
