//! The OpenAI-compatible handlers: `/v1/completions` and `/v1/chat/completions`, whole or streamed
//! as server-sent events (`data: {chunk}` ... `data: [DONE]`), and `/v1/models`.
//!
//! A generation request is parsed (request.rs), queued for the worker, and answered from the worker's
//! first message: a refusal is a JSON error with its status; an admitted request gets its body, or a
//! stream whose deltas are exactly the runtime's (`Event::Delta`: whole characters, never a part of a
//! stop string), so the concatenated stream equals the whole response's text.
//!
//! Extensions beside OpenAI's fields: `usage.prompt_tokens_details.cached_tokens` (prompt tokens the
//! session reused) and llama.cpp's `timings` object (prefill / decode counts, milliseconds, draft
//! tokens proposed and accepted) in a whole response and in the stream's last chunk.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use turbospark::runtime::{CancelFlag, GenerationResult};

use crate::error::ApiError;
use crate::logprobs::{self, Rendered};
use crate::request::{parse, Endpoint};
use crate::worker::{Job, Msg, Queue};
use crate::Client;

/// Sets the request's cancel flag when dropped: the handler's future or its stream went away, so
/// the client did.
struct CancelOnDrop(CancelFlag);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// What every response object of one request repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
    include_usage: bool,
    /// The request asked for `logprobs`: choices carry them (else `null`).
    logprobs: bool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Meta {
    fn new(endpoint: Endpoint, model: &str, include_usage: bool, logprobs: bool) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        Meta {
            id: format!("{prefix}-{created:x}{n:06x}"),
            created,
            model: model.to_string(),
            endpoint,
            include_usage,
            logprobs,
        }
    }

    /// A choice's `logprobs` over `entries`: `null` unless the request asked.
    fn logprobs(&self, entries: &[Rendered]) -> Value {
        match (self.logprobs, self.endpoint) {
            (false, _) => Value::Null,
            (true, Endpoint::Completions) => logprobs::completion_json(entries),
            (true, Endpoint::Chat) => logprobs::chat_json(entries),
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    /// One streamed chunk of choice 0 without entries (the usage chunk's frame).
    fn chunk(&self, text: Option<&str>, finish: Option<&str>, role: bool) -> Value {
        self.chunk_with(0, text, finish, role, &[])
    }

    /// One streamed chunk of choice `index`: `text` as its delta, `finish` on its last one, the
    /// log-probability entries of its tokens.
    fn chunk_with(
        &self,
        index: usize,
        text: Option<&str>,
        finish: Option<&str>,
        role: bool,
        entries: &[Rendered],
    ) -> Value {
        let lp = match entries.is_empty() {
            true => Value::Null,
            false => self.logprobs(entries),
        };
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": index, "text": text.unwrap_or(""), "logprobs": lp, "finish_reason": finish,
            }),
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [choice],
        })
    }

    /// The whole (non-streamed) response over its choices (each result with its text, an echo
    /// included, and every token's entries when asked).
    fn whole(&self, choices: &[(Box<GenerationResult>, Vec<Rendered>)]) -> Value {
        let list: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, (r, entries))| {
                let finish = r.reason.finish_reason();
                let lp = self.logprobs(entries);
                match self.endpoint {
                    Endpoint::Completions => json!({
                        "index": i, "text": r.text, "logprobs": lp, "finish_reason": finish,
                    }),
                    Endpoint::Chat => json!({
                        "index": i, "message": {"role": "assistant", "content": r.text},
                        "logprobs": lp, "finish_reason": finish,
                    }),
                }
            })
            .collect();
        let results: Vec<&GenerationResult> = choices.iter().map(|(r, _)| &**r).collect();
        let mut v = json!({
            "id": self.id, "object": self.object(false), "created": self.created,
            "model": self.model, "choices": list, "usage": usage(&results),
        });
        if let Some(last) = results.last() {
            v["timings"] = timings(last);
        }
        v
    }
}

/// The usage of a request's choices: the prompt once (as the first choice prefilled it), every
/// choice's tokens.
fn usage(results: &[&GenerationResult]) -> Value {
    let prompt = results.first().map_or(0, |r| r.prompt_tokens);
    let cached = results.first().map_or(0, |r| r.reused_tokens);
    let completion: usize = results.iter().map(|r| r.new_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// llama.cpp's server `timings`, plus the speculative counters when the run drafted.
fn timings(r: &GenerationResult) -> Value {
    let mut t = json!({
        "cache_n": r.reused_tokens,
        "prompt_n": r.prompt_tokens - r.reused_tokens.min(r.prompt_tokens),
        "prompt_ms": r.prefill_seconds * 1e3,
        "prompt_per_second": r.prefill_tokens_per_second(),
        "predicted_n": r.new_tokens,
        "predicted_ms": r.decode_seconds * 1e3,
        "predicted_per_second": r.decode_tokens_per_second(),
    });
    if let Some(spec) = &r.spec {
        t["draft_n"] = spec.proposed.into();
        t["draft_n_accepted"] = spec.accepted.into();
    }
    t
}

pub async fn completions(
    State(queue): State<Queue>,
    client: Option<Extension<Client>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(queue, Endpoint::Completions, client.map(|c| c.0), body).await
}

pub async fn chat_completions(
    State(queue): State<Queue>,
    client: Option<Extension<Client>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(queue, Endpoint::Chat, client.map(|c| c.0), body).await
}

pub async fn models(State(queue): State<Queue>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&queue.info)]}))
}

