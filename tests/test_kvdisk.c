/*
 * test_kvdisk.c - the disk KV cache file format and policy, standalone with
 * fake payloads (engine/kv_disk.c).
 *
 * Values checked come from outside the code: the file name must be the SHA1
 * of the text as computed by OpenSSL's one-shot SHA1(), header fields are
 * read back byte by byte at the offsets the layout documents, and damaged
 * files are produced by truncating or flipping bytes on disk.
 */
#include <dirent.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kv_disk.h"
#include "include/ds4.h"
#include "tests/test.h"

static char g_dir[256];
static int g_logs;

static void count_log(void *ud, const char *msg)
{
    (void)ud;
    if (strstr(msg, "removing")) g_logs++;
}

static uint64_t g_max_payload; /* kv_disk_options.max_payload_bytes of fresh() */

static kv_disk *fresh(uint64_t space)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/ds4-test-kvdisk-%d-XXXXXX", (int)getpid());
    if (!mkdtemp(g_dir)) return NULL;
    kv_disk_options o = {.dir = g_dir, .space_bytes = space, .quant_bits = 4, .ctx_size = 4096,
                         .max_payload_bytes = g_max_payload, .log = count_log};
    g_logs = 0;
    return kv_disk_open(&o);
}

static void cleanup(kv_disk *d)
{
    DIR *dir = opendir(g_dir);
    struct dirent *de;
    while (dir && (de = readdir(dir))) {
        if (de->d_name[0] == '.') continue;
        char p[600];
        snprintf(p, sizeof p, "%s/%s", g_dir, de->d_name);
        unlink(p);
    }
    if (dir) closedir(dir);
    rmdir(g_dir);
    kv_disk_close(d);
}

static void openssl_sha1_hex(const char *s, size_t n, char out[41])
{
    unsigned char md[20];
    SHA1((const unsigned char *)s, n, md);
    for (int i = 0; i < 20; i++) sprintf(out + 2 * i, "%02x", md[i]);
}

static char *file_for(const char *text)
{
    char sha[41];
    openssl_sha1_hex(text, strlen(text), sha);
    static char p[600];
    snprintf(p, sizeof p, "%s/%s.kv", g_dir, sha);
    return p;
}

static void test_roundtrip_and_layout(void)
{
    kv_disk *d = fresh(0);
    REQUIRE(d);
    const char *text = "<bos>system<User>hello<Assistant>";
    unsigned char payload[1000];
    for (int i = 0; i < 1000; i++) payload[i] = (unsigned char)(i * 7);
    kv_disk_tool t = {"call_1", "\n\n<dsml block>", 6, 14};
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_COLD, text, strlen(text), 42, payload, sizeof payload, &t, 1) == DS4_OK);

    /* the file name is SHA1(text) and the header sits where documented */
    size_t len;
    unsigned char *f = test_read_file(file_for(text), &len);
    REQUIRE(f);
    EXPECT(!memcmp(f, "KVC", 3) && f[3] == 1);
    EXPECT(f[4] == 4);                 /* quant bits */
    EXPECT(f[5] == 1);                 /* reason: cold */
    EXPECT(f[6] == (KV_DISK_EXT_CHECKSUM | KV_DISK_EXT_TOOL_MAP));
    EXPECT(f[8] == 42 && f[9] == 0);   /* tokens, little endian */
    EXPECT(f[16] == 0x00 && f[17] == 0x10); /* ctx 4096 */
    EXPECT(f[40] == (1000 & 0xff) && f[41] == (1000 >> 8)); /* payload bytes */
    EXPECT(f[48] == strlen(text));
    EXPECT(!memcmp(f + 52, text, strlen(text)));
    EXPECT(!memcmp(f + 52 + strlen(text), payload, sizeof payload));
    EXPECT(!memcmp(f + 52 + strlen(text) + 1000, "KTM\x01", 4));
    EXPECT(len == 52 + strlen(text) + 1000 + 8 + 8 + 6 + 14 + 32);
    free(f);

    /* a longer prompt finds it; the payload and tool map come back */
    const char *prompt = "<bos>system<User>hello<Assistant>Hi!<eos><User>more";
    kv_disk_hit hit;
    REQUIRE(kv_disk_lookup(d, prompt, strlen(prompt), strlen(prompt), &hit) == DS4_OK);
    EXPECT(hit.text_len == strlen(text));
    EXPECT(hit.tokens == 42);
    EXPECT(hit.payload_len == 1000 && !memcmp(hit.payload, payload, 1000));
    EXPECT(hit.n_tools == 1 && !strcmp(hit.tools[0].id, "call_1") && !strcmp(hit.tools[0].dsml, "\n\n<dsml block>"));
    kv_disk_hit_free(&hit);

    /* a prompt that does not start with the text does not */
    EXPECT(kv_disk_lookup(d, "<bos>other", 10, 10, &hit) == DS4_ERR_NOT_FOUND);
    /* max_text bounds the match */
    EXPECT(kv_disk_lookup(d, prompt, strlen(prompt), strlen(text) - 1, &hit) == DS4_ERR_NOT_FOUND);
    cleanup(d);
}

