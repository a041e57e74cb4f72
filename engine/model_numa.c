/*
 * model_numa.c - ds4_numa_interleave and ds4_numa_report (model_numa.h).
 * The two system calls are made directly (set_mempolicy(2), mbind(2)):
 * they are all that is needed, and the constants come with the kernel's
 * headers (linux/mempolicy.h).
 */
#include "engine/model_numa.h"

#include "util/error.h"

#include <errno.h>
#include <inttypes.h>
#include <linux/mempolicy.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NUMA_MAX_NODES 1024
#define MASK_WORDS (NUMA_MAX_NODES / (8 * sizeof(unsigned long)))

/* The nodes with memory (/sys/devices/system/node/has_memory, a list such
 * as "0-1,4") into mask; returns the highest node + 1, 0 if unreadable. */
static int nodes_with_memory(unsigned long *mask)
{
    memset(mask, 0, MASK_WORDS * sizeof *mask);
    FILE *f = fopen("/sys/devices/system/node/has_memory", "r");
    if (!f) return 0;
    char line[4096];
    int top = 0;
    if (fgets(line, sizeof line, f)) {
        for (char *p = line; *p && *p != '\n';) {
            char *end;
            long a = strtol(p, &end, 10), b = a;
            if (end == p) break;
            if (*end == '-') {
                p = end + 1;
                b = strtol(p, &end, 10);
                if (end == p) break;
            }
            for (long n = a; n <= b && n >= 0 && n < NUMA_MAX_NODES; n++) {
                mask[n / (8 * sizeof(unsigned long))] |= 1ul << (n % (8 * sizeof(unsigned long)));
                if (n + 1 > top) top = (int)n + 1;
            }
            p = *end == ',' ? end + 1 : end;
        }
    }
    fclose(f);
    return top;
}

ds4_status ds4_numa_interleave(const void *base, size_t size)
{
    unsigned long mask[MASK_WORDS];
    int top = nodes_with_memory(mask);
    if (!top)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "numa: this system lists no nodes with memory "
                                             "(/sys/devices/system/node/has_memory): no NUMA support");
    /* maxnode counts bits: one past the highest node the mask may name */
    unsigned long maxnode = (unsigned long)top + 1;
    if (syscall(SYS_set_mempolicy, MPOL_INTERLEAVE, mask, maxnode) != 0)
        return ds4_fail(errno == ENOSYS ? DS4_ERR_UNSUPPORTED : DS4_ERR_IO, "numa: set_mempolicy(interleave): %s",
                        strerror(errno));
    if (base && size) {
        long ps = sysconf(_SC_PAGESIZE);
        uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096, a = (uintptr_t)base & ~(page - 1);
        size_t len = size + ((uintptr_t)base - a);
        /* without MPOL_MF_STRICT a page that cannot move (another process
           maps it) stays where it is and is not an error */
        if (syscall(SYS_mbind, a, len, MPOL_INTERLEAVE, mask, maxnode, MPOL_MF_MOVE) != 0)
            return ds4_fail(DS4_ERR_IO, "numa: mbind(interleave) of the weights: %s", strerror(errno));
    }
    return DS4_OK;
}

int ds4_numa_report(const void *base, size_t size, char *buf, size_t len)
{
    FILE *f = fopen("/proc/self/numa_maps", "r");
    if (!f) return -1;
    const uintptr_t lo = (uintptr_t)base, hi = lo + size;
    long long pages[64] = {0}, total = 0;
    char policy[64] = "";
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        /* "start policy [file=...] [mapped=N] N0=a N1=b ... kernelpagesize_kB=k"; a
           mapping is listed by its start only: the weights' is the one starting in range */
        uintptr_t a;
        char pol[64];
        if (sscanf(line, "%" SCNxPTR " %63s", &a, pol) != 2 || a < lo || a >= hi) continue;
        if (!policy[0]) snprintf(policy, sizeof policy, "%s", pol);
        for (char *p = strstr(line, " N"); p; p = strstr(p + 1, " N")) {
            int node;
            long long n;
            if (sscanf(p, " N%d=%lld", &node, &n) == 2 && node >= 0 && node < 64) {
                pages[node] += n;
                total += n;
            }
        }
    }
    fclose(f);
    int listed = 0;
    size_t at = (size_t)snprintf(buf, len, "policy %s;", policy[0] ? policy : "?");
    for (int n = 0; n < 64; n++) {
        if (!pages[n]) continue;
        listed++;
        if (at < len)
            at += (size_t)snprintf(buf + at, len - at, " N%d %.1f%%", n, total ? 100.0 * (double)pages[n] / (double)total : 0);
    }
    if (!listed && at < len) snprintf(buf + at, len - at, " no pages in memory");
    return listed;
}
