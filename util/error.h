/*
 * error.h - setting the per-thread error message behind ds4_last_error().
 *
 * Library code reports a failure with `return ds4_fail(DS4_ERR_FORMAT,
 * "gguf: %s: key length %llu past end of file at offset %llu", ...)`:
 * it formats the message into a thread-local buffer and returns the code,
 * so the caller can propagate it unchanged.
 */
#ifndef DS4_UTIL_ERROR_H
#define DS4_UTIL_ERROR_H

#include "include/ds4.h"

#if defined(__GNUC__)
#define DS4_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DS4_PRINTF(a, b)
#endif

/* Record a message for the current thread and return `st`. */
ds4_status ds4_fail(ds4_status st, const char *fmt, ...) DS4_PRINTF(2, 3);

/* Prepend context ("loading model: ") to the current message. */
void ds4_error_prefix(const char *fmt, ...) DS4_PRINTF(1, 2);

/* Forget the current message. */
void ds4_clear_error(void);

#endif
