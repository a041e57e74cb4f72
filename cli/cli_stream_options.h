/*
 * cli_stream_options.h - the expert streaming and expert profile flags,
 * shared by every front end that opens a model (ds4, --dump-logits,
 * ds4-bench, ds4-server), parsed into ds4_model_options:
 *
 *   --ssd-streaming                      stream the routed experts
 *   --ssd-streaming-cache-experts N|NGB  cache size: N experts, or N GiB
 *   --ssd-streaming-preload-experts N    hot-list entries to read at start
 *   --ssd-streaming-cold                 start with an empty cache
 *   --ssd-streaming-hotlist FILE         preload this list, not the built-in one
 *   --ssd-streaming-evict lru|freq       eviction policy
 *   --expert-profile FILE                count expert selections into FILE
 *   --gpu-expert-cache N|NGB             CUDA: N experts / N GiB of them in VRAM
 *   --warm-weights                       read every weight page at open
 *   --tensor-parallel N                  split the layers over N ranks
 *   --gpu-devices LIST                   the ranks' CUDA devices
 */
#ifndef DS4_CLI_STREAM_OPTIONS_H
#define DS4_CLI_STREAM_OPTIONS_H

#include "include/ds4.h"

#include <stdbool.h>
#include <stdio.h>

/* If argv[*i] is one of the flags: parse it (and its value, advancing *i)
 * and return 1, or return -1 with *err set to a message naming the flag
 * and the bad value. 0 when argv[*i] is none of them. */
int ds4_cli_stream_option(ds4_model_options *o, int argc, char **argv, int *i, const char **err);

/* After parsing: a streaming flag without --ssd-streaming is an error. */
const char *ds4_cli_stream_check(const ds4_model_options *o);

/* The help lines of the flags. */
void ds4_cli_stream_help(FILE *f);

#endif
