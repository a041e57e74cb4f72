/*
 * test_model_numa.c - ds4_model_options.numa (`--numa interleave`): after
 * the open the kernel reports the weights' mapping with the interleave
 * policy over the nodes with memory (/proc/self/numa_maps, read here
 * directly, not through the code under test), where a default open
 * reports "default"; the report function agrees with it; the logits are
 * the same bits either way; an unknown mode is refused by name. Where the
 * kernel has no NUMA support the test says so and skips.
 */
#include "include/ds4.h"
#include "tests/model_fixture.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL "build/tests/numa.gguf"

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
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.backend = DS4_BACKEND_CPU;
    p.n_threads = 2;
    p.n_ctx = 64;
    ds4_session *s = ds4_session_create(m, &p);
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    if (s && ds4_session_prefill(s, toks, 8, NULL) == DS4_OK && n_vocab > 0)
        memcpy(logits, ds4_session_logits(s), (size_t)n_vocab * sizeof(float));
    ds4_session_free(s);
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

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    if (!fixture_write_gguf("tests/data/dsv4-tiny-a", MODEL, 0)) {
        fprintf(stderr, "cannot write %s\n", MODEL);
        return 1;
    }
    RUN(test_interleave_is_the_kernels_policy);
    RUN(test_unknown_mode_refused);
    return test_finish();
}
