/*
 * cli_printer.h - printing a streamed answer: reasoning marked off from
 * the answer.
 *
 * Fed by the output parser's events (ds4_gen_parser). On a terminal the
 * reasoning is dimmed; otherwise it sits between a "<think>" line and a
 * "</think>" line, so piped output stays parseable. show_reasoning=false
 * hides it entirely.
 */
#ifndef DS4_CLI_PRINTER_H
#define DS4_CLI_PRINTER_H

#include "include/ds4_dsml.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct {
    FILE *out;
    bool color;          /* ANSI dim for reasoning */
    bool show_reasoning;
    bool in_reasoning;
    bool wrote_any;
    bool last_newline;
} ds4_cli_printer;

void ds4_cli_printer_init(ds4_cli_printer *p, FILE *out, bool color, bool show_reasoning);
/* ds4_gen_event_fn */
void ds4_cli_printer_event(void *printer, const ds4_gen_event *ev);
/* Close an open reasoning section and end the line. */
void ds4_cli_printer_finish(ds4_cli_printer *p);

#endif