static void test_longest_prefix_wins(void)
{
    kv_disk *d = fresh(0);
    REQUIRE(d);
    const char *a = "AAAA", *ab = "AAAABBBB", *abc = "AAAABBBBCCCC";
    char p1[10] = "one", p2[10] = "two", p3[10] = "three";
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_COLD, a, 4, 1, p1, 3, NULL, 0) == DS4_OK);
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_CONTINUED, ab, 8, 2, p2, 3, NULL, 0) == DS4_OK);
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_EVICT, abc, 12, 3, p3, 5, NULL, 0) == DS4_OK);
    kv_disk_hit hit;
    REQUIRE(kv_disk_lookup(d, "AAAABBBBCCC", 11, 11, &hit) == DS4_OK);
    EXPECT(hit.text_len == 8 && hit.tokens == 2 && !memcmp(hit.payload, "two", 3));
    kv_disk_hit_free(&hit);
    REQUIRE(kv_disk_lookup(d, "AAAABBBBCCCCD", 13, 13, &hit) == DS4_OK);
    EXPECT(hit.text_len == 12 && !memcmp(hit.payload, "three", 5));
    kv_disk_hit_free(&hit);
    size_t files;
    uint64_t bytes;
    kv_disk_stats(d, &files, &bytes);
    EXPECT(files == 3);
    cleanup(d);
}

static void corrupt_case(int how)
{
    kv_disk *d = fresh(0);
    REQUIRE(d);
    const char *text = "prefix-text";
    char payload[4096];
    memset(payload, 'p', sizeof payload);
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_SHUTDOWN, text, strlen(text), 9, payload, sizeof payload, NULL, 0) == DS4_OK);
    const char *path = file_for(text);
    struct stat st;
    REQUIRE(stat(path, &st) == 0);
    if (how == 0) {
        REQUIRE(truncate(path, st.st_size - 100) == 0);       /* torn write */
    } else if (how == 1) {
        FILE *f = fopen(path, "r+b");                        /* bit rot in the payload */
        REQUIRE(f);
        fseek(f, 52 + (long)strlen(text) + 2000, SEEK_SET);
        fputc('X', f);
        fclose(f);
    } else {
        FILE *f = fopen(path, "r+b");                        /* header claims a huge payload */
        REQUIRE(f);
        fseek(f, 40, SEEK_SET);
        unsigned char big[8] = {0, 0, 0, 0, 0, 0, 0, 0x7f};
        fwrite(big, 1, 8, f);
        fclose(f);
    }
    kv_disk_hit hit;
    EXPECT(kv_disk_lookup(d, "prefix-text and more", 20, 20, &hit) == DS4_ERR_NOT_FOUND);
    EXPECT_MSG(stat(path, &st) != 0, "damaged file (case %d) was not removed", how);
    EXPECT(g_logs == 1);
    cleanup(d);
}

static void test_truncated_file_removed(void) { corrupt_case(0); }
static void test_corrupt_payload_removed(void) { corrupt_case(1); }
static void test_bad_header_removed(void) { corrupt_case(2); }

static void test_eviction_under_budget(void)
{
    /* each file is ~ 52 + 2 + 10000 + 32 bytes; a 25000-byte budget keeps 2 */
    kv_disk *d = fresh(25000);
    REQUIRE(d);
    char payload[10000];
    memset(payload, 1, sizeof payload);
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_COLD, "t1", 2, 1, payload, sizeof payload, NULL, 0) == DS4_OK);
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_COLD, "t2", 2, 1, payload, sizeof payload, NULL, 0) == DS4_OK);
    /* a hit makes t1 more valuable than t2 */
    kv_disk_hit hit;
    REQUIRE(kv_disk_lookup(d, "t1xx", 4, 4, &hit) == DS4_OK);
    kv_disk_hit_free(&hit);
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_COLD, "t3", 2, 1, payload, sizeof payload, NULL, 0) == DS4_OK);
    size_t files;
    uint64_t bytes;
    kv_disk_stats(d, &files, &bytes);
    EXPECT(files == 2);
    EXPECT(bytes <= 25000);
    struct stat st;
    EXPECT_MSG(stat(file_for("t1"), &st) == 0, "the file with a hit was evicted");
    EXPECT_MSG(stat(file_for("t3"), &st) == 0, "the file just written was evicted");
    EXPECT_MSG(stat(file_for("t2"), &st) != 0, "the unused file survived");
    cleanup(d);
}

