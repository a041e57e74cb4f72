/*
 * test_convert_official.c - the official checkpoint layout converts to the
 * same GGUF as the transformers one.
 *
 * From the tiny-a fixture this test writes an official-style checkpoint
 * (official tensor names from dsv4-model.md §2, official-style config.json
 * with compress_ratios + MTP slot, num_hash_layers, qk_rope_head_dim,
 * rope_scaling; two shards + model.safetensors.index.json): the attention
 * and shared-expert projections as FP8-E4M3 with UE8M0 128x128 block
 * scales, the routed experts per expert (w1/w2/w3) as packed FP4-E2M1 with
 * UE8M0 per-32 scales, tid2eid as I64, HC parameters as F32, the router as
 * F16, the rest BF16. The encoders here pick each code by exhaustive
 * nearest search, independent of the converter's decoders.
 *
 * Both checkpoints are converted with --type f32 --experts f32 and compared
 * tensor by tensor: same names, types and shapes; lossless sources equal
 * byte for byte; FP8/FP4 sources equal to exactly the value this test's
 * encoding represents, and within FP8/FP4 rounding of the original.
 */
#include "gguf/gguf.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "tests/safetensors_reader.h"
#include "tests/test.h"
#include "tools/convert_run.h"
#include "tools/convert_st_write.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- formats, written from their definitions ---------------------------- */

static float e4m3(uint8_t x) /* sign, 4-bit exponent bias 7, 3-bit mantissa */
{
    int e = (x >> 3) & 15, m = x & 7;
    float v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf(m / 8.0f, -6);
    return (x & 0x80) ? -v : v;
}

static float e2m1(uint8_t x) /* sign, 2-bit exponent bias 1, 1-bit mantissa */
{
    int e = (x >> 1) & 3, m = x & 1;
    float v = e ? ldexpf(1.0f + m / 2.0f, e - 1) : m * 0.5f;
    return (x & 8) ? -v : v;
}

static uint8_t nearest_e4m3(float y)
{
    uint8_t best = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue; /* NaN */
        if (fabsf(e4m3((uint8_t)c) - y) < fabsf(e4m3(best) - y)) best = (uint8_t)c;
    }
    return best;
}

static uint8_t nearest_e2m1(float y)
{
    uint8_t best = 0;
    for (int c = 0; c < 16; c++)
        if (fabsf(e2m1((uint8_t)c) - y) < fabsf(e2m1(best) - y)) best = (uint8_t)c;
    return best;
}

/* UE8M0 exponent of the smallest power of two s with amax / s <= maxq. */
static uint8_t ue8m0_for(float amax, float maxq)
{
    if (amax <= 0) return 127;
    int e = (int)ceilf(log2f(amax / maxq));
    return (uint8_t)(127 + e);
}

static float ue8m0(uint8_t e) { return ldexpf(1.0f, e - 127); }

/* ---- building the official checkpoint ----------------------------------- */

