/*
 * cli_printer.c - reasoning/answer printing (see cli_printer.h).
 */
#include "cli/cli_printer.h"

void ds4_cli_printer_init(ds4_cli_printer *p, FILE *out, bool color, bool show_reasoning)
{
    p->out = out;
    p->color = color;
    p->show_reasoning = show_reasoning;
    p->in_reasoning = false;
    p->wrote_any = false;
    p->last_newline = true;
}

static void write_text(ds4_cli_printer *p, const char *s, size_t n)
{
    if (!n) return;
    fwrite(s, 1, n, p->out);
    p->last_newline = s[n - 1] == '\n';
    p->wrote_any = true;
    fflush(p->out);
}

static void end_reasoning(ds4_cli_printer *p)
{
    if (!p->in_reasoning) return;
    p->in_reasoning = false;
    if (!p->show_reasoning) return;
    if (p->color) fputs("\x1b[0m", p->out);
    if (!p->last_newline) fputc('\n', p->out);
    if (!p->color) fputs("</think>\n", p->out);
    p->last_newline = true;
    fflush(p->out);
}

void ds4_cli_printer_event(void *printer, const ds4_gen_event *ev)
{
    ds4_cli_printer *p = printer;
    switch (ev->kind) {
    case DS4_GEN_REASONING:
        if (!p->in_reasoning) {
            p->in_reasoning = true;
            if (p->show_reasoning) fputs(p->color ? "\x1b[2m" : "<think>\n", p->out);
        }
        if (p->show_reasoning) write_text(p, ev->text, ev->len);
        break;
    case DS4_GEN_CONTENT:
        end_reasoning(p);
        write_text(p, ev->text, ev->len);
        break;
    default: /* the CLI declares no tools */
        break;
    }
}

void ds4_cli_printer_finish(ds4_cli_printer *p)
{
    end_reasoning(p);
    if (!p->last_newline) fputc('\n', p->out);
    p->last_newline = true;
    fflush(p->out);
}
