//! The C ABI of turbospark (`include/turbospark.h`, ABI version 1): open a checkpoint, generate or
//! chat with streamed UTF-8 deltas through a callback, cancel from any thread.
//!
//! Boundary invariants: every exported function catches panics (`boundary`) and reports failures as a
//! `TsStatus` plus an owned message naming the option key, parameter or file at fault; every pointer
//! argument is checked for NULL and every string for UTF-8 before use; memory handed to C
//! (`ts_result`, messages) is released only by the matching `ts_*_free`. The generation itself is the
//! front door's (`turbospark::Model` + `Session`), so the C caller gets the CLI's and the server's
//! contract: the same stop rules, the same deltas, the same tokens.
//!
//! Threads: each engine runs its kernels on its own pool (option `threads`), and a generation runs on
//! one of that pool's threads while the caller of `ts_generate` / `ts_chat` waits, so the delta
//! callback is called on an engine thread. A call on an engine from inside its own callback is refused
//! with `TS_BUSY` (it would wait for itself); calls from other threads wait their turn.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr;
use std::sync::{Mutex, PoisonError};

use ts::runtime::RuntimeError;
use ts::{
    CancelFlag, ChatMessage, Device, DrafterOptions, DrafterRequest, Event, GenerationConfig,
    GenerationResult, Model, RenderOptions, Session, Shaping, Speculation,
};

/// `ts_status`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TsStatus {
    Ok = 0,
    InvalidArgument = 1,
    LoadFailed = 2,
    Unavailable = 3,
    GenerationFailed = 4,
    Internal = 5,
    Busy = 6,
}

/// `ts_params` (layout mirrored by the header).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TsParams {
    pub size: u32,
    pub max_tokens: u32,
    pub temperature: f64,
    pub top_k: u32,
    pub top_p: f64,
    pub min_p: f64,
    pub repetition_penalty: f64,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
    pub seed: u64,
    pub stop: *const *const c_char,
    pub n_stop: usize,
    pub stop_token_ids: *const u32,
    pub n_stop_token_ids: usize,
}

/// `ts_result` (layout mirrored by the header).
#[repr(C)]
#[derive(Debug)]
pub struct TsResult {
    pub text: *mut c_char,
    pub text_len: usize,
    pub token_ids: *mut u32,
    pub n_tokens: usize,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub finish_reason: *const c_char,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub draft_proposed: usize,
    pub draft_accepted: usize,
}

/// `ts_delta_fn`.
pub type TsDeltaFn = Option<unsafe extern "C" fn(*const c_char, usize, *mut c_void) -> c_int>;

/// `ts_engine`: the engine and its one session, and the flag of the generation running on it.
pub struct TsEngine {
    model: Model,
    session: Mutex<Session>,
    running: Mutex<Option<CancelFlag>>,
    describe: String,
}

/// A failure on its way to C: the status and the message.
struct Failure(TsStatus, String);

impl Failure {
    fn invalid(message: impl Into<String>) -> Self {
        Failure(TsStatus::InvalidArgument, message.into())
    }
}

impl From<RuntimeError> for Failure {
    fn from(e: RuntimeError) -> Self {
        let status = match &e {
            RuntimeError::InvalidRequest { .. } | RuntimeError::InvalidFlag { .. } => {
                TsStatus::InvalidArgument
            }
            RuntimeError::SpeculationUnavailable { .. } => TsStatus::Unavailable,
            RuntimeError::Device(d) if ts::device::is_unavailable(d.as_ref()) => {
                TsStatus::Unavailable
            }
            RuntimeError::Load(_) | RuntimeError::Io { .. } | RuntimeError::Config { .. } => {
                TsStatus::LoadFailed
            }
            _ => TsStatus::GenerationFailed,
        };
        Failure(status, e.to_string())
    }
}

impl From<ts::Error> for Failure {
    fn from(e: ts::Error) -> Self {
        match e {
            ts::Error::Runtime(e) => e.into(),
            other => Failure(TsStatus::InvalidArgument, other.to_string()),
        }
    }
}

