/*
 * fuzz_dsml_output.c - libFuzzer target for the generated-text parser
 * (server/output_parser.c): reasoning / content / DSML tool-call events.
 *
 * Byte 0 sets thinking and tools mode and the feed step (1..16 bytes, to
 * hit every hold-back boundary); the rest is "model output". Seeds:
 * fuzz/corpus/dsml_output/.
 */
#include <stddef.h>
#include <stdint.h>

#include "server/output_parser.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void sink(void *ud, const out_event *ev)
{
    size_t *n = ud;
    *n += ev->len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t step = (size_t)(data[0] >> 4) + 1, total = 0;
    char *stops[1] = {"STOP"};
    out_parser *p = out_parser_new(data[0] & 1, data[0] & 2, "call_", stops, (data[0] & 4) ? 1 : 0, sink, &total);
    if (!p) return 0;
    for (size_t i = 1; i < size && !out_parser_done(p); i += step)
        out_parser_feed(p, (const char *)data + i, size - i < step ? size - i : step);
    out_parser_finish(p);
    for (size_t i = 0; i < out_parser_n_calls(p); i++) (void)out_parser_call(p, i)->arguments;
    out_parser_free(p);
    return 0;
}
