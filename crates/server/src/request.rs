//! Request bodies of `/v1/completions` and `/v1/chat/completions` → what the worker runs.
//!
//! Fields are read one by one from the JSON object so that every refusal names the parameter (serde's
//! derive errors give a line and column, not a name). `null` means absent, as OpenAI's clients send
//! it. Unknown fields are ignored (clients send many). Fields we know but cannot honour (`best_of`
//! other than `n`, `tools`, `logit_bias`, `echo`, a non-text `response_format`, ...) are refused, never silently
//! dropped. `echo` (completions) returns the prompt before the completion, scored when `logprobs` is
//! asked; with `echo`, `max_tokens` may be 0 (score only). `logprobs` is the completions API's integer (alternatives per token, 0 = the chosen
//! token's alone) or the chat API's boolean with `top_logprobs`; at most `turbospark::runtime::MAX_TOP_LOGPROBS`.
//!
//! `speculative` ("auto": the server's plan, "off", or N proposals per round) picks the request's
//! speculation; a named block the session's drafter cannot serve exactly is refused by the worker.
//!
//! Sampling defaults, per field: the request's value, else the checkpoint's `generation_config.json`
//! (greedy when it says `do_sample: false`), else OpenAI's (temperature 1, top_p 1): vLLM's order.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use serde_json::{Map, Value};
use turbospark::runtime::{ChatMessage, GenerationConfig, RenderOptions};
use turbospark::sampling::Shaping;

use crate::error::ApiError;
use crate::worker::{Input, ModelInfo};

/// Which endpoint a body came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// A parsed, checked request (admission against the prompt's length is the worker's).
pub struct Parsed {
    pub input: Input,
    pub config: GenerationConfig,
    pub max_tokens: Option<usize>,
    pub ignore_eos: bool,
    /// `speculative`: "auto" (the server's plan), "off", or proposals per round.
    pub speculation: Option<turbospark::runtime::Speculation>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// `echo` (completions): the prompt comes back before the completion.
    pub echo: bool,
    /// `n`: choices, generated one after another (choice i samples with seed + i).
    pub n: usize,
}

/// Typed access to the body's fields, each error naming its field.
struct Fields<'a>(&'a Map<String, Value>);

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong(field: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::param(field, format!("expected {expected}, got {}", kind(got)))
}

impl Fields<'_> {
    fn get(&self, field: &str) -> Option<&Value> {
        self.0.get(field).filter(|v| !v.is_null())
    }

    fn f64(&self, field: &str) -> Result<Option<f64>, ApiError> {
        self.get(field)
            .map(|v| v.as_f64().ok_or_else(|| wrong(field, "a number", v)))
            .transpose()
    }

    fn u64(&self, field: &str) -> Result<Option<u64>, ApiError> {
        self.get(field)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| wrong(field, "a non-negative integer", v))
            })
            .transpose()
    }

    fn bool(&self, field: &str) -> Result<Option<bool>, ApiError> {
        self.get(field)
            .map(|v| v.as_bool().ok_or_else(|| wrong(field, "a boolean", v)))
            .transpose()
    }

    fn str(&self, field: &str) -> Result<Option<&str>, ApiError> {
        self.get(field)
            .map(|v| v.as_str().ok_or_else(|| wrong(field, "a string", v)))
            .transpose()
    }

    /// Refuses `field` unless it is absent or `allowed(value)`.
    fn only(
        &self,
        field: &str,
        allowed: impl Fn(&Value) -> bool,
        reason: &str,
    ) -> Result<(), ApiError> {
        match self.get(field) {
            Some(v) if !allowed(v) => Err(ApiError::param(field, reason)),
            _ => Ok(()),
        }
    }

    /// `stop`: a string or an array of strings.
    fn stop(&self) -> Result<Vec<String>, ApiError> {
        match self.get("stop") {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| wrong(&format!("stop[{i}]"), "a string", v))
                })
                .collect(),
            Some(v) => Err(wrong("stop", "a string or an array of strings", v)),
        }
    }

    /// An array of token ids (`stop_token_ids`, a `prompt` of ids).
    fn ids(&self, field: &str, v: &Value) -> Result<Vec<u32>, ApiError> {
        let Value::Array(items) = v else {
            return Err(wrong(field, "an array of token ids", v));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| wrong(&format!("{field}[{i}]"), "a token id", x))
            })
            .collect()
    }
}