/// Stores `message` in `*error` (when `error` is not NULL) as an owned C string.
unsafe fn set_error(error: *mut *mut c_char, message: &str) {
    if !error.is_null() {
        let bytes: Vec<u8> = message.bytes().filter(|&b| b != 0).collect();
        // No NUL is left in `bytes`, so this cannot fail.
        let owned = std::ffi::CString::new(bytes).unwrap_or_default();
        *error = owned.into_raw();
    }
}

/// Runs `f`, turning its failure or panic into a status and `*error`.
unsafe fn boundary(error: *mut *mut c_char, f: impl FnOnce() -> Result<(), Failure>) -> TsStatus {
    if !error.is_null() {
        *error = ptr::null_mut();
    }
    let (status, message) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return TsStatus::Ok,
        Ok(Err(Failure(status, message))) => (status, message),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            (
                TsStatus::Internal,
                format!("internal error (a bug in turbospark): {what}"),
            )
        }
    };
    set_error(error, &message);
    status
}

/// A UTF-8 string argument, or the failure naming `what`.
unsafe fn utf8<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::invalid(format!("`{what}` is NULL")));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|e| Failure::invalid(format!("`{what}` is not valid UTF-8: {e}")))
}

/// `n` elements at `p` (NULL is allowed only for n = 0).
unsafe fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T], Failure> {
    match (p.is_null(), n) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(Failure::invalid(format!(
            "`{what}` is NULL but its count is {n}"
        ))),
        (false, _) => Ok(std::slice::from_raw_parts(p, n)),
    }
}

fn defaults() -> TsParams {
    TsParams {
        size: std::mem::size_of::<TsParams>() as u32,
        max_tokens: 128,
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: 0,
        stop: ptr::null(),
        n_stop: 0,
        stop_token_ids: ptr::null(),
        n_stop_token_ids: 0,
    }
}

/// The request a `ts_params` describes (NULL: the defaults). Values are judged by the runtime's
/// admission, whose errors name the parameter.
unsafe fn config(params: *const TsParams) -> Result<GenerationConfig, Failure> {
    let p = if params.is_null() {
        defaults()
    } else {
        *params
    };
    if p.size as usize != std::mem::size_of::<TsParams>() {
        return Err(Failure::invalid(format!(
            "`ts_params.size` is {}, expected {}: initialise the parameters with ts_params_init",
            p.size,
            std::mem::size_of::<TsParams>()
        )));
    }
    let stop = slice(p.stop, p.n_stop, "ts_params.stop")?
        .iter()
        .enumerate()
        .map(|(i, &s)| utf8(s, &format!("ts_params.stop[{i}]")).map(str::to_string))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(GenerationConfig {
        max_new_tokens: p.max_tokens as usize,
        stop_token_ids: slice(
            p.stop_token_ids,
            p.n_stop_token_ids,
            "ts_params.stop_token_ids",
        )?
        .to_vec(),
        stop_strings: stop,
        shaping: Shaping {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
        },
        seed: p.seed,
        logprobs: None,
    })
}

/// The engine's options from key/value strings.
struct Options {
    device: Device,
    speculative: Speculation,
    drafter: DrafterRequest,
    threads: Option<usize>,
    /// From `ngram_min`, `ngram_max`, `suffix_memory`.
    drafter_options: DrafterOptions,
    quantize: Option<ts::model_io::Quantize>,
}