static void test_tmp_files_ignored(void)
{
    kv_disk *d = fresh(0);
    REQUIRE(d);
    char p[600];
    snprintf(p, sizeof p, "%s/tmp-1-000000000000.kv.part", g_dir);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fputs("KVC partial", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/not-a-cache-file.txt", g_dir);
    f = fopen(p, "w");
    fclose(f);
    kv_disk_hit hit;
    EXPECT(kv_disk_lookup(d, "anything", 8, 8, &hit) == DS4_ERR_NOT_FOUND);
    size_t files;
    uint64_t bytes;
    kv_disk_stats(d, &files, &bytes);
    EXPECT(files == 0);
    EXPECT(g_logs == 0);
    cleanup(d);
}

/* ---- issue 13 item 5: the directory is not trusted ----------------------- */

static int read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return (int)n;
}

/* A symlink planted under the name the next save writes must not make the
 * save write through it; one planted as a cache file is removed, not read. */
static void test_symlinks_not_followed(void)
{
    char victim_dir[64] = "/tmp/ds4-test-victim-XXXXXX", victim[128];
    REQUIRE(mkdtemp(victim_dir));
    snprintf(victim, sizeof victim, "%s/victim.txt", victim_dir);
    FILE *f = fopen(victim, "w");
    REQUIRE(f);
    fputs("precious", f);
    fclose(f);
    kv_disk *d = fresh(0);
    REQUIRE(d);
    const char *text = "planted-prefix";
    REQUIRE(symlink(victim, file_for(text)) == 0);
    char payload[64] = "payload";
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_COLD, text, strlen(text), 3, payload, sizeof payload, NULL, 0) == DS4_OK);
    char got[64];
    EXPECT(read_small(victim, got, sizeof got) == 8 && !strcmp(got, "precious"));
    struct stat st;
    EXPECT(lstat(file_for(text), &st) == 0 && S_ISREG(st.st_mode));
    /* a symlink to a valid cache file elsewhere: removed, its target kept */
    char elsewhere[128];
    snprintf(elsewhere, sizeof elsewhere, "%s/copy.kv", victim_dir);
    REQUIRE(rename(file_for(text), elsewhere) == 0);
    REQUIRE(symlink(elsewhere, file_for(text)) == 0);
    kv_disk_hit hit;
    EXPECT(kv_disk_lookup(d, "planted-prefix and more", 23, 23, &hit) == DS4_ERR_NOT_FOUND);
    EXPECT_MSG(lstat(file_for(text), &st) != 0, "the planted symlink is still there");
    EXPECT(stat(elsewhere, &st) == 0);
    unlink(elsewhere);
    unlink(victim);
    rmdir(victim_dir);
    cleanup(d);
}

/* A FIFO named like a cache file used to block the worker in open(). */
static void test_fifo_does_not_hang(void)
{
    kv_disk *d = fresh(0);
    REQUIRE(d);
    const char *text = "fifo-prefix";
    REQUIRE(mkfifo(file_for(text), 0600) == 0);
    alarm(10); /* a hang fails the test instead of the suite */
    kv_disk_hit hit;
    EXPECT(kv_disk_lookup(d, "fifo-prefix and more", 20, 20, &hit) == DS4_ERR_NOT_FOUND);
    alarm(0);
    struct stat st;
    EXPECT_MSG(lstat(file_for(text), &st) != 0, "the FIFO was not removed");
    cleanup(d);
}

/* A file whose header claims a 1 GiB payload (sparse on disk) is refused
 * from its header, before anything is allocated or read. */
