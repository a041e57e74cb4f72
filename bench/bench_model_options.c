/*
 * bench_model_options.c - the command line of ds4-bench's model mode.
 *
 * The flags and their defaults are those of antirez/ds4's ds4-bench
 * (-m, --prompt-file, --ctx-start 2048, --ctx-max 32768, --ctx-alloc,
 * --step-incr 2048, --step-mul 1, --gen-tokens 128, --csv, --backend /
 * --cpu / --cuda, -t/--threads), so the same command lines run on both;
 * DwarfStar adds --ctx (= --ctx-alloc), --numerics, --gpu, --prefill-chunk,
 * --batch-sessions, --batch-loop, --host-pick and --plot. Values are checked here, before a multi-GiB model is opened.
 */
#include "bench/bench_model.h"

#include "cli/cli_stream_options.h"

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void bench_model_usage(FILE *f)
{
    fprintf(f,
            "usage: ds4-bench -m MODEL.gguf --prompt-file FILE [options]\n"
            "  Walks the file's tokens (BOS + text) to context frontiers ctx-start,\n"
            "  ..., ctx-max; at each it times the prefill of the newly added tokens,\n"
            "  snapshots the session, times a greedy decode of --gen-tokens tokens\n"
            "  (EOS never picked), restores, and writes one CSV row:\n"
            "  " BENCH_MODEL_CSV_HEADER "\n"
            "  (roofline_tps = measured copy bandwidth / weight bytes per token).\n"
            "model and backend:\n"
            "  -m, --model FILE        GGUF model (default ds4flash.gguf)\n"
            "  --backend cpu|cuda      also --cpu, --cuda (default: cuda when built with it\n"
            "                          and a GPU is present, else cpu)\n"
            "  -t, --threads N         CPU threads (default: all cores)\n"
            "  --numerics official|hf|auto  KV numerics (default auto: official where the\n"
            "                          model's shapes allow it, i.e. every real model)\n"
            "  --gpu N                 CUDA device (default 0)\n"
            "  --prefill-chunk N       tokens per prefill step (default: the library's)\n"
            "sweep:\n"
            "  --ctx-start N           first frontier (default 2048)\n"
            "  --ctx-max N             last frontier (default 32768)\n"
            "  --ctx, --ctx-alloc N    session context (default ctx-max + gen-tokens + 1)\n"
            "  --step-incr N           linear step when --step-mul is 1 (default 2048)\n"
            "  --step-mul F            multiplicative step, >= 1 (default 1)\n"
            "  --gen-tokens N          greedy decode tokens per frontier (default 128)\n"
            "  --batch-sessions N      also decode N sessions at once from each frontier\n"
            "                          (ds4_session_decode_batch; adds the columns\n"
            "                          batch_sessions,batch_gen_tps = aggregate tokens/s)\n"
            "  --warmup                before the walk, one untimed prefill step of the\n"
            "                          session's chunk and a decode (ds4_session_warmup): the\n"
            "                          first row then leaves out the process's one-time costs\n"
            "                          (its time is logged)\n"
            "  --batch-loop            with --batch-sessions: also time the same steps with\n"
            "                          one ds4_session_decode per session (column\n"
            "                          loop_gen_tps), the comparison for the batched step\n"
            "  --host-pick             pick each greedy token on the host from the downloaded\n"
            "                          logits row (ds4_session_decode + ds4_argmax_excluding),\n"
            "                          as before ds4_session_decode_pick; by default the token is\n"
            "                          picked on the device where the backend can (CUDA: 4 bytes\n"
            "                          a session cross instead of the row). For A/B runs\n"
            "output:\n"
            "  --mtp FILE|auto         also time the greedy probe with speculative decoding (the\n"
            "                          MTP block: a GGUF, or auto); columns mtp_draft, mtp_gen_tps,\n"
            "                          mtp_accept (share of drafts accepted)\n"
            "  --mtp-draft N           drafts per step with --mtp, 1..16 (default 2)\n"
            "  --csv FILE              CSV there instead of stdout\n"
            "  --plot FILE.svg         chart of prefill and decode tokens/s vs context\n"
            "expert streaming (docs/STREAMING.md): the flags of ds4 (--ssd-streaming,\n"
            "  --ssd-streaming-cache-experts N|NGB, ...; --expert-profile FILE); with\n"
            "  --ssd-streaming the disk's read bandwidth is measured first and each\n"
            "  frontier logs hit rates and bytes read per token (stderr).\n");
}

