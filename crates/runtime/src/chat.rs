//! Chat templates: renders a Hugging Face `chat_template` (Jinja) the way transformers'
//! `apply_chat_template` does, with minijinja.
//!
//! transformers (`utils/chat_template_utils.py`) compiles templates in a sandboxed Jinja
//! environment with `trim_blocks=True`, `lstrip_blocks=True` and loop controls, adds a
//! `raise_exception(message)` global and replaces `tojson` with `json.dumps(x, ensure_ascii=False,
//! indent=..., separators=..., sort_keys=...)`; the render context is `messages`, `tools`,
//! `add_generation_prompt`, the tokenizer's special tokens (`bos_token`, `eos_token`, ...) and any
//! extra keyword (Qwen3's `enable_thinking`). We configure minijinja the same way; Python string
//! methods templates call (`.startswith`, `.split`, `.strip('\n')`) come from minijinja-contrib's
//! pycompat, and [`python_json`] reproduces `json.dumps` byte for byte (its `", "` / `": "`
//! separators differ from minijinja's own `tojson`).
//!
//! Invariant: for the same template, messages and options, the rendered string equals
//! transformers' (tested against a transformers-rendered fixture). Not supported: the
//! `{% generation %}` tag (assistant-mask extension) and `strftime_now` (Llama 3 date headers).

use std::fmt::Write as _;
use std::path::Path;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

const TEMPLATE_NAME: &str = "chat_template";

/// One chat turn. Extra fields a template may read (tool calls) go through
/// [`ChatTemplate::render_value`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The assistant's thinking, for templates that re-render it (Qwen3 does, after the last
    /// user turn). Absent, not null, when `None`, so `is defined` tests behave as in Python.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
        }
    }
}

/// Rendering options beyond the messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// Append the header that opens the assistant's turn.
    pub add_generation_prompt: bool,
    /// Tool definitions (a JSON array), rendered by templates that support tools.
    pub tools: Option<serde_json::Value>,
    /// Extra template variables, e.g. `{"enable_thinking": false}` for Qwen3.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A compiled chat template plus the special tokens it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the template came from, for error messages.
    origin: String,
    /// `(name, token)`: `bos_token`, `eos_token`, ... as `tokenizer_config.json` sets them.
    special_tokens: Vec<(String, Value)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `special_tokens` become template variables.
    pub fn new(
        source: impl Into<String>,
        special_tokens: Vec<(String, String)>,
        origin: impl Into<String>,
    ) -> Result<Self, RuntimeError> {
        let tokens = special_tokens
            .into_iter()
            .map(|(name, token)| (name, Value::from(token)))
            .collect();
        Self::compile(source.into(), tokens, origin.into())
    }

    /// The template of a `tokenizer_config.json` (its text), with its special tokens.
    pub fn from_tokenizer_config(json: &str, origin: &str) -> Result<Self, RuntimeError> {
        let config: serde_json::Value =
            serde_json::from_str(json).map_err(|e| config_error(origin, e))?;
        let source = template_source(config.get("chat_template"), origin)?;
        Self::compile(source, special_tokens_of(&config), origin.to_string())
    }

    /// Reads a model directory: `chat_template.jinja` (where newer transformers save it) when
    /// present, else `tokenizer_config.json`'s `chat_template`; special tokens always come from
    /// `tokenizer_config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<Self, RuntimeError> {
        let config_path = dir.join("tokenizer_config.json");
        let config_text = read(&config_path)?;
        let origin = config_path.display().to_string();
        let jinja_path = dir.join("chat_template.jinja");
        if jinja_path.is_file() {
            let config: serde_json::Value =
                serde_json::from_str(&config_text).map_err(|e| config_error(&origin, e))?;
            let source = read(&jinja_path)?;
            return Self::compile(
                source,
                special_tokens_of(&config),
                jinja_path.display().to_string(),
            );
        }
        Self::from_tokenizer_config(&config_text, &origin)
    }

    /// Renders `messages` as transformers' `apply_chat_template(..., tokenize=False)` would.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions,
    ) -> Result<String, RuntimeError> {
        self.render_value(messages, options)
    }

    /// [`ChatTemplate::render`] for messages given as arbitrary JSON-like values (tool calls,
    /// multi-part content): anything `serde` can serialize.
    pub fn render_value<M: Serialize + ?Sized>(
        &self,
        messages: &M,
        options: &RenderOptions,
    ) -> Result<String, RuntimeError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| self.template_error("load", &e))?;
        let mut context: Vec<(String, Value)> = self.special_tokens.clone();
        for (key, value) in &options.extra {
            context.push((key.clone(), Value::from_serialize(value)));
        }
        context.push(("messages".into(), Value::from_serialize(messages)));
        context.push((
            "add_generation_prompt".into(),
            Value::from(options.add_generation_prompt),
        ));
        if let Some(tools) = &options.tools {
            context.push(("tools".into(), Value::from_serialize(tools)));
        }
        let context: Value = context.into_iter().collect();
        template
            .render(context)
            .map_err(|e| self.template_error("render", &e))
    }

    /// The `bos_token` the template sees, if the tokenizer config sets one.
    pub fn bos_token(&self) -> Option<&str> {
        self.special_token("bos_token")
    }

    /// The `eos_token` the template sees, if the tokenizer config sets one.
    pub fn eos_token(&self) -> Option<&str> {
        self.special_token("eos_token")
    }

    fn special_token(&self, name: &str) -> Option<&str> {
        self.special_tokens
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_str())
    }

    fn compile(
        source: String,
        special_tokens: Vec<(String, Value)>,
        origin: String,
    ) -> Result<Self, RuntimeError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| template_error(&origin, "compile", &e))?;
        Ok(ChatTemplate {
            env,
            origin,
            special_tokens,
        })
    }

    fn template_error(&self, stage: &'static str, e: &Error) -> RuntimeError {
        template_error(&self.origin, stage, e)
    }
}

