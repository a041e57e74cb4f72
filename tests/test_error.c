/* test_error.c - the error-message plumbing every module relies on. */
#include "tests/test.h"
#include "util/error.h"

#include <string.h>

static void test_fail_sets_message(void)
{
    ds4_status st = ds4_fail(DS4_ERR_FORMAT, "bad %s at offset %d", "key", 42);
    EXPECT(st == DS4_ERR_FORMAT);
    EXPECT(strcmp(ds4_last_error(), "bad key at offset 42") == 0);
    ds4_error_prefix("gguf: %s: ", "x.gguf");
    EXPECT(strcmp(ds4_last_error(), "gguf: x.gguf: bad key at offset 42") == 0);
    ds4_clear_error();
    EXPECT(ds4_last_error()[0] == '\0');
}

static void test_status_names(void)
{
    EXPECT(strcmp(ds4_status_name(DS4_OK), "ok") == 0);
    EXPECT(strcmp(ds4_status_name(DS4_ERR_NOMEM), "out of memory") == 0);
}

int main(void)
{
    RUN(test_fail_sets_message);
    RUN(test_status_names);
    return test_finish();
}
