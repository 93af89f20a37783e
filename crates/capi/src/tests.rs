//! The C ABI on the embedded testbed (CPU), against the runtime driven directly: greedy output through
//! `ts_generate` / `ts_chat` is `runtime::generate`'s sequential output (the engine speculates with
//! `auto`), the streamed deltas concatenate to the result's text, a callback can cancel, chat turns
//! reuse the session's prefix, and every refusal names what is wrong. The C program
//! built against the header is tests/c_program.rs.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;

use ts::runtime::{self, Engine};
use ts::{CancelFlag, ChatMessage, Device, DrafterRequest, GenerationConfig, Speculation};

use crate::*;

fn testbed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed")
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// Takes an error string the library returned.
unsafe fn take(error: *mut c_char) -> String {
    assert!(!error.is_null(), "no error message");
    let text = CStr::from_ptr(error).to_str().unwrap().to_string();
    ts_string_free(error);
    text
}

/// Opens `dir` with key/value options: the status, the engine, the error message.
unsafe fn open(dir: &Path, options: &[(&str, &str)]) -> (TsStatus, *mut TsEngine, String) {
    let keys: Vec<CString> = options.iter().map(|(k, _)| cstr(k)).collect();
    let values: Vec<CString> = options.iter().map(|(_, v)| cstr(v)).collect();
    let kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
    let vp: Vec<*const c_char> = values.iter().map(|v| v.as_ptr()).collect();
    let dir = cstr(dir.to_str().unwrap());
    let mut engine = ptr::null_mut();
    let mut error = ptr::null_mut();
    let status = ts_engine_open(
        dir.as_ptr(),
        kp.as_ptr(),
        vp.as_ptr(),
        options.len(),
        &mut engine,
        &mut error,
    );
    let message = if status == TsStatus::Ok {
        String::new()
    } else {
        take(error)
    };
    (status, engine, message)
}

fn params(max_tokens: u32) -> TsParams {
    let mut p = std::mem::MaybeUninit::<TsParams>::uninit();
    unsafe {
        ts_params_init(p.as_mut_ptr());
        let mut p = p.assume_init();
        p.max_tokens = max_tokens;
        p
    }
}

/// The deltas a callback saw, and after how many it cancels (0: never).
struct Seen {
    deltas: Vec<String>,
    cancel_after: usize,
}

unsafe extern "C" fn on_delta(delta: *const c_char, len: usize, user: *mut c_void) -> c_int {
    let seen = &mut *(user as *mut Seen);
    let bytes = std::slice::from_raw_parts(delta as *const u8, len);
    assert_eq!(*delta.add(len), 0, "deltas are NUL-terminated");
    seen.deltas
        .push(std::str::from_utf8(bytes).unwrap().to_string());
    c_int::from(seen.cancel_after != 0 && seen.deltas.len() >= seen.cancel_after)
}

/// A finished result's text, ids and finish reason (freeing it).
unsafe fn finish(r: &mut TsResult) -> (String, Vec<u32>, String) {
    let text = std::str::from_utf8(std::slice::from_raw_parts(r.text as *const u8, r.text_len))
        .unwrap()
        .to_string();
    let ids = std::slice::from_raw_parts(r.token_ids, r.n_tokens).to_vec();
    let reason = CStr::from_ptr(r.finish_reason)
        .to_str()
        .unwrap()
        .to_string();
    ts_result_free(r);
    (text, ids, reason)
}

fn reference(prompt_text: &str, max: usize) -> runtime::GenerationResult {
    let engine = Engine::open_on(&testbed(), Device::Cpu).unwrap();
    let mut session = engine
        .prepare(Speculation::Off, DrafterRequest::Auto)
        .unwrap()
        .session;
    let prompt = engine.encode(prompt_text).unwrap();
    let config = GenerationConfig::greedy(max);
    let request = runtime::Request {
        prompt: &prompt,
        config: &config,
        eos: &engine.eos,
        detok: &engine.tokenizer,
        speculative: None,
        cancel: CancelFlag::new(),
    };
    runtime::generate(&engine.model, &mut session, &request, &mut |_| {}).unwrap()
}