static const char *const name_map[][2] = {
    {"model.embed_tokens.weight", "embed.weight"}, {"lm_head.weight", "head.weight"},
    {"model.norm.weight", "norm.weight"}, {"model.hc_head.hc_fn", "hc_head_fn"},
    {"model.hc_head.hc_base", "hc_head_base"}, {"model.hc_head.hc_scale", "hc_head_scale"},
    {"attn_hc.fn", "hc_attn_fn"}, {"attn_hc.scale", "hc_attn_scale"}, {"attn_hc.base", "hc_attn_base"},
    {"ffn_hc.fn", "hc_ffn_fn"}, {"ffn_hc.scale", "hc_ffn_scale"}, {"ffn_hc.base", "hc_ffn_base"},
    {"input_layernorm.weight", "attn_norm.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_a_proj.weight", "attn.wq_a.weight"}, {"self_attn.q_a_norm.weight", "attn.q_norm.weight"},
    {"self_attn.q_b_proj.weight", "attn.wq_b.weight"}, {"self_attn.kv_proj.weight", "attn.wkv.weight"},
    {"self_attn.kv_norm.weight", "attn.kv_norm.weight"}, {"self_attn.sinks", "attn.attn_sink"},
    {"self_attn.o_a_proj.weight", "attn.wo_a.weight"}, {"self_attn.o_b_proj.weight", "attn.wo_b.weight"},
    {"self_attn.compressor.position_bias", "attn.compressor.ape"},
    {"self_attn.compressor.kv_proj.weight", "attn.compressor.wkv.weight"},
    {"self_attn.compressor.gate_proj.weight", "attn.compressor.wgate.weight"},
    {"self_attn.compressor.kv_norm.weight", "attn.compressor.norm.weight"},
    {"self_attn.compressor.indexer.q_b_proj.weight", "attn.indexer.wq_b.weight"},
    {"self_attn.compressor.indexer.scorer.weights_proj.weight", "attn.indexer.weights_proj.weight"},
    {"self_attn.compressor.indexer.position_bias", "attn.indexer.compressor.ape"},
    {"self_attn.compressor.indexer.kv_proj.weight", "attn.indexer.compressor.wkv.weight"},
    {"self_attn.compressor.indexer.gate_proj.weight", "attn.indexer.compressor.wgate.weight"},
    {"self_attn.compressor.indexer.kv_norm.weight", "attn.indexer.compressor.norm.weight"},
    {"mlp.gate.weight", "ffn.gate.weight"}, {"mlp.gate.e_score_correction_bias", "ffn.gate.bias"},
    {"mlp.gate.tid2eid", "ffn.gate.tid2eid"}, {"mlp.shared_experts.gate_proj.weight", "ffn.shared_experts.w1.weight"},
    {"mlp.shared_experts.up_proj.weight", "ffn.shared_experts.w3.weight"},
    {"mlp.shared_experts.down_proj.weight", "ffn.shared_experts.w2.weight"},
};

/* FP8 in the official checkpoint: attention and shared-expert projections. */
static int is_fp8(const char *official)
{
    const char *s[] = {"attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
                       "attn.wo_b.weight", "shared_experts.w1.weight", "shared_experts.w2.weight",
                       "shared_experts.w3.weight", "attn.indexer.wq_b.weight"};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        size_t n = strlen(official), m = strlen(s[i]);
        if (n >= m && strcmp(official + n - m, s[i]) == 0) return 1;
    }
    return 0;
}

#define MAXT 1024
static st_write_tensor out[MAXT];
static char *names[MAXT];
static void *bufs[MAXT];
static int nout;

static void emit(const char *name, const char *dtype, int nd, const int64_t *shape, void *data, size_t nbytes)
{
    names[nout] = strdup(name);
    bufs[nout] = data;
    out[nout] = (st_write_tensor){.name = names[nout], .dtype = dtype, .n_dims = nd, .data = data, .nbytes = nbytes};
    memcpy(out[nout].shape, shape, sizeof(int64_t) * (size_t)nd);
    nout++;
}

/* rows x cols floats -> FP8 codes + [ceil(rows/128), ceil(cols/128)] UE8M0 */
static void emit_fp8(const char *name, const float *x, int64_t rows, int64_t cols)
{
    int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    uint8_t *q = malloc((size_t)(rows * cols)), *s = malloc((size_t)(sr * sc));
    for (int64_t br = 0; br < sr; br++)
        for (int64_t bc = 0; bc < sc; bc++) {
            float amax = 0;
            for (int64_t r = br * 128; r < rows && r < br * 128 + 128; r++)
                for (int64_t c = bc * 128; c < cols && c < bc * 128 + 128; c++) amax = fmaxf(amax, fabsf(x[r * cols + c]));
            uint8_t e = ue8m0_for(amax, 448.0f);
            s[br * sc + bc] = e;
            for (int64_t r = br * 128; r < rows && r < br * 128 + 128; r++)
                for (int64_t c = bc * 128; c < cols && c < bc * 128 + 128; c++)
                    q[r * cols + c] = nearest_e4m3(x[r * cols + c] / ue8m0(e));
        }
    int64_t shw[2] = {rows, cols}, shs[2] = {sr, sc};
    char sname[256];
    snprintf(sname, sizeof sname, "%.*s.scale", (int)(strlen(name) - 7), name);
    emit(name, "F8_E4M3", 2, shw, q, (size_t)(rows * cols));
    emit(sname, "F8_E8M0", 2, shs, s, (size_t)(sr * sc));
}

