/*
 * ds4_gguf_main.c - `ds4-gguf`: inspect GGUF files.
 *
 *   ds4-gguf info [--full] FILE   metadata and tensor table, like gguf-dump
 *
 * A thin printer over gguf/gguf.h (a developer tool, so it reads the GGUF
 * layer directly rather than going through the engine API). All checking
 * is the reader's: a malformed file gives its one-line message naming the
 * cause and byte offset, and exit status 1. Arrays are summarised as
 * type, length and the first few elements; long strings are cut unless
 * --full; bytes that are not printable UTF-8 are shown as \xNN escapes so
 * the output stays one line per key.
 */
#include "gguf/gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <utf8proc.h>
#include "util/version.h"

#define ARR_SHOW 5
#define STR_SHOW 64

static int g_full;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ds4-gguf info [--full] FILE\n"
            "\n"
            "  info     print the header, every metadata key/value and the tensor table\n"
            "           (arrays: element type, length and the first %d elements)\n"
            "  --full   print strings and arrays in full\n"
            "  --help   this text\n"
            "\n"
            "Exit status: 0 on success, 1 if the file cannot be read or is malformed\n"
            "(with a one-line message naming the cause and byte offset), 2 on bad usage.\n",
            ARR_SHOW);
}

/* Print a string as a quoted, escaped, possibly shortened literal. */
static void print_str(ds4_gguf_str s)
{
    const uint8_t *p = (const uint8_t *)s.ptr;
    uint64_t shown = 0, i = 0;
    putchar('"');
    while (i < s.len) {
        if (!g_full && shown >= STR_SHOW) {
            printf("\"... (%" PRIu64 " bytes)", s.len);
            return;
        }
        utf8proc_int32_t cp = -1;
        uint64_t rest = s.len - i;
        utf8proc_ssize_t n = utf8proc_iterate(p + i, rest > 4 ? 4 : (utf8proc_ssize_t)rest, &cp);
        if (n <= 0) {
            printf("\\x%02x", p[i]);
            i++;
        } else if (cp == '"' || cp == '\\') {
            printf("\\%c", (char)cp);
            i++;
        } else if (cp == '\n') {
            fputs("\\n", stdout);
            i++;
        } else if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0)) {
            printf("\\u%04x", (unsigned)cp);
            i += (uint64_t)n;
        } else {
            fwrite(p + i, 1, (size_t)n, stdout);
            i += (uint64_t)n;
        }
        shown++;
    }
    putchar('"');
}

static void print_value(const ds4_gguf_value *v)
{
    switch (v->type) {
    case DS4_GGUF_U8: case DS4_GGUF_U16: case DS4_GGUF_U32: case DS4_GGUF_U64:
        printf("%" PRIu64, v->v.u);
        break;
    case DS4_GGUF_I8: case DS4_GGUF_I16: case DS4_GGUF_I32: case DS4_GGUF_I64:
        printf("%" PRId64, v->v.i);
        break;
    case DS4_GGUF_F32: printf("%.9g", v->v.f); break;
    case DS4_GGUF_F64: printf("%.17g", v->v.f); break;
    case DS4_GGUF_BOOL: fputs(v->v.b ? "true" : "false", stdout); break;
    case DS4_GGUF_STRING: print_str(v->v.s); break;
    default: fputs("?", stdout); break;
    }
}

