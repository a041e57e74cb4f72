/*
 * test_model_warm.c - ds4_model_options.warm_weights (`--warm-weights`):
 * every page of the mapped file is in the process's page tables right
 * after the open (the kernel's count, /proc/self/smaps Rss), where a plain
 * open maps in only what loading read; the logits are the same bits; with
 * ssd streaming the option is refused by name. Also the other placement
 * of the weights at open: the huge-page count (the kernel's, on a region
 * of the test's own) and `--numa interleave` (ds4_model_options.numa):
 * the kernel reports the weights' mapping with the interleave policy
 * (/proc/self/numa_maps, read here directly) where a default open reports
 * "default", the report function agrees, the logits keep their bits, an
 * unknown mode is refused; skipped with a message on a kernel without
 * NUMA support.
 */
#include "include/ds4.h"
#include "engine/model_warm.h"
#include "tests/model_fixture.h"
#include "tests/test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#define MODEL "build/tests/warm.gguf"

/* Resident KiB of this process's mapping(s) of `path` (the kernel's
 * /proc/self/smaps Rss: pages in this process's page tables), -1 if none. */
static long mapped_rss_kb(const char *path)
{
    char rp[4096];
    if (!realpath(path, rp)) return -1;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[8192];
    long total = -1;
    int in = 0;
    while (fgets(line, sizeof line, f)) {
        if (strchr(line, '-') && strstr(line, " r") == strchr(line, ' ') ) {
            /* a mapping header: "start-end perms offset dev inode path" */
            size_t n = strlen(line);
            if (n && line[n - 1] == '\n') line[n - 1] = 0;
            const char *sp = strrchr(line, ' ');
            in = sp && strcmp(sp + 1, rp) == 0;
            continue;
        }
        long kb;
        if (in && sscanf(line, "Rss: %ld kB", &kb) == 1) total = (total < 0 ? 0 : total) + kb;
    }
    fclose(f);
    return total;
}

/* Right after the open: with warming every page of the file is mapped in
 * (Rss = the file); without it only what loading read. The first prefill
 * then computes the same logits either way. */
/* The logits after prefilling 8 tokens on the CPU; 0 on failure. */
static int prefill_logits(ds4_model *m, int threads, float *logits, int n_vocab)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.backend = DS4_BACKEND_CPU;
    p.n_threads = threads;
    p.n_ctx = 64;
    ds4_session *s = ds4_session_create(m, &p);
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int ok = s && ds4_session_prefill(s, toks, 8, NULL) == DS4_OK;
    if (ok) memcpy(logits, ds4_session_logits(s), (size_t)n_vocab * sizeof(float));
    ds4_session_free(s);
    return ok;
}

static long open_rss_and_logits(int warm, float *logits, int n_vocab)
{
    ds4_model_options o = {0};
    o.warm_weights = warm;
    ds4_model *m = ds4_model_open(MODEL, &o);
    if (!m) {
        fprintf(stderr, "open: %s\n", ds4_last_error());
        return -1;
    }
    long rss = mapped_rss_kb(MODEL);
    if (!prefill_logits(m, 1, logits, n_vocab)) rss = -1;
    ds4_model_close(m);
    return rss;
}

static void test_warm_maps_every_page(void)
{
    struct stat st;
    REQUIRE(stat(MODEL, &st) == 0);
    ds4_model *m = ds4_model_open(MODEL, NULL);
    REQUIRE(m);
    int nv = ds4_model_n_vocab(m);
    ds4_model_close(m);
    float *a = malloc(sizeof(float) * (size_t)nv), *b = malloc(sizeof(float) * (size_t)nv);
    REQUIRE(a && b);
    long cold = open_rss_and_logits(0, b, nv);
    long warm = open_rss_and_logits(1, a, nv);
    long file_kb = (long)(st.st_size / 1024);
    printf("    file %ld KiB; mapped in after the open: %ld KiB warm, %ld KiB cold\n", file_kb, warm, cold);
    EXPECT_MSG(warm >= file_kb, "warm: %ld KiB mapped of a %ld KiB file", warm, file_kb);
    EXPECT_MSG(cold >= 0 && cold < warm, "cold %ld KiB, warm %ld KiB", cold, warm);
    EXPECT_MSG(memcmp(a, b, sizeof(float) * (size_t)nv) == 0, "warming changed the logits");
    free(a);
    free(b);
}

/* ds4_model_warm touches every page: its count is the file's size in pages */
static void test_warm_counts_pages(void)
{
    int fd = open(MODEL, O_RDONLY);
    REQUIRE(fd >= 0);
    struct stat st;
    REQUIRE(fstat(fd, &st) == 0);
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(p != MAP_FAILED);
    long ps = sysconf(_SC_PAGESIZE);
    size_t want = ((size_t)st.st_size + (size_t)ps - 1) / (size_t)ps;
    for (int th = 1; th <= 3; th++) EXPECT(ds4_model_warm(p, (size_t)st.st_size, th) == want);
    EXPECT(ds4_model_warm(p, 1, 4) == 1);
    EXPECT(ds4_model_warm(NULL, 0, 2) == 0);
    munmap(p, (size_t)st.st_size);
}

/* The kernel's whole-process count of anonymous huge pages
 * (/proc/self/smaps_rollup AnonHugePages), in bytes; -1 if unreadable. */