/* rows x cols floats -> packed FP4 [rows, cols/2] I8 + UE8M0 [rows, cols/32] */
static void emit_fp4(const char *name, const float *x, int64_t rows, int64_t cols)
{
    uint8_t *q = calloc((size_t)(rows * cols / 2), 1), *s = malloc((size_t)(rows * cols / 32));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < cols / 32; b++) {
            const float *v = x + r * cols + b * 32;
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
            uint8_t e = ue8m0_for(amax, 6.0f);
            s[r * (cols / 32) + b] = e;
            for (int j = 0; j < 32; j++) {
                uint8_t n = nearest_e2m1(v[j] / ue8m0(e));
                q[(r * cols + b * 32 + j) / 2] |= (uint8_t)(j % 2 ? n << 4 : n);
            }
        }
    int64_t shw[2] = {rows, cols / 2}, shs[2] = {rows, cols / 32};
    char sname[256];
    snprintf(sname, sizeof sname, "%.*s.scale", (int)(strlen(name) - 7), name);
    emit(name, "I8", 2, shw, q, (size_t)(rows * cols / 2));
    emit(sname, "F8_E8M0", 2, shs, s, (size_t)(rows * cols / 32));
}

static int make_official(const char *dir)
{
    stfile sf = {0};
    if (!st_load(&sf, test_data("dsv4-tiny-a/model.safetensors"))) return 0;
    mkdir(dir, 0755);
    nout = 0;
    const char *key;
    json_t *v;
    json_object_foreach(sf.hdr, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        const char *dtype;
        int64_t shape[4] = {1, 1, 1, 1}, n = 1;
        int nd;
        const uint8_t *src;
        if (!st_get(&sf, key, &dtype, shape, &nd, &src)) return 0;
        for (int d = 0; d < nd; d++) n *= shape[d];
        float *x = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {
            if (strcmp(dtype, "BF16") == 0) x[i] = (float)st_val(dtype, src, (uint64_t)i);
            else memcpy(&x[i], src + 4 * i, 4); /* F32 (bias) or I32 (tid2eid, handled below) */
        }
        int layer = -1;
        char rest[200] = "", off[256];
        sscanf(key, "model.layers.%d.%199s", &layer, rest);
        if (strstr(key, "mlp.experts.")) { /* per-expert FP4 */
            int gate_up = strstr(key, "gate_up_proj") != NULL;
            int64_t E = shape[0], R = shape[1], C = shape[2];
            for (int64_t e = 0; e < E; e++) {
                if (gate_up) {
                    snprintf(off, sizeof off, "layers.%d.ffn.experts.%lld.w1.weight", layer, (long long)e);
                    emit_fp4(off, x + e * R * C, R / 2, C);
                    snprintf(off, sizeof off, "layers.%d.ffn.experts.%lld.w3.weight", layer, (long long)e);
                    emit_fp4(off, x + e * R * C + R / 2 * C, R / 2, C);
                } else {
                    snprintf(off, sizeof off, "layers.%d.ffn.experts.%lld.w2.weight", layer, (long long)e);
                    emit_fp4(off, x + e * R * C, R, C);
                }
            }
            free(x);
            continue;
        }
        const char *mapped = NULL;
        for (size_t i = 0; i < sizeof name_map / sizeof name_map[0]; i++)
            if (strcmp(layer >= 0 ? rest : key, name_map[i][0]) == 0) mapped = name_map[i][1];
        if (!mapped) return fprintf(stderr, "no official name for %s\n", key), 0;
        if (layer >= 0) snprintf(off, sizeof off, "layers.%d.%s", layer, mapped);
        else snprintf(off, sizeof off, "%s", mapped);
        if (is_fp8(off)) {
            emit_fp8(off, x, shape[0], shape[1]);
            free(x);
        } else if (strstr(off, "tid2eid")) {
            int64_t *q = malloc((size_t)n * 8);
            for (int64_t i = 0; i < n; i++) {
                int32_t t;
                memcpy(&t, src + 4 * i, 4);
                q[i] = t;
            }
            emit(off, "I64", nd, shape, q, (size_t)n * 8);
            free(x);
        } else if (strstr(off, "hc_") || strstr(off, "attn_sink") || strcmp(dtype, "F32") == 0) {
            emit(off, "F32", nd, shape, x, (size_t)n * 4);
        } else if (strstr(off, "ffn.gate.weight")) {
            uint16_t *h = malloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) h[i] = ds4_f32_to_f16(x[i]);
            emit(off, "F16", nd, shape, h, (size_t)n * 2);
            free(x);
        } else {
            uint16_t *h = malloc((size_t)n * 2);
            memcpy(h, src, (size_t)n * 2);
            emit(off, "BF16", nd, shape, h, (size_t)n * 2);
            free(x);
        }
    }
    st_unload(&sf);
    /* two shards + index */
    char p[512];
    const char *files[MAXT];
    int half = nout / 2;
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    if (st_write_file(p, out, half)) return 0;
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    if (st_write_file(p, out + half, nout - half)) return 0;
    for (int i = 0; i < nout; i++) files[i] = i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (st_write_index(p, (const char *const *)names, files, nout)) return 0;
    for (int i = 0; i < nout; i++) free(names[i]), free(bufs[i]);

    /* official-style config.json, same model */
    json_t *src = json_load_file(test_data("dsv4-tiny-a/config.json"), 0, NULL);
    if (!src) return 0;
    json_t *cfg = json_object();
    const char *copy[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "q_lora_rank", "o_lora_rank", "o_groups",
                          "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                          "sliding_window", "index_n_heads", "index_head_dim", "index_topk", "hc_mult",
                          "hc_sinkhorn_iters", "hc_eps", "rms_norm_eps", "swiglu_limit", "routed_scaling_factor",
                          "norm_topk_prob", "scoring_func", "max_position_embeddings", "bos_token_id",
                          "eos_token_id", "num_nextn_predict_layers", "model_type", "qk_rope_head_dim"};
    for (size_t i = 0; i < sizeof copy / sizeof copy[0]; i++)
        json_object_set(cfg, copy[i], json_object_get(src, copy[i]));
    json_decref(src);
    json_object_set_new(cfg, "compress_ratios", json_pack("[i,i,i,i,i,i,i]", 0, 0, 4, 128, 4, 128, 0));
    json_object_set_new(cfg, "num_hash_layers", json_integer(3));
    json_object_set_new(cfg, "rope_theta", json_integer(10000));
    json_object_set_new(cfg, "compress_rope_theta", json_integer(160000));
    json_object_set_new(cfg, "rope_scaling", json_pack("{s:i, s:i, s:i, s:i, s:s}", "beta_fast", 32, "beta_slow", 1,
                                                       "factor", 16, "original_max_position_embeddings", 65536,
                                                       "type", "yarn"));
    snprintf(p, sizeof p, "%s/config.json", dir);
    int rc = json_dump_file(cfg, p, JSON_INDENT(2));
    json_decref(cfg);
    return rc == 0;
}