unsafe fn options(
    keys: *const *const c_char,
    values: *const *const c_char,
    n: usize,
) -> Result<Options, Failure> {
    let keys = slice(keys, n, "keys")?;
    let values = slice(values, n, "values")?;
    let mut o = Options {
        device: Device::Auto,
        speculative: Speculation::Auto,
        drafter: DrafterRequest::Auto,
        threads: None,
        drafter_options: DrafterOptions::default(),
        quantize: None,
    };
    // `ngram_min`, `ngram_max`, `suffix_memory` as given, checked together at the end.
    let mut sizes = [None; 3];
    for i in 0..n {
        let key = utf8(keys[i], &format!("keys[{i}]"))?;
        let value = utf8(values[i], &format!("values[{i}]"))?;
        let bad = |reason: String| {
            Failure::invalid(format!(
                "invalid value {value:?} for option `{key}`: {reason}"
            ))
        };
        let flag_reason = |e: RuntimeError| match e {
            RuntimeError::InvalidFlag { reason, .. } => reason,
            other => other.to_string(),
        };
        match key {
            "device" => {
                o.device = value
                    .parse()
                    .map_err(|_| bad("expected cpu, cuda or auto".into()))?
            }
            "speculative" => o.speculative = value.parse().map_err(|e| bad(flag_reason(e)))?,
            "drafter" => o.drafter = value.parse().map_err(|e| bad(flag_reason(e)))?,
            "quantize" => o.quantize = Some(value.parse().map_err(bad)?),
            "threads" => match value.parse::<usize>() {
                Ok(t) if t > 0 => o.threads = Some(t),
                _ => return Err(bad("expected a number of threads >= 1".into())),
            },
            "ngram_min" | "ngram_max" | "suffix_memory" => {
                let at = ["ngram_min", "ngram_max", "suffix_memory"]
                    .iter()
                    .position(|k| *k == key)
                    .unwrap_or(0);
                sizes[at] = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| bad("expected a whole number".into()))?,
                );
            }
            _ => {
                return Err(Failure::invalid(format!(
                    "unknown option key `{key}` (expected device, speculative, drafter, threads, \
                     quantize, ngram_min, ngram_max or suffix_memory)"
                )))
            }
        }
    }
    o.drafter_options = DrafterOptions::new(sizes[0], sizes[1], sizes[2]).map_err(|e| match e {
        // The runtime names the CLI flag; name the option key instead.
        RuntimeError::InvalidFlag {
            flag,
            value,
            reason,
        } => Failure::invalid(format!(
            "invalid value {value:?} for option `{}`: {reason}",
            flag.trim_start_matches("--").replace('-', "_")
        )),
        other => Failure::from(other),
    })?;
    Ok(o)
}

/// `ts_version`.
#[no_mangle]
pub extern "C" fn ts_version() -> *const c_char {
    concat!("turbospark ", env!("CARGO_PKG_VERSION"), " (ABI 1)\0").as_ptr() as *const c_char
}

/// `ts_params_init`.
///
/// # Safety
/// `params` is NULL or points to writable memory for a `ts_params`.
#[no_mangle]
pub unsafe extern "C" fn ts_params_init(params: *mut TsParams) {
    if !params.is_null() {
        params.write(defaults());
    }
}

/// `ts_engine_open`.
///
/// # Safety
/// Strings are NUL-terminated; `keys` / `values` hold `n_options` pointers; `engine` is writable.
#[no_mangle]
pub unsafe extern "C" fn ts_engine_open(
    model_dir: *const c_char,
    keys: *const *const c_char,
    values: *const *const c_char,
    n_options: usize,
    engine: *mut *mut TsEngine,
    error: *mut *mut c_char,
) -> TsStatus {
    boundary(error, || {
        if engine.is_null() {
            return Err(Failure::invalid("`engine` is NULL"));
        }
        *engine = ptr::null_mut();
        let dir = utf8(model_dir, "model_dir")?;
        let o = options(keys, values, n_options)?;
        let mut builder = Model::builder(Path::new(dir))
            .device(o.device)
            .speculation(o.speculative)
            .drafter(o.drafter)
            .drafter_options(o.drafter_options)
            .quantize(o.quantize);
        if let Some(threads) = o.threads {
            builder = builder.threads(threads);
        }
        let model = builder.build()?;
        let session = model
            .session()
            .map_err(|e| Failure::from(e).with_context("option `speculative` / `drafter`"))?;
        let describe = format!(
            "{} on {}, {}, context {}, {} threads",
            dir,
            model.device_name(),
            session.mode(),
            model.context(),
            model.threads()
        );
        *engine = Box::into_raw(Box::new(TsEngine {
            model,
            session: Mutex::new(session),
            running: Mutex::new(None),
            describe,
        }));
        Ok(())
    })
}

impl Failure {
    fn with_context(self, context: &str) -> Self {
        Failure(self.0, format!("{context}: {}", self.1))
    }
}