fn render(messages: &[ChatMessage]) -> String {
    let engine = Engine::open_on(&testbed(), Device::Cpu).unwrap();
    let options = runtime::RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    engine.chat.unwrap().render(messages, &options).unwrap()
}

const PROMPT: &str = "def fibonacci(n):";

#[test]
fn generate_streams_the_runtimes_greedy_output_and_can_cancel() {
    let want = reference(PROMPT, 40);
    unsafe {
        let (status, engine, message) = open(&testbed(), &[("device", "cpu")]);
        assert_eq!(status, TsStatus::Ok, "{message}");
        let describe = take(ts_engine_describe(engine));
        assert!(
            describe.contains("mtp"),
            "speculates with the MTP head: {describe}"
        );
        let prompt = cstr(PROMPT);
        let p = params(40);
        let mut seen = Seen {
            deltas: Vec::new(),
            cancel_after: 0,
        };
        let mut result = std::mem::zeroed::<TsResult>();
        let mut error = ptr::null_mut();
        let status = ts_generate(
            engine,
            prompt.as_ptr(),
            &p,
            Some(on_delta),
            &mut seen as *mut Seen as *mut c_void,
            &mut result,
            &mut error,
        );
        assert_eq!(status, TsStatus::Ok);
        assert!(result.draft_proposed > 0, "the engine speculated");
        assert_eq!(result.prompt_tokens, want.prompt_tokens);
        let (text, ids, reason) = finish(&mut result);
        assert_eq!(text, want.text);
        assert_eq!(ids, want.token_ids);
        assert_eq!(reason, "length");
        assert_eq!(seen.deltas.concat(), text);

        // A callback that returns non-zero after its third delta cancels the run there.
        let mut seen = Seen {
            deltas: Vec::new(),
            cancel_after: 3,
        };
        let unrelated = cstr("The quick brown fox");
        let status = ts_generate(
            engine,
            unrelated.as_ptr(),
            &params(200),
            Some(on_delta),
            &mut seen as *mut Seen as *mut c_void,
            &mut result,
            &mut error,
        );
        assert_eq!(status, TsStatus::Ok);
        let (text, ids, reason) = finish(&mut result);
        assert_eq!(reason, "cancelled");
        assert!(ids.len() < 200, "{} tokens", ids.len());
        assert_eq!(seen.deltas.concat(), text);
        ts_engine_free(engine);
    }
}

#[test]
fn chat_turns_reuse_the_session() {
    let mut messages = vec![ChatMessage::new(
        "user",
        "Write a function that adds two numbers.",
    )];
    let want1 = reference(&render(&messages), 24);
    unsafe {
        let (status, engine, message) =
            open(&testbed(), &[("device", "cpu"), ("speculative", "off")]);
        assert_eq!(status, TsStatus::Ok, "{message}");
        let turn = |messages: &[ChatMessage]| {
            let roles: Vec<CString> = messages.iter().map(|m| cstr(&m.role)).collect();
            let contents: Vec<CString> = messages.iter().map(|m| cstr(&m.content)).collect();
            let rp: Vec<*const c_char> = roles.iter().map(|s| s.as_ptr()).collect();
            let cp: Vec<*const c_char> = contents.iter().map(|s| s.as_ptr()).collect();
            let mut result = std::mem::zeroed::<TsResult>();
            let mut error = ptr::null_mut();
            let status = ts_chat(
                engine,
                rp.as_ptr(),
                cp.as_ptr(),
                messages.len(),
                &params(24),
                None,
                ptr::null_mut(),
                &mut result,
                &mut error,
            );
            assert_eq!(status, TsStatus::Ok);
            let cached = result.cached_tokens;
            (finish(&mut result).0, cached)
        };
        let (text1, cached1) = turn(&messages);
        assert_eq!(text1, want1.text);
        assert_eq!(cached1, 0);
        messages.push(ChatMessage::new("assistant", text1));
        messages.push(ChatMessage::new("user", "Now make it subtract."));
        let want2 = reference(&render(&messages), 24);
        let (text2, cached2) = turn(&messages);
        assert_eq!(text2, want2.text);
        assert!(cached2 > 0, "the second turn reused its prefix");
        ts_engine_free(engine);
    }
}