static long long rollup_anon_huge(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* ds4_mapped_huge_bytes counts a range's huge pages as the kernel does:
 * on a 2 MiB-aligned anonymous region asked for huge pages and touched,
 * it equals the growth of the process-wide count (0 = 0 where the kernel
 * has transparent huge pages off); outside the region it counts none. */
static void test_huge_bytes_match_kernel(void)
{
    const size_t huge = 2u << 20, len = 4 * huge;
    uint8_t *raw = mmap(NULL, len + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(raw != MAP_FAILED);
    uint8_t *a = (uint8_t *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
    long long before = rollup_anon_huge();
    if (before < 0) {
        printf("    SKIP: /proc/self/smaps_rollup not readable (not Linux?)\n");
        munmap(raw, len + huge);
        return;
    }
    int adv = madvise(a, len, MADV_HUGEPAGE);
    memset(a, 1, len);
    long long after = rollup_anon_huge(), got = ds4_mapped_huge_bytes(a, len);
    printf("    madvise %d; process huge pages +%lld bytes; the region's count %lld\n", adv, after - before, got);
    EXPECT_MSG(got == after - before, "range %lld, kernel's growth %lld", got, after - before);
    EXPECT(got >= 0 && got <= (long long)len && got % (long long)huge == 0);
    EXPECT(ds4_mapped_huge_bytes(&before, sizeof before) == 0); /* the stack: no huge pages */
    munmap(raw, len + huge);
}

/* The kernel's policy word for this process's mapping of `path` (the
 * first numa_maps line naming the file), "" if none. */
static void kernel_policy(const char *path, char *out, size_t len)
{
    char rp[4096], line[8192], want[4200];
    out[0] = 0;
    if (!realpath(path, rp)) return;
    snprintf(want, sizeof want, " file=%s ", rp);
    FILE *f = fopen("/proc/self/numa_maps", "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, want)) continue;
        char pol[128];
        if (sscanf(line, "%*s %127s", pol) == 1) snprintf(out, len, "%s", pol);
        break;
    }
    fclose(f);
}

static ds4_model *open_numa(int numa, float *logits, int n_vocab, char *policy, size_t len, char *report, size_t rlen)
{
    ds4_model_options o = {0};
    o.numa = numa;
    ds4_model *m = ds4_model_open(MODEL, &o);
    if (!m) return NULL;
    kernel_policy(MODEL, policy, len);
    ds4_model_weight_numa(m, report, rlen);
    prefill_logits(m, 2, logits, n_vocab);
    return m;
}

static void test_interleave_is_the_kernels_policy(void)
{
    if (access("/proc/self/numa_maps", R_OK) != 0) {
        test_skip("this kernel has no NUMA support (/proc/self/numa_maps)");
        return;
    }
    ds4_model *m = ds4_model_open(MODEL, NULL);
    REQUIRE(m);
    int nv = ds4_model_n_vocab(m);
    ds4_model_close(m);
    float *a = calloc((size_t)nv, sizeof(float)), *b = calloc((size_t)nv, sizeof(float));
    REQUIRE(a && b);
    char pol_off[128], pol_on[128], rep_off[256], rep_on[256];
    m = open_numa(DS4_NUMA_OFF, a, nv, pol_off, sizeof pol_off, rep_off, sizeof rep_off);
    REQUIRE(m);
    ds4_model_close(m);
    m = open_numa(DS4_NUMA_INTERLEAVE, b, nv, pol_on, sizeof pol_on, rep_on, sizeof rep_on);
    EXPECT_MSG(m != NULL, "open with numa interleave: %s", ds4_last_error());
    if (!m) goto done;
    ds4_model_close(m);
    printf("    kernel: default open '%s', --numa interleave '%s'; report: '%s' / '%s'\n", pol_off, pol_on, rep_off,
           rep_on);
    EXPECT_MSG(!strcmp(pol_off, "default"), "default open: policy '%s'", pol_off);
    EXPECT_MSG(!strncmp(pol_on, "interleave:", 11), "interleave open: policy '%s'", pol_on);
    char want[160];
    snprintf(want, sizeof want, "policy %s;", pol_on);
    EXPECT_MSG(!strncmp(rep_on, want, strlen(want)), "report '%s', kernel '%s'", rep_on, pol_on);
    EXPECT_MSG(!memcmp(a, b, sizeof(float) * (size_t)nv), "interleaving changed the logits");
done:
    free(a);
    free(b);
}

static void test_unknown_mode_refused(void)
{
    ds4_model_options o = {0};
    o.numa = 7;
    EXPECT(ds4_model_open(MODEL, &o) == NULL);
    EXPECT_MSG(strstr(ds4_last_error(), "numa") != NULL, "%s", ds4_last_error());
}

static void test_not_with_streaming(void)
{
    ds4_model_options o = {0};
    o.warm_weights = 1;
    o.ssd_streaming = 1;
    EXPECT(ds4_model_open(MODEL, &o) == NULL);
    EXPECT_MSG(strstr(ds4_last_error(), "ssd streaming") != NULL, "%s", ds4_last_error());
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    if (!fixture_write_gguf("tests/data/dsv4-tiny-a", MODEL, 0)) {
        fprintf(stderr, "cannot write %s\n", MODEL);
        return 1;
    }
    RUN(test_warm_maps_every_page);
    RUN(test_warm_counts_pages);
    RUN(test_huge_bytes_match_kernel);
    RUN(test_interleave_is_the_kernels_policy);
    RUN(test_unknown_mode_refused);
    RUN(test_not_with_streaming);
    return test_finish();
}
