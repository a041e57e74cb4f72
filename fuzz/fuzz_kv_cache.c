/*
 * fuzz_kv_cache.c - libFuzzer target: a disk KV cache file parsed, looked
 * up and restored into a live session, as the server does it.
 *
 * The input is one cache file (engine/kv_disk.h layout). It is stored in a
 * private directory under the name its own text hashes to (so the lookup
 * reaches the full read, checksum and tool-map parsing instead of stopping
 * at the name), then looked up with a prompt that extends that text. A hit
 * is restored like slot_session.c does (token count, ids, engine state)
 * into a session of the micro model (fuzz_support.h), and a restored
 * session decodes one more token. Forged files with recomputed checksums
 * are what this reaches. Seeds: fuzz/corpus/kv_cache/ (fuzz/make_seeds.c).
 */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "engine/kv_disk.h"
#include "fuzz/fuzz_support.h"
#include "include/ds4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CTX 32

static ds4_model *g_model;
static ds4_session *g_sess;
static kv_disk *g_disk;
static char g_dir[64];

static int init(void)
{
    char model_path[96];
    snprintf(g_dir, sizeof g_dir, "/tmp/ds4-fuzz-kv-XXXXXX");
    if (!mkdtemp(g_dir)) return 0;
    snprintf(model_path, sizeof model_path, "%s.gguf", g_dir);
    if (!synth_write_gguf(&fuzz_micro_shape, 7, model_path)) return 0;
    g_model = ds4_model_open(model_path, NULL);
    unlink(model_path);
    if (!g_model) return 0;
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = CTX;
    p.n_threads = 1;
    p.backend = DS4_BACKEND_CPU;
    g_sess = ds4_session_create(g_model, &p);
    if (!g_sess) return 0;
    kv_disk_options o = {.dir = g_dir, .quant_bits = 2, .ctx_size = CTX,
                         .max_payload_bytes = 4 + 4 * CTX + ds4_session_snapshot_size_max(g_sess)};
    g_disk = kv_disk_open(&o);
    return g_disk != NULL;
}

static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready = -1;
    if (ready < 0) ready = init();
    if (!ready || size < KV_DISK_HEADER_BYTES + 4) return 0;
    uint32_t text_len = get32(data + KV_DISK_HEADER_BYTES);
    if ((uint64_t)text_len + KV_DISK_HEADER_BYTES + 4 > size) return 0;
    const char *text = (const char *)data + KV_DISK_HEADER_BYTES + 4;
    char sha[41], name[128];
    kv_disk_sha1_hex(text, text_len, sha);
    snprintf(name, sizeof name, "%s/%s.kv", g_dir, sha);
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return 0;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    close(fd);
    char *prompt = malloc((size_t)text_len + 2);
    if (!prompt) return 0;
    memcpy(prompt, text, text_len);
    memcpy(prompt + text_len, "x", 2);
    kv_disk_hit hit;
    if (kv_disk_lookup(g_disk, prompt, text_len + 1, text_len + 1, &hit) == DS4_OK) {
        const uint8_t *p = hit.payload;
        if (hit.payload_len >= 4) {
            uint32_t n = get32(p);
            if (n == hit.tokens && (uint64_t)n * 4 + 4 <= hit.payload_len) {
                ds4_session_reset(g_sess);
                if (ds4_session_restore(g_sess, p + 4 + (size_t)n * 4, hit.payload_len - 4 - (size_t)n * 4) == DS4_OK &&
                    ds4_session_n_past(g_sess) < CTX) {
                    int32_t t = (int32_t)(get32(p + 4) % (uint32_t)ds4_model_n_vocab(g_model));
                    if (ds4_session_logits(g_sess)) ds4_session_decode(g_sess, t);
                    else ds4_session_prefill(g_sess, &t, 1, NULL);
                }
            }
        }
        kv_disk_hit_free(&hit);
    }
    unlink(name);
    free(prompt);
    return 0;
}
