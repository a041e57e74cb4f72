/*
 * kv_disk.c - the disk KV cache files (layout and policy in kv_disk.h).
 *
 * The directory is the index: every lookup lists it and reads only the
 * 52-byte head of each file (header + text length) to decide whether the
 * file could be a prefix of the prompt; only then is the prompt prefix
 * hashed and compared with the name, and only the winner is read whole and
 * verified. That keeps the cache correct when files are deleted or copied in
 * by hand, at the price of a directory scan per request (cheap next to a
 * prefill).
 */
#include "engine/kv_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"

#define HALF_LIFE_S (6.0 * 3600.0)
#define MAX_TEXT_BYTES (1ull << 32)

/* The directory is not trusted beyond its permissions: it is opened once
 * (dfd) and every file is reached relative to it without following
 * symbolic links, only regular files are read, sizes are bounded before
 * anything is allocated, and temp files get unpredictable O_EXCL names. */
struct kv_disk {
    char *dir;
    int dfd;
    kv_disk_options o;
};

#define OPEN_FLAGS (O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) /* no symlinks; a FIFO never blocks */

typedef struct {
    char sha[41];
    uint8_t quant_bits, reason, ext;
    uint32_t tokens, hits;
    uint64_t created, last_used, payload_bytes, text_bytes, file_size;
} head;

static void logf_(kv_disk *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(kv_disk *d, const char *fmt, ...)
{
    if (!d->o.log) return;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    d->o.log(d->o.log_ud, msg);
}

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }

void kv_disk_sha1_hex(const void *p, size_t n, char out[41])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int ml = 0;
    EVP_Digest(p, n, md, &ml, EVP_sha1(), NULL);
    for (unsigned i = 0; i < 20; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    out[40] = 0;
}

static char *path_for(kv_disk *d, const char *sha, const char *suffix)
{
    size_t n = strlen(d->dir) + 64;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s%s", d->dir, sha, suffix);
    return p;
}

static bool sha_name(const char *name, char sha[41])
{
    if (strlen(name) != 43 || strcmp(name + 40, ".kv")) return false;
    for (int i = 0; i < 40; i++) {
        char c = name[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
        sha[i] = c;
    }
    sha[40] = 0;
    return true;
}

kv_disk *kv_disk_open(const kv_disk_options *o)
{
    if (!o || !o->dir || !*o->dir) {
        ds4_fail(DS4_ERR_INVALID, "kv_disk: no directory given");
        return NULL;
    }
    /* mkdir -p */
    char *tmp = strdup(o->dir);
    if (!tmp) { ds4_fail(DS4_ERR_NOMEM, "kv_disk: out of memory"); return NULL; }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST) break;
        *p = '/';
    }
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
        ds4_fail(DS4_ERR_IO, "kv_disk: cannot create %s: %s", o->dir, strerror(errno));
        free(tmp);
        return NULL;
    }
    free(tmp);
    int dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (dfd < 0 || fstat(dfd, &st) != 0) {
        ds4_fail(DS4_ERR_IO, "kv_disk: cannot open %s: %s", o->dir, strerror(errno));
        if (dfd >= 0) close(dfd);
        return NULL;
    }
    /* Whoever can write the directory can plant states that steer the
     * model's output: only its owner may. */
    if (st.st_uid != geteuid()) {
        ds4_fail(DS4_ERR_INVALID, "kv_disk: %s belongs to uid %u, not to this user (%u); refusing it", o->dir,
                 (unsigned)st.st_uid, (unsigned)geteuid());
        close(dfd);
        return NULL;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        ds4_fail(DS4_ERR_INVALID, "kv_disk: %s is writable by %s (mode %03o); refusing it (chmod 700 %s)", o->dir,
                 st.st_mode & S_IWOTH ? "everyone" : "its group", (unsigned)(st.st_mode & 0777), o->dir);
        close(dfd);
        return NULL;
    }
    kv_disk *d = calloc(1, sizeof *d);
    if (!d || !(d->dir = strdup(o->dir))) {
        free(d);
        close(dfd);
        ds4_fail(DS4_ERR_NOMEM, "kv_disk: out of memory");
        return NULL;
    }
    d->dfd = dfd;
    d->o = *o;
    d->o.dir = d->dir;
    return d;
}

void kv_disk_close(kv_disk *d)
{
    if (!d) return;
    close(d->dfd);
    free(d->dir);
    free(d);
}

