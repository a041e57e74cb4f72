/*
 * bench_disk.c - the read bandwidth of the disk under a model file, the
 * roofline of expert streaming (docs/STREAMING.md): random reads of one
 * expert's size, several in flight, each range dropped from the page cache
 * before and after (what the streaming cache does), so the figure is the
 * disk's and not memory's.
 */
#include "bench/bench_disk.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int fd;
    uint64_t size, chunk, per_thread, seed;
    uint64_t done;
    int err;
} disk_job;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *disk_worker(void *arg)
{
    disk_job *j = arg;
    uint8_t *buf = malloc(j->chunk);
    if (!buf) {
        j->err = ENOMEM;
        return NULL;
    }
    uint64_t x = j->seed | 1;
    for (uint64_t r = 0; r < j->per_thread; r++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t off = (x % (j->size - j->chunk)) & ~(uint64_t)4095;
        posix_fadvise(j->fd, (off_t)off, (off_t)j->chunk, POSIX_FADV_DONTNEED);
        uint64_t got = 0;
        while (got < j->chunk) {
            ssize_t n = pread(j->fd, buf + got, j->chunk - got, (off_t)(off + got));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                j->err = n < 0 ? errno : EIO;
                free(buf);
                return NULL;
            }
            got += (uint64_t)n;
        }
        posix_fadvise(j->fd, (off_t)off, (off_t)j->chunk, POSIX_FADV_DONTNEED);
        j->done += got;
    }
    free(buf);
    return NULL;
}

double bench_disk_read_bw(const char *path, uint64_t chunk, uint64_t total, int threads)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size < 2 * chunk) {
        if (fd >= 0) close(fd);
        return -1;
    }
    if (threads < 1) threads = 1;
    disk_job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    uint64_t per = total / chunk / (uint64_t)threads;
    if (per < 1) per = 1;
    double t0 = now_s();
    int started = 0;
    for (int i = 0; jobs && th && i < threads; i++) {
        jobs[i] = (disk_job){fd, (uint64_t)st.st_size, chunk, per, 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1), 0, 0};
        if (pthread_create(&th[i], NULL, disk_worker, &jobs[i]) != 0) break;
        started++;
    }
    uint64_t bytes = 0;
    int err = started == threads ? 0 : 1;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        bytes += jobs[i].done;
        err |= jobs[i].err;
    }
    double dt = now_s() - t0;
    free(jobs);
    free(th);
    close(fd);
    return err || dt <= 0 ? -1 : (double)bytes / dt;
}
