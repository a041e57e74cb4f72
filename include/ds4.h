/*
 * ds4.h - the one public API of DwarfStar (libds4.a).
 *
 * Every front end (cli/, server/, tools/) includes only this header. The
 * layers below (engine/, model/, backend/, gguf/, quant/, text/, util/) are
 * private: their headers are not part of the API.
 *
 * Errors are values: functions return a ds4_status (or NULL) and leave a
 * human-readable message, naming the cause and the offending value, that
 * ds4_last_error() returns (per thread).
 */
#ifndef DS4_H
#define DS4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DS4_OK = 0,
    DS4_ERR_IO,          /* open/read/write/mmap failed */
    DS4_ERR_FORMAT,      /* malformed input file or data */
    DS4_ERR_NOMEM,       /* allocation failed */
    DS4_ERR_INVALID,     /* bad argument or configuration */
    DS4_ERR_UNSUPPORTED, /* valid but not handled (type, version, ...) */
    DS4_ERR_NOT_FOUND,   /* missing key, tensor, file */
    DS4_ERR_BACKEND,     /* device / backend failure */
} ds4_status;

/* Message of the last error set on this thread ("" when none). */
const char *ds4_last_error(void);

/* Short name of a status code ("format error", ...). */
const char *ds4_status_name(ds4_status st);

#ifdef __cplusplus
}
#endif

#endif /* DS4_H */