static void print_kv(const ds4_gguf *g, int64_t i)
{
    char type[48];
    uint32_t t = ds4_gguf_kv_type(g, i);
    if (t == DS4_GGUF_ARRAY)
        snprintf(type, sizeof type, "arr[%s,%" PRIu64 "]", ds4_gguf_vtype_name(ds4_gguf_arr_type(g, i)),
                 ds4_gguf_arr_len(g, i));
    else
        snprintf(type, sizeof type, "%s", ds4_gguf_vtype_name(t));
    printf("%5" PRId64 ": %-18s %s = ", i, type, ds4_gguf_key(g, i));
    ds4_gguf_value v;
    if (t != DS4_GGUF_ARRAY) {
        ds4_gguf_kv_value(g, i, &v);
        print_value(&v);
    } else {
        uint64_t n = ds4_gguf_arr_len(g, i);
        putchar('[');
        for (uint64_t j = 0; j < n && (g_full || j < ARR_SHOW); j++) {
            if (j) fputs(", ", stdout);
            ds4_gguf_arr_elem(g, i, j, &v);
            print_value(&v);
        }
        if (!g_full && n > ARR_SHOW) fputs(", ...", stdout);
        putchar(']');
    }
    putchar('\n');
}

static void print_tensors(const ds4_gguf *g)
{
    int64_t n = ds4_gguf_n_tensors(g);
    uint64_t count[64] = {0}, bytes[64] = {0}, total = 0;
    printf("* Tensors: %" PRId64 "\n", n);
    if (n) printf("%5s  %-8s %-32s %14s %14s  %s\n", "idx", "type", "shape", "offset", "bytes", "name");
    for (int64_t i = 0; i < n; i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        char shape[96];
        int p = snprintf(shape, sizeof shape, "[");
        for (uint32_t d = 0; d < t->n_dims; d++)
            p += snprintf(shape + p, sizeof shape - (size_t)p, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
        snprintf(shape + p, sizeof shape - (size_t)p, "]");
        printf("%5" PRId64 "  %-8s %-32s %14" PRIu64 " %14" PRIu64 "  %s\n", i, ds4_gguf_type_name(t->type),
               shape, t->offset, t->size, t->name);
        if (t->type < 64) {
            count[t->type]++;
            bytes[t->type] += t->size;
        }
        total += t->size;
    }
    if (!n) return;
    printf("* Tensor types:\n");
    for (uint32_t ty = 0; ty < 64; ty++)
        if (count[ty])
            printf("  %-8s %6" PRIu64 " tensors %16" PRIu64 " bytes\n", ds4_gguf_type_name(ty), count[ty],
                   bytes[ty]);
    printf("  %-8s %6" PRId64 " tensors %16" PRIu64 " bytes\n", "total", n, total);
}

static int cmd_info(const char *path)
{
    ds4_gguf *g = ds4_gguf_open(path);
    if (!g) {
        fprintf(stderr, "ds4-gguf: %s\n", ds4_last_error());
        return 1;
    }
    printf("* File: %s\n", path);
    printf("* GGUF v%u, %" PRIu64 " bytes, alignment %u, data section at offset %" PRIu64 "\n",
           ds4_gguf_version(g), ds4_gguf_file_size(g), ds4_gguf_alignment(g), ds4_gguf_data_offset(g));
    printf("* Key/values: %" PRId64 "\n", ds4_gguf_n_kv(g));
    for (int64_t i = 0; i < ds4_gguf_n_kv(g); i++) print_kv(g, i);
    print_tensors(g);
    ds4_gguf_close(g);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "ds4-gguf: write error on standard output\n");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (ds4_version_requested(argc, argv)) { ds4_version_print(stdout, "ds4-gguf"); return 0; }
    const char *cmd = NULL, *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--full") == 0) {
            g_full = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "ds4-gguf: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        } else if (!cmd) {
            cmd = argv[i];
        } else if (!file) {
            file = argv[i];
        } else {
            fprintf(stderr, "ds4-gguf: unexpected argument '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    if (!cmd) {
        usage(stderr);
        return 2;
    }
    if (strcmp(cmd, "info") != 0) {
        fprintf(stderr, "ds4-gguf: unknown command '%s' (try --help)\n", cmd);
        return 2;
    }
    if (!file) {
        fprintf(stderr, "ds4-gguf: info needs a FILE (try --help)\n");
        return 2;
    }
    return cmd_info(file);
}
