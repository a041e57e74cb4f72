/*
 * version.h - what every DwarfStar binary prints for --version: the
 * release, the git commit it was built from and the backends compiled in,
 * so a bug report says exactly what ran. Every binary the Makefile links
 * gets the flag (a constructor in version.c, pulled in with -u); a main
 * may still call ds4_version_requested/print itself.
 */
#ifndef DS4_UTIL_VERSION_H
#define DS4_UTIL_VERSION_H

#include <stdbool.h>
#include <stdio.h>

#define DS4_VERSION "0.1.0"

/* "0.1.0 (commit 1a2b3c4, backends: cpu[scalar avx2 avx512] cuda)" */
const char *ds4_version_string(void);

/* True when argv holds --version (any position). */
bool ds4_version_requested(int argc, char **argv);

/* "NAME 0.1.0 (commit ..., backends: ...)\n" */
void ds4_version_print(FILE *f, const char *name);

#endif