/// `ts_engine_describe`.
///
/// # Safety
/// `engine` is NULL or from `ts_engine_open`.
#[no_mangle]
pub unsafe extern "C" fn ts_engine_describe(engine: *const TsEngine) -> *mut c_char {
    let text = engine
        .as_ref()
        .map_or("(null engine)", |e| e.describe.as_str());
    let mut out = ptr::null_mut();
    set_error(&mut out, text);
    out
}

/// `ts_engine_free`.
///
/// # Safety
/// `engine` is NULL or from `ts_engine_open`, and not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ts_engine_free(engine: *mut TsEngine) {
    if !engine.is_null() {
        drop(Box::from_raw(engine));
    }
}

/// `ts_cancel`.
///
/// # Safety
/// `engine` is NULL or from `ts_engine_open`.
#[no_mangle]
pub unsafe extern "C" fn ts_cancel(engine: *mut TsEngine) {
    if let Some(e) = engine.as_ref() {
        if let Some(flag) = &*e.running.lock().unwrap_or_else(PoisonError::into_inner) {
            flag.cancel();
        }
    }
}

/// What to continue: text, or a conversation for the chat template.
enum Input {
    Text(String),
    Chat(Vec<ChatMessage>),
}

/// Runs one generation on `engine` and fills `result`.
unsafe fn run(
    engine: *mut TsEngine,
    input: Input,
    params: *const TsParams,
    on_delta: TsDeltaFn,
    user: *mut c_void,
    result: *mut TsResult,
) -> Result<(), Failure> {
    let e = engine
        .as_ref()
        .ok_or_else(|| Failure::invalid("`engine` is NULL"))?;
    if result.is_null() {
        return Err(Failure::invalid("`result` is NULL"));
    }
    let config = config(params)?;
    if e.model.is_pool_thread() {
        return Err(Failure(
            TsStatus::Busy,
            "this engine is generating: a call on it from inside its own delta callback would wait \
             for itself"
                .into(),
        ));
    }
    let mut session = e.session.lock().unwrap_or_else(PoisonError::into_inner);
    let text = match input {
        Input::Text(text) => text,
        Input::Chat(messages) => {
            if e.model.engine().chat.is_none() {
                return Err(Failure::invalid(
                    "the model has no chat template (chat_template.jinja or tokenizer_config.json's \
                     chat_template); use ts_generate",
                ));
            }
            let options = RenderOptions {
                add_generation_prompt: true,
                ..RenderOptions::default()
            };
            e.model
                .render_chat(&messages, &options)
                .map_err(|e| Failure::invalid(format!("`contents`: {e}")))?
        }
    };
    let prompt = e.model.encode(&text)?;
    let cancel = session.cancel_flag();
    *e.running.lock().unwrap_or_else(PoisonError::into_inner) = Some(cancel.clone());
    let callback = Callback { on_delta, user };
    let mut piece = Vec::new();
    let on_event = |event: Event<'_>| {
        if let (Event::Delta(text), Some(f)) = (event, callback.on_delta) {
            piece.clear();
            piece.extend_from_slice(text.as_bytes());
            piece.push(0);
            if f(piece.as_ptr() as *const c_char, text.len(), callback.user()) != 0 {
                cancel.cancel();
            }
        }
    };
    let outcome = session.generate_ids(&prompt, &config, on_event);
    *e.running.lock().unwrap_or_else(PoisonError::into_inner) = None;
    match outcome {
        Ok(r) => {
            result.write(to_c(r));
            Ok(())
        }
        Err(err) => {
            if !matches!(err.as_runtime(), Some(RuntimeError::InvalidRequest { .. })) {
                // A run that failed midway may leave a half-run state: the next one starts afresh.
                let _ = session.reset();
            }
            Err(err.into())
        }
    }
}

/// The caller's delta callback and its `user` pointer, handed to the engine thread that runs the
/// generation.
struct Callback {
    on_delta: TsDeltaFn,
    user: *mut c_void,
}

impl Callback {
    fn user(&self) -> *mut c_void {
        self.user
    }
}