fn template_error(origin: &str, stage: &'static str, e: &Error) -> RuntimeError {
    // minijinja's Display carries the kind, the detail and the template line.
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let _ = write!(message, ": {cause}");
        source = cause.source();
    }
    RuntimeError::Template {
        origin: origin.to_string(),
        stage,
        message,
    }
}

fn config_error(origin: &str, e: serde_json::Error) -> RuntimeError {
    RuntimeError::Config {
        origin: origin.to_string(),
        reason: format!("not valid JSON: {e}"),
    }
}

fn read(path: &Path) -> Result<String, RuntimeError> {
    std::fs::read_to_string(path).map_err(|source| RuntimeError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// `chat_template` is a string, or (older multi-template configs) a list of `{name, template}`
/// of which transformers uses `default` when no other is asked for.
fn template_source(
    value: Option<&serde_json::Value>,
    origin: &str,
) -> Result<String, RuntimeError> {
    let bad = |reason: String| RuntimeError::Config {
        origin: origin.to_string(),
        reason,
    };
    match value {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Array(named)) => {
            let name_of =
                |t: &serde_json::Value| t.get("name").and_then(|n| n.as_str()).map(str::to_string);
            named
                .iter()
                .find(|t| name_of(t).as_deref() == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string))
                .ok_or_else(|| {
                    let names: Vec<String> = named.iter().filter_map(name_of).collect();
                    bad(format!(
                        "`chat_template` lists templates {names:?} but none named \"default\""
                    ))
                })
        }
        Some(other) => Err(bad(format!(
            "`chat_template` must be a string or a list of named templates, found {other}"
        ))),
        None => Err(bad(
            "has no `chat_template` (a base model? pass a template or use raw completion)".into(),
        )),
    }
}