async fn run(
    queue: Queue,
    endpoint: Endpoint,
    client: Option<Client>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    queue.metrics.requests.fetch_add(1, Ordering::Relaxed);
    match admit(&queue, endpoint, client, body).await {
        Ok(response) => response,
        Err(e) => {
            if e.status.is_client_error() || e.status.as_u16() == 503 {
                queue.metrics.refused.fetch_add(1, Ordering::Relaxed);
            }
            e.into_response()
        }
    }
}

async fn admit(
    queue: &Queue,
    endpoint: Endpoint,
    client: Option<Client>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let parsed = parse(endpoint, &read_body(body)?, &queue.info)?;
    let asked_logprobs = parsed.config.logprobs.is_some();
    let (tx, mut rx) = mpsc::channel(256);
    let cancel = CancelFlag::new();
    let guard = CancelOnDrop(cancel.clone());
    queue.submit(Job {
        label: match endpoint {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
        },
        input: parsed.input,
        config: parsed.config,
        max_tokens: parsed.max_tokens,
        ignore_eos: parsed.ignore_eos,
        speculation: parsed.speculation,
        echo: parsed.echo,
        n: parsed.n,
        client,
        events: tx,
        cancel,
    })?;
    match rx.recv().await {
        Some(Msg::Admitted { .. }) => {}
        // The worker counted this refusal (the model's limits, the template): the caller must not.
        Some(Msg::Failed(e)) => return Ok(e.into_response()),
        _ => return Err(ApiError::internal("the worker dropped the request")),
    }
    let meta = Meta::new(
        endpoint,
        &queue.info.name,
        parsed.include_usage,
        asked_logprobs,
    );
    if parsed.stream {
        return Ok(stream_response(meta, rx, guard, parsed.n));
    }
    // Per choice: its entries and echo, then its result.
    let mut done = Vec::with_capacity(parsed.n);
    let (mut entries, mut echoed) = (Vec::new(), String::new());
    while let Some(msg) = rx.recv().await {
        match msg {
            Msg::Delta(_) | Msg::Admitted { .. } | Msg::Choice(_) => {}
            Msg::Logprobs(e) => entries.extend(e),
            Msg::Echo(text) => echoed = text,
            Msg::Done(mut result) => {
                result.text.insert_str(0, &std::mem::take(&mut echoed));
                done.push((result, std::mem::take(&mut entries)));
                if done.len() == parsed.n {
                    return Ok(Json(meta.whole(&done)).into_response());
                }
            }
            Msg::Failed(e) => return Ok(e.into_response()),
        }
    }
    drop(guard);
    Err(ApiError::internal(
        "the worker ended the request without a result",
    ))
}