/* ---- comparison --------------------------------------------------------- */

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static int fp8_sourced(const char *gguf)
{
    const char *s[] = {".attn_q_a.weight", ".attn_q_b.weight", ".attn_kv.weight", ".attn_output_a.weight",
                       ".attn_output_b.weight", "_shexp.weight", ".indexer.attn_q_b.weight"};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        if (has_suffix(gguf, s[i])) return 1;
    return 0;
}

static char tmpdir[64];

static void test_official_matches_transformers(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ds4-test-official-XXXXXX");
    REQUIRE(mkdtemp(tmpdir));
    char dir[128], a_path[128], b_path[128];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    snprintf(a_path, sizeof a_path, "%s/official.gguf", tmpdir);
    snprintf(b_path, sizeof b_path, "%s/hf.gguf", tmpdir);
    REQUIRE(make_official(dir));
    convert_options o = {.dense = DS4_TYPE_F32, .exp_gate_up = DS4_TYPE_F32, .exp_down = DS4_TYPE_F32,
                         .threads = 2, .quiet = true};
    o.out = a_path;
    ds4_status st = convert_checkpoint(dir, &o);
    EXPECT_MSG(st == DS4_OK, "official conversion: %s", ds4_last_error());
    REQUIRE(st == DS4_OK);
    o.out = b_path;
    REQUIRE(convert_checkpoint(test_data("dsv4-tiny-a"), &o) == DS4_OK);
    ds4_gguf *a = ds4_gguf_open(a_path), *b = ds4_gguf_open(b_path);
    REQUIRE(a && b);
    EXPECT(ds4_gguf_n_tensors(a) == ds4_gguf_n_tensors(b));
    EXPECT(ds4_gguf_n_kv(a) == ds4_gguf_n_kv(b));
    /* the official config must give the same metadata */
    for (int64_t k = 0; k < ds4_gguf_n_kv(b); k++) {
        const char *key = ds4_gguf_key(b, k);
        int64_t ka = ds4_gguf_find_key(a, key);
        EXPECT_MSG(ka >= 0, "official file lacks key %s", key);
        if (ka < 0 || ds4_gguf_kv_type(a, ka) != ds4_gguf_kv_type(b, k)) continue;
        if (ds4_gguf_kv_type(b, k) == DS4_GGUF_ARRAY) {
            uint64_t n = ds4_gguf_arr_len(b, k);
            EXPECT_MSG(ds4_gguf_arr_len(a, ka) == n, "key %s length", key);
            const void *da = ds4_gguf_arr_data(a, ka), *db = ds4_gguf_arr_data(b, k);
            if (da && db && n == ds4_gguf_arr_len(a, ka))
                EXPECT_MSG(memcmp(da, db, n * ds4_gguf_vtype_size(ds4_gguf_arr_type(b, k))) == 0, "key %s differs", key);
        } else {
            ds4_gguf_value va, vb;
            ds4_gguf_kv_value(a, ka, &va);
            ds4_gguf_kv_value(b, k, &vb);
            if (vb.type != DS4_GGUF_STRING)
                EXPECT_MSG(va.v.u == vb.v.u, "key %s differs", key);
        }
    }
    int lossless = 0, fp8 = 0, fp4 = 0, bad_exact = 0, bad_bound = 0;
    for (int64_t i = 0; i < ds4_gguf_n_tensors(b); i++) {
        const ds4_gguf_tensor *tb = ds4_gguf_tensor_at(b, i);
        int64_t ia = ds4_gguf_find_tensor(a, tb->name);
        EXPECT_MSG(ia >= 0, "official file lacks %s", tb->name);
        if (ia < 0) continue;
        const ds4_gguf_tensor *ta = ds4_gguf_tensor_at(a, ia);
        EXPECT_MSG(ta->type == tb->type && ta->n_dims == tb->n_dims && memcmp(ta->ne, tb->ne, sizeof ta->ne) == 0,
                   "%s: type/shape differ", tb->name);
        if (ta->size != tb->size) continue;
        const float *fa = ta->data, *fb = tb->data;
        const int64_t cols = (int64_t)tb->ne[0], rows = (int64_t)(tb->size / 4 / tb->ne[0]);
        if (fp8_sourced(tb->name)) {
            fp8++;
            for (int64_t br = 0; br < rows; br += 128)
                for (int64_t bc = 0; bc < cols; bc += 128) {
                    float amax = 0;
                    for (int64_t r = br; r < rows && r < br + 128; r++)
                        for (int64_t c = bc; c < cols && c < bc + 128; c++) amax = fmaxf(amax, fabsf(fb[r * cols + c]));
                    float s = ue8m0(ue8m0_for(amax, 448.0f));
                    for (int64_t r = br; r < rows && r < br + 128; r++)
                        for (int64_t c = bc; c < cols && c < bc + 128; c++) {
                            float x = fb[r * cols + c], y = fa[r * cols + c];
                            bad_exact += y != e4m3(nearest_e4m3(x / s)) * s;
                            bad_bound += fabsf(y - x) > fabsf(x) / 16 + s * ldexpf(1, -10);
                        }
                }
        } else if (strstr(tb->name, "_exps.weight")) {
            fp4++;
            for (int64_t k = 0; k < rows * cols; k += 32) {
                float amax = 0;
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(fb[k + j]));
                float s = ue8m0(ue8m0_for(amax, 6.0f));
                for (int j = 0; j < 32; j++) {
                    bad_exact += fa[k + j] != e2m1(nearest_e2m1(fb[k + j] / s)) * s;
                    bad_bound += fabsf(fa[k + j] - fb[k + j]) > amax / 3;
                }
            }
        } else {
            lossless++;
            EXPECT_MSG(memcmp(ta->data, tb->data, tb->size) == 0, "%s: bytes differ", tb->name);
        }
    }
    /* --experts mxfp4 from FP4 + UE8M0 experts is a lossless repack: the
     * MXFP4 blocks decode to exactly the FP4 values of the f32 conversion */
    char c_path[128];
    snprintf(c_path, sizeof c_path, "%s/mxfp4.gguf", tmpdir);
    o.out = c_path;
    o.exp_gate_up = o.exp_down = DS4_TYPE_MXFP4;
    st = convert_checkpoint(dir, &o);
    EXPECT_MSG(st == DS4_OK, "mxfp4 conversion: %s", ds4_last_error());
    ds4_gguf *c = st ? NULL : ds4_gguf_open(c_path);
    int mx = 0, mx_bad = 0;
    for (int64_t i = 0; c && i < ds4_gguf_n_tensors(c); i++) {
        const ds4_gguf_tensor *tc = ds4_gguf_tensor_at(c, i);
        if (!strstr(tc->name, "_exps.weight")) continue;
        const ds4_gguf_tensor *ta = ds4_gguf_tensor_at(a, ds4_gguf_find_tensor(a, tc->name));
        EXPECT(tc->type == DS4_TYPE_MXFP4);
        uint64_t cols = tc->ne[0], rows = tc->ne[1] * tc->ne[2];
        int64_t rb = ds4_row_bytes(tc->type, (int64_t)cols);
        float row[256];
        for (uint64_t r = 0; r < rows && cols <= 256; r++) {
            ds4_dequantize_row(tc->type, (const uint8_t *)tc->data + r * (uint64_t)rb, row, (int64_t)cols);
            for (uint64_t k = 0; k < cols; k++) mx_bad += row[k] != ((const float *)ta->data)[r * cols + k];
        }
        mx++;
    }
    EXPECT_MSG(mx == 18 && mx_bad == 0, "%d MXFP4 expert tensors, %d values differ from the FP4 source", mx, mx_bad);
    ds4_gguf_close(c);
    EXPECT_MSG(bad_exact == 0, "%d values differ from the FP8/FP4 value the checkpoint holds", bad_exact);
    EXPECT_MSG(bad_bound == 0, "%d values outside FP8/FP4 rounding of the original", bad_bound);
    EXPECT_MSG(fp8 == 6 * 8 + 2 && fp4 == 18 && lossless > 80, "coverage: %d lossless, %d fp8, %d fp4 tensors",
               lossless, fp8, fp4);
    ds4_gguf_close(a);
    ds4_gguf_close(b);
}

