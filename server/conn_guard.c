/*
 * conn_guard.c - header deadline and connection count (see conn_guard.h).
 *
 * Every connection is registered when libmicrohttpd accepts it and removed
 * when it closes (its CLOSED notification comes before the socket is
 * closed, and both run under the guard's mutex here, so the reaper never
 * shuts down a descriptor that was closed and reused). The reaper wakes
 * four times a second and shuts down (SHUT_RDWR) the sockets of the
 * connections still without complete headers past the deadline; the
 * connection's own thread then sees end of input and closes it.
 */
#include "server/conn_guard.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

typedef struct entry {
    struct entry *prev, *next;
    struct MHD_Connection *c;
    int fd;
    double t0;
    bool headers_done, shut;
} entry;

struct conn_guard {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool stop;
    int header_timeout_s;
    entry *head;
    int open;
    unsigned long reaped;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *reaper(void *arg)
{
    conn_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        double now = now_s();
        for (entry *e = g->head; e; e = e->next) {
            if (e->headers_done || e->shut || now - e->t0 < g->header_timeout_s) continue;
            shutdown(e->fd, SHUT_RDWR);
            e->shut = true;
            g->reaped++;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

conn_guard *conn_guard_new(int header_timeout_s)
{
    conn_guard *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->header_timeout_s = header_timeout_s > 0 ? header_timeout_s : 1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->th, NULL, reaper, g) != 0) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        free(g);
        return NULL;
    }
    return g;
}

void conn_guard_free(conn_guard *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->th, NULL);
    while (g->head) {
        entry *e = g->head;
        g->head = e->next;
        free(e);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

void conn_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode toe)
{
    conn_guard *g = cls;
    pthread_mutex_lock(&g->mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        entry *e = calloc(1, sizeof *e);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (e && ci) {
            e->c = c;
            e->fd = ci->connect_fd;
            e->t0 = now_s();
            e->next = g->head;
            if (g->head) g->head->prev = e;
            g->head = e;
            *socket_context = e;
        } else {
            free(e);
        }
        g->open++;
    } else {
        entry *e = *socket_context;
        if (e) {
            if (e->prev) e->prev->next = e->next;
            else g->head = e->next;
            if (e->next) e->next->prev = e->prev;
            free(e);
            *socket_context = NULL;
        }
        g->open--;
    }
    pthread_mutex_unlock(&g->mu);
}

static void set_done(conn_guard *g, struct MHD_Connection *c, bool done)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    pthread_mutex_lock(&g->mu);
    entry *e = ci ? ci->socket_context : NULL;
    if (e) {
        e->headers_done = done;
        e->t0 = now_s();
    }
    pthread_mutex_unlock(&g->mu);
}

void conn_guard_headers_done(conn_guard *g, struct MHD_Connection *c) { set_done(g, c, true); }
void conn_guard_request_done(conn_guard *g, struct MHD_Connection *c) { set_done(g, c, false); }

int conn_guard_open(const conn_guard *g)
{
    conn_guard *m = (conn_guard *)g;
    pthread_mutex_lock(&m->mu);
    int n = m->open;
    pthread_mutex_unlock(&m->mu);
    return n;
}

unsigned long conn_guard_reaped(const conn_guard *g)
{
    conn_guard *m = (conn_guard *)g;
    pthread_mutex_lock(&m->mu);
    unsigned long n = m->reaped;
    pthread_mutex_unlock(&m->mu);
    return n;
}