/* Opens a cache file for reading: regular files only, no symlink. -1 and
 * *why when it is something else (*why NULL when it simply vanished). */
static int open_regular(kv_disk *d, const char *name, int flags, struct stat *st, const char **why)
{
    *why = NULL;
    int fd = openat(d->dfd, name, flags | OPEN_FLAGS);
    if (fd < 0) {
        if (errno == ELOOP) *why = "a symbolic link, not a cache file";
        else if (errno != ENOENT) *why = "cannot be opened";
        return -1;
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        *why = "not a regular file";
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads and sanity-checks the header; sizes are checked against the file. */
static bool read_head(const kv_disk *d, int fd, const char *sha, uint64_t file_size, head *h, const char **why)
{
    uint64_t d_ctx_size = d->o.ctx_size, d_max_payload = d->o.max_payload_bytes, d_space = d->o.space_bytes;
    uint8_t b[KV_DISK_HEADER_BYTES + 4];
    if (file_size < sizeof b) { *why = "shorter than the header"; return false; }
    if (pread(fd, b, sizeof b, 0) != (ssize_t)sizeof b) { *why = "header read failed"; return false; }
    if (memcmp(b, "KVC", 3) || b[3] != 1) { *why = "bad magic or version"; return false; }
    memset(h, 0, sizeof *h);
    memcpy(h->sha, sha, 41);
    h->quant_bits = b[4];
    h->reason = b[5];
    h->ext = b[6];
    h->tokens = get32(b + 8);
    h->hits = get32(b + 12);
    h->created = get64(b + 24);
    h->last_used = get64(b + 32);
    h->payload_bytes = get64(b + 40);
    h->text_bytes = get32(b + 48);
    h->file_size = file_size;
    if (!(h->ext & KV_DISK_EXT_CHECKSUM)) { *why = "no checksum"; return false; }
    if (b[20] != KV_DISK_PAYLOAD_ABI) { *why = "payload ABI differs"; return false; }
    uint64_t need = KV_DISK_HEADER_BYTES + 4 + h->text_bytes;
    if (h->payload_bytes > file_size || need + h->payload_bytes + 32 > file_size) {
        *why = "truncated (sizes in the header exceed the file)";
        return false;
    }
    if (!(h->ext & KV_DISK_EXT_TOOL_MAP) && need + h->payload_bytes + 32 != file_size) {
        *why = "size does not match the header";
        return false;
    }
    if (h->tokens == 0) { *why = "zero tokens"; return false; }
    /* bounds before anything is allocated for the file */
    if (d_ctx_size && h->tokens > d_ctx_size) { *why = "more tokens than the context holds"; return false; }
    if (d_max_payload && h->payload_bytes > d_max_payload) {
        *why = "payload larger than a session state of this context can be";
        return false;
    }
    if (d_space && file_size > d_space) { *why = "larger than the whole cache budget"; return false; }
    return true;
}

static void remove_bad(kv_disk *d, const char *name, const char *why)
{
    logf_(d, "kv-disk: removing %s/%s: %s", d->dir, name, why);
    unlinkat(d->dfd, name, 0); /* removes a symlink itself, never its target */
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static double score(const head *h, uint64_t now)
{
    uint64_t used = h->last_used ? h->last_used : h->created;
    double age = now > used ? (double)(now - used) : 0.0;
    /* +1 so that fresh zero-hit files still rank by age */
    return ((double)h->hits + 1.0) * exp2(-age / HALF_LIFE_S);
}

/* List all valid heads (bad files are removed). */
static head *scan(kv_disk *d, size_t *n_out)
{
    *n_out = 0;
    DIR *dir = opendir(d->dir);
    if (!dir) return NULL;
    head *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        char sha[41];
        if (!sha_name(de->d_name, sha)) {
            /* temp files of a crashed writer */
            if (!strncmp(de->d_name, "tmp-", 4) && strstr(de->d_name, ".kv.part")) {
                struct stat st;
                if (fstatat(d->dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && time(NULL) - st.st_mtime > 3600)
                    unlinkat(d->dfd, de->d_name, 0);
            }
            continue;
        }
        struct stat st;
        head h;
        const char *why = NULL;
        int fd = open_regular(d, de->d_name, O_RDONLY, &st, &why);
        if (fd >= 0 && read_head(d, fd, sha, (uint64_t)st.st_size, &h, &why)) {
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                head *q = realloc(v, cap * sizeof *q);
                if (!q) { close(fd); break; }
                v = q;
            }
            v[n++] = h;
        } else if (why) {
            remove_bad(d, de->d_name, why);
        }
        if (fd >= 0) close(fd);
    }
    closedir(dir);
    *n_out = n;
    return v;
}

void kv_disk_stats(kv_disk *d, size_t *files, uint64_t *bytes)
{
    size_t n;
    head *v = scan(d, &n);
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++) t += v[i].file_size;
    free(v);
    *files = n;
    *bytes = t;
}

static void evict(kv_disk *d, const char *keep_sha)
{
    if (!d->o.space_bytes) return;
    size_t n;
    head *v = scan(d, &n);
    uint64_t total = 0, now = (uint64_t)time(NULL);
    for (size_t i = 0; i < n; i++) total += v[i].file_size;
    while (total > d->o.space_bytes) {
        size_t worst = n;
        for (size_t i = 0; i < n; i++) {
            if (!v[i].file_size || !strcmp(v[i].sha, keep_sha)) continue;
            if (worst == n || score(&v[i], now) < score(&v[worst], now)) worst = i;
        }
        if (worst == n) break;
        char name[48];
        snprintf(name, sizeof name, "%s.kv", v[worst].sha);
        logf_(d, "kv-disk: evict %s (%llu bytes, %u hits) to stay under %llu bytes", v[worst].sha,
              (unsigned long long)v[worst].file_size, v[worst].hits, (unsigned long long)d->o.space_bytes);
        unlinkat(d->dfd, name, 0);
        total -= v[worst].file_size;
        v[worst].file_size = 0;
    }
    free(v);
}

ds4_status kv_disk_save(kv_disk *d, kv_disk_reason reason,
                        const char *text, size_t text_len, uint32_t tokens,
                        const void *payload, size_t payload_len,
                        const kv_disk_tool *tools, size_t n_tools)
{
    if ((uint64_t)text_len >= MAX_TEXT_BYTES)
        return ds4_fail(DS4_ERR_INVALID, "kv_disk: text of %zu bytes is too long", text_len);
    if (tokens == 0) return ds4_fail(DS4_ERR_INVALID, "kv_disk: refusing to save 0 tokens");
    char sha[41];
    kv_disk_sha1_hex(text, text_len, sha);
    uint8_t h[KV_DISK_HEADER_BYTES + 4];
    memset(h, 0, sizeof h);
    memcpy(h, "KVC", 3);
    h[3] = 1;
    h[4] = d->o.quant_bits;
    h[5] = (uint8_t)reason;
    h[6] = KV_DISK_EXT_CHECKSUM | (n_tools ? KV_DISK_EXT_TOOL_MAP : 0);
    put32(h + 8, tokens);
    put32(h + 16, d->o.ctx_size);
    h[20] = KV_DISK_PAYLOAD_ABI;
    uint64_t now = (uint64_t)time(NULL);
    put64(h + 24, now);
    put64(h + 32, now);
    put64(h + 40, payload_len);
    put32(h + 48, (uint32_t)text_len);

    /* An unpredictable temp name, created exclusively: nothing planted
     * under it (a symlink to a victim file) can be written through. */
    char name[96], final_name[48];
    unsigned char rnd[16];
    if (RAND_bytes(rnd, sizeof rnd) != 1) return ds4_fail(DS4_ERR_IO, "kv_disk: no random bytes for a temp name");
    int k = snprintf(name, sizeof name, "tmp-%d-", (int)getpid());
    for (size_t i = 0; i < sizeof rnd; i++) k += snprintf(name + k, sizeof name - (size_t)k, "%02x", rnd[i]);
    snprintf(name + k, sizeof name - (size_t)k, ".kv.part");
    snprintf(final_name, sizeof final_name, "%s.kv", sha);
    char *tmp = path_for(d, "", name);
    char *final = path_for(d, sha, ".kv");
    if (!tmp || !final) { free(tmp); free(final); return ds4_fail(DS4_ERR_NOMEM, "kv_disk: out of memory"); }
    int fd = openat(d->dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        ds4_status st = ds4_fail(DS4_ERR_IO, "kv_disk: cannot create %s: %s", tmp, strerror(errno));
        free(tmp); free(final);
        return st;
    }
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    int bad = write_all(fd, h, sizeof h);
    bad |= write_all(fd, text, text_len);
    EVP_DigestUpdate(md, text, text_len);
    bad |= write_all(fd, payload, payload_len);
    EVP_DigestUpdate(md, payload, payload_len);
    if (n_tools) {
        uint8_t th[8];
        memcpy(th, "KTM", 3);
        th[3] = 1;
        put32(th + 4, (uint32_t)n_tools);
        bad |= write_all(fd, th, 8);
        EVP_DigestUpdate(md, th, 8);
        for (size_t i = 0; i < n_tools; i++) {
            uint8_t l[8];
            put32(l, (uint32_t)tools[i].id_len);
            put32(l + 4, (uint32_t)tools[i].dsml_len);
            bad |= write_all(fd, l, 8);
            bad |= write_all(fd, tools[i].id, tools[i].id_len);
            bad |= write_all(fd, tools[i].dsml, tools[i].dsml_len);
            EVP_DigestUpdate(md, l, 8);
            EVP_DigestUpdate(md, tools[i].id, tools[i].id_len);
            EVP_DigestUpdate(md, tools[i].dsml, tools[i].dsml_len);
        }
    }
    unsigned char sum[EVP_MAX_MD_SIZE];
    unsigned int sl = 0;
    EVP_DigestFinal_ex(md, sum, &sl);
    EVP_MD_CTX_free(md);
    bad |= write_all(fd, sum, 32);
    if (!bad && fsync(fd) != 0) bad = 1;
    int err = errno;
    close(fd);
    if (bad || renameat(d->dfd, name, d->dfd, final_name) != 0) {
        if (!bad) err = errno;
        unlinkat(d->dfd, name, 0);
        ds4_status st = ds4_fail(DS4_ERR_IO, "kv_disk: writing %s failed: %s", final, strerror(err));
        free(tmp); free(final);
        return st;
    }
    fsync(d->dfd);
    static const char *const names[] = {"unknown", "cold", "continued", "evict", "shutdown"};
    logf_(d, "kv-disk: saved %s (%s, %u tokens, %zu text bytes, %zu payload bytes)", sha,
          names[reason <= 4 ? reason : 0], tokens, text_len, payload_len);
    free(tmp);
    free(final);
    evict(d, sha);
    return DS4_OK;
}

void kv_disk_hit_free(kv_disk_hit *hit)
{
    if (!hit) return;
    free(hit->payload);
    for (size_t i = 0; i < hit->n_tools; i++) { free(hit->tools[i].id); free(hit->tools[i].dsml); }
    free(hit->tools);
    memset(hit, 0, sizeof *hit);
}

/* Reads the whole file and verifies it. Returns false (and says why). */
static bool load(kv_disk *d, const head *h, const char *prompt, kv_disk_hit *hit, const char **why)
{
    char name[48];
    snprintf(name, sizeof name, "%s.kv", h->sha);
    struct stat st;
    int fd = open_regular(d, name, O_RDONLY, &st, why);
    if (fd < 0) { if (!*why) *why = "vanished"; return false; }
    if ((uint64_t)st.st_size != h->file_size) { *why = "changed since it was listed"; close(fd); return false; }
    uint64_t body = h->file_size - (KV_DISK_HEADER_BYTES + 4);
    unsigned char *b = malloc(body ? body : 1);
    bool ok = false;
    if (!b) { *why = "out of memory"; goto out; }
    uint64_t got = 0;
    while (got < body) {
        ssize_t r = pread(fd, b + got, body - got, (off_t)(KV_DISK_HEADER_BYTES + 4 + got));
        if (r <= 0) break;
        got += (uint64_t)r;
    }
    if (got != body) { *why = "short read"; goto out; }
    if (memcmp(b, prompt, h->text_bytes)) { *why = "text differs from the prompt (hash collision?)"; goto out; }
    unsigned char sum[EVP_MAX_MD_SIZE];
    unsigned int sl = 0;
    EVP_Digest(b, body - 32, sum, &sl, EVP_sha256(), NULL);
    if (memcmp(sum, b + body - 32, 32)) { *why = "checksum mismatch (corrupt file)"; goto out; }
    memset(hit, 0, sizeof *hit);
    memcpy(hit->sha, h->sha, 41);
    hit->text_len = h->text_bytes;
    hit->tokens = h->tokens;
    hit->reason = (kv_disk_reason)h->reason;
    hit->payload_len = h->payload_bytes;
    hit->payload = malloc(h->payload_bytes ? h->payload_bytes : 1);
    if (!hit->payload) { *why = "out of memory"; goto out; }
    memcpy(hit->payload, b + h->text_bytes, h->payload_bytes);
    uint64_t off = h->text_bytes + h->payload_bytes, end = body - 32;
    if (h->ext & KV_DISK_EXT_TOOL_MAP) {
        if (end - off < 8 || memcmp(b + off, "KTM", 3) || b[off + 3] != 1) { *why = "bad tool map"; goto fail; }
        uint32_t cnt = get32(b + off + 4);
        off += 8;
        if (cnt > (end - off) / 8) { *why = "tool map count too large"; goto fail; }
        hit->tools = calloc(cnt ? cnt : 1, sizeof *hit->tools);
        if (!hit->tools) { *why = "out of memory"; goto fail; }
        for (uint32_t i = 0; i < cnt; i++) {
            if (end - off < 8) { *why = "tool map truncated"; goto fail; }
            uint32_t il = get32(b + off), dl = get32(b + off + 4);
            off += 8;
            if ((uint64_t)il + dl > end - off) { *why = "tool map entry past the end"; goto fail; }
            kv_disk_tool *t = &hit->tools[hit->n_tools++];
            t->id = strndup((char *)b + off, il);
            t->dsml = malloc(dl + 1);
            if (!t->id || !t->dsml) { *why = "out of memory"; goto fail; }
            memcpy(t->dsml, b + off + il, dl);
            t->dsml[dl] = 0;
            t->id_len = il;
            t->dsml_len = dl;
            off += (uint64_t)il + dl;
        }
    }
    if (off != end) { *why = "trailing bytes before the checksum"; goto fail; }
    ok = true;
    goto out;
fail:
    kv_disk_hit_free(hit);
out:
    free(b);
    close(fd);
    return ok;
}

static void touch(kv_disk *d, const head *h)
{
    char name[48];
    snprintf(name, sizeof name, "%s.kv", h->sha);
    struct stat st;
    const char *why;
    int fd = open_regular(d, name, O_WRONLY, &st, &why);
    if (fd < 0) return;
    uint8_t b[12];
    put32(b, h->hits + 1);
    if (pwrite(fd, b, 4, 12) != 4) { close(fd); return; }
    put64(b, (uint64_t)time(NULL));
    if (pwrite(fd, b, 8, 32) != 8) { close(fd); return; }
    close(fd);
}

ds4_status kv_disk_lookup(kv_disk *d, const char *prompt, size_t len,
                          size_t max_text, kv_disk_hit *hit)
{
    memset(hit, 0, sizeof *hit);
    size_t n;
    head *v = scan(d, &n);
    for (;;) {
        size_t best = n;
        for (size_t i = 0; i < n; i++) {
            if (!v[i].file_size || v[i].text_bytes > len || v[i].text_bytes > max_text) continue;
            if (d->o.reject_different_quant && v[i].quant_bits != d->o.quant_bits) continue;
            if (best == n || v[i].text_bytes > v[best].text_bytes) best = i;
        }
        if (best == n) break;
        char sha[41];
        kv_disk_sha1_hex(prompt, v[best].text_bytes, sha);
        if (strcmp(sha, v[best].sha)) { v[best].file_size = 0; continue; }
        const char *why = NULL;
        if (load(d, &v[best], prompt, hit, &why)) {
            touch(d, &v[best]);
            logf_(d, "kv-disk: hit %s (%u tokens, %llu text bytes)", v[best].sha,
                  v[best].tokens, (unsigned long long)v[best].text_bytes);
            free(v);
            return DS4_OK;
        }
        char name[48];
        snprintf(name, sizeof name, "%s.kv", v[best].sha);
        remove_bad(d, name, why);
        v[best].file_size = 0;
    }
    free(v);
    return ds4_fail(DS4_ERR_NOT_FOUND, "kv_disk: no stored prefix of a %zu-byte prompt", len);
}

void kv_disk_remove(kv_disk *d, const char *sha, const char *why)
{
    char name[48];
    if (strlen(sha) != 40) return;
    snprintf(name, sizeof name, "%s.kv", sha);
    remove_bad(d, name, why);
}
