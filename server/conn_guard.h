/*
 * conn_guard.h - connection limits that libmicrohttpd does not give
 * (docs/SERVER.md "Connection limits"):
 *   - a header deadline: a connection whose request headers are not complete
 *     within --header-timeout-s seconds of its accept is shut down, however
 *     slowly it keeps sending (an idle timeout alone lets a client that
 *     sends a byte now and then hold its thread forever);
 *   - a total: the number of open connections, so that past
 *     --max-connections the server answers at once 503 + Retry-After instead
 *     of leaving new clients hanging.
 * The per-client limit is libmicrohttpd's own (MHD_OPTION_PER_IP_CONNECTION_LIMIT).
 */
#ifndef DS4_SERVER_CONN_GUARD_H
#define DS4_SERVER_CONN_GUARD_H

#include <microhttpd.h>
#include <stdbool.h>

typedef struct conn_guard conn_guard;

/* Starts the reaper thread. NULL on out of memory. */
conn_guard *conn_guard_new(int header_timeout_s);
void conn_guard_free(conn_guard *g);

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls = the guard). */
void conn_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode toe);
/* The connection's request headers are complete (first request callback). */
void conn_guard_headers_done(conn_guard *g, struct MHD_Connection *c);
/* Its request is answered: on a kept-alive connection the next request's
 * headers get a deadline of their own. */
void conn_guard_request_done(conn_guard *g, struct MHD_Connection *c);
/* Connections open now. */
int conn_guard_open(const conn_guard *g);
/* Connections shut down by the header deadline since start. */
unsigned long conn_guard_reaped(const conn_guard *g);

#endif
