/*
 * dump_logits.h - `ds4 --dump-logits`: run a token sequence through the
 * model and write every position's logits (for golden tests and checks).
 */
#ifndef DS4_CLI_DUMP_LOGITS_H
#define DS4_CLI_DUMP_LOGITS_H

/* Parses its own options from the whole ds4 command line:
 *   -m MODEL --token-ids FILE --dump-logits OUT [--numerics hf|official|auto]
 *   [--prefill-chunk N] [--decode-from K] [--threads N]
 * Returns the process exit code (0 ok, 1 failure, 2 usage). */
int ds4_cli_dump_logits(int argc, char **argv);

#endif