#[test]
fn refusals_name_what_is_wrong() {
    unsafe {
        for (options, status, needle) in [
            (
                vec![("colour", "blue")],
                TsStatus::InvalidArgument,
                "colour",
            ),
            (vec![("device", "tpu")], TsStatus::InvalidArgument, "device"),
            (
                vec![("speculative", "0")],
                TsStatus::InvalidArgument,
                "speculative",
            ),
            (vec![("threads", "0")], TsStatus::InvalidArgument, "threads"),
        ] {
            let (got, engine, message) = open(&testbed(), &options);
            assert_eq!(got, status, "{options:?}: {message}");
            assert!(engine.is_null());
            assert!(message.contains(needle), "{options:?}: {message}");
        }
        let (got, _, message) = open(Path::new("/nonexistent/ts-model"), &[]);
        assert_eq!(got, TsStatus::LoadFailed, "{message}");
        assert!(message.contains("/nonexistent/ts-model"), "{message}");
        // A named block of a drafter the checkpoint lacks: refused, not downgraded (without a drafter
        // named, `auto` is the suffix drafter, which needs no weights).
        let dense = testdata::fixture("qwen3_realtok");
        let options = [("device", "cpu"), ("speculative", "3"), ("drafter", "mtp")];
        let (got, _, message) = open(&dense, &options);
        assert_eq!(got, TsStatus::Unavailable, "{message}");
        assert!(
            message.contains("speculative") && message.contains("MTP head"),
            "{message}"
        );

        let (status, engine, message) = open(&testbed(), &[("device", "cpu")]);
        assert_eq!(status, TsStatus::Ok, "{message}");
        let mut result = std::mem::zeroed::<TsResult>();
        let generate = |prompt: *const c_char, p: *const TsParams, result: &mut TsResult| {
            let mut error = ptr::null_mut();
            let status = ts_generate(engine, prompt, p, None, ptr::null_mut(), result, &mut error);
            (
                status,
                if status == TsStatus::Ok {
                    String::new()
                } else {
                    take(error)
                },
            )
        };
        let prompt = cstr(PROMPT);
        let bad_utf8 = CString::new(vec![b'a', 0xff, b'b']).unwrap();
        let with = |edit: fn(&mut TsParams)| {
            let mut p = params(8);
            edit(&mut p);
            p
        };
        let cases: [(*const c_char, TsParams, &str); 6] = [
            (
                prompt.as_ptr(),
                with(|p| p.temperature = -1.0),
                "temperature",
            ),
            (prompt.as_ptr(), with(|p| p.size = 8), "ts_params.size"),
            (prompt.as_ptr(), with(|p| p.n_stop = 2), "ts_params.stop"),
            (ptr::null(), params(8), "prompt"),
            (bad_utf8.as_ptr(), params(8), "UTF-8"),
            (prompt.as_ptr(), params(5000), "max_tokens"),
        ];
        for (text, p, needle) in cases {
            let (s, m) = generate(text, &p, &mut result);
            assert_eq!(s, TsStatus::InvalidArgument, "{needle}: {m}");
            assert!(m.contains(needle), "{needle}: {m}");
        }
        // Nothing was lost: the engine still serves; NULL parameters are the defaults (greedy, 128).
        let (s, m) = generate(prompt.as_ptr(), ptr::null(), &mut result);
        assert_eq!(s, TsStatus::Ok, "{m}");
        assert_eq!(finish(&mut result).1, reference(PROMPT, 128).token_ids);
        ts_engine_free(engine);
    }
}

/// What the re-entrant callback saw: the engine it calls back into and that call's status.
struct Reentry {
    engine: *mut TsEngine,
    status: Option<TsStatus>,
    message: String,
}

