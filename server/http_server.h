/*
 * http_server.h - the HTTP/1.1 front of ds4-server, on libmicrohttpd.
 *
 * Routes, authentication, CORS, the body limit and the translation between
 * HTTP and jobs live here; everything model-related is the worker's. Each
 * connection has its own thread (MHD_USE_THREAD_PER_CONNECTION), so a
 * handler may block while its job waits in the queue or streams.
 */
#ifndef DS4_SERVER_HTTP_SERVER_H
#define DS4_SERVER_HTTP_SERVER_H

#include "server/server_config.h"
#include "server/worker.h"

typedef struct http_server http_server;

/* Starts listening; returns NULL with a message in err. The bound port is
 * reported by http_server_port (useful with --port 0). */
http_server *http_server_start(const server_config *cfg, worker *w, char *err, size_t err_size);
int http_server_port(http_server *s);
/* Stop accepting new connections (first step of shutdown). */
void http_server_quiesce(http_server *s);
void http_server_stop(http_server *s);

#endif