static void test_oversized_file_refused_unread(void)
{
    g_max_payload = 1u << 20;
    kv_disk *d = fresh(0);
    g_max_payload = 0;
    REQUIRE(d);
    const char *text = "big-prefix";
    char payload[100];
    memset(payload, 'p', sizeof payload);
    REQUIRE(kv_disk_save(d, KV_DISK_REASON_COLD, text, strlen(text), 5, payload, sizeof payload, NULL, 0) == DS4_OK);
    const char *path = file_for(text);
    FILE *f = fopen(path, "r+b");
    REQUIRE(f);
    uint64_t big = 1ull << 30;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(big >> (8 * i));
    fseek(f, 40, SEEK_SET);
    fwrite(le, 1, 8, f);
    fclose(f);
    REQUIRE(truncate(path, (off_t)(52 + strlen(text) + big + 32)) == 0);
    kv_disk_hit hit;
    EXPECT(kv_disk_lookup(d, "big-prefix and more", 19, 19, &hit) == DS4_ERR_NOT_FOUND);
    struct stat st;
    EXPECT_MSG(stat(path, &st) != 0, "the oversized file was not removed");
    EXPECT(g_logs == 1);
    cleanup(d);
}

/* The directory: created 0700 whatever the umask; refused when others can
 * write it. */
static void test_directory_permissions(void)
{
    char base[64] = "/tmp/ds4-test-kvdir-XXXXXX", sub[128];
    REQUIRE(mkdtemp(base));
    snprintf(sub, sizeof sub, "%s/a/b", base);
    mode_t old = umask(0);
    kv_disk_options o = {.dir = sub, .quant_bits = 4, .ctx_size = 4096};
    kv_disk *d = kv_disk_open(&o);
    umask(old);
    REQUIRE(d);
    struct stat st;
    EXPECT(stat(sub, &st) == 0 && (st.st_mode & 0777) == 0700);
    kv_disk_close(d);
    REQUIRE(chmod(sub, 0777) == 0);
    d = kv_disk_open(&o);
    EXPECT_MSG(!d && strstr(ds4_last_error(), "writable"), "a world-writable directory was accepted: %s",
               d ? "(opened)" : ds4_last_error());
    kv_disk_close(d);
    REQUIRE(chmod(sub, 0770) == 0);
    d = kv_disk_open(&o);
    EXPECT_MSG(!d, "a group-writable directory was accepted");
    kv_disk_close(d);
    char p[160];
    rmdir(sub);
    snprintf(p, sizeof p, "%s/a", base);
    rmdir(p);
    rmdir(base);
}

/* Temp names come from a CSPRNG, not rand(): two processes seeded alike
 * (rand() was never seeded) no longer pick the same name. Observed through
 * the names a crashed writer would leave: both saves succeed even when the
 * name rand() would give is planted as a symlink. */
static void test_tmp_name_not_predictable(void)
{
    kv_disk *d = fresh(0);
    REQUIRE(d);
    char victim[300], p[600];
    snprintf(victim, sizeof victim, "%s-victim", g_dir);
    FILE *f = fopen(victim, "w");
    REQUIRE(f);
    fputs("precious", f);
    fclose(f);
    srand(1);
    unsigned char r[6];
    for (int i = 0; i < 6; i++) r[i] = (unsigned char)(rand() & 0xff);
    snprintf(p, sizeof p, "%s/tmp-%d-%02x%02x%02x%02x%02x%02x.kv.part", g_dir, (int)getpid(), r[0], r[1], r[2], r[3],
             r[4], r[5]);
    REQUIRE(symlink(victim, p) == 0);
    char payload[16] = "x";
    EXPECT(kv_disk_save(d, KV_DISK_REASON_COLD, "tmpname", 7, 1, payload, sizeof payload, NULL, 0) == DS4_OK);
    char got[64];
    EXPECT(read_small(victim, got, sizeof got) == 8 && !strcmp(got, "precious"));
    unlink(victim);
    cleanup(d);
}

static void test_sha1_matches_openssl(void)
{
    char a[41], b[41];
    kv_disk_sha1_hex("abc", 3, a);
    openssl_sha1_hex("abc", 3, b);
    b[40] = 0;
    EXPECT(!strcmp(a, b));
    EXPECT(!strcmp(a, "a9993e364706816aba3e25717850c26c9cd0d89d")); /* FIPS 180 test vector */
}

int main(void)
{
    RUN(test_sha1_matches_openssl);
    RUN(test_roundtrip_and_layout);
    RUN(test_longest_prefix_wins);
    RUN(test_truncated_file_removed);
    RUN(test_corrupt_payload_removed);
    RUN(test_bad_header_removed);
    RUN(test_eviction_under_budget);
    RUN(test_tmp_files_ignored);
    RUN(test_symlinks_not_followed);
    RUN(test_fifo_does_not_hang);
    RUN(test_oversized_file_refused_unread);
    RUN(test_directory_permissions);
    RUN(test_tmp_name_not_predictable);
    return test_finish();
}
