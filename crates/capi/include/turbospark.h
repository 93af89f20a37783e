/* turbospark C API (ABI version 1): load a Hugging Face checkpoint, generate with lossless speculative
 * decoding, stream UTF-8 text through a callback.
 *
 * Link: -lturbospark (libturbospark.so, built by `cargo build --release -p capi`).
 *
 * Conventions:
 * - Every fallible call returns a ts_status; on failure, when `error` is not NULL, *error receives a
 *   message naming what is wrong and where (the option key, the parameter, the file), to be released
 *   with ts_string_free. Nothing panics across this boundary.
 * - An engine serves one generation at a time (calls on one engine are serialised); ts_cancel may be
 *   called from any thread. On CUDA, use an engine from the thread that opened it.
 * - Generations on one engine share one session: a prompt that extends the previous one (the next chat
 *   turn) prefills only its new tokens (ts_result.cached_tokens).
 * - At temperature 0 the output is the model's greedy continuation whether or not it speculates.
 */
#ifndef TURBOSPARK_H
#define TURBOSPARK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_ABI_VERSION 1

typedef struct ts_engine ts_engine;

typedef enum ts_status {
    TS_OK = 0,
    TS_INVALID_ARGUMENT = 1, /* an option, parameter or argument is invalid; the error names it */
    TS_LOAD_FAILED = 2,      /* the checkpoint could not be loaded; the error names the file */
    TS_UNAVAILABLE = 3,      /* the device or the named speculation cannot be served here */
    TS_GENERATION_FAILED = 4,
    TS_INTERNAL = 5,         /* a bug in turbospark, caught at the boundary */
    TS_BUSY = 6              /* a call on an engine from inside its own delta callback */
} ts_status;

/* Sampling and stopping parameters. Initialise with ts_params_init, then change fields. */
typedef struct ts_params {
    uint32_t size;        /* sizeof(ts_params): set by ts_params_init */
    uint32_t max_tokens;  /* most tokens to generate, a stop token included (default 128) */
    double temperature;   /* 0 = greedy (default) */
    uint32_t top_k;       /* 0 = off */
    double top_p;         /* (0, 1], 1 = off */
    double min_p;         /* [0, 1], 0 = off */
    double repetition_penalty; /* > 0, 1 = off */
    double presence_penalty;   /* [-2, 2], 0 = off */
    double frequency_penalty;  /* [-2, 2], 0 = off */
    uint64_t seed;        /* a seeded sampled run reproduces exactly */
    const char *const *stop;   /* stop strings (UTF-8): the match and what follows are never emitted */
    size_t n_stop;
    const uint32_t *stop_token_ids; /* in addition to the model's EOS ids */
    size_t n_stop_token_ids;
} ts_params;

/* What a generation produced. Release with ts_result_free. */
typedef struct ts_result {
    char *text;                /* NUL-terminated UTF-8: exactly the concatenation of the deltas */
    size_t text_len;           /* its length in bytes (the text itself may hold a NUL) */
    uint32_t *token_ids;       /* the generated ids, a stop token included */
    size_t n_tokens;
    size_t prompt_tokens;
    size_t cached_tokens;      /* prompt tokens the session already held (not prefilled) */
    const char *finish_reason; /* static: "stop", "length" or "cancelled" */
    double prefill_seconds;
    double decode_seconds;
    size_t draft_proposed;     /* speculative runs: draft tokens proposed / accepted */
    size_t draft_accepted;
} ts_result;

/* Receives each new piece of text: `len` bytes of whole UTF-8 characters (NUL-terminated, valid only
 * during the call). Return 0 to go on, non-zero to cancel the generation. It is called on one of the
 * engine's kernel threads while the caller of ts_generate / ts_chat waits; calling ts_generate or
 * ts_chat on the same engine from inside it returns TS_BUSY. */
typedef int (*ts_delta_fn)(const char *delta, size_t len, void *user);

/* "turbospark X.Y.Z (ABI 1)". Static. */
const char *ts_version(void);

/* Fills `params` with the defaults (greedy, 128 tokens, no stops). */
void ts_params_init(ts_params *params);

/* Opens the checkpoint directory `model_dir` (config.json, *.safetensors, tokenizer.json, ...), or a
 * GGUF file (`.gguf`, or the first file of a split `-00001-of-0000N.gguf` set).
 * Options, as key/value strings (n_options may be 0): "device" cpu|cuda|auto (default auto),
 * "speculative" auto|off|N (default auto), "drafter" auto|mtp|dflash|ngram|suffix (default auto), "threads" N (this engine's own kernel threads; default
 * one per core), "ngram_min" / "ngram_max" N (prompt lookup's n-gram sizes, 1..=64; default 1 and 3),
 * "suffix_memory" N (the suffix drafter's bound in indexed tokens, 256..=1048576; default 32768),
 * "quantize" q8_0|q4_k|fp8 (quantize a bf16/f32 checkpoint's weight matrices at load).
 * A named speculative block the checkpoint cannot serve is TS_UNAVAILABLE, not a silent downgrade. */
ts_status ts_engine_open(const char *model_dir, const char *const *keys, const char *const *values,
                         size_t n_options, ts_engine **engine, char **error);

/* One line describing the engine: device, speculation mode, context. Release with ts_string_free. */
char *ts_engine_describe(const ts_engine *engine);

void ts_engine_free(ts_engine *engine);

/* Continues `prompt` (UTF-8). `on_delta` may be NULL. On TS_OK, *result holds the outcome. */
ts_status ts_generate(ts_engine *engine, const char *prompt, const ts_params *params,
                      ts_delta_fn on_delta, void *user, ts_result *result, char **error);

/* Renders the conversation (roles[i], contents[i]) with the model's chat template, opens the
 * assistant's turn and generates it. */
ts_status ts_chat(ts_engine *engine, const char *const *roles, const char *const *contents,
                  size_t n_messages, const ts_params *params, ts_delta_fn on_delta, void *user,
                  ts_result *result, char **error);

/* Cancels the generation running on `engine`, if any (from any thread). */
void ts_cancel(ts_engine *engine);

void ts_result_free(ts_result *result);
void ts_string_free(char *s);

#ifdef __cplusplus
}
#endif
#endif
