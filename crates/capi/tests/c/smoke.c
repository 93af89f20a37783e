/* A C program against include/turbospark.h, built and run by tests/capi.rs: it proves the header's
 * declarations and layouts match the library. argv[1]: model dir, argv[2]: prompt; the device is
 * $TS_DEVICE (default cpu). Prints the streamed deltas, then "\n--result--\n" and the result's
 * fields, one per line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "turbospark.h"

static int print_delta(const char *delta, size_t len, void *user) {
    size_t *calls = (size_t *)user;
    *calls += 1;
    if (strlen(delta) != len) return 1; /* the delta is NUL-terminated at len */
    fwrite(delta, 1, len, stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    char *error = NULL;
    ts_engine *engine = NULL;
    const char *bad_keys[] = {"device", "colour"};
    const char *bad_values[] = {"cpu", "blue"};
    if (ts_engine_open(argv[1], bad_keys, bad_values, 2, &engine, &error) != TS_INVALID_ARGUMENT) return 3;
    printf("bad option: %s\n", error);
    ts_string_free(error);

    const char *keys[] = {"device", "speculative"};
    const char *device = getenv("TS_DEVICE");
    const char *values[] = {device ? device : "cpu", "auto"};
    if (ts_engine_open(argv[1], keys, values, 2, &engine, &error) != TS_OK) {
        fprintf(stderr, "open: %s\n", error);
        return 4;
    }
    char *describe = ts_engine_describe(engine);
    fprintf(stderr, "%s\n%s\n", ts_version(), describe);
    ts_string_free(describe);

    ts_params params;
    ts_params_init(&params);
    params.max_tokens = 24;
    size_t calls = 0;
    ts_result result;
    if (ts_generate(engine, argv[2], &params, print_delta, &calls, &result, &error) != TS_OK) {
        fprintf(stderr, "generate: %s\n", error);
        return 5;
    }
    printf("\n--result--\n%s\n%s\n%zu\n%zu\n%zu\n", result.text, result.finish_reason, result.n_tokens,
           result.prompt_tokens, calls);
    ts_result_free(&result);

    params.temperature = -1.0;
    if (ts_generate(engine, argv[2], &params, NULL, NULL, &result, &error) != TS_INVALID_ARGUMENT) return 6;
    printf("%s\n", error);
    ts_string_free(error);
    ts_engine_free(engine);
    return 0;
}