/// `seed`: any integer, negative ones included (OpenAI and vLLM accept them); a negative seed is used
/// as its two's-complement bits.
fn seed(f: &Fields<'_>) -> Result<Option<u64>, ApiError> {
    f.get("seed")
        .map(|v| {
            v.as_u64()
                .or_else(|| v.as_i64().map(|i| i as u64))
                .ok_or_else(|| wrong("seed", "an integer", v))
        })
        .transpose()
}

/// The chat roles Qwen's templates render (OpenAI's, less its newer `developer` alias of `system`).
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// A fresh seed for a request that names none.
fn random_seed() -> u64 {
    RandomState::new().build_hasher().finish()
}

/// A non-negative integer field as a `usize`.
fn usize_field(fields: &Fields<'_>, field: &str) -> Result<Option<usize>, ApiError> {
    fields.u64(field)?.map_or(Ok(None), |n| {
        usize::try_from(n)
            .map(Some)
            .map_err(|_| ApiError::param(field, "too large"))
    })
}

/// Parses `body` for `endpoint` against the served model.
pub fn parse(endpoint: Endpoint, body: &[u8], info: &ModelInfo) -> Result<Parsed, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(map) = &value else {
        return Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, got {}",
            kind(&value)
        )));
    };
    let f = Fields(map);
    if let Some(model) = f.str("model")? {
        if model != info.name {
            return Err(ApiError::not_found(
                Some("model"),
                format!(
                    "the model `{model}` does not exist: this server serves `{}`",
                    info.name
                ),
            ));
        }
    }
    refuse_unsupported(endpoint, &f)?;
    let input = match endpoint {
        Endpoint::Completions => completion_input(&f)?,
        Endpoint::Chat => chat_input(&f)?,
    };
    let max_tokens = match endpoint {
        // The newer name wins, as in OpenAI's API.
        Endpoint::Chat => match usize_field(&f, "max_completion_tokens")? {
            Some(n) => Some(n),
            None => usize_field(&f, "max_tokens")?,
        },
        Endpoint::Completions => usize_field(&f, "max_tokens")?,
    };
    let d = &info.defaults;
    let greedy_default = d.do_sample == Some(false);
    let shaping = Shaping {
        temperature: f.f64("temperature")?.unwrap_or(if greedy_default {
            0.0
        } else {
            d.temperature.map_or(1.0, f64::from)
        }),
        top_k: match f.get("top_k") {
            // vLLM's "-1 = off" as well as 0.
            Some(v) if v.as_i64() == Some(-1) => 0,
            Some(_) => u32::try_from(f.u64("top_k")?.unwrap_or(0))
                .map_err(|_| ApiError::param("top_k", "too large"))?,
            None => d.top_k.map_or(0, |k| u32::try_from(k).unwrap_or(u32::MAX)),
        },
        top_p: f.f64("top_p")?.unwrap_or(d.top_p.map_or(1.0, f64::from)),
        min_p: f.f64("min_p")?.unwrap_or(d.min_p.map_or(0.0, f64::from)),
        repetition_penalty: f
            .f64("repetition_penalty")?
            .unwrap_or(d.repetition_penalty.map_or(1.0, f64::from)),
        presence_penalty: f.f64("presence_penalty")?.unwrap_or(0.0),
        frequency_penalty: f.f64("frequency_penalty")?.unwrap_or(0.0),
    };
    // OpenAI's range; the runtime checks the rest of the shaping values.
    if !(0.0..=2.0).contains(&shaping.temperature) {
        return Err(ApiError::param(
            "temperature",
            format!("{} is outside [0, 2]", shaping.temperature),
        ));
    }
    let stop_token_ids = match f.get("stop_token_ids") {
        Some(v) => f.ids("stop_token_ids", v)?,
        None => Vec::new(),
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o)
            .bool("include_usage")
            .map_err(|_| {
                wrong(
                    "stream_options.include_usage",
                    "a boolean",
                    &o["include_usage"],
                )
            })?
            .unwrap_or(false),
        Some(v) => return Err(wrong("stream_options", "an object", v)),
    };
    Ok(Parsed {
        input,
        config: GenerationConfig {
            // Set by the worker once the prompt's length is known.
            max_new_tokens: 0,
            stop_token_ids,
            stop_strings: f.stop()?,
            shaping,
            seed: seed(&f)?.unwrap_or_else(random_seed),
            logprobs: logprobs(endpoint, &f)?,
        },
        max_tokens,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        speculation: speculation(&f)?,
        stream,
        include_usage,
        echo: match endpoint {
            Endpoint::Completions => f.bool("echo")?.unwrap_or(false),
            Endpoint::Chat => false,
        },
        n: choices(&f)?,
    })
}

