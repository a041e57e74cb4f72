/*
 * trace.c - the --trace file (see trace.h). One mutex; records are written
 * whole and flushed so a crash leaves a readable file.
 */
#include "server/trace.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/time.h>
#include <unistd.h>

static FILE *g_trace;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

int trace_open(const char *path)
{
    if (!path) return 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0) return -1;
    g_trace = fdopen(fd, "a");
    if (!g_trace) { close(fd); return -1; }
    return 0;
}

void trace_close(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_trace) fclose(g_trace);
    g_trace = NULL;
    pthread_mutex_unlock(&g_mu);
}

bool trace_on(void) { return g_trace != NULL; }

static void stamp(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    fprintf(g_trace, "== %ld.%03ld ", (long)tv.tv_sec, (long)(tv.tv_usec / 1000));
}

void trace_text(const char *what, const char *text, size_t len)
{
    if (!g_trace) return;
    pthread_mutex_lock(&g_mu);
    if (g_trace) {
        stamp();
        fprintf(g_trace, "%s (%zu bytes)\n", what, len);
        for (size_t i = 0; i < len; i++) {
            unsigned char c = (unsigned char)text[i];
            if (c < 0x20 && c != '\n' && c != '\t') fprintf(g_trace, "\\x%02x", c);
            else fputc(c, g_trace);
        }
        fputc('\n', g_trace);
        fflush(g_trace);
    }
    pthread_mutex_unlock(&g_mu);
}

void trace_printf(const char *fmt, ...)
{
    if (!g_trace) return;
    pthread_mutex_lock(&g_mu);
    if (g_trace) {
        stamp();
        va_list ap;
        va_start(ap, fmt);
        vfprintf(g_trace, fmt, ap);
        va_end(ap);
        fputc('\n', g_trace);
        fflush(g_trace);
    }
    pthread_mutex_unlock(&g_mu);
}