/* Errors of the official layout name the tensor. */
static void test_official_errors(void)
{
    char dir[128], p[256], outp[128];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    snprintf(outp, sizeof outp, "%s/bad.gguf", tmpdir);
    /* drop a scale tensor from the index and shard: rewrite the index without it */
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_load_file(p, 0, NULL);
    REQUIRE(idx);
    const char *gone = "layers.4.ffn.experts.5.w2.weight";
    REQUIRE(json_object_del(json_object_get(idx, "weight_map"), gone) == 0);
    REQUIRE(json_dump_file(idx, p, 0) == 0);
    json_decref(idx);
    /* the tensor is still in its shard, so the index drop alone is harmless:
     * remove the shard file's expert by pointing the index at a missing shard */
    idx = json_load_file(p, 0, NULL);
    json_object_set_new(json_object_get(idx, "weight_map"), gone, json_string("model-00003-of-00002.safetensors"));
    REQUIRE(json_dump_file(idx, p, 0) == 0);
    json_decref(idx);
    convert_options o = {.out = outp, .dense = DS4_TYPE_F32, .exp_gate_up = DS4_TYPE_F32, .exp_down = DS4_TYPE_F32,
                         .threads = 1, .quiet = true};
    EXPECT(convert_checkpoint(dir, &o) != DS4_OK);
    EXPECT_MSG(strstr(ds4_last_error(), "model-00003-of-00002.safetensors"), "message: %s", ds4_last_error());
    EXPECT(access(outp, F_OK) != 0);
}

int main(void)
{
    RUN(test_official_matches_transformers);
    if (tmpdir[0]) RUN(test_official_errors);
    if (tmpdir[0]) test_remove_dir(tmpdir);
    return test_finish();
}
