/*
 * fuzz_http_request.c - libFuzzer target for ds4-server's request parser.
 *
 * The first byte picks the API (chat, completions, responses, messages);
 * the rest is the HTTP body. A body that parses is also rendered into a
 * prompt (with and without thinking, with an exact-replay memory), so the
 * renderer sees every shape the parser lets through. Seeds:
 * fuzz/corpus/http_request/.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "server/api_request.h"
#include "server/prompt_render.h"
#include "server/tool_memory.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static tool_memory *mem;
    if (!mem) mem = tool_memory_new(64);
    api_kind kind = (api_kind)(data[0] % 4);
    api_request r;
    api_error e;
    if (api_request_parse(kind, (const char *)data + 1, size - 1, &r, &e) != 0) return 0;
    for (int mode = 0; mode < 2; mode++) {
        render_opts o = {mode == 1, mode == 1 && r.think_max, true, mem};
        size_t len;
        char *p = prompt_render(&r, &o, &len, NULL);
        free(p);
    }
    api_request_free(&r);
    return 0;
}