unsafe extern "C" fn reenter(_delta: *const c_char, _len: usize, user: *mut c_void) -> c_int {
    let r = &mut *(user as *mut Reentry);
    if r.status.is_none() {
        let prompt = cstr("again");
        let p = params(2);
        let mut result = std::mem::zeroed::<TsResult>();
        let mut error = ptr::null_mut();
        let status = ts_generate(
            r.engine,
            prompt.as_ptr(),
            &p,
            None,
            ptr::null_mut(),
            &mut result,
            &mut error,
        );
        r.status = Some(status);
        if status != TsStatus::Ok {
            r.message = take(error);
        }
    }
    0
}

#[test]
fn a_call_from_inside_the_callback_is_refused_not_deadlocked() {
    unsafe {
        let (status, engine, message) = open(&testbed(), &[("device", "cpu")]);
        assert_eq!(status, TsStatus::Ok, "{message}");
        let mut seen = Reentry {
            engine,
            status: None,
            message: String::new(),
        };
        let prompt = cstr(PROMPT);
        let p = params(4);
        let mut result = std::mem::zeroed::<TsResult>();
        let mut error = ptr::null_mut();
        let status = ts_generate(
            engine,
            prompt.as_ptr(),
            &p,
            Some(reenter),
            &mut seen as *mut Reentry as *mut c_void,
            &mut result,
            &mut error,
        );
        assert_eq!(status, TsStatus::Ok);
        assert_eq!(seen.status, Some(TsStatus::Busy), "{}", seen.message);
        assert!(seen.message.contains("callback"), "{}", seen.message);
        finish(&mut result);
        ts_engine_free(engine);
    }
}

#[test]
fn each_engine_has_its_own_thread_count() {
    unsafe {
        let mut engines = Vec::new();
        for threads in ["1", "2", "3"] {
            let (status, engine, message) =
                open(&testbed(), &[("device", "cpu"), ("threads", threads)]);
            assert_eq!(status, TsStatus::Ok, "threads {threads}: {message}");
            let describe = ts_engine_describe(engine);
            let text = CStr::from_ptr(describe).to_str().unwrap().to_string();
            ts_string_free(describe);
            assert!(text.ends_with(&format!(", {threads} threads")), "{text}");
            engines.push(engine);
        }
        // All three generate the same greedy text whatever their pool.
        let want = reference(PROMPT, 12).text;
        for &engine in &engines {
            let prompt = cstr(PROMPT);
            let p = params(12);
            let mut result = std::mem::zeroed::<TsResult>();
            let mut error = ptr::null_mut();
            let status = ts_generate(
                engine,
                prompt.as_ptr(),
                &p,
                None,
                ptr::null_mut(),
                &mut result,
                &mut error,
            );
            assert_eq!(status, TsStatus::Ok);
            assert_eq!(finish(&mut result).0, want);
            ts_engine_free(engine);
        }
    }
}