// SAFETY: the header documents that the callback runs on an engine thread while the caller of
// ts_generate / ts_chat waits; `user` is only passed back to that callback, never dereferenced here.
unsafe impl Send for Callback {}
unsafe impl Sync for Callback {}

fn to_c(r: GenerationResult) -> TsResult {
    let text_len = r.text.len();
    let mut text = r.text.into_bytes();
    text.push(0);
    let ids = r.token_ids.into_boxed_slice();
    let n_tokens = ids.len();
    let finish: &'static [u8] = match r.reason.finish_reason() {
        "stop" => b"stop\0",
        "length" => b"length\0",
        _ => b"cancelled\0",
    };
    let (draft_proposed, draft_accepted) =
        r.spec.as_ref().map_or((0, 0), |s| (s.proposed, s.accepted));
    TsResult {
        text: Box::into_raw(text.into_boxed_slice()) as *mut c_char,
        text_len,
        token_ids: Box::into_raw(ids) as *mut u32,
        n_tokens,
        prompt_tokens: r.prompt_tokens,
        cached_tokens: r.reused_tokens,
        finish_reason: finish.as_ptr() as *const c_char,
        prefill_seconds: r.prefill_seconds,
        decode_seconds: r.decode_seconds,
        draft_proposed,
        draft_accepted,
    }
}

/// `ts_generate`.
///
/// # Safety
/// `engine` from `ts_engine_open`; `prompt` NUL-terminated; `params` NULL or initialised by
/// `ts_params_init`; `result` writable.
#[no_mangle]
pub unsafe extern "C" fn ts_generate(
    engine: *mut TsEngine,
    prompt: *const c_char,
    params: *const TsParams,
    on_delta: TsDeltaFn,
    user: *mut c_void,
    result: *mut TsResult,
    error: *mut *mut c_char,
) -> TsStatus {
    boundary(error, || {
        let text = utf8(prompt, "prompt")?.to_string();
        run(engine, Input::Text(text), params, on_delta, user, result)
    })
}

/// `ts_chat`.
///
/// # Safety
/// As `ts_generate`; `roles` and `contents` hold `n_messages` NUL-terminated strings each.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ts_chat(
    engine: *mut TsEngine,
    roles: *const *const c_char,
    contents: *const *const c_char,
    n_messages: usize,
    params: *const TsParams,
    on_delta: TsDeltaFn,
    user: *mut c_void,
    result: *mut TsResult,
    error: *mut *mut c_char,
) -> TsStatus {
    boundary(error, || {
        if n_messages == 0 {
            return Err(Failure::invalid(
                "`n_messages` is 0: at least one message is needed",
            ));
        }
        let roles = slice(roles, n_messages, "roles")?;
        let contents = slice(contents, n_messages, "contents")?;
        let messages = (0..n_messages)
            .map(|i| {
                Ok(ChatMessage::new(
                    utf8(roles[i], &format!("roles[{i}]"))?,
                    utf8(contents[i], &format!("contents[{i}]"))?,
                ))
            })
            .collect::<Result<Vec<_>, Failure>>()?;
        run(
            engine,
            Input::Chat(messages),
            params,
            on_delta,
            user,
            result,
        )
    })
}

/// `ts_result_free`.
///
/// # Safety
/// `result` is NULL or was filled by `ts_generate` / `ts_chat` and not freed before.
#[no_mangle]
pub unsafe extern "C" fn ts_result_free(result: *mut TsResult) {
    let Some(r) = result.as_mut() else { return };
    if !r.text.is_null() {
        let bytes = ptr::slice_from_raw_parts_mut(r.text as *mut u8, r.text_len + 1);
        drop(Box::from_raw(bytes));
        r.text = ptr::null_mut();
    }
    if !r.token_ids.is_null() {
        drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
            r.token_ids,
            r.n_tokens,
        )));
        r.token_ids = ptr::null_mut();
    }
}

/// `ts_string_free`.
///
/// # Safety
/// `s` is NULL or a string this library returned, not freed before.
#[no_mangle]
pub unsafe extern "C" fn ts_string_free(s: *mut c_char) {
    if !s.is_null() {
        drop(std::ffi::CString::from_raw(s));
    }
}

#[cfg(test)]
mod tests;
