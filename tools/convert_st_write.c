/*
 * convert_st_write.c - safetensors writer (see convert_st_write.h). The
 * header is built with jansson; data_offsets are cumulative.
 */
#include "tools/convert_st_write.h"

#include "util/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ds4_status st_write_file(const char *path, const st_write_tensor *t, int n)
{
    json_t *root = json_object();
    uint64_t off = 0;
    for (int i = 0; root && i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].n_dims; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", t[i].dtype, "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)(off + t[i].nbytes));
        json_object_set_new(root, t[i].name, e);
        off += t[i].nbytes;
    }
    char *hdr = root ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!hdr) return ds4_fail(DS4_ERR_NOMEM, "safetensors writer: out of memory");
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return ds4_fail(DS4_ERR_IO, "safetensors writer: cannot create %s", path);
    }
    uint64_t hl = strlen(hdr);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hl >> (8 * i));
    int ok = fwrite(le, 1, 8, f) == 8 && fwrite(hdr, 1, hl, f) == hl;
    for (int i = 0; ok && i < n; i++) ok = !t[i].nbytes || fwrite(t[i].data, 1, t[i].nbytes, f) == t[i].nbytes;
    free(hdr);
    if (fclose(f) != 0 || !ok) return ds4_fail(DS4_ERR_IO, "safetensors writer: write %s failed", path);
    return DS4_OK;
}

ds4_status st_write_index(const char *path, const char *const *names, const char *const *files, int n)
{
    json_t *wm = json_object();
    for (int i = 0; i < n; i++) json_object_set_new(wm, names[i], json_string(files[i]));
    json_t *root = json_pack("{s:{}, s:o}", "metadata", "weight_map", wm);
    int rc = root ? json_dump_file(root, path, JSON_INDENT(1)) : -1;
    json_decref(root);
    return rc == 0 ? DS4_OK : ds4_fail(DS4_ERR_IO, "safetensors writer: cannot write %s", path);
}
