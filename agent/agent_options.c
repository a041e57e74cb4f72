/*
 * agent_options.c - ds4-agent's flags (see agent_options.h).
 */
#include "agent/agent_options.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static char g_err[300];

void agent_print_help(FILE *f)
{
    fputs(
        "Usage: ds4-agent [options]\n"
        "\n"
        "A coding agent on DeepSeek V4 running in this process: the model reads,\n"
        "searches and edits the files of a workspace and runs commands there,\n"
        "calling tools in its own DSML format. Interactive by default; with -p it\n"
        "runs one task to the end and exits (0 done, 1 error, 3 step limit,\n"
        "130 interrupted).\n"
        "\n"
        "Agent:\n"
        "  -p, --prompt TASK       Run one task and exit.\n"
        "  --prompt-file FILE      Read the task from FILE.\n"
        "  --workspace DIR         The directory the tools work in. Default: .\n"
        "  --non-interactive       Never ask and never read stdin: writes, edits and\n"
        "                          commands are refused unless --yes is given.\n"
        "  -y, --yes               Allow writes, edits and commands without asking.\n"
        "  --session NAME          Resume session NAME (or start it) and save it after\n"
        "                          every task. Interactive mode always saves, by\n"
        "                          default under a new date-time name.\n"
        "  --sessions-dir DIR      Where sessions live. Default:\n"
        "                          $XDG_STATE_HOME/ds4-agent/sessions or\n"
        "                          ~/.local/state/ds4-agent/sessions\n"
        "  --tools SET             coding (read write edit list glob search shell) or\n"
        "                          demo (get_weather add get_time, the tools the demo\n"
        "                          model knows). Default: demo for models/ds4-demo.gguf,\n"
        "                          else coding.\n"
        "  --max-steps N           Model turns per task before giving up. Default: 50\n"
        "  --cmd-timeout S         Seconds a command may run (the model may ask for\n"
        "                          less). Default: 120\n"
        "  --output-cap BYTES      Bytes of one tool result given to the model (head and\n"
        "                          tail kept). Default: 32768\n"
        "  --compact-at F          Summarise older turns when the session would pass\n"
        "                          F x ctx tokens. Default: 0.85\n"
        "  --trace FILE            Append every prefilled text, generation and tool\n"
        "                          call to FILE.\n"
        "\n"
        "Model, machine, sampling (as in ds4 --help):\n"
        "  -m, --model FILE        GGUF model. Default: ./ds4flash.gguf, else the demo\n"
        "                          model models/ds4-demo.gguf\n"
        "  --ctx N                 Context size in tokens. Default: 32768\n"
        "  -t, --threads N   --cpu   --cuda   --gpu-device N\n"
        "  -sys, --system TEXT     Replace the agent's system prompt.\n"
        "  -n, --tokens N          Maximum tokens per model turn. Default: 16384\n"
        "  --think | --think-max | --nothink   Reasoning mode. Default: --think\n"
        "  --temp F  --top-p F  --top-k N  --min-p F  --seed N\n"
        "  --dir-steering-file F  --dir-steering-ffn S  --dir-steering-attn S  --power N   as in ds4\n"
        "  -h, --help              This help.\n"
        "\n"
        "Interactive commands: /help /sessions /new [NAME] /switch NAME /save [NAME]\n"
        "/compact /think /nothink /quit. Ctrl-C stops the answer or the running\n"
        "command and returns to the prompt. Reasoning is shown dimmed; tool calls\n"
        "and their results are echoed; speeds go to stderr. See docs/AGENT.md.\n",
        f);
}

const char *agent_options_parse(agent_options *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    ds4_cli_options_default(&o->cli);
    o->cli.n_predict = 16384;
    o->workspace = ".";
    o->max_steps = 50;
    o->cmd_timeout_s = 120;
    o->output_cap = 32768;
    o->compact_at = 0.85;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return "out of memory";
    int nr = 0;
    rest[nr++] = argv[0];
    const char *err = NULL;
    for (int i = 1; i < argc && !err; i++) {
        const char *a = argv[i];
#define IS(x) (strcmp(a, x) == 0)
#define VALUE()                                                                                   \
    (i + 1 < argc ? argv[++i] : (snprintf(g_err, sizeof g_err, "%s needs a value", a), err = g_err, (char *)NULL))
        long lv;
        const char *v;
        if (IS("-h") || IS("--help")) o->help = true;
        else if (IS("--non-interactive")) o->non_interactive = true;
        else if (IS("-y") || IS("--yes")) o->yes = true;
        else if (IS("--workspace")) { if ((v = VALUE())) o->workspace = v; }
        else if (IS("--trace")) { if ((v = VALUE())) o->trace = v; }
        else if (IS("--session")) { if ((v = VALUE())) o->session = v; }
        else if (IS("--sessions-dir")) { if ((v = VALUE())) o->sessions_dir = v; }
        else if (IS("--tools")) {
            if ((v = VALUE())) {
                o->toolset = v;
                if (strcmp(v, "coding") && strcmp(v, "demo"))
                    err = (snprintf(g_err, sizeof g_err, "--tools %s: not coding or demo", v), g_err);
            }
        } else if (IS("--test-script")) { if ((v = VALUE())) o->test_script = v; }
        else if (IS("--max-steps") || IS("--cmd-timeout") || IS("--output-cap")) {
            if ((v = VALUE())) {
                long hi = IS("--output-cap") ? (1L << 26) : 100000;
                if (!ds4_cli_parse_long(v, IS("--output-cap") ? 256 : 1, hi, &lv))
                    err = (snprintf(g_err, sizeof g_err, "invalid value for %s: '%s'", a, v), g_err);
                else if (IS("--max-steps")) o->max_steps = (int)lv;
                else if (IS("--cmd-timeout")) o->cmd_timeout_s = (int)lv;
                else o->output_cap = lv;
            }
        } else if (IS("--compact-at")) {
            if ((v = VALUE())) {
                char *end;
                double f = strtod(v, &end);
                if (!*v || *end || !isfinite(f) || f < 0.1 || f > 1.0)
                    err = (snprintf(g_err, sizeof g_err, "invalid value for --compact-at: '%s' (0.1 .. 1)", v), g_err);
                o->compact_at = f;
            }
        } else if (IS("--raw-prompt") || IS("--dump-tokens") || IS("--dump-logprobs") || IS("--dump-logits") ||
                   IS("--logprobs-top-k")) {
            err = (snprintf(g_err, sizeof g_err, "%s is a ds4 option, not one of ds4-agent (see ds4 --help)", a), g_err);
        } else {
            rest[nr++] = argv[i];
        }
#undef IS
#undef VALUE
    }
    if (!err) {
        const char *ce = ds4_cli_options_parse(&o->cli, nr, rest);
        if (ce) {
            /* the CLI's message points at ds4 --help; ours at ds4-agent --help */
            const char *p = strstr(ce, "ds4 --help");
            if (p) snprintf(g_err, sizeof g_err, "%.*sds4-agent%s", (int)(p - ce), ce, p + 3);
            else snprintf(g_err, sizeof g_err, "%s", ce);
            err = g_err;
        }
        if (o->cli.help) o->help = true;
    }
    free(rest);
    return err;
}
