/*
 * error.c - thread-local error message storage (see error.h).
 */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DS4_ERROR_MAX 1024

static _Thread_local char g_error[DS4_ERROR_MAX];

const char *ds4_last_error(void) { return g_error; }

void ds4_clear_error(void) { g_error[0] = '\0'; }

ds4_status ds4_fail(ds4_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    return st;
}

void ds4_error_prefix(const char *fmt, ...)
{
    char prefix[DS4_ERROR_MAX];
    char old[DS4_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t n = strlen(prefix);
    memcpy(old, g_error, sizeof old);
    if (n >= sizeof g_error) n = sizeof g_error - 1;
    memcpy(g_error, prefix, n);
    size_t rest = strnlen(old, sizeof old - 1);
    if (rest > sizeof g_error - 1 - n) rest = sizeof g_error - 1 - n;
    memcpy(g_error + n, old, rest);
    g_error[n + rest] = '\0';
}

const char *ds4_status_name(ds4_status st)
{
    switch (st) {
    case DS4_OK: return "ok";
    case DS4_ERR_IO: return "i/o error";
    case DS4_ERR_FORMAT: return "format error";
    case DS4_ERR_NOMEM: return "out of memory";
    case DS4_ERR_INVALID: return "invalid argument";
    case DS4_ERR_UNSUPPORTED: return "unsupported";
    case DS4_ERR_NOT_FOUND: return "not found";
    case DS4_ERR_BACKEND: return "backend error";
    }
    return "unknown error";
}