/// Most choices one request may ask for (`n`): they run one after another.
pub const MAX_CHOICES: usize = 64;

/// `n` (1 ..= MAX_CHOICES); `best_of`, when given, must equal it (choosing among more is not done).
fn choices(f: &Fields<'_>) -> Result<usize, ApiError> {
    let n = usize_field(f, "n")?.unwrap_or(1);
    if !(1..=MAX_CHOICES).contains(&n) {
        return Err(ApiError::param("n", format!("must be 1 to {MAX_CHOICES}")));
    }
    match usize_field(f, "best_of")? {
        Some(b) if b != n => Err(ApiError::param(
            "best_of",
            "only best_of = n is supported (choosing the best of more is not done)",
        )),
        _ => Ok(n),
    }
}

/// `logprobs` (+ `top_logprobs` on chat): `Some(n)` alternatives per generated token, or `None`.
fn logprobs(endpoint: Endpoint, f: &Fields<'_>) -> Result<Option<usize>, ApiError> {
    let cap = turbospark::runtime::MAX_TOP_LOGPROBS;
    let capped = |field: &str, n: usize| match n <= cap {
        true => Ok(n),
        false => Err(ApiError::param(
            field,
            format!("at most {cap} alternatives per token"),
        )),
    };
    match endpoint {
        Endpoint::Completions => {
            if f.get("top_logprobs").is_some() {
                return Err(ApiError::param(
                    "top_logprobs",
                    "/v1/completions takes `logprobs: N` (alternatives per token)",
                ));
            }
            match f.get("logprobs") {
                None | Some(Value::Bool(false)) => Ok(None),
                Some(_) => {
                    let n = usize_field(f, "logprobs")?.unwrap_or(0);
                    capped("logprobs", n).map(Some)
                }
            }
        }
        Endpoint::Chat => {
            let top = usize_field(f, "top_logprobs")?;
            match (f.bool("logprobs")?.unwrap_or(false), top) {
                (true, n) => capped("top_logprobs", n.unwrap_or(0)).map(Some),
                (false, Some(n)) if n > 0 => {
                    Err(ApiError::param("top_logprobs", "needs `logprobs: true`"))
                }
                (false, _) => Ok(None),
            }
        }
    }
}

/// `speculative`: "auto", "off", or a number of proposals per round (string or integer).
fn speculation(f: &Fields<'_>) -> Result<Option<turbospark::runtime::Speculation>, ApiError> {
    let text = match f.get("speculative") {
        None => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(v) => return Err(wrong("speculative", "\"auto\", \"off\" or a number", v)),
    };
    text.parse().map(Some).map_err(|e| match e {
        turbospark::runtime::RuntimeError::InvalidFlag { reason, .. } => {
            ApiError::param("speculative", reason)
        }
        other => ApiError::param("speculative", other.to_string()),
    })
}

