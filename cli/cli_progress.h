/*
 * cli_progress.h - the clock and the prefill progress bar of the
 * interactive front ends: `ds4` and ds4-agent draw the same bar, and time
 * their prefill, generation and quality runs with the same clock.
 */
#ifndef DS4_CLI_PROGRESS_H
#define DS4_CLI_PROGRESS_H

#include <stddef.h>

/* Seconds on the monotonic clock: differences only (elapsed times, speeds). */
double ds4_cli_now_s(void);

/* "prefill [#####     ]  50% 512/1024" over itself on stderr; erased once
 * done reaches total, so the answer starts on a clean line. */
void ds4_cli_draw_progress(size_t done, size_t total);

#endif
