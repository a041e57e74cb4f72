/*
 * agent_fileio.c - file helpers (see agent_fileio.h).
 */
#include "agent/agent_fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *agent_read_whole(const char *path, size_t max, size_t *len, char *err, size_t es)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, es, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, es, "%s is not a regular file", path);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size > max) {
        snprintf(err, es, "%s has %lld bytes, more than the %zu this reads", path, (long long)st.st_size, max);
        close(fd);
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        snprintf(err, es, "out of memory");
        close(fd);
        return NULL;
    }
    for (;;) {
        ssize_t k = read(fd, buf + n, cap - 1 - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            snprintf(err, es, "cannot read %s: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (k == 0) break;
        n += (size_t)k;
        if (n == cap - 1) break; /* the file grew: read what stat said */
    }
    close(fd);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static bool write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

bool agent_write_atomic(const char *path, const char *data, size_t len, char *err, size_t es)
{
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 32), *dir = strdup(path);
    if (!tmp || !dir) {
        free(tmp);
        free(dir);
        snprintf(err, es, "out of memory");
        return false;
    }
    snprintf(tmp, pl + 32, "%s.tmp.%ld", path, (long)getpid());
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = '\0';
    else if (slash) *slash = '\0';
    else strcpy(dir, ".");
    bool ok = false;
    /* keep the mode of a file being replaced */
    struct stat st;
    mode_t mode = stat(path, &st) == 0 ? (st.st_mode & 07777) : 0644;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0) {
        snprintf(err, es, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (!write_all(fd, data, len) || fsync(fd) != 0) {
        snprintf(err, es, "cannot write %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    fchmod(fd, mode);
    close(fd);
    if (rename(tmp, path) != 0) {
        snprintf(err, es, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    ok = true;
out:
    free(tmp);
    free(dir);
    return ok;
}

bool agent_mkdirs(const char *dir, char *err, size_t es)
{
    char *tmp = strdup(dir);
    if (!tmp) {
        snprintf(err, es, "out of memory");
        return false;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
            snprintf(err, es, "cannot create %s: %s", tmp, strerror(errno));
            free(tmp);
            return false;
        }
        *p = '/';
    }
    bool ok = mkdir(tmp, 0700) == 0 || errno == EEXIST;
    if (!ok) snprintf(err, es, "cannot create %s: %s", tmp, strerror(errno));
    free(tmp);
    return ok;
}