/// The parameters we know and cannot honour: refused with the reason, never ignored.
fn refuse_unsupported(endpoint: Endpoint, f: &Fields<'_>) -> Result<(), ApiError> {
    if endpoint == Endpoint::Chat {
        let off = |v: &Value| v == &Value::Bool(false);
        f.only("echo", off, "only /v1/completions echoes the prompt")?;
    }
    f.only("suffix", |_| false, "suffix (insertion) is not supported")?;
    let empty = |v: &Value| v.as_object().is_some_and(Map::is_empty);
    f.only("logit_bias", empty, "logit_bias is not supported")?;
    let none = |v: &Value| v.as_array().is_some_and(Vec::is_empty);
    f.only(
        "tools",
        none,
        "tool calling is not supported by this server",
    )?;
    f.only(
        "functions",
        none,
        "function calling is not supported by this server",
    )?;
    f.only(
        "tool_choice",
        |v| v == "none" || v == "auto",
        "tool calling is not supported by this server",
    )?;
    f.only(
        "response_format",
        |v| v.get("type").and_then(Value::as_str) == Some("text"),
        "only response_format {\"type\": \"text\"} is supported",
    )?;
    if endpoint == Endpoint::Completions && f.get("messages").is_some() {
        return Err(ApiError::param(
            "messages",
            "/v1/completions takes `prompt`; send messages to /v1/chat/completions",
        ));
    }
    Ok(())
}

fn completion_input(f: &Fields<'_>) -> Result<Input, ApiError> {
    let Some(prompt) = f.get("prompt") else {
        return Err(ApiError::param("prompt", "is required"));
    };
    match prompt {
        Value::String(s) => Ok(Input::Text(s.clone())),
        Value::Array(items) => match items.as_slice() {
            [Value::String(s)] => Ok(Input::Text(s.clone())),
            [Value::Array(_)] => Ok(Input::Ids(f.ids("prompt[0]", &items[0])?)),
            [] => Err(ApiError::param("prompt", "the prompt is empty")),
            [first, ..] if first.is_number() => Ok(Input::Ids(f.ids("prompt", prompt)?)),
            _ => Err(ApiError::param(
                "prompt",
                "one prompt per request: a string, an array of one string, or an array of token ids",
            )),
        },
        v => Err(wrong("prompt", "a string or an array of token ids", v)),
    }
}

/// A message's `content`: a string, or an array of text parts (joined), or null.
fn content_text(at: &str, v: Option<&Value>) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let here = format!("{at}[{j}]");
                let ty = part.get("type").and_then(Value::as_str);
                match (ty, part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some("text"), None) => {
                        return Err(ApiError::param(format!("{here}.text"), "is required"))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::param(
                            format!("{here}.type"),
                            format!(
                                "content parts of type {other:?} are not supported (text only)"
                            ),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::param(format!("{here}.type"), "is required"))
                    }
                }
            }
            Ok(text)
        }
        Some(v) => Err(wrong(at, "a string or an array of content parts", v)),
    }
}

fn chat_input(f: &Fields<'_>) -> Result<Input, ApiError> {
    let messages = match f.get("messages") {
        None => return Err(ApiError::param("messages", "is required")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::param(
                "messages",
                "at least one message is needed",
            ))
        }
        Some(Value::Array(items)) => items,
        Some(v) => return Err(wrong("messages", "an array of messages", v)),
    };
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(obj) = m else {
            return Err(wrong(&at, "an object", m));
        };
        let role = match obj.get("role") {
            Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
            Some(v) => {
                return Err(wrong(
                    &format!("{at}.role"),
                    "one of system, user, assistant, tool",
                    v,
                ))
            }
            None => return Err(ApiError::param(format!("{at}.role"), "is required")),
        };
        if obj.get("tool_calls").is_some_and(|v| !v.is_null()) {
            return Err(ApiError::param(
                format!("{at}.tool_calls"),
                "tool calling is not supported by this server",
            ));
        }
        let mut message = ChatMessage::new(
            role,
            content_text(&format!("{at}.content"), obj.get("content"))?,
        );
        if let Some(r) = obj.get("reasoning_content").filter(|v| !v.is_null()) {
            let text = r
                .as_str()
                .ok_or_else(|| wrong(&format!("{at}.reasoning_content"), "a string", r))?;
            message.reasoning_content = Some(text.to_string());
        }
        out.push(message);
    }
    let mut options = RenderOptions {
        add_generation_prompt: f.bool("add_generation_prompt")?.unwrap_or(true),
        ..RenderOptions::default()
    };
    match f.get("chat_template_kwargs") {
        None => {}
        Some(Value::Object(kwargs)) => options.extra = kwargs.clone(),
        Some(v) => return Err(wrong("chat_template_kwargs", "an object", v)),
    }
    Ok(Input::Chat {
        messages: out,
        options,
    })
}
