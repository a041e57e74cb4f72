/*
 * version.c - see the header. DS4_COMMIT comes from the Makefile (git
 * describe of the tree at build time, "unknown" outside a git checkout);
 * only this file is recompiled when it changes.
 */
#include "util/version.h"

#include <stdlib.h>
#include <string.h>

#ifndef DS4_COMMIT
#define DS4_COMMIT "unknown"
#endif

/* The CPU kernels are compiled for every level and picked at run time
 * (backend/cpu dispatch); CUDA only when the build found nvcc. */
#if defined(DS4_HAVE_CUDA) && DS4_HAVE_CUDA
#define DS4_BACKENDS "cpu[scalar avx2 avx512] cuda"
#else
#define DS4_BACKENDS "cpu[scalar avx2 avx512]"
#endif

const char *ds4_version_string(void)
{
    return DS4_VERSION " (commit " DS4_COMMIT ", backends: " DS4_BACKENDS ")";
}

bool ds4_version_requested(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (argv[i] && !strcmp(argv[i], "--version")) return true;
    return false;
}

void ds4_version_print(FILE *f, const char *name)
{
    fprintf(f, "%s %s\n", name, ds4_version_string());
}

/* Every program linked with this file answers --version before its main
 * runs (glibc passes argc/argv to ELF constructors; the Makefile links
 * version.o into every binary), so a new front end has the flag without
 * code of its own. The name is the program's file name. */
__attribute__((constructor)) static void version_flag(int argc, char **argv, char **envp)
{
    (void)envp;
    if (argc < 1 || !argv || !argv[0] || !ds4_version_requested(argc, argv)) return;
    const char *name = strrchr(argv[0], '/');
    ds4_version_print(stdout, name ? name + 1 : argv[0]);
    exit(0);
}