/// The `drafter` option names prompt lookup: it serves a checkpoint with no drafter weights (dense
/// Qwen3), keeps the greedy output, and copies a prompt that repeats itself on the testbed.
#[test]
fn the_drafter_option_selects_prompt_lookup_on_any_checkpoint() {
    unsafe {
        let generate_ids = |engine: *mut TsEngine, text: &str, max: u32| {
            let prompt = cstr(text);
            let mut result = std::mem::zeroed::<TsResult>();
            let mut error = ptr::null_mut();
            let status = ts_generate(
                engine,
                prompt.as_ptr(),
                &params(max),
                None,
                ptr::null_mut(),
                &mut result,
                &mut error,
            );
            assert_eq!(status, TsStatus::Ok);
            let counts = (result.draft_proposed, result.draft_accepted);
            (finish(&mut result).1, counts)
        };
        let dense = testdata::fixture("qwen3_realtok");
        let (status, sequential, message) =
            open(&dense, &[("device", "cpu"), ("speculative", "off")]);
        assert_eq!(status, TsStatus::Ok, "{message}");
        let options = [
            ("device", "cpu"),
            ("speculative", "3"),
            ("drafter", "ngram"),
        ];
        let (status, engine, message) = open(&dense, &options);
        assert_eq!(status, TsStatus::Ok, "{message}");
        let describe = take(ts_engine_describe(engine));
        assert!(describe.contains("ngram"), "{describe}");
        let text = "one two three one two three one two";
        let (want, _) = generate_ids(sequential, text, 24);
        let (got, _) = generate_ids(engine, text, 24);
        assert_eq!(got, want);
        ts_engine_free(engine);
        ts_engine_free(sequential);

        // Both weight-free drafters, with their options.
        let weight_free: [&[(&str, &str)]; 3] = [
            &[("drafter", "ngram")],
            &[("drafter", "ngram"), ("ngram_min", "2"), ("ngram_max", "4")],
            &[("drafter", "suffix"), ("suffix_memory", "4096")],
        ];
        for options in weight_free {
            let options = [&[("device", "cpu")], options].concat();
            let (status, engine, message) = open(&testbed(), &options);
            assert_eq!(status, TsStatus::Ok, "{message}");
            let describe = take(ts_engine_describe(engine));
            assert!(describe.contains(options[1].1), "{describe}");
            let repeated = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n";
            let engine_ids = generate_ids(engine, repeated, 16);
            assert_eq!(engine_ids.0, reference(repeated, 16).token_ids);
            let (proposed, accepted) = engine_ids.1;
            assert!(
                accepted > 0,
                "{options:?}: {accepted} of {proposed} proposals accepted"
            );
            ts_engine_free(engine);
        }
        // Options out of range are refused naming the option key.
        let bad: [(&str, &str); 4] = [
            ("ngram_min", "0"),
            ("ngram_max", "100"),
            ("suffix_memory", "8"),
            ("suffix_memory", "many"),
        ];
        for (key, value) in bad {
            let (got, _, message) = open(&testbed(), &[("drafter", "suffix"), (key, value)]);
            assert_eq!(got, TsStatus::InvalidArgument, "{key}={value}: {message}");
            assert!(message.contains(&format!("`{key}`")), "{message}");
        }

        let (got, _, message) = open(&testbed(), &[("drafter", "eagle")]);
        assert_eq!(got, TsStatus::InvalidArgument, "{message}");
        assert!(
            message.contains("drafter") && message.contains("ngram"),
            "{message}"
        );
    }
}

/// The `quantize` option runs the checkpoint on the quantized kernels: with MTP speculation it gives
/// what the same quantized model gives sequentially; a value it does not know is TS_INVALID_ARGUMENT
/// naming the key.
#[test]
fn the_quantize_option_speculates_exactly() {
    unsafe {
        let generate_text = |engine: *mut TsEngine| {
            let prompt = cstr("The history of the");
            let mut result = std::mem::zeroed::<TsResult>();
            let mut error = ptr::null_mut();
            let status = ts_generate(
                engine,
                prompt.as_ptr(),
                &params(32),
                None,
                ptr::null_mut(),
                &mut result,
                &mut error,
            );
            assert_eq!(status, TsStatus::Ok);
            finish(&mut result).1
        };
        let (status, plain, message) =
            open(&testbed(), &[("quantize", "q4_k"), ("speculative", "off")]);
        assert_eq!(status, TsStatus::Ok, "{message}");
        let (status, spec, message) =
            open(&testbed(), &[("quantize", "q4_k"), ("speculative", "3")]);
        assert_eq!(status, TsStatus::Ok, "{message}");
        assert_eq!(generate_text(spec), generate_text(plain));
        ts_engine_free(spec);
        ts_engine_free(plain);
        let (status, _, message) = open(&testbed(), &[("quantize", "q2_k")]);
        assert_eq!(status, TsStatus::InvalidArgument);
        assert!(message.contains("`quantize`"), "{message}");
    }
}