/// The special tokens transformers puts in the render context (`special_tokens_map`): each is a
/// string or an added-token object `{"content": ...}`; null ones are absent.
fn special_tokens_of(config: &serde_json::Value) -> Vec<(String, Value)> {
    let content = |v: &serde_json::Value| -> Option<String> {
        match v {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
            _ => None,
        }
    };
    let mut tokens = Vec::new();
    for name in [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ] {
        if let Some(token) = config.get(name).and_then(content) {
            tokens.push((name.to_string(), Value::from(token)));
        }
    }
    if let Some(serde_json::Value::Array(extra)) = config.get("additional_special_tokens") {
        let extra: Vec<String> = extra.iter().filter_map(content).collect();
        tokens.push(("additional_special_tokens".into(), Value::from(extra)));
    }
    tokens
}

/// `raise_exception(message)`: a template's own refusal, surfaced with its message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, keyword arguments honoured.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let options = JsonOptions {
        indent: kwargs.get::<Option<usize>>("indent")?,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        separators: kwargs.get::<Option<Vec<String>>>("separators")?,
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    python_json(value, &options, 0, &mut out)?;
    Ok(out)
}

/// How Python's `json.dumps` was asked to format.
struct JsonOptions {
    indent: Option<usize>,
    sort_keys: bool,
    ensure_ascii: bool,
    /// `(item separator, key separator)`; Python's default is `(", ", ": ")` without indent and
    /// `(",", ": ")` with one.
    separators: Option<Vec<String>>,
}

impl JsonOptions {
    fn separators(&self) -> (&str, &str) {
        match self.separators.as_deref() {
            Some([item, key]) => (item, key),
            _ if self.indent.is_some() => (",", ": "),
            _ => (", ", ": "),
        }
    }
}

/// Writes `value` as Python's `json.dumps` would.
fn python_json(
    value: &Value,
    options: &JsonOptions,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&python_number(value)),
        ValueKind::String => python_string(
            value.as_str().unwrap_or_default(),
            options.ensure_ascii,
            out,
        ),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, options, depth, '[', ']', &items, |item, out| {
                python_json(item, options, depth + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                let key = match key.as_str() {
                    Some(s) => s.to_string(),
                    None => key.to_string(),
                };
                entries.push((key, item));
            }
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            let (_, key_sep) = options.separators();
            write_container(
                out,
                options,
                depth,
                '{',
                '}',
                &entries,
                |(key, item), out| {
                    python_string(key, options.ensure_ascii, out);
                    out.push_str(key_sep);
                    python_json(item, options, depth + 1, out)
                },
            )?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {} value is not JSON serializable", value.kind()),
            ))
        }
    }
    Ok(())
}

/// `[a, b]` / `{...}` with Python's separators and indentation.
fn write_container<T>(
    out: &mut String,
    options: &JsonOptions,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut write_item: impl FnMut(&T, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let (item_sep, _) = options.separators();
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = options.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', indent * level));
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(item_sep);
        }
        newline(out, depth + 1);
        write_item(item, out)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// A number as Python prints it: integers in full, floats by `repr` (shortest round-trip digits,
/// `1e-05` / `1e+16` exponents, `NaN` / `Infinity`).
fn python_number(value: &Value) -> String {
    if value.is_integer() {
        // Any width (u64, i128) prints in full, as Python's int does.
        return value.to_string();
    }
    let Ok(f) = f64::try_from(value.clone()) else {
        return value.to_string();
    };
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // Rust's `{:?}` is the shortest round-trip form and switches to exponent notation at the same
    // thresholds as Python's repr (|f| < 1e-4 or >= 1e16); only the exponent is spelt differently.
    let repr = format!("{f:?}");
    match repr.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => repr,
    }
}

/// A JSON string literal with Python's escapes: `"`, `\`, `\n` `\r` `\t` `\b` `\f`, other control
/// characters as `\u00XX`; with `ensure_ascii` every non-ASCII character as `\uXXXX` (UTF-16).
fn python_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