/// The SSE stream of an admitted request: per choice (chat: a role chunk), a chunk per delta, its
/// finishing chunk; after the last choice the usage chunk when asked for, then `[DONE]`. A failure
/// mid-stream is an `{"error": ...}` event.
fn stream_response(meta: Meta, rx: mpsc::Receiver<Msg>, guard: CancelOnDrop, n: usize) -> Response {
    let state = Streaming {
        meta,
        rx,
        _guard: guard,
        pending: VecDeque::new(),
        entries: Vec::new(),
        index: 0,
        results: Vec::new(),
        n,
        ended: false,
    };
    let events = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(data) = st.pending.pop_front() {
                let event = Ok::<_, Infallible>(SseEvent::default().data(data));
                return Some((event, st));
            }
            if st.ended {
                return None;
            }
            let msg = st.rx.recv().await;
            st.on(msg);
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A stream's state between events.
struct Streaming {
    meta: Meta,
    rx: mpsc::Receiver<Msg>,
    _guard: CancelOnDrop,
    /// Events ready to send.
    pending: VecDeque<String>,
    /// The current choice's entries not yet sent with a chunk.
    entries: Vec<Rendered>,
    index: usize,
    /// The finished choices' results (for the usage).
    results: Vec<GenerationResult>,
    n: usize,
    ended: bool,
}

impl Streaming {
    fn push(&mut self, chunk: Value) {
        self.pending.push_back(chunk.to_string());
    }

    fn on(&mut self, msg: Option<Msg>) {
        let index = self.index;
        match msg {
            Some(Msg::Choice(i)) => {
                self.index = i;
                if self.meta.endpoint == Endpoint::Chat {
                    let role = self.meta.chunk_with(i, Some(""), None, true, &[]);
                    self.push(role);
                }
            }
            Some(Msg::Logprobs(e)) => self.entries.extend(e),
            Some(Msg::Delta(text) | Msg::Echo(text)) => {
                let chunk = self
                    .meta
                    .chunk_with(index, Some(&text), None, false, &self.entries);
                self.entries.clear();
                self.push(chunk);
            }
            Some(Msg::Done(result)) => {
                if !self.entries.is_empty() {
                    // Tokens whose text never came (a stop token, a stop string's tail).
                    let text = (self.meta.endpoint == Endpoint::Completions).then_some("");
                    let chunk = self
                        .meta
                        .chunk_with(index, text, None, false, &self.entries);
                    self.entries.clear();
                    self.push(chunk);
                }
                let finish = result.reason.finish_reason();
                let mut last = self.meta.chunk_with(index, None, Some(finish), false, &[]);
                last["timings"] = timings(&result);
                self.push(last);
                self.results.push(*result);
                if self.results.len() == self.n {
                    if self.meta.include_usage {
                        let mut u = self.meta.chunk(None, None, false);
                        u["choices"] = json!([]);
                        let results: Vec<&GenerationResult> = self.results.iter().collect();
                        u["usage"] = usage(&results);
                        self.push(u);
                    }
                    self.pending.push_back("[DONE]".into());
                    self.ended = true;
                }
            }
            Some(Msg::Failed(e)) => {
                self.pending.push_back(e.body().to_string());
                self.pending.push_back("[DONE]".into());
                self.ended = true;
            }
            Some(Msg::Admitted { .. }) => {}
            None => self.ended = true,
        }
    }
}

/// `GET /v1/models/{id}`: the served model, or 404 naming the one served.
pub async fn model(
    State(queue): State<Queue>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let info = &queue.info;
    if id != info.name {
        return ApiError::not_found(
            Some("model"),
            format!(
                "the model `{id}` does not exist: this server serves `{}`",
                info.name
            ),
        )
        .into_response();
    }
    Json(model_object(info)).into_response()
}

/// `POST /tokenize` (vLLM's): `{"prompt": text}` → `{"tokens", "count", "max_model_len"}`, the ids a
/// completion of that prompt would start from.
pub async fn tokenize(State(queue): State<Queue>, body: Result<Bytes, BytesRejection>) -> Response {
    // Tokenizing a large body takes a while: never on the async threads that serve everyone.
    off_async(move || {
        let v = json_body(body)?;
        let Some(prompt) = v.get("prompt").and_then(Value::as_str) else {
            return Err(ApiError::param("prompt", "a string is required"));
        };
        let ids = queue
            .tokenizer
            .encode(prompt, false)
            .map_err(|e| {
                ApiError::param("prompt", format!("the tokenizer could not encode it: {e}"))
            })?
            .get_ids()
            .to_vec();
        Ok(json!({"count": ids.len(), "tokens": ids, "max_model_len": queue.info.context}))
    })
    .await
}

/// Runs `work` on tokio's blocking pool and answers with its JSON or its error.
async fn off_async(work: impl FnOnce() -> Result<Value, ApiError> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(_) => ApiError::internal("the tokenizer task failed").into_response(),
    }
}

/// `POST /detokenize` (vLLM's): `{"tokens": [ids]}` → `{"prompt": text}`.
pub async fn detokenize(
    State(queue): State<Queue>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    off_async(move || {
        let v = json_body(body)?;
        let ids: Vec<u32> = match v.get("tokens").and_then(Value::as_array) {
            Some(items) => items
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|&n| (n as usize) < queue.info.vocab)
                        .ok_or_else(|| {
                            ApiError::param(
                                format!("tokens[{i}]"),
                                format!("expected a token id below {}", queue.info.vocab),
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
            None => {
                return Err(ApiError::param(
                    "tokens",
                    "an array of token ids is required",
                ))
            }
        };
        let text = queue.tokenizer.decode(&ids, false).map_err(|e| {
            ApiError::param(
                "tokens",
                format!("the tokenizer could not decode them: {e}"),
            )
        })?;
        Ok(json!({ "prompt": text }))
    })
    .await
}

/// A request body as a JSON object, or the error naming what is wrong with it.
fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    match serde_json::from_slice::<Value>(&read_body(body)?) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(ApiError::bad_request(
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::bad_request(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// The body's bytes, or the error axum found reading them (too large, ...), as an API error.
fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| ApiError {
        status: e.status(),
        message: format!("cannot read the request body: {}", e.body_text()),
        param: None,
    })
}

/// The served model as OpenAI's model object.
fn model_object(info: &crate::worker::ModelInfo) -> Value {
    json!({
        "id": info.name, "object": "model", "created": 0, "owned_by": "turbospark",
        "max_model_len": info.context,
    })
}