static int bad(const char *opt, const char *val, const char *why)
{
    fprintf(stderr, "ds4-bench: %s '%s': %s\n", opt, val ? val : "", why);
    return 2;
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int bench_model_parse(int argc, char **argv, bench_model_opts *o)
{
    memset(o, 0, sizeof *o);
    o->model_path = "ds4flash.gguf";
    o->backend = DS4_BACKEND_CPU;
#if DS4_HAVE_CUDA
    if (ds4_cuda_device_count() > 0) o->backend = DS4_BACKEND_CUDA; /* as antirez/ds4: the GPU if there is one */
#endif
    o->numerics = DS4_NUMERICS_AUTO;
    o->ctx_start = 2048;
    o->ctx_max = 32768;
    o->step_incr = 2048;
    o->step_mul = 1.0;
    o->gen_tokens = 128;
    const int64_t big = (int64_t)1 << 40;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(s) (strcmp(a, s) == 0)
        const char *serr = NULL;
        int sr = ds4_cli_stream_option(&o->model_opt, argc, argv, &i, &serr);
        if (sr < 0) return bad(a, v, serr);
        if (sr > 0) continue;
        if (IS("-h") || IS("--help")) {
            bench_model_usage(stdout);
            return 1;
        } else if (IS("--cpu")) {
            o->backend = DS4_BACKEND_CPU;
            continue;
        } else if (IS("--cuda")) {
            o->backend = DS4_BACKEND_CUDA;
            continue;
        } else if (IS("--batch-loop")) {
            o->batch_loop = 1;
            continue;
        } else if (IS("--warmup")) {
            o->warmup = 1;
            continue;
        } else if (IS("--host-pick")) {
            o->host_pick = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "ds4-bench: unknown option or missing value: '%s'\n", a);
            bench_model_usage(stderr);
            return 2;
        }
        i++;
        int64_t n;
        if (IS("-m") || IS("--model")) o->model_path = v;
        else if (IS("--prompt-file")) o->prompt_path = v;
        else if (IS("--csv")) o->csv_path = v;
        else if (IS("--plot")) o->plot_path = v;
        else if (IS("--backend")) {
            if (!strcmp(v, "cpu")) o->backend = DS4_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) o->backend = DS4_BACKEND_CUDA;
            else return bad(a, v, "expected cpu or cuda");
        } else if (IS("--numerics")) {
            if (!strcmp(v, "official")) o->numerics = DS4_NUMERICS_OFFICIAL;
            else if (!strcmp(v, "hf")) o->numerics = DS4_NUMERICS_HF;
            else if (!strcmp(v, "auto")) o->numerics = DS4_NUMERICS_AUTO;
            else return bad(a, v, "expected official, hf or auto");
        } else if (IS("--gpu")) {
            if (parse_i64(v, 0, 1024, &n)) return bad(a, v, "expected a device index 0..1024");
            o->gpu_device = (int)n;
        } else if (IS("-t") || IS("--threads")) {
            if (parse_i64(v, 0, 4096, &n)) return bad(a, v, "expected 0..4096");
            o->threads = (int)n;
        } else if (IS("--prefill-chunk")) {
            if (parse_i64(v, 1, 65536, &n)) return bad(a, v, "expected 1..65536");
            o->prefill_chunk = (int)n;
        } else if (IS("--ctx-start")) {
            if (parse_i64(v, 1, big, &o->ctx_start)) return bad(a, v, "expected a positive token count");
        } else if (IS("--ctx-max")) {
            if (parse_i64(v, 1, big, &o->ctx_max)) return bad(a, v, "expected a positive token count");
        } else if (IS("--ctx") || IS("--ctx-alloc")) {
            if (parse_i64(v, 1, big, &o->ctx_alloc)) return bad(a, v, "expected a positive token count");
        } else if (IS("--step-incr")) {
            if (parse_i64(v, 1, big, &o->step_incr)) return bad(a, v, "expected a positive token count");
        } else if (IS("--step-mul")) {
            char *end;
            double d = strtod(v, &end);
            if (!*v || *end || !isfinite(d) || d < 1.0 || d > 1e6) return bad(a, v, "expected a number >= 1");
            o->step_mul = d;
        } else if (IS("--mtp")) {
            o->mtp = v;
        } else if (IS("--mtp-draft")) {
            if (parse_i64(v, 1, 16, &n)) return bad(a, v, "expected 1..16");
            o->mtp_draft = (int)n;
        } else if (IS("--batch-sessions")) {
            if (parse_i64(v, 1, 1024, &n)) return bad(a, v, "expected 1..1024");
            o->batch_sessions = (int)n;
        } else if (IS("--gen-tokens") || IS("--tokens") || IS("-n")) {
            if (parse_i64(v, 1, 1 << 20, &n)) return bad(a, v, "expected 1..1048576");
            o->gen_tokens = (int)n;
        } else {
            fprintf(stderr, "ds4-bench: unknown option '%s'\n", a);
            bench_model_usage(stderr);
            return 2;
        }
#undef IS
    }
    if (!o->prompt_path) {
        fprintf(stderr, "ds4-bench: the model mode needs --prompt-file FILE\n");
        return 2;
    }
    if (ds4_cli_stream_check(&o->model_opt)) {
        fprintf(stderr, "ds4-bench: %s\n", ds4_cli_stream_check(&o->model_opt));
        return 2;
    }
    if (o->mtp_draft && !o->mtp) {
        fprintf(stderr, "ds4-bench: --mtp-draft needs --mtp FILE|auto\n");
        return 2;
    }
    if (o->batch_loop && !o->batch_sessions) {
        fprintf(stderr, "ds4-bench: --batch-loop needs --batch-sessions N\n");
        return 2;
    }
    if (o->ctx_start > o->ctx_max) {
        fprintf(stderr, "ds4-bench: --ctx-start %lld is above --ctx-max %lld\n", (long long)o->ctx_start,
                (long long)o->ctx_max);
        return 2;
    }
    int64_t need = o->ctx_max + o->gen_tokens + 1;
    if (o->ctx_alloc == 0) o->ctx_alloc = need;
    if (o->ctx_alloc < o->ctx_max + o->gen_tokens) {
        fprintf(stderr, "ds4-bench: --ctx %lld is below ctx-max + gen-tokens = %lld\n", (long long)o->ctx_alloc,
                (long long)(o->ctx_max + o->gen_tokens));
        return 2;
    }
    return 0;
}
